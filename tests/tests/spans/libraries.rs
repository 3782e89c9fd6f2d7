//! Span contexts read from the tracing libraries' own objects: OpenTelemetry in two threads
//! and in asyncio tasks, OSProfiler in two threads, OpenTelemetry imported after spanprof
//! attached, OSProfiler exporting its points with its OTLP driver.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use spanprof_tests::otlp::{self, HttpSink};
use spanprof_tests::{
    profile_pid, profiling_lock, require_green_libs, sample_str_labels, spanprof_command,
    start_py_workload_with_libs, Background, RunOutput, TempDir, RUN_TIMEOUT,
};

use crate::common::{
    require_span_profiling, Interp, FREQUENCY, MIN_SPAN_SAMPLES, OSPROFILER_NAMED_KEYS,
    OTEL_NAMED_KEYS, WORKLOAD,
};
use crate::truth::{check_labels, check_labels_at, check_mode, read_truth};

pub(super) fn otel_threads(interp: &Interp) {
    check_mode(interp, "otel_threads", &OTEL_NAMED_KEYS);
}

pub(super) fn otel_asyncio(interp: &Interp) {
    check_mode(interp, "otel_asyncio", &OTEL_NAMED_KEYS);
}

pub(super) fn osprofiler(interp: &Interp) {
    let (out, _) = check_mode(interp, "osprofiler", &OSPROFILER_NAMED_KEYS);
    assert_no_span_read_warning(interp, &out);
}

/// Every request in a thread of its own: each new thread's OSProfiler local starts as an empty
/// dict (CPython's shared empty keys) while `profiler.init` builds its `_Profiler`; samples
/// there have no span and count no failed read (6–12 warnings a run before empty dicts were
/// known).
pub(super) fn osprofiler_fresh_threads(interp: &Interp) {
    let (out, _) = check_mode(interp, "osprofiler_fresh_threads", &OSPROFILER_NAMED_KEYS);
    assert_no_span_read_warning(interp, &out);
}

/// OSProfiler under eventlet or gevent (`lib`), monkey-patched before OSProfiler's import:
/// three green threads of one OS thread, each its own request, switching after every chunk of
/// work. OSProfiler's local is then the green thread's, read through the greenlet running when
/// the sample is taken; the labels must follow it as they follow threads.
pub(super) fn osprofiler_green(interp: &Interp, lib: &str) {
    require_green_libs(&interp.path, &interp.libs);
    let (out, _) = check_mode(interp, &format!("osprofiler_{lib}"), &OSPROFILER_NAMED_KEYS);
    assert_no_span_read_warning(interp, &out);
    assert!(
        !out.stderr.contains("trace points are not read"),
        "{}: spanprof could not read OSProfiler's {lib} local\n{out}",
        interp.label
    );
}

/// OpenTelemetry under eventlet or gevent: the same three green threads with spans (greenlet
/// gives each greenlet its own contextvars context, which the kernel reads as any).
pub(super) fn otel_green(interp: &Interp, lib: &str) {
    require_green_libs(&interp.path, &interp.libs);
    check_mode(interp, &format!("otel_{lib}"), &OTEL_NAMED_KEYS);
}

#[track_caller]
fn assert_no_span_read_warning(interp: &Interp, out: &RunOutput) {
    assert!(
        !out.stderr.contains("span contexts not read"),
        "{}: spanprof warns of span contexts it failed to read, though the workload's objects \
         are all well formed\n{out}",
        interp.label
    );
}

/// spanprof attaches to a process that has not imported OpenTelemetry (it runs `outside_work`);
/// 0.5 s later the process imports it and runs spans, two threads, for 5 s.
pub(super) fn otel_late(interp: &Interp) {
    require_span_profiling(interp);
    let _lock = profiling_lock();
    let tmp = TempDir::new("spans-otel-late");
    let truth = tmp.join("truth.jsonl");
    let go = tmp.join("go");
    let pprof = tmp.join("spans.pb.gz");
    let workload = start_py_workload_with_libs(
        &interp.path,
        &interp.libs,
        WORKLOAD,
        &[
            "otel_late",
            "5",
            truth.to_str().expect("UTF-8 temp path"),
            go.to_str().expect("UTF-8 temp path"),
        ],
    );
    let mut cmd: Command = spanprof_command(["profile", "--duration", "5s", "--frequency"]);
    cmd.arg(FREQUENCY.to_string())
        .arg("--pid")
        .arg(workload.pid().to_string())
        .arg("-o")
        .arg(&pprof);
    let mut run = Background::spawn(cmd);
    run.wait_for_stderr("spanprof: profiling", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&go, b"go").expect("writing the go file");
    let out = run.finish(RUN_TIMEOUT);
    let workload_out = workload.finish(RUN_TIMEOUT);
    out.assert_success();
    workload_out.assert_success();
    check_labels(interp, "otel_late", &pprof, &truth, &OTEL_NAMED_KEYS, &out);
}

