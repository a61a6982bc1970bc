//! Shared by the bench targets (not a bench itself): the generators of synthetic traffic.
//! Frames, the TCP connection model, the PRNG and the pcap writer come from mcptap-testkit.
#![allow(dead_code)]

pub mod adversarial;
pub mod flood;
pub mod frames;
pub mod gateway;
pub mod traffic;
