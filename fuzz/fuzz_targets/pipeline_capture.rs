#![no_main]
//! See `mcptap_fuzz::run_capture` for the input format.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mcptap_fuzz::run_capture(data);
});
