//! The opt-in publisher (`python/spanprof-context`): the OTEP 4947 thread context record read
//! instead of the libraries' objects; and a native program publishing its own.

use spanprof_tests::{
    decode_pprof, profile_pid, profiling_lock, published_span_samples, require_root,
    require_spanprof_context, sample_functions, sample_str_labels, spans_summary_line, TempDir,
    Workload,
};

use crate::common::{
    Interp, FREQUENCY, MAX_OUTSIDE_LABELLED, MIN_OUTSIDE_SAMPLES, MIN_PUBLISHED, MIN_RIGHT,
    MIN_SPAN_SAMPLES, OSPROFILER_KEYS, OTEL_KEYS,
};
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

/// A native program (C, no Python: `tests/workloads/native_thread_ctx.c`) that publishes OTEP
/// 4947 thread contexts from two threads, span K of thread T worked in `span_work_T_K`: at least
/// [`MIN_RIGHT`] of the samples in a span carry exactly its trace and span ids (trace 16 bytes
/// of `(T+1)*0x11`, span 8 bytes of `(T+1)*0x10+K+1`), at most [`MAX_OUTSIDE_LABELLED`] of
/// those in `outside_work` (published NULL) carry any, and no span context read fails.
pub(super) fn native_thread_context() {
    require_root();
    let _lock = profiling_lock();
    let tmp = TempDir::new("spans-native-ctx");
    let pprof = tmp.join("native.pb.gz");
    let workload = Workload::start("native_thread_ctx", 7.5);
    let out = profile_pid(workload.pid(), "5s", FREQUENCY, &[&pprof], &[]);
    out.assert_success();
    let profile = decode_pprof(&pprof);
    let (mut in_span, mut right, mut outside, mut outside_labelled) = (0i64, 0i64, 0i64, 0i64);
    let mut wrong = Vec::new();
    for sample in profile["samples"].as_array().expect("samples") {
        let weight = sample["values"][0].as_i64().unwrap_or(0);
        let labels = sample_str_labels(sample);
        let functions = sample_functions(sample);
        let span = functions.iter().find_map(|f| {
            let (t, k) = f.strip_prefix("span_work_")?.split_once('_')?;
            Some((t.parse::<u8>().ok()?, k.parse::<u8>().ok()?))
        });
        let Some((t, k)) = span else {
            if functions.iter().any(|f| f == "outside_work") {
                outside += weight;
                if OTEL_KEYS.iter().any(|key| labels.contains_key(*key)) {
                    outside_labelled += weight;
                }
            }
            continue;
        };
        in_span += weight;
        let trace = format!("{:02x}", (t + 1) * 0x11).repeat(16);
        let span_id = format!("{:02x}", (t + 1) * 0x10 + k + 1).repeat(8);
        if labels.get("trace_id") == Some(&trace) && labels.get("span_id") == Some(&span_id) {
            right += weight;
        } else if wrong.len() < 6 {
            wrong.push(format!("span_work_{t}_{k}: {labels:?}"));
        }
    }
    let share = |n: i64, of: i64| n as f64 / of.max(1) as f64;
    let line = spans_summary_line(&out.stderr).unwrap_or_default();
    println!(
        "native_thread_ctx: {right} of {in_span} samples in a span with exactly its ids, \
         {outside_labelled} of {outside} outside with ids\n  {line}"
    );
    assert!(
        in_span >= MIN_SPAN_SAMPLES && share(right, in_span) >= MIN_RIGHT,
        "{right} of the {in_span} samples in a span of the native program carry exactly its \
         published ids, expected at least {:.0}% of at least {MIN_SPAN_SAMPLES}; e.g.\n{}\n{out}",
        100.0 * MIN_RIGHT,
        wrong.join("\n")
    );
    assert!(
        outside >= MIN_OUTSIDE_SAMPLES && share(outside_labelled, outside) <= MAX_OUTSIDE_LABELLED,
        "{outside_labelled} of the {outside} samples outside any span carry ids (expected at \
         most {:.0}% of at least {MIN_OUTSIDE_SAMPLES})\n{out}",
        100.0 * MAX_OUTSIDE_LABELLED
    );
    assert!(
        !out.stderr.contains("span contexts not read"),
        "spanprof failed to read some published contexts\n{out}"
    );
    assert!(workload.wait().success(), "native_thread_ctx failed");
}
