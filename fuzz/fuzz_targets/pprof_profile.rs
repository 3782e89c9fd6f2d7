//! A profile given to `spanprof report`, `diff` or `check` (`.pb.gz` or plain profile.proto):
//! read it, then compute and render everything those commands can from it (for half the
//! inputs after the privacy rewrite, with the written pprof read back).
#![no_main]

use libfuzzer_sys::fuzz_target;
use spanprof::analysis::{self, Diff, Functions};
use spanprof::output::{self, Format};
use spanprof::privacy::{PathMode, Privacy};
use spanprof::report;

fuzz_target!(|data: &[u8]| {
    let Ok(mut profile) = report::read_pprof(data) else {
        return;
    };
    // What `report --redact-paths=hash --drop-label …` does before rendering, and a read back
    // of what it writes.
    if data.len().is_multiple_of(2) {
        Privacy {
            redact_paths: Some(PathMode::Hash),
            drop_labels: ["thread.id", "thread.name", "osprofiler.trace_id"]
                .map(String::from)
                .into(),
        }
        .apply(&mut profile);
        if let Ok(bytes) = output::render(&profile, Format::Pprof) {
            let _ = report::read_pprof(&bytes);
        }
    }
    let functions = Functions::of(&profile);
    let spans = analysis::span_times(&profile, analysis::span_name_and_id).unwrap_or_default();
    let _ = analysis::report_text(&profile, &functions, &spans, 20);
    let _ = analysis::report_json(&profile, &functions, &spans, 0);
    let _ = analysis::run_line(&profile);
    if let Ok(d) = Diff::of(&profile, &profile) {
        let _ = analysis::diff_text((&profile, "a"), (&profile, "b"), &d, 20);
        let _ = analysis::diff_json(&profile, &profile, &d, 20, Some(0.05));
        let _ = analysis::verdict(&d, 0.05);
    }
    for format in [
        Format::Folded,
        Format::Svg,
        Format::Pprof,
        Format::Speedscope,
        Format::Otlp,
    ] {
        let _ = output::render(&profile, format);
    }
});
