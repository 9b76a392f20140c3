#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = rebound_fuzz_harness::page_sums(data);
});