/// A 1-s `profile -- CMD` run whose spans begin as soon as OpenTelemetry is imported (the
/// workload's `otel_threads`, its first span within ms of the import), at 999 Hz: at least 99%
/// of the samples in a span carry exactly its ids. Until a first span is set, the SDK's span key
/// has no hash cached, which span reading needs: spanprof computes it from the process's
/// `_Py_HashSecret` (before, the first 30–240 ms of spans went untagged: recall 94.4–99.2% on
/// 3.11, 3 runs).
pub(super) fn otel_first_spans(interp: &Interp) {
    require_span_profiling(interp);
    let _lock = profiling_lock();
    let tmp = TempDir::new("spans-first");
    let truth = tmp.join("truth.jsonl");
    let pprof = tmp.join("spans.pb.gz");
    let mut cmd = spanprof_command(["profile", "--frequency", "999", "-o"]);
    cmd.arg(&pprof)
        .arg("--")
        .arg(&interp.path)
        .arg(spanprof_tests::py_workload_source(WORKLOAD))
        .args(["otel_threads", "1"])
        .arg(&truth)
        .env("PYTHONPATH", &interp.libs)
        .env("PYTHONNOUSERSITE", "1");
    let out = spanprof_tests::run_with_timeout(cmd, RUN_TIMEOUT);
    out.assert_success();
    check_labels_at(
        interp,
        "otel_threads in a 1-s command run",
        &pprof,
        &truth,
        &OTEL_NAMED_KEYS,
        &out,
        0.99,
    );
}

