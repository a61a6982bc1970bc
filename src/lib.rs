//! mcptap: the adapters around [`mcptap_core`]. File capture, live capture, the daemon, the
//! metrics server, sinks and configuration each depend on the core, not on each other; the
//! `mcptap` binary wires them together.

pub mod allocator;
pub mod capture;
pub mod config;
pub mod daemon;
pub mod endpoints;
pub mod fleet;
pub mod flow_shards;
pub mod forensics;
pub mod live;
pub mod progress;
pub mod redact;
pub mod replay;
pub mod server;
pub mod sharded;
pub mod sink;
pub mod state;
