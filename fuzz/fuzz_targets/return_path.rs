#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = rebound_fuzz_harness::return_path(data);
});
