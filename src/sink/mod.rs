//! Sinks: where outputs go. Every output becomes a log line, a counter, or both; product
//! events also become NDJSON lines.

pub mod handshake_line;
pub mod json;
pub mod log;
pub mod log_writer;
pub mod metrics;
pub mod ndjson;
pub mod summary;
