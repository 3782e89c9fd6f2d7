//! Python stacks unwound in the kernel, against real interpreters (pyenv's
//! CPython 3.8–3.13 and Debian's own `python3.11`), with py-spy run on the
//! same process at the same time as the reference:
//! - a known 50/30/20 split of CPU time between three functions is measured
//!   within ±5 points of the truth and of py-spy, with the same hottest lines;
//! - four threads each spinning in their own function each carry their own
//!   stack, also when they start after spanprof attached;
//! - a 300-deep recursion is whole or marked `[truncated]`, a 600-deep one is
//!   marked; generators and coroutines sit under their callers; a callback
//!   from C code (`sorted(key=…)`) has a non-Python frame between its caller
//!   and itself (3.11+); kernel frames come below native frames below Python
//!   frames;
//! - a Python process started after the session began is unwound;
//! - `--python-only` and `--no-lines` reshape the frames.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use spanprof_tests::{
    args, decode_pprof, folded_count, folded_summary, folded_total, is_kernel_frame, is_py_frame,
    last_json_line, parse_py_frame, parse_summary, profile_pid, profiling_lock, py_spy,
    py_workload_source, pyenv_python, read_folded, require_root, run_spanprof, spanprof_bin,
    start_py_spy, start_py_workload, system_python, FoldedStack, RunOutput, TempDir, RUN_TIMEOUT,
};

/// A CPython interpreter under test.
struct Interp {
    path: PathBuf,
    minor: u8,
    label: String,
}

impl Interp {
    #[track_caller]
    fn pyenv(minor: u8) -> Self {
        let path = pyenv_python(minor);
        let label = format!("pyenv {}", path.display());
        Self { path, minor, label }
    }

    #[track_caller]
    fn debian_3_11() -> Self {
        let path = system_python("/usr/bin/python3.11", "python3.11");
        Self {
            path,
            minor: 11,
            label: "Debian /usr/bin/python3.11".into(),
        }
    }

    /// The name spanprof (and py-spy) give a method: `co_qualname` from 3.11,
    /// `co_name` before.
    fn method(&self, class: &str, name: &str) -> String {
        if self.minor >= 11 {
            format!("{class}.{name}")
        } else {
            name.to_owned()
        }
    }

    /// The path as a string, for `sh -c` command lines.
    fn path_str(&self) -> &str {
        self.path.to_str().expect("interpreter paths are UTF-8")
    }
}

