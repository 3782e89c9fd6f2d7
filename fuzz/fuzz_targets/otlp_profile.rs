//! An OTLP profiles request given to `spanprof report`, `diff` or `check` (`.otlp`): read it,
//! then compute and render what those commands can.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(profile) = spanprof_profile::format::otlp::read_otlp(data) {
        spanprof_fuzz::report_everything(&profile);
    }
});
