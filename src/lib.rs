//! mcptap: a passive monitor for MCP (Model Context Protocol) over HTTP.
//!
//! The core is sans-IO: [`pipeline::Pipeline`] takes packets with their capture timestamps and
//! returns typed outputs. Data flows one way through the layers:
//! [`decode`] → [`reassembly`] → [`http`] (+ [`sse`]) → [`jsonrpc`] → [`mcp`] → [`detect`] →
//! [`sink`]. File reading ([`capture`]), live capture and the metrics server are thin adapters.

pub mod capture;
pub mod config;
pub mod daemon;
pub mod decode;
pub mod detect;
pub mod endpoints;
pub mod event;
pub mod http;
pub mod jsonrpc;
pub mod live;
pub mod mcp;
pub mod pipeline;
pub mod reassembly;
pub mod replay;
pub mod server;
pub mod sink;
pub mod sse;