/// Everything a test here needs before it takes the lock.
#[track_caller]
fn require_python_profiling() {
    require_root();
    spanprof_bin();
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

/// Folded stacks printed for failure messages.
fn top(stacks: &[FoldedStack]) -> String {
    folded_summary(stacks, 12)
}

/// Fails with every problem found, the interpreter and the heaviest stacks.
#[track_caller]
fn assert_no_problems(
    problems: &[String],
    interp: &Interp,
    stacks: &[FoldedStack],
    out: &RunOutput,
) {
    assert!(
        problems.is_empty(),
        "{}:\n- {}\nheaviest stacks:\n{}\n{out}",
        interp.label,
        problems.join("\n- "),
        top(stacks)
    );
}

// ---------------------------------------------------------------------------
// 1. A known split, against the truth and py-spy
// ---------------------------------------------------------------------------

/// The three functions of `py_split.py`: each one's key in the workload's
/// JSON and its name in the frames for `interp`.
fn split_functions(interp: &Interp) -> [(&'static str, String); 3] {
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
struct SplitCounts {
    samples: BTreeMap<&'static str, u64>,
    lines: BTreeMap<&'static str, BTreeMap<u32, u64>>,
}

impl SplitCounts {
    fn of(stacks: &[FoldedStack], functions: &[(&'static str, String); 3]) -> Self {
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

    fn total(&self) -> u64 {
        self.samples.values().sum()
    }

    /// The share of `key` in percent of the three functions' samples.
    fn share(&self, key: &str) -> f64 {
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
fn split_matches_truth_and_py_spy(interp: &Interp) {
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

per_version!(split_matches_truth_and_py_spy:
    split_matches_truth_and_py_spy_3_8 => 8,
    split_matches_truth_and_py_spy_3_9 => 9,
    split_matches_truth_and_py_spy_3_10 => 10,
    split_matches_truth_and_py_spy_3_11 => 11,
    split_matches_truth_and_py_spy_3_12 => 12,
    split_matches_truth_and_py_spy_3_13 => 13,
);

/// Debian's own python3.11: stripped, no frame pointers, statically linked
/// interpreter (no libpython).
#[test]
fn split_matches_truth_and_py_spy_debian_3_11() {
    split_matches_truth_and_py_spy(&Interp::debian_3_11());
}

// ---------------------------------------------------------------------------
// 2. Threads
// ---------------------------------------------------------------------------

const SPIN_FUNCTIONS: [(&str, &str); 4] = [
    ("spin_a", "spin-a"),
    ("spin_b", "spin-b"),
    ("spin_c", "spin-c"),
    ("spin_d", "spin-d"),
];

/// The spin functions among the Python frames of a stack.
fn spins_in(names: &[&str]) -> BTreeSet<&'static str> {
    SPIN_FUNCTIONS
        .iter()
        .filter(|(f, _)| names.contains(f))
        .map(|(f, _)| *f)
        .collect()
}

/// Four threads each spinning in their own function: each function has
/// samples, no stack mixes two of them, each sits under `thread_body`, and in
/// pprof each function's samples carry its own thread's id and name.
fn threads_carry_their_own_stacks(interp: &Interp) {
    check_threads(interp, None);
}

/// The same with threads that start 0.7 s after spanprof attached.
fn threads_started_later_carry_their_own_stacks(interp: &Interp) {
    check_threads(interp, Some("0.7"));
}

fn check_threads(interp: &Interp, delay: Option<&str>) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-threads");
    let folded = tmp.join("threads.folded");
    let pprof = tmp.join("threads.pb.gz");

    let mut workload_args = vec!["4"];
    workload_args.extend(delay);
    let workload = start_py_workload(&interp.path, "py_threads.py", &workload_args);
    let out = profile_pid(workload.pid(), "3s", 199, &[&folded, &pprof], &[]);
    let workload_out = workload.finish(RUN_TIMEOUT);
    out.assert_success();
    workload_out.assert_success();
    let tids = last_json_line(&workload_out.stdout);
    let stacks = read_folded(&folded);

    let mut problems = Vec::new();
    for (function, _) in SPIN_FUNCTIONS {
        let n = folded_count(&stacks, |s| s.py_qualnames().contains(&function));
        if n < 20 {
            problems.push(format!("{function} has {n} samples, expected at least 20"));
        }
        let under = folded_count(&stacks, |s| {
            let names = s.py_qualnames();
            names.ends_with(&["thread_body", function])
        });
        if under < n {
            problems.push(format!(
                "{} of {n} samples of {function} do not end in the Python frames thread_body -> {function}",
                n - under
            ));
        }
    }
    for stack in &stacks {
        let names = stack.py_qualnames();
        let spins = spins_in(&names);
        if spins.len() > 1 {
            problems.push(format!(
                "a stack has the functions of several threads {spins:?}: {}",
                stack.frames.join(";")
            ));
        }
    }
    assert_no_problems(&problems, interp, &stacks, &out);

    // pprof: thread.id and thread.name per function.
    let profile = decode_pprof(&pprof);
    let mut threads: BTreeMap<&str, BTreeSet<(i64, String)>> = BTreeMap::new();
    // Per thread id: (samples, samples with a spin function).
    let mut per_tid: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for sample in profile["samples"].as_array().expect("samples") {
        let names: Vec<&str> = sample["stack_root_first"]
            .as_array()
            .expect("stack")
            .iter()
            .filter_map(|f| f.as_str())
            .map(|f| f.split(" (").next().unwrap_or(f))
            .collect();
        let spins = spins_in(&names);
        let labels = sample["labels"].as_array().expect("labels");
        let label = |key: &str| labels.iter().find(|l| l["key"] == key);
        let tid = label("thread.id")
            .and_then(|l| l["num"].as_i64())
            .unwrap_or(-1);
        let value = sample["values"][0].as_i64().unwrap_or(0);
        let entry = per_tid.entry(tid).or_default();
        entry.0 += value;
        let Some(function) = spins.first() else {
            continue;
        };
        entry.1 += value;
        let name = label("thread.name")
            .and_then(|l| l["str"].as_str())
            .unwrap_or("<none>")
            .to_owned();
        threads.entry(function).or_default().insert((tid, name));
    }
    for (function, thread_name) in SPIN_FUNCTIONS {
        let expected_tid = tids[thread_name].as_i64();
        let seen = threads.get(function).cloned().unwrap_or_default();
        let expected: BTreeSet<(i64, String)> = expected_tid
            .map(|tid| (tid, thread_name.to_owned()))
            .into_iter()
            .collect();
        if seen != expected {
            problems.push(format!(
                "pprof samples of {function}: threads (thread.id, thread.name) {seen:?}, expected \
                 only {expected:?} (the workload's thread ids: {tids})"
            ));
        }
        // Nearly every sample of the thread has its Python stack, also
        // just after the thread started.
        if let Some(tid) = expected_tid {
            let (all, with_function) = per_tid.get(&tid).copied().unwrap_or_default();
            if (with_function as f64) < 0.9 * all as f64 {
                problems.push(format!(
                    "only {with_function} of the {all} samples of thread {thread_name} ({tid}) \
                     have {function}"
                ));
            }
        }
    }
    assert_no_problems(&problems, interp, &stacks, &out);
}

per_version!(threads_carry_their_own_stacks:
    threads_carry_their_own_stacks_3_8 => 8,
    threads_carry_their_own_stacks_3_9 => 9,
    threads_carry_their_own_stacks_3_10 => 10,
    threads_carry_their_own_stacks_3_11 => 11,
    threads_carry_their_own_stacks_3_12 => 12,
    threads_carry_their_own_stacks_3_13 => 13,
);

per_version!(threads_started_later_carry_their_own_stacks:
    threads_started_later_carry_their_own_stacks_3_8 => 8,
    threads_started_later_carry_their_own_stacks_3_11 => 11,
    threads_started_later_carry_their_own_stacks_3_12 => 12,
    threads_started_later_carry_their_own_stacks_3_13 => 13,
);

// ---------------------------------------------------------------------------
// 3. Deep stacks, generators, coroutines, callbacks from C
// ---------------------------------------------------------------------------

/// Checks the stacks whose innermost Python frame is `leaf`, reached through
/// `depth` frames of `down`: each is whole (`<module> -> main -> drive ->
/// down x depth -> leaf`) or has a `[truncated]` frame before (rootwards of)
/// all its Python frames, which are then an unbroken run of `down` ending in
/// `leaf`. Returns the (whole, truncated) sample counts.
fn check_deep(
    stacks: &[FoldedStack],
    down: &str,
    leaf: &str,
    depth: usize,
    problems: &mut Vec<String>,
) -> (u64, u64) {
    let (mut whole, mut truncated) = (0, 0);
    let mut bad = 0;
    for stack in stacks {
        let py = stack.py_qualnames();
        if py.last() != Some(&leaf) {
            continue;
        }
        let downs = py.iter().filter(|n| **n == down).count();
        let is_whole = py.len() == depth + 4
            && py[..3] == ["<module>", "main", "drive"]
            && py[3..3 + depth].iter().all(|n| *n == down);
        let marker = stack.frames.iter().position(|f| f == "[truncated]");
        let first_py = stack.frames.iter().position(|f| is_py_frame(f));
        let is_truncated = match (marker, first_py) {
            (Some(m), Some(p)) => {
                m < p && downs < depth && py[..py.len() - 1].iter().all(|n| *n == down)
            }
            _ => false,
        };
        if is_whole {
            whole += stack.count;
        } else if is_truncated {
            truncated += stack.count;
            // The walker must not stop early: at least 256 Python frames.
            if py.len() < 256 {
                problems.push(format!(
                    "a truncated stack of {leaf} has only {} Python frames, fewer than 256",
                    py.len()
                ));
            }
        } else {
            bad += stack.count;
            if bad <= 3 {
                problems.push(format!(
                    "a stack of {leaf} ({} Python frames, {downs} of {down}, expected {depth}) is \
                     neither whole nor marked [truncated] before its Python frames: {}",
                    py.len(),
                    abbreviate(&stack.frames)
                ));
            }
        }
    }
    if whole + truncated < 20 {
        problems.push(format!(
            "{leaf}: only {} samples are whole or truncated ({bad} neither), expected at least 20",
            whole + truncated
        ));
    }
    (whole, truncated)
}

/// A long stack with runs of the same frame collapsed (`f x300`).
fn abbreviate(frames: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < frames.len() {
        let run = frames[i..].iter().take_while(|f| **f == frames[i]).count();
        out.push(if run > 1 {
            format!("{} x{run}", frames[i])
        } else {
            frames[i].clone()
        });
        i += run;
    }
    out.join(";")
}

/// A 300-deep recursion is whole or marked `[truncated]`; a 600-deep one
/// (deeper than the walker's 512-frame cap) is marked `[truncated]` at its
/// root end and still has at least 256 Python frames.
fn deep_recursion_whole_or_truncated(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-deep");
    let folded = tmp.join("deep.folded");
    let workload = start_py_workload(&interp.path, "py_deep.py", &["4"]);
    let out = profile_pid(workload.pid(), "2500ms", 199, &[&folded], &[]);
    drop(workload);
    out.assert_success();
    let stacks = read_folded(&folded);
    let mut problems = Vec::new();
    let (whole_300, truncated_300) =
        check_deep(&stacks, "down_whole", "leaf_whole", 300, &mut problems);
    let (whole_600, truncated_600) =
        check_deep(&stacks, "down_deep", "leaf_deep", 600, &mut problems);
    if truncated_600 == 0 {
        problems.push(format!(
            "no 600-deep stack is marked [truncated] ({whole_600} are whole), yet it is deeper \
             than the walker's 512 frames"
        ));
    }
    let deep_stacks: Vec<FoldedStack> = stacks
        .iter()
        .filter(|s| s.py_leaf().is_some_and(|f| f.qualname.starts_with("leaf_")))
        .map(|s| FoldedStack {
            frames: vec![abbreviate(&s.frames)],
            count: s.count,
        })
        .collect();
    assert!(
        problems.is_empty(),
        "{}: 300 deep: {whole_300} whole, {truncated_300} truncated; 600 deep: {whole_600} \
         whole, {truncated_600} truncated\n- {}\nstacks of the leaves (runs collapsed):\n{}\n\
         heaviest stacks:\n{}\n{out}",
        interp.label,
        problems.join("\n- "),
        folded_summary(&deep_stacks, 12),
        folded_summary(&stacks, 6)
    );
}

per_version!(deep_recursion_whole_or_truncated:
    deep_recursion_whole_or_truncated_3_8 => 8,
    deep_recursion_whole_or_truncated_3_9 => 9,
    deep_recursion_whole_or_truncated_3_10 => 10,
    deep_recursion_whole_or_truncated_3_11 => 11,
    deep_recursion_whole_or_truncated_3_12 => 12,
    deep_recursion_whole_or_truncated_3_13 => 13,
);

/// Checks that at least 95% (and at least 20) of the samples whose innermost
/// Python frame is `leaf` satisfy `ok`.
fn check_shape(
    stacks: &[FoldedStack],
    leaf: &str,
    what: &str,
    ok: impl Fn(&FoldedStack) -> bool,
    problems: &mut Vec<String>,
) {
    let of_leaf: Vec<&FoldedStack> = stacks
        .iter()
        .filter(|s| s.py_leaf().is_some_and(|f| f.qualname == leaf))
        .collect();
    let n: u64 = of_leaf.iter().map(|s| s.count).sum();
    let good: u64 = of_leaf.iter().filter(|s| ok(s)).map(|s| s.count).sum();
    if n < 20 {
        problems.push(format!("{leaf} has {n} samples, expected at least 20"));
    } else if (good as f64) < 0.95 * n as f64 {
        let examples: Vec<String> = of_leaf
            .iter()
            .filter(|s| !ok(s))
            .take(3)
            .map(|s| format!("    {} {}", s.frames.join(";"), s.count))
            .collect();
        problems.push(format!(
            "only {good} of {n} samples of {leaf} show {what}; for example:\n{}",
            examples.join("\n")
        ));
    }
}

/// In `stack`, the frames strictly between the Python frame `caller` and the
/// Python frame `callee` that follows it, if they appear in that order.
fn frames_between<'a>(stack: &'a FoldedStack, caller: &str, callee: &str) -> Option<&'a [String]> {
    fn qualname(frame: &str) -> Option<&str> {
        parse_py_frame(frame).map(|p| p.qualname)
    }
    let i = stack
        .frames
        .iter()
        .position(|f| qualname(f) == Some(caller))?;
    let j = i
        + 1
        + stack.frames[i + 1..]
            .iter()
            .position(|f| qualname(f) == Some(callee))?;
    Some(&stack.frames[i + 1..j])
}

/// Generators under their consumers, awaited coroutines under their awaiters,
/// a key function called by `sorted` under its caller with (3.11+) a
/// non-Python frame between the two, and a system call from Python with the
/// kernel frames below native frames below the Python frames.
fn generators_coroutines_callbacks_and_syscalls(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-shapes");
    let folded = tmp.join("shapes.folded");
    let workload = start_py_workload(&interp.path, "py_shapes.py", &["4.5"]);
    let out = profile_pid(workload.pid(), "3s", 199, &[&folded], &[]);
    drop(workload);
    out.assert_success();
    let stacks = read_folded(&folded);
    let mut problems = Vec::new();

    check_shape(
        &stacks,
        "gen_producer",
        "the Python frames run_generators -> consumer -> gen_producer",
        |s| {
            s.py_qualnames()
                .ends_with(&["run_generators", "consumer", "gen_producer"])
        },
        &mut problems,
    );
    check_shape(
        &stacks,
        "coro_inner",
        "the Python frames main -> coro_outer -> coro_inner, under run_coroutines",
        |s| {
            let names = s.py_qualnames();
            names.ends_with(&["main", "coro_outer", "coro_inner"])
                && names.contains(&"run_coroutines")
        },
        &mut problems,
    );
    if interp.minor >= 11 {
        check_shape(
            &stacks,
            "slow_key",
            "sort_caller, then at least one non-Python frame (sorted's C code or \
             [native code]), then slow_key",
            |s| {
                s.py_qualnames()
                    .ends_with(&["run_callbacks", "sort_caller", "slow_key"])
                    && frames_between(s, "sort_caller", "slow_key").is_some_and(|between| {
                        !between.is_empty() && !between.iter().any(|f| is_py_frame(f))
                    })
            },
            &mut problems,
        );
    } else {
        check_shape(
            &stacks,
            "slow_key",
            "the Python frames run_callbacks -> sort_caller -> slow_key",
            |s| {
                s.py_qualnames()
                    .ends_with(&["run_callbacks", "sort_caller", "slow_key"])
            },
            &mut problems,
        );
    }
    // Mixed stacks in the right order, root first: Python frames, then native
    // ones (os.read's C code, libc's read), then kernel ones.
    let syscall_stacks: Vec<FoldedStack> = stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| is_kernel_frame(f)))
        .cloned()
        .collect();
    check_shape(
        &syscall_stacks,
        "read_zeros",
        "run_syscalls -> read_zeros, then at least one native frame, then only kernel frames",
        |s| {
            let last_py = s.frames.iter().rposition(|f| is_py_frame(f));
            let first_kernel = s.frames.iter().position(|f| is_kernel_frame(f));
            s.py_qualnames().ends_with(&["run_syscalls", "read_zeros"])
                && match (last_py, first_kernel) {
                    (Some(p), Some(k)) => {
                        p + 1 < k && s.frames[k..].iter().all(|f| is_kernel_frame(f))
                    }
                    _ => false,
                }
        },
        &mut problems,
    );
    assert_no_problems(&problems, interp, &stacks, &out);
}

per_version!(generators_coroutines_callbacks_and_syscalls:
    generators_coroutines_callbacks_and_syscalls_3_8 => 8,
    generators_coroutines_callbacks_and_syscalls_3_9 => 9,
    generators_coroutines_callbacks_and_syscalls_3_10 => 10,
    generators_coroutines_callbacks_and_syscalls_3_11 => 11,
    generators_coroutines_callbacks_and_syscalls_3_12 => 12,
    generators_coroutines_callbacks_and_syscalls_3_13 => 13,
);

// ---------------------------------------------------------------------------
// 4. Python processes that start after the session
// ---------------------------------------------------------------------------

/// Checks that the `py_split.py` process(es) in `stacks` were unwound: most
/// samples have the whole Python path to one of the three functions, and the
/// shares are within ±`tolerance` points of `truth` (a sanity check here; the
/// precise comparison is `split_matches_truth_and_py_spy`).
fn check_split_unwound(
    interp: &Interp,
    stacks: &[FoldedStack],
    truth: &serde_json::Value,
    tolerance: f64,
    problems: &mut Vec<String>,
) {
    let total = folded_total(stacks);
    let functions = split_functions(interp);
    let counts = SplitCounts::of(stacks, &functions);
    let with_path = folded_count(stacks, |s| {
        let names = s.py_qualnames();
        names.starts_with(&["<module>", "main", "run_split"])
    });
    // The session also covers `sh`, the sleep and the interpreter's start-up.
    if (with_path as f64) < 0.6 * total as f64 || counts.total() < 100 {
        problems.push(format!(
            "only {with_path} of {total} samples have the Python path <module> -> main -> \
             run_split of py_split.py ({} in its three functions)",
            counts.total()
        ));
        return;
    }
    for (key, name) in &functions {
        let expected = 100.0 * truth["truth"][key].as_f64().unwrap_or(f64::NAN);
        let share = counts.share(key);
        let off = (share - expected).abs();
        if off.is_nan() || off > tolerance {
            problems.push(format!(
                "{name}: share {share:.1}% is not within ±{tolerance} points of the truth \
                 {expected:.1}%"
            ));
        }
    }
}

/// `-- sh -c 'sleep 0.3; exec python3.X py_split.py'`: the interpreter
/// appears by exec after the session began.
fn exec_after_start_is_unwound(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-exec");
    let folded = tmp.join("exec.folded");
    let script = py_workload_source("py_split.py");
    let command = format!(
        "sleep 0.3; exec {} {} 2.5",
        interp.path_str(),
        script.to_str().expect("UTF-8 path")
    );
    let out = run_spanprof(args![
        "profile",
        "--frequency",
        "499",
        "-o",
        folded,
        "--",
        "sh",
        "-c",
        command,
    ]);
    out.assert_success();
    let stacks = read_folded(&folded);
    let truth = last_json_line(&out.stdout);
    let mut problems = Vec::new();
    check_split_unwound(interp, &stacks, &truth, 10.0, &mut problems);
    assert_no_problems(&problems, interp, &stacks, &out);
}

/// `-- python3.X py_spawn.py`: a Python parent starts a Python child (the
/// split workload) with subprocess after 0.3 s; the child is unwound.
fn child_started_later_is_unwound(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-child");
    let folded = tmp.join("child.folded");
    let out = run_spanprof(args![
        "profile",
        "--frequency",
        "499",
        "-o",
        folded,
        "--",
        interp.path,
        py_workload_source("py_spawn.py"),
        "2.5",
    ]);
    out.assert_success();
    let stacks = read_folded(&folded);
    let truth = last_json_line(&out.stdout);
    let mut problems = Vec::new();
    check_split_unwound(interp, &stacks, &truth, 10.0, &mut problems);
    let summary = parse_summary(&out.stderr).unwrap_or_else(|e| panic!("{e}\n{out}"));
    if summary.processes < 2 {
        problems.push(format!(
            "the summary counts {} process(es), expected the parent and the child",
            summary.processes
        ));
    }
    assert_no_problems(&problems, interp, &stacks, &out);
}

per_version!(exec_after_start_is_unwound:
    exec_after_start_is_unwound_3_11 => 11,
    exec_after_start_is_unwound_3_12 => 12,
    exec_after_start_is_unwound_3_8 => 8,
);

per_version!(child_started_later_is_unwound:
    child_started_later_is_unwound_3_11 => 11,
    child_started_later_is_unwound_3_12 => 12,
    child_started_later_is_unwound_3_13 => 13,
);

#[test]
fn child_started_later_is_unwound_debian_3_11() {
    child_started_later_is_unwound(&Interp::debian_3_11());
}

// ---------------------------------------------------------------------------
// --python-only and --no-lines
// ---------------------------------------------------------------------------

/// `--python-only --no-lines`: every frame is a Python frame without a line
/// (`qualname (file.py)`) or a marker, `[no python frames]` stands alone, and
/// the split is still right.
fn python_only_without_lines(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-only");
    let folded = tmp.join("only.folded");
    let workload = start_py_workload(&interp.path, "py_split.py", &["4"]);
    let out = run_spanprof(args![
        "profile",
        "--pid",
        workload.pid().to_string(),
        "--duration",
        "2500ms",
        "--frequency",
        "499",
        "--python-only",
        "--no-lines",
        "-o",
        folded,
    ]);
    let workload_out = workload.finish(RUN_TIMEOUT);
    out.assert_success();
    workload_out.assert_success();
    let truth = last_json_line(&workload_out.stdout);
    let stacks = read_folded(&folded);
    let mut problems = Vec::new();
    for stack in &stacks {
        for frame in &stack.frames {
            let ok = match parse_py_frame(frame) {
                Some(py) => py.line.is_none(),
                None => {
                    frame == "[truncated]"
                        || frame == "[native code]"
                        || frame == "[no python frames]" && stack.frames.len() == 1
                }
            };
            if !ok {
                problems.push(format!(
                    "frame {frame:?} is not `qualname (file.py)` nor a marker: {}",
                    stack.frames.join(";")
                ));
                break;
            }
        }
    }
    let functions = split_functions(interp);
    for (_, name) in &functions {
        let frame = format!("{name} (py_split.py)");
        let path = [
            "<module> (py_split.py)",
            "main (py_split.py)",
            "run_split (py_split.py)",
            &frame,
        ];
        if !stacks.iter().any(|s| s.frames == path) {
            problems.push(format!("no stack is exactly {}", path.join(";")));
        }
    }
    check_split_unwound(interp, &stacks, &truth, 10.0, &mut problems);
    assert_no_problems(&problems, interp, &stacks, &out);
}

per_version!(python_only_without_lines:
    python_only_without_lines_3_9 => 9,
    python_only_without_lines_3_12 => 12,
);

// ---------------------------------------------------------------------------
// 5. Code objects shared by many function objects, code objects freed while
//    the session runs, processes that exit while it runs
// ---------------------------------------------------------------------------

/// The frame spanprof shows for a code object it could not name.
const UNKNOWN_PY_CODE: &str = "[unknown python code]";

/// The line of the workload `script` marked `# hot: KEY`.
fn marked_line(script: &str, key: &str) -> u32 {
    let path = py_workload_source(script);
    let source = std::fs::read_to_string(&path).expect("readable workload");
    let marker = format!("# hot: {key}");
    let index = source
        .lines()
        .position(|l| l.trim_end().ends_with(&marker))
        .unwrap_or_else(|| panic!("no line ending in {marker:?} in {}", path.display()));
    index as u32 + 1
}

/// The three kinds of `py_closures.py`: each one's key (the `# hot:` marker),
/// the function that runs it, and the name of its code object in the frames
/// for `interp` (`co_qualname` from 3.11, `co_name` before).
fn closure_kinds(interp: &Interp) -> [(&'static str, &'static str, &'static str); 3] {
    if interp.minor >= 11 {
        [
            ("lambda", "run_lambdas", "run_lambdas.<locals>.<lambda>"),
            ("genexpr", "run_genexprs", "run_genexprs.<locals>.<genexpr>"),
            ("closure", "run_closures", "make.<locals>.inner"),
        ]
    } else {
        [
            ("lambda", "run_lambdas", "<lambda>"),
            ("genexpr", "run_genexprs", "<genexpr>"),
            ("closure", "run_closures", "inner"),
        ]
    }
}

/// True when a stack has a frame spanprof could not name.
fn has_unknown_code(stack: &FoldedStack) -> bool {
    stack.contains(UNKNOWN_PY_CODE)
}

/// `py_closures.py` by pid: a lambda made anew for each `sorted(key=…)`, a
/// generator expression per `sum(…)` and a closure made anew per call, so one
/// code object runs under a new function object each time. Each is named
/// (`co_qualname` on 3.11+) with the line the source marks, under the
/// function that runs it, in a meaningful share of the samples, and fewer
/// than 2% of the samples have an `[unknown python code]` frame.
fn closures_lambdas_genexprs_are_named(interp: &Interp) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-closures");
    let folded = tmp.join("closures.folded");
    let workload = start_py_workload(&interp.path, "py_closures.py", &["4"]);
    let out = profile_pid(workload.pid(), "2500ms", 499, &[&folded], &[]);
    drop(workload);
    out.assert_success();
    let stacks = read_folded(&folded);
    let total = folded_total(&stacks);
    let unknown = folded_count(&stacks, has_unknown_code);
    let mut problems = Vec::new();
    let mut table = String::from("kind      samples  share  under caller  lines\n");
    for (key, runner, name) in closure_kinds(interp) {
        let is_leaf = |s: &FoldedStack| {
            s.py_leaf()
                .is_some_and(|f| f.qualname == name && f.file == "py_closures.py")
        };
        let samples = folded_count(&stacks, is_leaf);
        let under = folded_count(&stacks, |s| {
            is_leaf(s)
                && s.py_qualnames()
                    .ends_with(&["<module>", "main", runner, name])
        });
        let mut lines: BTreeMap<Option<u32>, u64> = BTreeMap::new();
        for stack in stacks.iter().filter(|s| is_leaf(s)) {
            let line = stack.py_leaf().and_then(|f| f.line);
            *lines.entry(line).or_default() += stack.count;
        }
        let hottest = lines
            .iter()
            .filter(|(line, _)| line.is_some())
            .max_by_key(|(line, n)| (**n, std::cmp::Reverse(**line)))
            .and_then(|(line, _)| *line);
        let share = 100.0 * samples as f64 / total.max(1) as f64;
        table.push_str(&format!(
            "{key:<9} {samples:>7} {share:>5.1}% {under:>13}  {lines:?}\n"
        ));
        // A third of the CPU time each: ~28% of the samples is expected.
        if samples < 50 || share < 10.0 {
            problems.push(format!(
                "{name}: {samples} of {total} samples ({share:.1}%) have it as the innermost \
                 Python frame, expected about a third and at least 10%"
            ));
            continue;
        }
        let marked = marked_line("py_closures.py", key);
        if hottest != Some(marked) {
            problems.push(format!(
                "{name}: the hottest line is {hottest:?}, not the line the source marks, \
                 {marked}; lines (None: no line): {lines:?}"
            ));
        }
        if (under as f64) < 0.95 * samples as f64 {
            problems.push(format!(
                "{name}: only {under} of its {samples} samples have the Python path \
                 <module> -> main -> {runner} -> {name}"
            ));
        }
    }
    let unknown_share = 100.0 * unknown as f64 / total.max(1) as f64;
    if unknown_share >= 2.0 {
        let examples: Vec<FoldedStack> = stacks
            .iter()
            .filter(|s| has_unknown_code(s))
            .cloned()
            .collect();
        problems.push(format!(
            "{unknown} of {total} samples ({unknown_share:.1}%) have an {UNKNOWN_PY_CODE} \
             frame, expected under 2%; the heaviest of them:\n{}",
            folded_summary(&examples, 8)
        ));
    }
    println!(
        "{}: {total} samples, {unknown} ({unknown_share:.1}%) with {UNKNOWN_PY_CODE}\n{table}",
        interp.label
    );
    assert!(
        problems.is_empty(),
        "{}:\n- {}\n{table}heaviest stacks:\n{}\n{out}",
        interp.label,
        problems.join("\n- "),
        top(&stacks)
    );
}

per_version!(closures_lambdas_genexprs_are_named:
    closures_lambdas_genexprs_are_named_3_8 => 8,
    closures_lambdas_genexprs_are_named_3_11 => 11,
    closures_lambdas_genexprs_are_named_3_12 => 12,
    closures_lambdas_genexprs_are_named_3_13 => 13,
);

/// The iteration `i` of a frame named `gen_fn_{i}` or `gen_fn_{i}.<locals>.inner`
/// (`py_churn.py`'s generated functions).
fn gen_iteration(qualname: &str) -> Option<u64> {
    let rest = qualname.strip_prefix("gen_fn_")?;
    let digits = rest.strip_suffix(".<locals>.inner").unwrap_or(rest);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What the frame after the `nest` frames of a `py_churn.py` stack is.
#[derive(Debug, Default)]
struct ChurnCounts {
    /// Samples with `gen_fn_{i}` there, consistent with the stack.
    named: u64,
    /// Samples with `[unknown python code]` there.
    unknown: u64,
    /// Samples with a `gen_fn_{i}` frame that is not iteration `i`'s (wrong
    /// file, or a `nest` depth that is not `i % 5 + 1`).
    misnamed: u64,
    /// Samples with something else there.
    other: u64,
}

/// `-- python py_churn.py`: every iteration compiles, runs and frees a
/// function `gen_fn_{i}` in the file `gen_{i}.py`, called through a `nest`
/// recursion `i % 5 + 1` deep, and short-lived Python children start and exit
/// every ~300 ms. spanprof exits 0 with parseable output; a frame named
/// `gen_fn_{i}` is always iteration `i`'s (its file is `gen_{i}.py`, the
/// `nest` depth above it is `i % 5 + 1`), whatever was freed and reused by the
/// time spanprof read it; some of them are named; and the children's samples
/// (other pids in the pprof output) have their Python frames,
/// `<module> (<string>:9) -> child_spin`.
fn freed_code_and_exiting_processes_never_mislead(interp: &Interp) {
    churn_never_misleads(interp, false);
}

/// The same with nested functions (`py_churn.py … nested`): each iteration's `inner` has the
/// same `co_name`, and a qualname `gen_fn_{i}.<locals>.inner` that is neither interned nor
/// immortal, so only what is read of the code object at sample time tells them apart (3.11+:
/// before, the qualname does not exist and the frames all read `inner`).
fn freed_nested_code_never_misleads(interp: &Interp) {
    churn_never_misleads(interp, true);
}

fn churn_never_misleads(interp: &Interp, nested: bool) {
    require_python_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("py-churn");
    let folded = tmp.join("churn.folded");
    let pprof = tmp.join("churn.pb.gz");
    let out = run_spanprof(args![
        "profile",
        "--frequency",
        "499",
        "-o",
        folded,
        "-o",
        pprof,
        "--",
        interp.path,
        py_workload_source("py_churn.py"),
        "3",
        if nested { "nested" } else { "flat" },
    ]);
    out.assert_success();
    let stacks = read_folded(&folded);
    let result = last_json_line(&out.stdout);
    let mut problems = Vec::new();

    // Generated functions: never another iteration's name.
    let mut counts = ChurnCounts::default();
    let mut inner = ChurnCounts::default();
    let mut misnamed_examples = Vec::new();
    let mut wrong_file = 0;
    for stack in &stacks {
        let py = stack.py_frames();
        for frame in &py {
            if let Some(i) = gen_iteration(frame.qualname) {
                let file = format!("gen_{i}.py");
                if frame.file != file {
                    wrong_file += stack.count;
                    if wrong_file <= 3 {
                        problems.push(format!(
                            "a frame is named gen_fn_{i} but its file is {}, not {file}: {}",
                            frame.file,
                            stack.frames.join(";")
                        ));
                    }
                }
            }
        }
        if !py.iter().any(|f| f.qualname == "nest") {
            continue;
        }
        let depth = py.iter().filter(|f| f.qualname == "nest").count() as u64;
        // Nested functions: the frame called by the generated function.
        if nested {
            for frame in py
                .iter()
                .filter(|f| f.qualname.ends_with(".<locals>.inner"))
            {
                match gen_iteration(frame.qualname) {
                    Some(i) if i % 5 + 1 == depth => inner.named += stack.count,
                    Some(_) => {
                        inner.misnamed += stack.count;
                        if misnamed_examples.len() < 6 {
                            misnamed_examples.push(format!(
                                "    {depth} nest frames but {}: …{} {}",
                                frame.qualname,
                                stack.frames[stack.frames.len().saturating_sub(4)..].join(";"),
                                stack.count
                            ));
                        }
                    }
                    None => inner.other += stack.count,
                }
            }
        }
        // The next Python frame: with whole native stacks the interpreter's C frames of the
        // call (function_code_fastcall, …) come in between.
        let called = stack
            .frames
            .iter()
            .rposition(|f| parse_py_frame(f).is_some_and(|p| p.qualname == "nest"))
            .and_then(|at| {
                stack.frames[at + 1..]
                    .iter()
                    .find(|f| *f == UNKNOWN_PY_CODE || parse_py_frame(f).is_some())
            });
        match called {
            Some(frame) if frame == UNKNOWN_PY_CODE => counts.unknown += stack.count,
            Some(frame) => match parse_py_frame(frame).and_then(|p| gen_iteration(p.qualname)) {
                Some(i) if i % 5 + 1 == depth => counts.named += stack.count,
                Some(i) => {
                    counts.misnamed += stack.count;
                    if misnamed_examples.len() < 6 {
                        misnamed_examples.push(format!(
                            "    {depth} nest frames (iteration ≡ {} mod 5) but gen_fn_{i} \
                             (≡ {} mod 5): …{} {}",
                            (depth + 4) % 5,
                            i % 5,
                            stack.frames[stack.frames.len().saturating_sub(4)..].join(";"),
                            stack.count
                        ));
                    }
                }
                None => counts.other += stack.count,
            },
            // The sample hit `nest` itself.
            None => counts.other += stack.count,
        }
    }
    if counts.misnamed > 0 {
        problems.push(format!(
            "{} samples show a gen_fn_N frame below a nest depth that is not N % 5 + 1: the \
             frame was named after another iteration's code (freed and its address reused); \
             for example:\n{}",
            counts.misnamed,
            misnamed_examples.join("\n")
        ));
    }
    if inner.misnamed > 0 {
        problems.push(format!(
            "{} samples show a gen_fn_N.<locals>.inner frame below a nest depth that is not \
             N % 5 + 1: named after another iteration's code; for example:\n{}",
            inner.misnamed,
            misnamed_examples.join("\n")
        ));
    }
    if nested && inner.named < 5 {
        problems.push(format!(
            "only {} samples name a nested function gen_fn_N.<locals>.inner, expected at least 5",
            inner.named
        ));
    }
    if nested {
        println!("{}: nested functions: {inner:?}", interp.label);
    }
    if counts.named + counts.misnamed < 5 {
        problems.push(format!(
            "only {} samples name a generated function gen_fn_N ({} are {UNKNOWN_PY_CODE}), \
             expected at least 5",
            counts.named + counts.misnamed,
            counts.unknown
        ));
    }
    println!(
        "{}: generated functions: {} named consistently with their nest depth (1 in 5 of \
         wrong names would be too), {} provably another iteration's, {} {UNKNOWN_PY_CODE}, \
         {} other ({} iterations)",
        interp.label,
        counts.named,
        counts.misnamed,
        counts.unknown,
        counts.other,
        result["iterations"]
    );

    // The children: other pids, each with its Python frames.
    let parent = result["pid"].as_i64();
    let children: BTreeSet<i64> = result["children"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p.as_i64()).collect())
        .unwrap_or_default();
    if parent.is_none() || children.is_empty() {
        problems.push(format!(
            "the workload reported no pid or no children: {result}"
        ));
    }
    let profile = decode_pprof(&pprof);
    // Per child: (samples, with child_spin, with child_spin under `<module> (<string>:9)`).
    let mut per_child: BTreeMap<i64, (i64, i64, i64)> = BTreeMap::new();
    let mut wrong_caller = Vec::new();
    // Per child: its samples without child_spin, by the leaf end of their stacks.
    let mut other_stacks: BTreeMap<i64, BTreeMap<String, i64>> = BTreeMap::new();
    // Per child: its samples whose stack was never unwound because the child exited before
    // spanprof drained its first sample (they say so: `unwind.reason`).
    let mut gone_before_drain: BTreeMap<i64, i64> = BTreeMap::new();
    for sample in profile["samples"].as_array().expect("samples") {
        let labels = sample["labels"].as_array().expect("labels");
        let Some(pid) = labels
            .iter()
            .find(|l| l["key"] == "process.id")
            .and_then(|l| l["num"].as_i64())
        else {
            continue;
        };
        if !children.contains(&pid) {
            continue;
        }
        let value = sample["values"][0].as_i64().unwrap_or(0);
        let entry = per_child.entry(pid).or_default();
        entry.0 += value;
        // Root first: (function, base name of the file, line).
        let frames: Vec<(&str, &str, i64)> = sample["stack"]
            .as_array()
            .expect("stack")
            .iter()
            .rev()
            .map(|f| {
                (
                    f["function"].as_str().unwrap_or(""),
                    f["file"]
                        .as_str()
                        .unwrap_or("")
                        .rsplit('/')
                        .next()
                        .unwrap_or(""),
                    f["line"].as_i64().unwrap_or(0),
                )
            })
            .collect();
        let Some(spin) = frames
            .iter()
            .position(|(function, file, _)| *function == "child_spin" && *file == "<string>")
        else {
            if labels.iter().any(|l| {
                l["key"] == "unwind.reason" && l["str"] == "process exited before unwinding"
            }) {
                *gone_before_drain.entry(pid).or_default() += value;
            }
            // Kept to show what a child without child_spin was doing, its leaf end.
            let leaf: Vec<String> = frames
                .iter()
                .rev()
                .take(8)
                .map(|(function, file, line)| format!("{function} ({file}:{line})"))
                .collect();
            *other_stacks
                .entry(pid)
                .or_default()
                .entry(leaf.join(" <- "))
                .or_default() += value;
            continue;
        };
        entry.1 += value;
        let caller = frames[..spin]
            .iter()
            .rev()
            .find(|(_, file, _)| file.ends_with(".py") || file.starts_with('<'));
        if caller == Some(&("<module>", "<string>", 9)) {
            entry.2 += value;
        } else if wrong_caller.len() < 6 {
            wrong_caller.push(format!(
                "    pid {pid}: caller {caller:?}, expected <module> (<string>:9)"
            ));
        }
    }
    let mut child_table = String::new();
    let mut unwound_too_late = 0;
    for (pid, (samples, spin, right_caller)) in &per_child {
        let gone = gone_before_drain.get(pid).copied().unwrap_or(0);
        child_table.push_str(&format!(
            "    child {pid}: {samples} samples, {spin} in child_spin, {right_caller} of them \
             under <module> (<string>:9), {gone} not unwound (exited before its first drain)\n"
        ));
        // NB: a child that exits before spanprof drains its first sample (its maps are gone
        // then) keeps its samples, unwound by nobody and saying so. On a loaded machine that
        // was one child of 10 in 6 runs here: one such child per run is a known limit, not a
        // misleading name (the faults suite measures how many short-lived processes are named).
        if *samples >= 20 && gone >= *samples - *samples / 4 && unwound_too_late == 0 {
            unwound_too_late += 1;
            continue;
        }
        // ~100 ms of child_spin after a ~20 ms start-up: ~40 of ~60 samples.
        if *samples >= 20 && (*spin as f64) < 0.4 * *samples as f64 {
            let mut others: Vec<(&String, &i64)> = other_stacks
                .get(pid)
                .map(|m| m.iter().collect())
                .unwrap_or_default();
            others.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let others: Vec<String> = others
                .iter()
                .take(5)
                .map(|(stack, n)| format!("      {n} {stack}"))
                .collect();
            problems.push(format!(
                "child {pid}: only {spin} of its {samples} samples have child_spin (<string>); \
                 its other samples, leaf first:\n{}",
                others.join("\n")
            ));
        }
        // Names are checked above; a stray sample may catch the call being made.
        if (*right_caller as f64) < 0.95 * *spin as f64 {
            problems.push(format!(
                "child {pid}: {} of its {spin} samples of child_spin are not under \
                 <module> (<string>:9), the line that calls it (py-spy shows that line)",
                spin - right_caller
            ));
        }
    }
    let spinning = per_child.values().filter(|(_, spin, _)| *spin > 0).count();
    if spinning * 2 < children.len() {
        problems.push(format!(
            "only {spinning} of the {} children have samples in child_spin",
            children.len()
        ));
    }
    println!("{child_table}");
    if !wrong_caller.is_empty() {
        println!("child_spin callers:\n{}", wrong_caller.join("\n"));
    }
    assert!(
        problems.is_empty(),
        "{}:\n- {}\ngenerated functions: {counts:?}\nchildren:\n{child_table}{}\nheaviest \
         stacks:\n{}\n{out}",
        interp.label,
        problems.join("\n- "),
        wrong_caller.join("\n"),
        top(&stacks)
    );
}

per_version!(freed_code_and_exiting_processes_never_mislead:
    freed_code_and_exiting_processes_never_mislead_3_9 => 9,
    freed_code_and_exiting_processes_never_mislead_3_11 => 11,
    freed_code_and_exiting_processes_never_mislead_3_12 => 12,
    freed_code_and_exiting_processes_never_mislead_3_13 => 13,
);

per_version!(freed_nested_code_never_misleads:
    freed_nested_code_never_misleads_3_11 => 11,
    freed_nested_code_never_misleads_3_12 => 12,
    freed_nested_code_never_misleads_3_13 => 13,
);
