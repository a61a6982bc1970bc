//! mcptap-core: the sans-IO heart of mcptap, a passive monitor for MCP (Model Context
//! Protocol) over HTTP.
//!
//! Packets (or HTTP messages) and their timestamps go in; typed [`model::Output`]s come out.
//! No clock, no sockets, no threads, no logging: time is an argument, and everything the core
//! notices (alerts, gaps, drops, limits, parse errors) is a typed value for the caller to log
//! and count. Data flows one way through the layers:
//!
//! [`decode`] → [`reassembly`] → [`http`] (chunked, [`http::sse`]) → [`jsonrpc`] → [`mcp`]
//! (session state) → [`detect`] (alerts), with [`model`] as the leaf every layer shares and
//! [`pipeline`] as the driver. [`limits`], a leaf like [`model`], holds every bound of every layer.

mod ascii;
pub mod decode;
pub mod detect;
pub mod flow_shard;
pub mod flow_unit;
pub mod http;
pub mod jsonrpc;
mod lasting_digest;
pub mod limits;
pub mod mcp;
pub mod model;
pub mod pipeline;
pub mod reassembly;
pub mod shard;
mod table_hash;
pub mod usage;

#[cfg(test)]
mod tests;
