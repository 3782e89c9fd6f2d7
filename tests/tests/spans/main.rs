//! Trace correlation: each pprof sample of a CPython process carries the span context active on
//! the sampled thread, checked against the ground truth the workload
//! (`tests/workloads/py_span_workload.py`) writes, on pyenv's CPython 3.8–3.13 with
//! OpenTelemetry's SDK and OSProfiler from `target/span-libs/3.X` (`cargo xtask deps`).
//!
//! Every span runs its work in a function of its own, `span_work_N`, so a sample's Python stack
//! says which span was active; work outside any span runs in `outside_work`. Of the samples
//! (weighted by value) with a `span_work_N` frame, at least 98% must carry exactly that span's
//! ids, and at least 98% of those with ids must carry the right ones; of the samples in
//! `outside_work` (and no span), at most 1% may carry any; at least 100 samples in spans and 30
//! outside, so no test passes on too little. Where names are read (`otel_threads`,
//! `otel_asyncio`, `osprofiler`, `otel_late`), "its ids" include its name: `span.name` or
//! `osprofiler.name` is the span's or trace point's name cut to its first 64 bytes, and absent
//! for the workload's names that are not ASCII (every span has a name of its own).
//! - `otel_threads_*`: two threads running OpenTelemetry spans (some with a child span inside)
//!   at once: labels `trace_id` (32 hex digits) and `span_id` (16) are the innermost span's, on
//!   the thread the span ran on (`thread.id` is the span's thread too); also Debian's
//!   `/usr/bin/python3.11` with the 3.11 libraries;
//! - `otel_asyncio_*`: four asyncio tasks on one thread, interleaving at every
//!   `await asyncio.sleep(0)`, each with its own spans: the label follows the running task;
//! - `osprofiler_*`: two threads running OSProfiler requests of three nested trace points:
//!   `osprofiler.base_id`, `osprofiler.trace_id` (the innermost trace point's id) and
//!   `osprofiler.parent_id` are the request's and trace point's; after `profiler.clean()`, none;
//!   no sample anywhere carries the name of another point than its `osprofiler.trace_id`'s
//!   (also inside `profiler.start`/`stop`, which update the names and ids one after the other);
//! - `osprofiler_eventlet_*`, `osprofiler_gevent_*` (3.11, 3.13): OSProfiler's requests in
//!   three green threads of one OS thread (monkey-patched before OSProfiler's import, so its
//!   local is the green thread's), switching after every chunk of work: the labels follow the
//!   running greenlet; `otel_eventlet_*`, `otel_gevent_*`: the same with OpenTelemetry spans;
//! - `osprofiler_fresh_threads_*`: `osprofiler` with every request in a new thread: the same
//!   thresholds, and (as in `osprofiler_*`) no warning of span contexts not read;
//! - `osprofiler_otlp_links_3_11`: `osprofiler` with OSProfiler's own OTLP driver exporting the
//!   points to a local OTLP/HTTP receiver: every sample with OSProfiler ids links (pprof
//!   `trace_id`/`span_id` with `span.ids_from=osprofiler`, OTLP link) to an exported span;
//! - `otel_late_*`: spanprof attaches while the process has not imported OpenTelemetry; the
//!   process then imports it and runs spans as in `otel_threads`: their samples carry their ids
//!   (spans entered within 200 ms of the import are not checked: spanprof looks for newly
//!   imported libraries every drain, 50 or 100 ms);
//! - `published_otel_asyncio_*`: `otel_asyncio` with the publisher: its per-thread record is
//!   taken only while the Python context it was published in runs, so the thresholds hold;
//! - `native_thread_context_from_two_threads`: a C program (no Python) publishing OTEP 4947 thread contexts
//!   from two threads: the samples of each span carry its ids;
//! - `published_otel_threads_*`, `published_osprofiler_*`: `otel_threads` and `osprofiler` with
//!   the opt-in publisher `spanprof_context.install()` (`python/spanprof-context`) run first: the
//!   same thresholds, and at least 98% of the samples with span labels were read from the OTEP
//!   4947 thread context the process publishes (the summary's `spans:` line says how many);
//! - `publisher_unit_tests`: the package's own unit tests (`python/spanprof-context/tests`)
//!   pass under every pyenv CPython 3.8–3.13, with none skipped for a missing library.
//!
//! The tests are declared here; the ground truth and the checks against it are in `truth`, the
//! parts' checks in `libraries` and `published`, what they share in `common`.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use spanprof_tests::{
    decode_pprof, profile_pid, profiling_lock, read_folded, require_span_libs,
    require_spanprof_context, run_spanprof, run_with_timeout, sample_functions, sample_str_labels,
    spanprof_context_dir, start_py_workload_with_libs, FoldedStack, TempDir, RUN_TIMEOUT,
};

