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
//! - `otel_late_*`: spanprof attaches while the process has not imported OpenTelemetry; the
//!   process then imports it and runs spans as in `otel_threads`: their samples carry their ids
//!   (spans entered within 200 ms of the import are not checked: spanprof looks for newly
//!   imported libraries every 50 ms);
//! - `published_otel_asyncio_*`: `otel_asyncio` with the publisher: its per-thread record is
//!   taken only while the Python context it was published in runs, so the thresholds hold;
//! - `published_otel_threads_*`, `published_osprofiler_*`: `otel_threads` and `osprofiler` with
//!   the opt-in publisher `spanprof_context.install()` (`python/spanprof-context`) run first: the
//!   same thresholds, and at least 98% of the samples with span labels were read from the OTEP
//!   4947 thread context the process publishes (the summary's `spans:` line says how many);
//! - `publisher_unit_tests`: the package's own unit tests (`python/spanprof-context/tests`)
//!   pass under every pyenv CPython 3.8–3.13, with none skipped for a missing library.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use spanprof_tests::rootfs::{rootfs, start_confined_py_with_env, Confinement, RootfsDir};
use spanprof_tests::{
    decode_pprof, profile_pid, profiling_lock, published_span_samples, pyenv_python, read_folded,
    require_root, require_span_libs, require_spanprof_context, run_spanprof, run_with_timeout,
    sample_functions, sample_num_label, sample_str_labels, span_libs, spanprof_bin,
    spanprof_command, spanprof_context_dir, spans_summary_line, start_py_workload_with_libs,
    system_python, Background, FoldedStack, RunOutput, TempDir, RUN_TIMEOUT,
};

/// The workload of every test here.
const WORKLOAD: &str = "py_span_workload.py";
/// Sampling frequency of the sessions.
const FREQUENCY: u32 = 199;
/// At least this share (weighted) of the samples in a span must carry exactly its ids.
const MIN_RIGHT: f64 = 0.98;
/// At most this share of the samples outside any span may carry span ids.
const MAX_OUTSIDE_LABELLED: f64 = 0.01;
/// Samples needed for the shares to mean something.
const MIN_SPAN_SAMPLES: i64 = 100;
const MIN_OUTSIDE_SAMPLES: i64 = 30;
/// With the publisher installed, at least this share of the samples with span labels must have
/// been read from the thread context the process publishes.
const MIN_PUBLISHED: f64 = 0.98;

const OTEL_KEYS: [&str; 2] = ["trace_id", "span_id"];
const OSPROFILER_KEYS: [&str; 3] = [
    "osprofiler.base_id",
    "osprofiler.trace_id",
    "osprofiler.parent_id",
];
/// The ids and the name, where names are read (the span contexts read from the interpreter).
const OTEL_NAMED_KEYS: [&str; 3] = ["trace_id", "span_id", SPAN_NAME];
const OSPROFILER_NAMED_KEYS: [&str; 4] = [
    "osprofiler.base_id",
    "osprofiler.trace_id",
    "osprofiler.parent_id",
    OSP_NAME,
];
/// Name labels, and what spanprof keeps of a name: at most this many bytes, of ASCII only.
const SPAN_NAME: &str = "span.name";
const OSP_NAME: &str = "osprofiler.name";
const NAME_MAX: usize = 64;

/// A CPython interpreter under test and its tracing libraries.
struct Interp {
    path: PathBuf,
    libs: PathBuf,
    label: String,
    /// Run in a container of the Debian sid rootfs: `path` and `libs` are its paths.
    container: bool,
}

impl Interp {
    #[track_caller]
    fn pyenv(minor: u8) -> Self {
        let path = pyenv_python(minor);
        let libs = span_libs(minor);
        let label = format!("pyenv {}", path.display());
        Self {
            path,
            libs,
            label,
            container: false,
        }
    }

    /// Debian sid's python3.`minor` in a container (`tests/src/rootfs.rs`), with the libraries
    /// `cargo xtask rootfs` installs in its `/opt/span-libs/3.X`.
    fn sid_container(minor: u8) -> Self {
        Self {
            path: PathBuf::from(format!("/usr/bin/python3.{minor}")),
            libs: PathBuf::from(format!("/opt/span-libs/3.{minor}")),
            label: format!("Debian sid python3.{minor} in a container"),
            container: true,
        }
    }

