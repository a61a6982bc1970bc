//! Dev-only test kit for mcptap: everything the tests, benches, fuzz seed generators and
//! adversarial tests need to *make* traffic, in one place.
//!
//! - [`wire`]: one frame emitter (Ethernet II with 802.1Q / 802.1ad tags, Linux SLL and SLL2,
//!   raw IP, BSD loopback; IPv4 / IPv6; TCP with flags, sequence numbers and options), laid out
//!   by named field ranges that mirror what `mcptap_core::decode` reads.
//! - [`capture`]: classic pcap (µs / ns, either byte order) and pcapng (sections, interfaces,
//!   per-interface link type and `if_tsresol`) writers.
//! - [`segment`]: TCP segments decoded from frames, re-cut, re-framed, grouped into streams.
//! - [`tcp`]: a TCP connection model turning application writes into packets (handshake,
//!   MSS-sized segments, delayed ACKs, FIN exchange).
//! - [`sim`]: an in-memory conversation simulator on a virtual clock with segmentation, loss,
//!   reordering and duplication knobs; [`mcp`] builds the HTTP/1.1 MCP messages it carries.
//! - [`rng`]: the one SplitMix64; [`http_check`]: the HTTP-event invariant checker.
//! - [`exchange`]: one connection through the pipeline; the bytes of a `gzip on` proxy.

pub mod capture;
pub mod exchange;
pub mod http_check;
pub mod mcp;
pub mod rng;
pub mod segment;
pub mod sim;
pub mod tcp;
pub mod wire;

pub use capture::{Frame, PcapWriter, PcapngWriter, pcap_bytes, pcapng_bytes};
pub use http_check::HttpEventChecker;
pub use rng::SplitMix64;
pub use segment::Segment;
pub use wire::{Link, TcpFrame, VlanTag};

#[cfg(test)]
mod tests;