use common::{require_span_profiling, Interp, FREQUENCY, WORKLOAD};
use libraries::{
    osprofiler, osprofiler_fresh_threads, osprofiler_green, osprofiler_otlp, otel_asyncio,
    otel_first_spans, otel_green, otel_late, otel_threads,
};
use published::{
    native_thread_context, published_osprofiler, published_otel_asyncio, published_otel_threads,
};
use truth::read_truth;

mod common;
mod libraries;
mod published;
mod truth;

/// Runs the checks of one test for each interpreter version, one test per version.
macro_rules! per_version {
    ($check:ident: $($name:ident => $minor:literal),+ $(,)?) => {
        $(
            #[test]
            fn $name() {
                $check(&Interp::pyenv($minor));
            }
        )+
    };
}

// ---------------------------------------------------------------------------
// 1. OpenTelemetry, two threads
// ---------------------------------------------------------------------------

per_version!(otel_threads:
    otel_threads_3_8 => 8,
    otel_threads_3_9 => 9,
    otel_threads_3_10 => 10,
    otel_threads_3_11 => 11,
    otel_threads_3_12 => 12,
    otel_threads_3_13 => 13,
);

/// Debian sid's stripped 3.14 and 3.15, in a container (its own mount namespace).
#[test]
fn otel_threads_sid_3_14_in_a_container() {
    otel_threads(&Interp::sid_container(14));
}

#[test]
fn otel_threads_sid_3_15_in_a_container() {
    otel_threads(&Interp::sid_container(15));
}

/// Debian's own python3.11 (stripped, interpreter linked into the executable).
#[test]
fn otel_threads_debian_3_11() {
    otel_threads(&Interp::debian_3_11());
}

// A 1-s command run, spans from the import on: SipHash-2-4 (3.8, 3.10) and SipHash-1-3
// (3.11–3.13) str hashes.
per_version!(otel_first_spans:
    otel_first_spans_of_a_command_run_3_8 => 8,
    otel_first_spans_of_a_command_run_3_10 => 10,
    otel_first_spans_of_a_command_run_3_11 => 11,
    otel_first_spans_of_a_command_run_3_12 => 12,
    otel_first_spans_of_a_command_run_3_13 => 13,
);

// ---------------------------------------------------------------------------
// 2. OpenTelemetry, asyncio tasks
// ---------------------------------------------------------------------------

per_version!(otel_asyncio:
    otel_asyncio_3_8 => 8,
    otel_asyncio_3_9 => 9,
    otel_asyncio_3_10 => 10,
    otel_asyncio_3_11 => 11,
    otel_asyncio_3_12 => 12,
    otel_asyncio_3_13 => 13,
);

// ---------------------------------------------------------------------------
// 3. OSProfiler, two threads
// ---------------------------------------------------------------------------

per_version!(osprofiler:
    osprofiler_3_8 => 8,
    osprofiler_3_9 => 9,
    osprofiler_3_10 => 10,
    osprofiler_3_11 => 11,
    osprofiler_3_12 => 12,
    osprofiler_3_13 => 13,
);

// ---------------------------------------------------------------------------
// 3b. Green threads: OSProfiler and OpenTelemetry under eventlet and gevent
// ---------------------------------------------------------------------------

/// One test per library and version (3.11 and 3.13: the versions with the libraries).
macro_rules! green {
    ($check:ident: $($name:ident => $lib:literal, $minor:literal),+ $(,)?) => {
        $(
            #[test]
            fn $name() {
                $check(&Interp::pyenv($minor), $lib);
            }
        )+
    };
}

green!(osprofiler_green:
    osprofiler_eventlet_3_11 => "eventlet", 11,
    osprofiler_eventlet_3_13 => "eventlet", 13,
    osprofiler_gevent_3_11 => "gevent", 11,
    osprofiler_gevent_3_13 => "gevent", 13,
);

green!(otel_green:
    otel_eventlet_3_11 => "eventlet", 11,
    otel_eventlet_3_13 => "eventlet", 13,
    otel_gevent_3_11 => "gevent", 11,
    otel_gevent_3_13 => "gevent", 13,
);

#[test]
fn osprofiler_sid_3_14_in_a_container() {
    osprofiler(&Interp::sid_container(14));
}

#[test]
fn osprofiler_sid_3_15_in_a_container() {
    osprofiler(&Interp::sid_container(15));
}

