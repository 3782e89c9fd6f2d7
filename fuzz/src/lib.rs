//! Helpers shared by spanprof's fuzz targets (`fuzz_targets/`).
//!
//! # Overview
//! Each target feeds libFuzzer's bytes to one of spanprof's readers of untrusted input: profile
//! files given to `report`/`diff`/`check`, and what is read from a profiled process's memory
//! or module files. A target must never panic, hang or allocate without bound, whatever the
//! bytes. `cargo xtask fuzz` builds them with coverage instrumentation on stable Rust and runs
//! each for a bounded time from the seeds in `fuzz/corpus/<target>/`; `cargo xtask test` runs
//! it too.

use symbolizer::python::memory::FixtureMemory;

/// Where [`memory`] maps the input: low, so that pointers into it are small numbers the
/// fuzzer's comparison tracing finds quickly, and above the first page (a null pointer plus an
/// offset, which readers refuse).
pub const BASE: u64 = 0x1_0000;

/// An address space holding `data` at [`BASE`], as a target process's memory would: pointers
/// in it that fall inside `[BASE, BASE + data.len())` lead back into it, others fail to read.
pub fn memory(data: &[u8]) -> FixtureMemory {
    let mut mem = FixtureMemory::new();
    mem.insert(BASE, data.to_vec());
    mem
}

/// Splits a selector byte off the input: which variant of a target to run.
pub fn split_selector(data: &[u8]) -> Option<(u8, &[u8])> {
    let (&first, rest) = data.split_first()?;
    Some((first, rest))
}

/// A little-endian `u32` from the first 4 bytes, 0 if there are fewer.
pub fn u32_at(data: &[u8], at: usize) -> u32 {
    data.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// What `report`, `diff` and `check` compute and render from a profile they read: the
/// function table, span times, the text and JSON reports, the run line, a diff with itself,
/// every output format, and a read back of the pprof written.
pub fn report_everything(profile: &spanprof_profile::profile::Profile) {
    use spanprof_analysis::{self as analysis, Diff, Functions};
    use spanprof_profile::format::{self, Format};
    let functions = Functions::of(profile);
    let spans = analysis::span_times(profile, analysis::span_name_and_id).unwrap_or_default();
    let _ = analysis::report_text(profile, &functions, &spans, 20);
    let _ = analysis::report_json(profile, &functions, &spans, 0);
    let _ = analysis::run_line(profile);
    if let Ok(d) = Diff::of(profile, profile) {
        let _ = analysis::diff_text((profile, "a"), (profile, "b"), &d, 20);
        let _ = analysis::diff_json(profile, profile, &d, 20, Some(0.05));
        let _ = analysis::verdict(&d, 0.05);
    }
    for format in [
        Format::Folded,
        Format::Svg,
        Format::Pprof,
        Format::Speedscope,
        Format::Otlp,
    ] {
        if let Ok(bytes) = format::render(profile, format) {
            if format == Format::Pprof {
                let _ = spanprof_profile::format::pprof::read_pprof(&bytes);
            }
        }
    }
}