    /// Debian's python3.11 with the libraries pip installed for pyenv's 3.11 (same ABI).
    #[track_caller]
    fn debian_3_11() -> Self {
        let path = system_python("/usr/bin/python3.11", "python3.11");
        Self {
            path,
            libs: span_libs(11),
            label: "Debian /usr/bin/python3.11".into(),
            container: false,
        }
    }
}

/// Everything a test here needs before it takes the lock.
#[track_caller]
fn require_span_profiling(interp: &Interp) {
    require_root();
    spanprof_bin();
    if interp.container {
        // The workload's import of the libraries fails it otherwise.
        rootfs();
    } else {
        require_span_libs(&interp.path, &interp.libs);
    }
}

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
// Ground truth and the comparison
// ---------------------------------------------------------------------------

/// One span (or trace point) of the workload: its work function's ids.
#[derive(Debug)]
struct SpanTruth {
    /// The expected labels: `trace_id`/`span_id` and `span.name`, or the four `osprofiler.*`
    /// (no name label when spanprof reads none: the workload's names that are not ASCII).
    labels: BTreeMap<&'static str, String>,
    /// The native id of the thread the span ran on.
    tid: i64,
    /// Entered within [`LATE_GRACE_S`] of OpenTelemetry's import (`otel_late`): its samples
    /// are counted apart, not held to the thresholds.
    grace: bool,
}

/// spanprof looks for newly imported tracing libraries every 50 ms: spans entered this soon
/// after the import may be partly read before the library is found.
const LATE_GRACE_S: f64 = 0.2;

/// Reads the workload's ground truth: `span_work_N` → its span. Fails unless the file is
/// complete (ends in the `done` line) and every record has its ids.
#[track_caller]
fn read_truth(path: &Path) -> BTreeMap<String, SpanTruth> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no ground truth {}: {e}", path.display()));
    let mut spans = BTreeMap::new();
    let mut done = false;
    for line in text.lines() {
        let record: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("bad ground-truth line {line:?}: {e}"));
        if record["done"] == true {
            done = true;
            continue;
        }
        let (keys, name_key): (&[&'static str], _) = match record["kind"].as_str() {
            Some("otel") => (&OTEL_KEYS, SPAN_NAME),
            Some("osprofiler") => (&OSPROFILER_KEYS, OSP_NAME),
            other => panic!("ground-truth line of unknown kind {other:?}: {line}"),
        };
        let mut labels: BTreeMap<&'static str, String> = keys
            .iter()
            .map(|key| {
                let field = key.strip_prefix("osprofiler.").unwrap_or(key);
                let value = record[field]
                    .as_str()
                    .unwrap_or_else(|| panic!("no {field} in the ground-truth line {line}"));
                (*key, value.to_owned())
            })
            .collect();
        let name = record["name"]
            .as_str()
            .unwrap_or_else(|| panic!("no name in the ground-truth line {line}"));
        if let Some(kept) = kept_name(name) {
            labels.insert(name_key, kept);
        }
        let function = record["function"]
            .as_str()
            .unwrap_or_else(|| panic!("no function in the ground-truth line {line}"))
            .to_owned();
        let tid = record["tid"]
            .as_i64()
            .unwrap_or_else(|| panic!("no tid in the ground-truth line {line}"));
        let grace = record["since_import"]
            .as_f64()
            .is_some_and(|t| t < LATE_GRACE_S);
        let previous = spans.insert(function.clone(), SpanTruth { labels, tid, grace });
        assert!(
            previous.is_none(),
            "{function} appears twice in the ground truth"
        );
    }
    assert!(
        done,
        "the ground truth {} has no `done` line: the workload did not finish",
        path.display()
    );
    assert!(!spans.is_empty(), "the ground truth has no spans");
    spans
}

/// What spanprof keeps of a span name: none unless ASCII; the first [`NAME_MAX`] bytes.
fn kept_name(name: &str) -> Option<String> {
    (name.is_ascii() && !name.is_empty()).then(|| name[..name.len().min(NAME_MAX)].to_owned())
}

/// The weighted sample counts of one session, compared with the ground truth.
#[derive(Debug, Default)]
struct Tally {
    /// Samples with a `span_work_N` frame.
    in_span: i64,
    /// … carrying every expected label with its expected value.
    right: i64,
    /// … carrying any of the expected labels.
    labelled: i64,
    /// … per expected label key: with that label right.
    right_per_key: BTreeMap<&'static str, i64>,
    /// … on the thread the span ran on (`thread.id`).
    right_thread: i64,
    /// … whose function is not in the ground truth.
    unknown_function: i64,
    /// Samples of spans entered within [`LATE_GRACE_S`] of the import (`otel_late`).
    in_grace: i64,
    /// Samples with an `outside_work` frame and none of `span_work_N`.
    outside: i64,
    /// … carrying any of the checked labels.
    outside_labelled: i64,
    /// Every sample.
    total: i64,
    /// A few kinds of samples in a span without exactly its ids, and their weights.
    wrong_examples: Vec<(String, i64)>,
    /// A few kinds of samples outside any span with ids, and their weights.
    outside_examples: Vec<(String, i64)>,
}

