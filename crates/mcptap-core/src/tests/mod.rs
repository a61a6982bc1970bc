//! Tests across layers: the session layer driven with the real detectors.

mod session_layer;
