//! Folded stacks given to `spanprof report`, `diff` or `check` (`.folded`): read them, then
//! compute and render what those commands can.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(profile) = spanprof_profile::format::folded::read_folded(data) {
        spanprof_fuzz::report_everything(&profile);
    }
});
