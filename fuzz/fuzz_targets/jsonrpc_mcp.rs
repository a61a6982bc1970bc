#![no_main]
//! See `mcptap_fuzz::run_mcp` for the input format.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mcptap_fuzz::run_mcp(data);
});
