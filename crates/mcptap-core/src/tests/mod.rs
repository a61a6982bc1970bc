//! Tests across layers: the session layer driven with the real detectors.

mod eras;
mod session_layer;
