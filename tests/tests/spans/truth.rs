//! Ground truth and the comparison: the spans the workload records, the samples that fall in
//! each, and the checks of the labels, the span-grouped folded output and the modes.

use std::collections::BTreeMap;
use std::path::Path;

use spanprof_tests::rootfs::{rootfs, start_confined_py_with_env, Confinement, RootfsDir};
use spanprof_tests::{
    decode_pprof, profile_pid, profiling_lock, sample_functions, sample_num_label,
    sample_str_labels, start_py_workload_with_libs, RunOutput, TempDir, RUN_TIMEOUT,
};

use crate::common::{
    require_span_profiling, Interp, FREQUENCY, MAX_OUTSIDE_LABELLED, MIN_OUTSIDE_SAMPLES,
    MIN_RIGHT, MIN_SPAN_SAMPLES, NAME_MAX, OSPROFILER_KEYS, OSP_NAME, OTEL_KEYS, SPAN_NAME,
    WORKLOAD,
};

/// One span (or trace point) of the workload: its work function's ids.
#[derive(Debug)]
pub(super) struct SpanTruth {
    /// The expected labels: `trace_id`/`span_id` and `span.name`, or the four `osprofiler.*`
    /// (no name label when spanprof reads none: the workload's names that are not ASCII).
    pub(super) labels: BTreeMap<&'static str, String>,
    /// The native id of the thread the span ran on.
    tid: i64,
    /// Entered within [`LATE_GRACE_S`] of OpenTelemetry's import (`otel_late`): its samples
    /// are counted apart, not held to the thresholds.
    grace: bool,
}

/// spanprof looks for newly imported tracing libraries at every tick (50 ms, 100 ms once the
/// collection is quiet): spans entered this soon after the import may be partly read before the
/// library is found.
const LATE_GRACE_S: f64 = 0.2;

/// Reads the workload's ground truth: `span_work_N` → its span. Fails unless the file is
/// complete (ends in the `done` line) and every record has its ids.
#[track_caller]
pub(super) fn read_truth(path: &Path) -> BTreeMap<String, SpanTruth> {
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
    /// Samples anywhere (also inside OSProfiler's own start/stop) whose `osprofiler.name` is
    /// not the name of the point their `osprofiler.trace_id` identifies.
    name_of_another_point: i64,
    /// A few of them, and their weights.
    name_examples: Vec<(String, i64)>,
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
        // Every OSProfiler point's id → its name, as spanprof keeps it.
        let point_names: BTreeMap<&str, &str> = truth
            .values()
            .filter_map(|s| {
                let id = s.labels.get("osprofiler.trace_id")?;
                Some((id.as_str(), s.labels.get(OSP_NAME)?.as_str()))
            })
            .collect();
        for sample in profile["samples"].as_array().expect("samples") {
            let value = sample["values"][0].as_i64().unwrap_or(0);
            tally.total += value;
            let functions = sample_functions(sample);
            let labels = sample_str_labels(sample);
            if let (Some(id), Some(name)) =
                (labels.get("osprofiler.trace_id"), labels.get(OSP_NAME))
            {
                if let Some(expected) = point_names.get(id.as_str()) {
                    if expected != name {
                        tally.name_of_another_point += value;
                        let leaf = functions.first().map_or("", String::as_str);
                        add_example(
                            &mut tally.name_examples,
                            format!(
                                "    {OSP_NAME}={name} with the id of {expected} (leaf {leaf})"
                            ),
                            value,
                        );
                    }
                }
            }
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

    /// Every threshold missed, as sentences; `min_right` is the least recall and precision.
    fn problems(&self, min_right: f64) -> Vec<String> {
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
        if recall < min_right {
            problems.push(format!(
                "recall: {} of the {} samples in a span ({:.1}%) carry exactly its ids, \
                 expected at least {:.0}%",
                self.right,
                self.in_span,
                100.0 * recall,
                100.0 * min_right
            ));
        }
        let precision = share(self.right, self.labelled);
        if self.labelled > 0 && precision < min_right {
            problems.push(format!(
                "precision: {} of the {} samples in a span with ids ({:.1}%) carry the right \
                 ones, expected at least {:.0}%",
                self.right,
                self.labelled,
                100.0 * precision,
                100.0 * min_right
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
        if self.name_of_another_point > 0 {
            problems.push(format!(
                "{} samples carry the name of another OSProfiler point than their \
                 osprofiler.trace_id's",
                self.name_of_another_point
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
        if !self.name_examples.is_empty() {
            table.push_str(&format!(
                "samples named after another point than their id's:\n{}\n",
                show_examples(&self.name_examples)
            ));
        }
        table
    }
}

/// Decodes the session's pprof, compares it with the ground truth and fails with every
/// threshold missed; returns the decoded profile.
#[track_caller]
pub(super) fn check_labels(
    interp: &Interp,
    mode: &str,
    pprof: &Path,
    truth: &Path,
    keys: &[&'static str],
    out: &RunOutput,
) -> serde_json::Value {
    check_labels_at(interp, mode, pprof, truth, keys, out, MIN_RIGHT)
}

/// [`check_labels`] with `min_right` as the least recall and precision.
pub(super) fn check_labels_at(
    interp: &Interp,
    mode: &str,
    pprof: &Path,
    truth: &Path,
    keys: &[&'static str],
    out: &RunOutput,
    min_right: f64,
) -> serde_json::Value {
    let truth = read_truth(truth);
    let profile = decode_pprof(pprof);
    let tally = Tally::of(&profile, &truth, keys);
    let table = tally.table();
    let problems = tally.problems(min_right);
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
pub(super) fn check_mode(
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
