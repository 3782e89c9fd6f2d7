//! 1. A known split (`py_split.py`), against the truth and py-spy.

use std::collections::BTreeMap;

use spanprof_tests::{
    args, folded_count, folded_total, last_json_line, profile_pid, profiling_lock, py_spy,
    py_workload_source, read_folded, run_spanprof, start_py_spy, start_py_workload, FoldedStack,
    TempDir, RUN_TIMEOUT,
};

use crate::common::{require_python_profiling, top, Interp};

/// The three functions of `py_split.py`: each one's key in the workload's
/// JSON and its name in the frames for `interp`.
pub(super) fn split_functions(interp: &Interp) -> [(&'static str, String); 3] {
    [
        ("alpha", "alpha".to_owned()),
        ("beta", interp.method("Worker", "beta")),
        ("gamma", "gamma".to_owned()),
    ]
}

/// The line of `py_split.py` marked `# hot: KEY`.
fn hot_line(key: &str) -> u32 {
    let path = py_workload_source("py_split.py");
    let source = std::fs::read_to_string(&path).expect("readable workload");
    let marker = format!("# hot: {key}");
    let index = source
        .lines()
        .position(|l| l.trim_end().ends_with(&marker))
        .unwrap_or_else(|| panic!("no line ending in {marker:?} in {}", path.display()));
    index as u32 + 1
}

/// Per split function (by JSON key): the samples whose innermost Python frame
/// is that function in `py_split.py`, and those samples per line.
#[derive(Debug, Default)]
pub(super) struct SplitCounts {
    samples: BTreeMap<&'static str, u64>,
    lines: BTreeMap<&'static str, BTreeMap<u32, u64>>,
}

impl SplitCounts {
    pub(super) fn of(stacks: &[FoldedStack], functions: &[(&'static str, String); 3]) -> Self {
        let mut counts = Self::default();
        for (key, _) in functions {
            counts.samples.insert(key, 0);
            counts.lines.insert(key, BTreeMap::new());
        }
        for stack in stacks {
            let Some(leaf) = stack.py_leaf() else {
                continue;
            };
            if !leaf.file.ends_with("py_split.py") {
                continue;
            }
            if let Some((key, _)) = functions.iter().find(|(_, name)| name == leaf.qualname) {
                *counts.samples.get_mut(key).expect("inserted") += stack.count;
                if let Some(line) = leaf.line {
                    *counts
                        .lines
                        .get_mut(key)
                        .expect("inserted")
                        .entry(line)
                        .or_default() += stack.count;
                }
            }
        }
        counts
    }

    pub(super) fn total(&self) -> u64 {
        self.samples.values().sum()
    }

    /// The share of `key` in percent of the three functions' samples.
    pub(super) fn share(&self, key: &str) -> f64 {
        100.0 * self.samples[key] as f64 / self.total().max(1) as f64
    }

    /// The line with the most samples of `key`.
    fn hottest_line(&self, key: &str) -> Option<u32> {
        self.lines[key]
            .iter()
            .max_by_key(|(line, n)| (**n, std::cmp::Reverse(**line)))
            .map(|(line, _)| *line)
    }
}

/// `py_split.py` profiled by spanprof and py-spy at the same time, by pid:
/// shares within ±5 points of the truth the workload measured and of py-spy,
/// the hottest line of each function equal to py-spy's (and to the line the
/// source marks), and every sample of the three functions under
/// `<module> -> main -> run_split`.
pub(super) fn split_matches_truth_and_py_spy(interp: &Interp) {
    require_python_profiling();
    let spy_bin = py_spy();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-split");
    let folded = tmp.join("spanprof.folded");
    let spy_raw = tmp.join("py-spy.raw");

    // The workload outlives both 5 s sessions, whatever their start-up.
    // ~2500 samples from each profiler: the standard error of a share is
    // then ~1 point, of the difference between the two ~1.4.
    let workload = start_py_workload(&interp.path, "py_split.py", &["7.5"]);
    let pid = workload.pid();
    let spy = start_py_spy(pid, 500, 5, &spy_raw);
    let out = profile_pid(pid, "5s", 499, &[&folded], &[]);
    let spy_out = spy.finish(RUN_TIMEOUT);
    let workload_out = workload.finish(RUN_TIMEOUT);
    out.assert_success();
    assert!(
        spy_out.status.success(),
        "py-spy ({}) failed on {}:\n{spy_out}",
        spy_bin.display(),
        interp.label
    );
    workload_out.assert_success();

    let truth_json = last_json_line(&workload_out.stdout);
    let stacks = read_folded(&folded);
    let spy_stacks = read_folded(&spy_raw);
    let functions = split_functions(interp);
    let ours = SplitCounts::of(&stacks, &functions);
    let theirs = SplitCounts::of(&spy_stacks, &functions);
    let total = folded_total(&stacks);

    let mut table =
        String::from("function       truth  spanprof  py-spy   (samples: spanprof, py-spy)\n");
    let mut problems = Vec::new();
    for (key, name) in &functions {
        let truth = 100.0
            * truth_json["truth"][key]
                .as_f64()
                .unwrap_or_else(|| panic!("no truth.{key} in {truth_json}"));
        let (our_share, their_share) = (ours.share(key), theirs.share(key));
        table.push_str(&format!(
            "{name:<13} {truth:>6.1} {our_share:>9.1} {their_share:>7.1}   ({}, {})\n",
            ours.samples[key], theirs.samples[key]
        ));
        if (our_share - truth).abs() > 5.0 {
            problems.push(format!(
                "{name}: spanprof's share {our_share:.1}% is not within ±5 points of the truth {truth:.1}%"
            ));
        }
        if (our_share - their_share).abs() > 5.0 {
            problems.push(format!(
                "{name}: spanprof's share {our_share:.1}% is not within ±5 points of py-spy's {their_share:.1}%"
            ));
        }
        let marked = hot_line(key);
        let (our_line, their_line) = (ours.hottest_line(key), theirs.hottest_line(key));
        if our_line != their_line {
            problems.push(format!(
                "{name}: spanprof's hottest line {our_line:?} differs from py-spy's {their_line:?} \
                 (the source marks line {marked}); spanprof's lines: {:?}, py-spy's: {:?}",
                ours.lines[key], theirs.lines[key]
            ));
        }
        if our_line != Some(marked) {
            problems.push(format!(
                "{name}: spanprof's hottest line {our_line:?} is not the line the source marks, \
                 {marked}; spanprof's lines: {:?}",
                ours.lines[key]
            ));
        }
    }
    // Enough samples for ±5 points to mean something (at 1000, a 50% share has a standard
    // error of 1.6 points): ~2500 are expected from each profiler; a busy machine may halve
    // them (a fresh-clone run beside other builds had 1087 and 1158).
    if ours.total() < 1000 {
        problems.push(format!(
            "only {} of spanprof's {total} samples are in the three functions",
            ours.total()
        ));
    }
    if theirs.total() < 1000 {
        problems.push(format!(
            "only {} of py-spy's samples are in the three functions",
            theirs.total()
        ));
    }
    // The process does little but run the three: nearly every sample has
    // Python frames, and those in the three have the whole Python path.
    let with_path = folded_count(&stacks, |s| {
        let names = s.py_qualnames();
        names.starts_with(&["<module>", "main", "run_split"])
            && functions
                .iter()
                .any(|(_, n)| names.last() == Some(&n.as_str()))
    });
    if (with_path as f64) < 0.95 * ours.total() as f64 || (with_path as f64) < 0.85 * total as f64 {
        problems.push(format!(
            "only {with_path} of spanprof's {total} samples ({} in the three functions) have the \
             Python path <module> -> main -> run_split -> function",
            ours.total()
        ));
    }
    // `spanprof report` reads py-spy's raw output (a `.raw` file, told folded by its lines)
    // whole and counts what py-spy counted. NB: this workload is always busy, so py-spy writes
    // no line without a stack (` 10`) here; the folded reader's unit tests read those.
    let report = run_spanprof(args!["report", &spy_raw, "--format", "json", "--top", "0"]);
    report.assert_success();
    let report: serde_json::Value = serde_json::from_str(&report.stdout)
        .unwrap_or_else(|e| panic!("report JSON: {e}\n{report}"));
    let spy_total = folded_total(&spy_stacks);
    if report["profile"]["total"].as_u64() != Some(spy_total) {
        problems.push(format!(
            "spanprof report counts {} samples in py-spy's file, which holds {spy_total}",
            report["profile"]["total"]
        ));
    }
    // The figures, for `--nocapture` runs that watch the margins.
    println!("{}: {total} spanprof samples\n{table}", interp.label);
    assert!(
        problems.is_empty(),
        "{}:\n- {}\n{table}spanprof's heaviest stacks:\n{}\npy-spy's heaviest stacks:\n{}\n{out}",
        interp.label,
        problems.join("\n- "),
        top(&stacks),
        top(&spy_stacks)
    );
}