// A thread per request (OSProfiler's local made anew in each), on the dict layouts before and
// since 3.11 and 3.13's per-local dicts.
per_version!(osprofiler_fresh_threads:
    osprofiler_fresh_threads_3_8 => 8,
    osprofiler_fresh_threads_3_11 => 11,
    osprofiler_fresh_threads_3_13 => 13,
);

/// OSProfiler's own OTLP driver exporting the points to a local receiver: samples link to them.
#[test]
fn osprofiler_otlp_links_3_11() {
    osprofiler_otlp(&Interp::pyenv(11));
}

// ---------------------------------------------------------------------------
// 4. OpenTelemetry imported after spanprof attached
// ---------------------------------------------------------------------------

per_version!(otel_late:
    otel_late_3_8 => 8,
    otel_late_3_9 => 9,
    otel_late_3_10 => 10,
    otel_late_3_11 => 11,
    otel_late_3_12 => 12,
    otel_late_3_13 => 13,
);

// ---------------------------------------------------------------------------
// 5. The opt-in publisher (python/spanprof-context)
// ---------------------------------------------------------------------------

per_version!(published_otel_threads:
    published_otel_threads_3_8 => 8,
    published_otel_threads_3_9 => 9,
    published_otel_threads_3_10 => 10,
    published_otel_threads_3_11 => 11,
    published_otel_threads_3_12 => 12,
    published_otel_threads_3_13 => 13,
);

per_version!(published_osprofiler:
    published_osprofiler_3_8 => 8,
    published_osprofiler_3_9 => 9,
    published_osprofiler_3_10 => 10,
    published_osprofiler_3_11 => 11,
    published_osprofiler_3_12 => 12,
    published_osprofiler_3_13 => 13,
);

/// A native program publishing OTEP 4947 thread contexts itself (issue 21 item 6).
#[test]
fn native_thread_context_from_two_threads() {
    native_thread_context();
}

per_version!(published_otel_asyncio:
    published_otel_asyncio_3_8 => 8,
    published_otel_asyncio_3_9 => 9,
    published_otel_asyncio_3_10 => 10,
    published_otel_asyncio_3_11 => 11,
    published_otel_asyncio_3_12 => 12,
    published_otel_asyncio_3_13 => 13,
);

