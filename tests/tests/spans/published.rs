//! The opt-in publisher (`python/spanprof-context`): the OTEP 4947 thread context record read
//! instead of the libraries' objects.

use spanprof_tests::{
    published_span_samples, require_spanprof_context, sample_str_labels, spans_summary_line,
};

use crate::common::{Interp, MIN_PUBLISHED, OSPROFILER_KEYS, OTEL_KEYS};
use crate::truth::check_mode;

/// The samples (weighted) of `profile` carrying any span label, OpenTelemetry or OSProfiler.
fn span_labelled(profile: &serde_json::Value) -> i64 {
    profile["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .filter(|sample| {
            let labels = sample_str_labels(sample);
            OTEL_KEYS
                .iter()
                .chain(&OSPROFILER_KEYS)
                .any(|k| labels.contains_key(*k))
        })
        .map(|sample| sample["values"][0].as_i64().unwrap_or(0))
        .sum()
}

/// `mode` with `spanprof_context.install()` first (the workload's `published_MODE`): the checks
/// of `mode`, and at least [`MIN_PUBLISHED`] of the samples with span labels read from the
/// published thread context.
pub(super) fn published(interp: &Interp, mode: &str, keys: &[&'static str]) {
    require_spanprof_context(&interp.path, &interp.libs);
    let mode = format!("published_{mode}");
    let (out, profile) = check_mode(interp, &mode, keys);
    let labelled = span_labelled(&profile);
    let published = published_span_samples(&out.stderr).unwrap_or_else(|e| panic!("{e}\n{out}"));
    let share = published as f64 / labelled.max(1) as f64;
    let line = spans_summary_line(&out.stderr).unwrap_or_default();
    println!(
        "{} {mode}: {published} of the {labelled} samples with span labels ({:.1}%) read from \
         the published thread context\n  {line}",
        interp.label,
        100.0 * share
    );
    assert!(
        labelled > 0 && share >= MIN_PUBLISHED,
        "{} {mode}: {published} of the {labelled} samples with span labels ({:.1}%) were read \
         from the thread context the process publishes, expected at least {:.0}%\n  {line}\n{out}",
        interp.label,
        100.0 * share,
        100.0 * MIN_PUBLISHED
    );
}

pub(super) fn published_otel_threads(interp: &Interp) {
    published(interp, "otel_threads", &OTEL_KEYS);
}

pub(super) fn published_osprofiler(interp: &Interp) {
    published(interp, "osprofiler", &OSPROFILER_KEYS);
}

/// asyncio tasks interleaving spans on one thread with the publisher installed: the thread's
/// record holds the span of the task that attached last, which is not the running task's after
/// a switch (no attach or detach happens then). The record carries the Python context it was
/// published in, so spanprof takes it only while that context runs and reads the running
/// task's span from the interpreter otherwise: the thresholds of `otel_asyncio` hold, and some
/// samples come from the record.
pub(super) fn published_otel_asyncio(interp: &Interp) {
    require_spanprof_context(&interp.path, &interp.libs);
    let (out, _) = check_mode(interp, "published_otel_asyncio", &OTEL_KEYS);
    let published = published_span_samples(&out.stderr).unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert!(
        published > 0,
        "{}: no sample read from the published thread context\n{out}",
        interp.label
    );
}