/// OSProfiler with its own OTLP driver exporting every trace point as an OpenTelemetry span to
/// a local OTLP/HTTP receiver: the OSProfiler labels are right as in `osprofiler`, and every
/// sample in a trace point (no OpenTelemetry span is current there: the driver starts its spans
/// without making them current) links to the span the driver exported for that point, in the
/// pprof labels (`trace_id`, `span_id`, `span.ids_from=osprofiler`) and in the OTLP link.
pub(super) fn osprofiler_otlp(interp: &Interp) {
    require_span_profiling(interp);
    let _lock = profiling_lock();
    let sink = HttpSink::start();
    let tmp = TempDir::new("spans-osprofiler-otlp");
    let truth = tmp.join("truth.jsonl");
    let pprof = tmp.join("spans.pb.gz");
    let otlp_file = tmp.join("spans.otlp");
    let workload = start_py_workload_with_libs(
        &interp.path,
        &interp.libs,
        WORKLOAD,
        &[
            "osprofiler_otlp",
            "7.5",
            truth.to_str().expect("UTF-8 temp path"),
            &sink.endpoint(),
        ],
    );
    let out = profile_pid(workload.pid(), "5s", FREQUENCY, &[&pprof, &otlp_file], &[]);
    let workload_out = workload.finish(RUN_TIMEOUT);
    out.assert_success();
    workload_out.assert_success();
    let profile = check_labels(
        interp,
        "osprofiler_otlp",
        &pprof,
        &truth,
        &OSPROFILER_NAMED_KEYS,
        &out,
    );
    let exported: BTreeSet<(String, String)> = sink
        .exported_spans()
        .iter()
        .map(|s| {
            let id = |key: &str| s[key].as_str().unwrap_or_default().to_owned();
            (id("trace_id"), id("span_id"))
        })
        .collect();
    assert!(
        exported.len() >= 30,
        "the OSProfiler OTLP driver exported {} spans to the sink, expected a span per trace \
         point (3 a request)\n{}",
        exported.len(),
        sink.stderr_text()
    );

    // The points' ids: a sample in one links to its exported span; a sample of a request
    // before its first point is in the parent the request came with (a caller's point: the
    // workload makes one up every other request), or, with none, in no span.
    let points: BTreeSet<String> = read_truth(&truth)
        .values()
        .filter_map(|s| s.labels.get("osprofiler.trace_id").cloned())
        .collect();
    let right_link = |base: &str, point: &str, link: Option<(String, String)>, from: &str| {
        let hex = |uuid: &str| uuid.replace('-', "");
        if points.contains(point) {
            from == "osprofiler" && link.is_some_and(|ids| exported.contains(&ids))
        } else if base == point {
            link.is_none() && from.is_empty()
        } else {
            let caller = (hex(base), hex(point)[16..].to_owned());
            from == "osprofiler" && link == Some(caller)
        }
    };
    let show = |tally: (i64, i64, i64)| {
        format!(
            "{} of {} samples with OSProfiler ids ({} before the request's first point)",
            tally.1, tally.0, tally.2
        )
    };

    // pprof, read by the independent decoder.
    let (mut tally, mut examples) = ((0i64, 0i64, 0i64), Vec::new());
    for sample in profile["samples"].as_array().expect("samples") {
        let labels = sample_str_labels(sample);
        let (Some(base), Some(point)) = (
            labels.get("osprofiler.base_id"),
            labels.get("osprofiler.trace_id"),
        ) else {
            continue;
        };
        let weight = sample["values"][0].as_i64().unwrap_or(0);
        tally.0 += weight;
        if !points.contains(point) {
            tally.2 += weight;
        }
        let link = labels
            .get("trace_id")
            .cloned()
            .zip(labels.get("span_id").cloned());
        let from = labels.get("span.ids_from").map_or("", String::as_str);
        if right_link(base, point, link, from) {
            tally.1 += weight;
        } else if examples.len() < 6 {
            examples.push(format!("{labels:?}"));
        }
    }
    assert!(
        tally.0 >= MIN_SPAN_SAMPLES && tally.1 == tally.0,
        "pprof: {} carry the trace_id/span_id (and span.ids_from=osprofiler) of the span the \
         OSProfiler OTLP driver exported for their point; expected all, and at least \
         {MIN_SPAN_SAMPLES}; e.g.\n{}",
        show(tally),
        examples.join("\n")
    );
    let pprof_tally = tally;

    // OTLP, read by the independent decoder: the sample's link.
    let decoded = otlp::decode_file(&otlp_file);
    otlp::assert_valid(&decoded);
    let (mut tally, mut examples) = ((0i64, 0i64, 0i64), Vec::new());
    for (_, p) in otlp::profiles(&decoded) {
        for sample in p["samples"].as_array().into_iter().flatten() {
            let attrs = &sample["attributes"];
            let (Some(base), Some(point)) = (
                attrs["osprofiler.base_id"].as_str(),
                attrs["osprofiler.trace_id"].as_str(),
            ) else {
                continue;
            };
            let weight = otlp::sample_weight(sample);
            tally.0 += weight;
            if !points.contains(point) {
                tally.2 += weight;
            }
            let link = &sample["link"];
            let ids = link["trace_id"]
                .as_str()
                .map(str::to_owned)
                .zip(link["span_id"].as_str().map(str::to_owned));
            let from = attrs["span.ids_from"].as_str().unwrap_or_default();
            if right_link(base, point, ids, from) {
                tally.1 += weight;
            } else if examples.len() < 6 {
                examples.push(format!("link {link} attributes {attrs}"));
            }
        }
    }
    assert!(
        tally.0 >= MIN_SPAN_SAMPLES && tally.1 == tally.0,
        "OTLP: {} link to the span the OSProfiler OTLP driver exported for their point; \
         expected all, and at least {MIN_SPAN_SAMPLES}; e.g.\n{}",
        show(tally),
        examples.join("\n")
    );
    println!(
        "{} osprofiler_otlp: {} spans exported; linked right: pprof {}, OTLP {}",
        interp.label,
        exported.len(),
        show(pprof_tally),
        show(tally)
    );
}