/// The package's own unit tests (`python -m unittest discover -s python/spanprof-context/tests`)
/// under every pyenv CPython 3.8–3.13, with `PYTHONPATH=target/span-libs/3.X`: every version
/// must pass, and no test may be skipped for a library that is not importable (`cargo xtask
/// deps` installs them all). A missing interpreter or library directory fails the test.
#[test]
fn publisher_unit_tests() {
    let interps: Vec<Interp> = (8..=13).map(Interp::pyenv).collect();
    for interp in &interps {
        require_span_libs(&interp.path, &interp.libs);
        require_spanprof_context(&interp.path, &interp.libs);
    }
    let tests = spanprof_context_dir().join("tests");
    // Not sampled, but its forks and threads would take CPU from the sessions of the others.
    let _lock = profiling_lock();
    let mut failures = Vec::new();
    for interp in &interps {
        let mut cmd = Command::new(&interp.path);
        cmd.args(["-m", "unittest", "discover", "-v", "-s"])
            .arg(&tests)
            .env("PYTHONPATH", &interp.libs)
            .env("PYTHONNOUSERSITE", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1");
        let out = run_with_timeout(cmd, Duration::from_secs(120));
        // unittest reports on stderr: `Ran N tests in …s`, then `OK` or `FAILED (…)`.
        let ran = out
            .stderr
            .lines()
            .find(|l| l.starts_with("Ran "))
            .unwrap_or("no `Ran N tests` line");
        let verdict = out.stderr.lines().last().unwrap_or_default();
        let skipped_for_library: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.contains("... skipped") && l.contains("not importable"))
            .collect();
        println!("{}: {ran}: {verdict}", interp.label);
        if !out.status.success() {
            failures.push(format!("{}: the unit tests failed:\n{out}", interp.label));
        } else if !ran.starts_with("Ran ") || ran.starts_with("Ran 0 ") {
            failures.push(format!("{}: no unit test ran:\n{out}", interp.label));
        } else if !skipped_for_library.is_empty() {
            failures.push(format!(
                "{}: tests skipped for a missing library (`cargo xtask deps` installs it into \
                 {}):\n{}",
                interp.label,
                interp.libs.display(),
                skipped_for_library.join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// ---------------------------------------------------------------------------
// 6. `spanprof report` on a real span profile
// ---------------------------------------------------------------------------

/// The flamegraph of one span from a real profile: `spanprof report --span-id` keeps exactly
/// the samples the profile labels with that span (all of its work function, no other span's),
/// `--trace-id` those of its trace, and `--group-by span` puts every sample under its span's root frame.
#[test]
fn report_one_span_of_a_real_profile() {
    let interp = Interp::pyenv(12);
    require_span_profiling(&interp);
    let _lock = profiling_lock();
    let tmp = TempDir::new("spans-report");
    let truth_path = tmp.join("truth.jsonl");
    let pprof = tmp.join("spans.pb.gz");
    let workload = start_py_workload_with_libs(
        &interp.path,
        &interp.libs,
        WORKLOAD,
        &[
            "otel_threads",
            "7.5",
            truth_path.to_str().expect("UTF-8 temp path"),
        ],
    );
    let out = profile_pid(workload.pid(), "5s", FREQUENCY, &[&pprof], &[]);
    workload.finish(RUN_TIMEOUT).assert_success();
    out.assert_success();
    let truth = read_truth(&truth_path);
    let profile = decode_pprof(&pprof);

    // Samples per span work function, and the busiest span.
    let mut per_function: BTreeMap<String, u64> = BTreeMap::new();
    for sample in profile["samples"].as_array().expect("samples") {
        let value = sample["values"][0].as_u64().expect("value");
        if let Some(f) = sample_functions(sample)
            .into_iter()
            .find(|f| f.starts_with("span_work_"))
        {
            *per_function.entry(f).or_default() += value;
        }
    }
    let (function, &count) = per_function
        .iter()
        .max_by_key(|(_, &n)| n)
        .expect("samples in spans");
    assert!(count >= 5, "the busiest span has only {count} samples");
    let span = &truth[function];
    let span_id = &span.labels["span_id"];
    let trace_id = &span.labels["trace_id"];

    // Every sample labelled with the span: its work, and the workload's own code in the span
    // (e.g. writing the ground truth).
    let labelled_with = |id: &String| -> u64 {
        profile["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .filter(|s| sample_str_labels(s).get("span_id") == Some(id))
            .map(|s| s["values"][0].as_u64().expect("value"))
            .sum()
    };
    let labelled = labelled_with(span_id);
    let one = tmp.join("one.folded");
    let pprof_arg = pprof.to_str().expect("UTF-8 temp path");
    run_spanprof([
        "report",
        pprof_arg,
        "--span-id",
        span_id,
        "-o",
        one.to_str().unwrap(),
    ])
    .assert_success();
    let stacks = read_folded(&one);
    let total: u64 = stacks.iter().map(|s| s.count).sum();
    let in_function: u64 = stacks
        .iter()
        .filter(|s| {
            s.frames
                .iter()
                .any(|f| f.starts_with(&format!("{function} ")))
        })
        .map(|s| s.count)
        .sum();
    let others: Vec<&FoldedStack> = stacks
        .iter()
        .filter(|s| {
            s.frames
                .iter()
                .any(|f| f.starts_with("span_work_") && !f.starts_with(&format!("{function} ")))
        })
        .collect();
    assert_eq!(
        (total, in_function, others.len()),
        (labelled, count, 0),
        "report --span-id {span_id} ({function}: {count} samples, {labelled} labelled with the \
         span in the profile) kept {total} samples, {in_function} in {function}, {} stacks of \
         other spans: {:?}",
        others.len(),
        others.iter().take(3).collect::<Vec<_>>()
    );

    // The trace: every span of the same trace id (parent and child spans), nothing else.
    let expected: u64 = per_function
        .iter()
        .filter(|(f, _)| truth[*f].labels["trace_id"] == *trace_id)
        .map(|(_, n)| n)
        .sum();
    let whole = tmp.join("trace.folded");
    run_spanprof([
        "report",
        pprof_arg,
        "--trace-id",
        trace_id,
        "-o",
        whole.to_str().unwrap(),
    ])
    .assert_success();
    let in_trace: u64 = read_folded(&whole)
        .iter()
        .filter(|s| s.frames.iter().any(|f| f.starts_with("span_work_")))
        .map(|s| s.count)
        .sum();
    assert_eq!(in_trace, expected, "report --trace-id {trace_id}");

    // Grouped: each span_work stack under its own span's root frame.
    let grouped = tmp.join("grouped.folded");
    run_spanprof([
        "report",
        pprof_arg,
        "--group-by",
        "span",
        "-o",
        grouped.to_str().unwrap(),
    ])
    .assert_success();
    for stack in read_folded(&grouped) {
        let Some(f) = stack.frames.iter().find(|f| f.starts_with("span_work_")) else {
            continue;
        };
        let name = f.split(' ').next().expect("a name");
        let t = &truth[name];
        let ids = format!("{} trace {}", t.labels["span_id"], t.labels["trace_id"]);
        // Named after the span when its name was read.
        let root = match t.labels.get("span.name") {
            Some(span_name) => format!("[span {span_name} ({ids})]"),
            None => format!("[span {ids}]"),
        };
        assert_eq!(stack.frames[0], root, "root of a stack of {name}");
    }

    // By span name: one root per name, holding what the span's own root held.
    let by_span_name = tmp.join("by-span-name.folded");
    run_spanprof([
        "report",
        pprof_arg,
        "--group-by",
        "span-name",
        "-o",
        by_span_name.to_str().unwrap(),
    ])
    .assert_success();
    let mut named_roots = 0;
    for stack in read_folded(&by_span_name) {
        let Some(f) = stack.frames.iter().find(|f| f.starts_with("span_work_")) else {
            continue;
        };
        let name = f.split(' ').next().expect("a name");
        let root = match truth[name].labels.get("span.name") {
            Some(span_name) => {
                named_roots += 1;
                format!("[span {span_name}]")
            }
            None => "[span (no name)]".to_string(),
        };
        assert_eq!(stack.frames[0], root, "span-name root of a stack of {name}");
    }
    assert!(named_roots > 0, "no stack under a named span root");

    // By name: names are unique per span in the workload, so `--span NAME` keeps the samples
    // labelled with that span's id.
    let (named, _) = per_function
        .iter()
        .filter(|(f, _)| truth[*f].labels.contains_key("span.name"))
        .max_by_key(|(_, &n)| n)
        .expect("a span with a name read");
    let name = &truth[named].labels["span.name"];
    let named_id = &truth[named].labels["span_id"];
    let labelled_named = labelled_with(named_id);
    let by_name = tmp.join("by-name.folded");
    run_spanprof([
        "report",
        pprof_arg,
        "--span",
        name,
        "-o",
        by_name.to_str().unwrap(),
    ])
    .assert_success();
    let kept: u64 = read_folded(&by_name).iter().map(|s| s.count).sum();
    assert_eq!(kept, labelled_named, "report --span {name:?}");

    // Span times: that span's samples, and GET spans (60 ms of CPU of their own each) near
    // 60 ms on average.
    let out = run_spanprof(["report", pprof_arg, "--format", "json", "--top", "0"]);
    out.assert_success();
    let doc: serde_json::Value = serde_json::from_str(&out.stdout).expect("report JSON");
    let spans = doc["spans"].as_array().expect("spans");
    let period = 1_000_000_000 / u64::from(FREQUENCY);
    let row = spans
        .iter()
        .find(|t| t["name"] == name.as_str())
        .unwrap_or_else(|| panic!("no span {name:?} in {spans:?}"));
    assert_eq!(
        (row["spans"].as_u64(), row["total_ns"].as_u64()),
        (Some(1), Some(labelled_named * period)),
        "{row}"
    );
    let (mut get_ns, mut get_spans) = (0, 0);
    for t in spans
        .iter()
        .filter(|t| t["name"].as_str().unwrap().starts_with("GET "))
    {
        get_ns += t["total_ns"].as_u64().unwrap();
        get_spans += t["spans"].as_u64().unwrap();
    }
    let mean_ms = get_ns as f64 / get_spans.max(1) as f64 / 1e6;
    println!("GET spans: {get_spans} named, {mean_ms:.1} ms of samples on average (60 ms of CPU)");
    assert!(
        (40.0..80.0).contains(&mean_ms),
        "GET spans average {mean_ms:.1} ms of samples over {get_spans}, for 60 ms of CPU"
    );

    // Budgets on span names.
    let check = |budget: &str| run_spanprof(["check", pprof_arg, "--span-max", budget]);
    let over = check("GET *=20ms");
    assert_eq!(over.code(), 3, "{over}");
    assert!(
        over.stdout
            .contains("OVER  --span-max 'GET *=20ms': GET /servers/"),
        "{over}"
    );
    let within = check("GET *=10s");
    assert_eq!(within.code(), 0, "{within}");
    let none = check("DELETE *=1ms");
    assert_eq!(none.code(), 0, "{none}");
    assert!(none.stderr.contains("matches no span name"), "{none}");
}