/// Adds `value` to the example `what`, or records it when there are fewer than 6.
fn add_example(examples: &mut Vec<(String, i64)>, what: String, value: i64) {
    if let Some(entry) = examples.iter_mut().find(|(w, _)| *w == what) {
        entry.1 += value;
    } else if examples.len() < 6 {
        examples.push((what, value));
    }
}

/// The examples, one per line, with their weights.
fn show_examples(examples: &[(String, i64)]) -> String {
    examples
        .iter()
        .map(|(what, n)| format!("{what} x{n}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Tally {
    /// Compares the samples of `profile` with `truth`; `keys` are the labels checked.
    fn of(
        profile: &serde_json::Value,
        truth: &BTreeMap<String, SpanTruth>,
        keys: &[&'static str],
    ) -> Self {
        let mut tally = Self::default();
        for key in keys {
            tally.right_per_key.insert(key, 0);
        }
        for sample in profile["samples"].as_array().expect("samples") {
            let value = sample["values"][0].as_i64().unwrap_or(0);
            tally.total += value;
            let functions = sample_functions(sample);
            let labels = sample_str_labels(sample);
            let has = |key: &str| labels.contains_key(key);
            let shown = || {
                let ours: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let tid = sample_num_label(sample, "thread.id").unwrap_or(-1);
                format!("thread.id={tid} {}", ours.join(" "))
            };
            let span_function = functions.iter().find(|f| f.starts_with("span_work_"));
            let Some(function) = span_function else {
                if functions.iter().any(|f| f == "outside_work") {
                    tally.outside += value;
                    if keys.iter().any(|k| has(k)) {
                        tally.outside_labelled += value;
                        add_example(
                            &mut tally.outside_examples,
                            format!("    {}", shown()),
                            value,
                        );
                    }
                }
                continue;
            };
            if truth.get(function).is_some_and(|s| s.grace) {
                tally.in_grace += value;
                continue;
            }
            tally.in_span += value;
            let Some(span) = truth.get(function) else {
                tally.unknown_function += value;
                add_example(
                    &mut tally.wrong_examples,
                    format!("    {function} (not in the ground truth): {}", shown()),
                    value,
                );
                continue;
            };
            if keys.iter().any(|k| has(k)) {
                tally.labelled += value;
            }
            let mut all_right = true;
            for key in keys {
                if labels.get(*key) == span.labels.get(key) {
                    *tally.right_per_key.get_mut(key).expect("inserted") += value;
                } else {
                    all_right = false;
                }
            }
            if all_right {
                tally.right += value;
            } else {
                let expected: Vec<String> = span
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                add_example(
                    &mut tally.wrong_examples,
                    format!(
                        "    {function}: expected thread.id={} {}\n      got {}",
                        span.tid,
                        expected.join(" "),
                        shown()
                    ),
                    value,
                );
            }
            if sample_num_label(sample, "thread.id") == Some(span.tid) {
                tally.right_thread += value;
            }
        }
        tally
    }

    /// Every threshold missed, as sentences.
    fn problems(&self) -> Vec<String> {
        let share = |n: i64, of: i64| n as f64 / of.max(1) as f64;
        let mut problems = Vec::new();
        if self.in_span < MIN_SPAN_SAMPLES {
            problems.push(format!(
                "only {} of {} samples are in a span_work_N function, expected at least \
                 {MIN_SPAN_SAMPLES}",
                self.in_span, self.total
            ));
        }
        if self.outside < MIN_OUTSIDE_SAMPLES {
            problems.push(format!(
                "only {} of {} samples are in outside_work, expected at least \
                 {MIN_OUTSIDE_SAMPLES}",
                self.outside, self.total
            ));
        }
        let recall = share(self.right, self.in_span);
        if recall < MIN_RIGHT {
            problems.push(format!(
                "recall: {} of the {} samples in a span ({:.1}%) carry exactly its ids, \
                 expected at least {:.0}%",
                self.right,
                self.in_span,
                100.0 * recall,
                100.0 * MIN_RIGHT
            ));
        }
        let precision = share(self.right, self.labelled);
        if self.labelled > 0 && precision < MIN_RIGHT {
            problems.push(format!(
                "precision: {} of the {} samples in a span with ids ({:.1}%) carry the right \
                 ones, expected at least {:.0}%",
                self.right,
                self.labelled,
                100.0 * precision,
                100.0 * MIN_RIGHT
            ));
        }
        let thread = share(self.right_thread, self.in_span);
        if thread < MIN_RIGHT {
            problems.push(format!(
                "{} of the {} samples in a span ({:.1}%) are on the span's thread (thread.id): \
                 the stacks themselves are wrong",
                self.right_thread,
                self.in_span,
                100.0 * thread
            ));
        }
        let outside = share(self.outside_labelled, self.outside);
        if outside > MAX_OUTSIDE_LABELLED {
            problems.push(format!(
                "{} of the {} samples outside any span ({:.1}%) carry span ids, expected at \
                 most {:.0}%",
                self.outside_labelled,
                self.outside,
                100.0 * outside,
                100.0 * MAX_OUTSIDE_LABELLED
            ));
        }
        problems
    }

    /// The figures, for failure messages and `--nocapture` runs.
    fn table(&self) -> String {
        let pct = |n: i64, of: i64| 100.0 * n as f64 / of.max(1) as f64;
        let mut table = format!(
            "samples: {} in all, {} in spans, {} outside any span\n\
             in spans: {} ({:.1}%) exactly right, {} with ids, {} on the span's thread, {} of \
             functions not in the ground truth\n",
            self.total,
            self.in_span,
            self.outside,
            self.right,
            pct(self.right, self.in_span),
            self.labelled,
            self.right_thread,
            self.unknown_function
        );
        for (key, right) in &self.right_per_key {
            table.push_str(&format!(
                "  {key} right: {right} ({:.1}%)\n",
                pct(*right, self.in_span)
            ));
        }
        if self.in_grace > 0 {
            table.push_str(&format!(
                "in spans entered within {LATE_GRACE_S} s of the import (not checked): {}\n",
                self.in_grace
            ));
        }
        table.push_str(&format!(
            "outside any span: {} ({:.1}%) with ids\n",
            self.outside_labelled,
            pct(self.outside_labelled, self.outside)
        ));
        if !self.wrong_examples.is_empty() {
            table.push_str(&format!(
                "samples in a span without exactly its ids:\n{}\n",
                show_examples(&self.wrong_examples)
            ));
        }
        if !self.outside_examples.is_empty() {
            table.push_str(&format!(
                "samples outside any span with ids:\n{}\n",
                show_examples(&self.outside_examples)
            ));
        }
        table
    }
}

/// Decodes the session's pprof, compares it with the ground truth and fails with every
/// threshold missed; returns the decoded profile.
#[track_caller]
fn check_labels(
    interp: &Interp,
    mode: &str,
    pprof: &Path,
    truth: &Path,
    keys: &[&'static str],
    out: &RunOutput,
) -> serde_json::Value {
    let truth = read_truth(truth);
    let profile = decode_pprof(pprof);
    let tally = Tally::of(&profile, &truth, keys);
    let table = tally.table();
    let problems = tally.problems();
    if problems.is_empty() {
        // The margins, for `--nocapture` runs.
        println!("{} {mode}: {} spans\n{table}", interp.label, truth.len());
    }
    assert!(
        problems.is_empty(),
        "{} {mode} ({} spans in the ground truth):\n- {}\n{table}\n{out}",
        interp.label,
        truth.len(),
        problems.join("\n- ")
    );
    profile
}

/// Starts the workload in `mode`, profiles it by pid for 5 s, and checks the `keys` labels;
/// returns spanprof's output and the decoded profile.
fn check_mode(
    interp: &Interp,
    mode: &str,
    keys: &[&'static str],
) -> (RunOutput, serde_json::Value) {
    require_span_profiling(interp);
    let _lock = profiling_lock();
    let tmp = TempDir::new(&format!("spans-{mode}"));
    let pprof = tmp.join("spans.pb.gz");
    let (truth, workload, _in_rootfs);
    // The workload outlives the 5 s session, whatever its start-up.
    if interp.container {
        let root = rootfs();
        let dir = RootfsDir::new(&root, "spans");
        truth = dir.host.join("truth.jsonl");
        let inside = dir.inside.join("truth.jsonl");
        workload = start_confined_py_with_env(
            &root,
            &dir,
            Confinement::Container,
            interp.path.to_str().expect("UTF-8"),
            &[
                ("PYTHONPATH", interp.libs.to_str().expect("UTF-8")),
                ("PYTHONNOUSERSITE", "1"),
            ],
            WORKLOAD,
            &[mode, "7.5", inside.to_str().expect("UTF-8")],
        );
        _in_rootfs = Some(dir);
    } else {
        truth = tmp.join("truth.jsonl");
        let truth_arg = truth.to_str().expect("UTF-8 temp path");
        workload = start_py_workload_with_libs(
            &interp.path,
            &interp.libs,
            WORKLOAD,
            &[mode, "7.5", truth_arg],
        );
        _in_rootfs = None;
    }
    let out = profile_pid(workload.pid(), "5s", FREQUENCY, &[&pprof], &[]);
    let workload_out = workload.finish(RUN_TIMEOUT);
    out.assert_success();
    workload_out.assert_success();
    let profile = check_labels(interp, mode, &pprof, &truth, keys, &out);
    (out, profile)
}

// ---------------------------------------------------------------------------
// 1. OpenTelemetry, two threads
// ---------------------------------------------------------------------------

fn otel_threads(interp: &Interp) {
    check_mode(interp, "otel_threads", &OTEL_NAMED_KEYS);
}

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

// ---------------------------------------------------------------------------
// 2. OpenTelemetry, asyncio tasks
// ---------------------------------------------------------------------------

fn otel_asyncio(interp: &Interp) {
    check_mode(interp, "otel_asyncio", &OTEL_NAMED_KEYS);
}

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

fn osprofiler(interp: &Interp) {
    check_mode(interp, "osprofiler", &OSPROFILER_NAMED_KEYS);
}

per_version!(osprofiler:
    osprofiler_3_8 => 8,
    osprofiler_3_9 => 9,
    osprofiler_3_10 => 10,
    osprofiler_3_11 => 11,
    osprofiler_3_12 => 12,
    osprofiler_3_13 => 13,
);

#[test]
fn osprofiler_sid_3_14_in_a_container() {
    osprofiler(&Interp::sid_container(14));
}

#[test]
fn osprofiler_sid_3_15_in_a_container() {
    osprofiler(&Interp::sid_container(15));
}

// ---------------------------------------------------------------------------
// 4. OpenTelemetry imported after spanprof attached
// ---------------------------------------------------------------------------

/// spanprof attaches to a process that has not imported OpenTelemetry (it runs `outside_work`);
/// 0.5 s later the process imports it and runs spans, two threads, for 5 s.
fn otel_late(interp: &Interp) {
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
fn published(interp: &Interp, mode: &str, keys: &[&'static str]) {
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

fn published_otel_threads(interp: &Interp) {
    published(interp, "otel_threads", &OTEL_KEYS);
}

per_version!(published_otel_threads:
    published_otel_threads_3_8 => 8,
    published_otel_threads_3_9 => 9,
    published_otel_threads_3_10 => 10,
    published_otel_threads_3_11 => 11,
    published_otel_threads_3_12 => 12,
    published_otel_threads_3_13 => 13,
);

fn published_osprofiler(interp: &Interp) {
    published(interp, "osprofiler", &OSPROFILER_KEYS);
}

per_version!(published_osprofiler:
    published_osprofiler_3_8 => 8,
    published_osprofiler_3_9 => 9,
    published_osprofiler_3_10 => 10,
    published_osprofiler_3_11 => 11,
    published_osprofiler_3_12 => 12,
    published_osprofiler_3_13 => 13,
);

/// asyncio tasks interleaving spans on one thread with the publisher installed: the thread's
/// record holds the span of the task that attached last, which is not the running task's after
/// a switch (no attach or detach happens then). The record carries the Python context it was
/// published in, so spanprof takes it only while that context runs and reads the running
/// task's span from the interpreter otherwise: the thresholds of `otel_asyncio` hold, and some
/// samples come from the record.
fn published_otel_asyncio(interp: &Interp) {
    require_spanprof_context(&interp.path, &interp.libs);
    let (out, _) = check_mode(interp, "published_otel_asyncio", &OTEL_KEYS);
    let published = published_span_samples(&out.stderr).unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert!(
        published > 0,
        "{}: no sample read from the published thread context\n{out}",
        interp.label
    );
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
        let root = format!(
            "[span {} trace {}]",
            t.labels["span_id"], t.labels["trace_id"]
        );
        assert_eq!(stack.frames[0], root, "root of a stack of {name}");
    }

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
