//! An OTLP profiles request given to `spanprof report`, `diff` or `check` (`.otlp`): read it, then
//! compute and render what those commands can.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spanprof::analysis::{self, Diff, Functions};
use spanprof::output::{self, Format};
use spanprof::report;

fuzz_target!(|data: &[u8]| {
    let Ok(profile) = spanprof::otlp_input::read_otlp(data) else {
        return;
    };
    let functions = Functions::of(&profile);
    let _ = analysis::report_text(&profile, &functions, &[], 20);
    let _ = analysis::report_json(&profile, &functions, &[], 0);
    let _ = analysis::run_line(&profile);
    if let Ok(d) = Diff::of(&profile, &profile) {
        let _ = analysis::diff_text((&profile, "a"), (&profile, "b"), &d, 20);
    }
    for format in [Format::Folded, Format::Svg, Format::Pprof, Format::Otlp] {
        if let Ok(bytes) = output::render(&profile, format) {
            // What spanprof writes of OTLP input reads back.
            if format == Format::Pprof {
                let _ = report::read_pprof(&bytes);
            }
        }
    }
});
