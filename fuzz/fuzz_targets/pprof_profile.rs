//! A profile given to `spanprof report`, `diff` or `check` (`.pb.gz` or plain profile.proto):
//! read it, then compute and render everything those commands can from it (for half the
//! inputs after the privacy rewrite, with the written pprof read back).
#![no_main]

use libfuzzer_sys::fuzz_target;
use spanprof_profile::format::pprof as report;
use spanprof_profile::privacy::{PathMode, Privacy};

fuzz_target!(|data: &[u8]| {
    let Ok(mut profile) = report::read_pprof(data) else {
        return;
    };
    // What `report --redact-paths=hash --drop-label …` does before rendering (the pprof
    // written is read back in report_everything).
    if data.len().is_multiple_of(2) {
        Privacy {
            redact_paths: Some(PathMode::Hash),
            drop_labels: ["thread.id", "thread.name", "osprofiler.trace_id"]
                .map(String::from)
                .into(),
        }
        .apply(&mut profile);
    }
    spanprof_fuzz::report_everything(&profile);
});
