//! 5. Code objects shared by many function objects, code objects freed while the session
//!    runs, processes that exit while it runs: never a wrong name.

use std::collections::{BTreeMap, BTreeSet};

use spanprof_tests::{
    args, decode_pprof, folded_count, folded_summary, folded_total, last_json_line, parse_py_frame,
    profile_pid, profiling_lock, py_workload_source, read_folded, run_spanprof, start_py_workload,
    FoldedStack, TempDir,
};

use crate::common::{require_python_profiling, top, Interp};

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
pub(super) fn closures_lambdas_genexprs_are_named(interp: &Interp) {
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
pub(super) fn freed_code_and_exiting_processes_never_mislead(interp: &Interp) {
    churn_never_misleads(interp, false);
}

/// The same with nested functions (`py_churn.py … nested`): each iteration's `inner` has the
/// same `co_name`, and a qualname `gen_fn_{i}.<locals>.inner` that is neither interned nor
/// immortal, so only what is read of the code object at sample time tells them apart (3.11+:
/// before, the qualname does not exist and the frames all read `inner`).
pub(super) fn freed_nested_code_never_misleads(interp: &Interp) {
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
        let exempt = *samples >= 20 && gone >= *samples - *samples / 4 && unwound_too_late == 0;
        unwound_too_late += usize::from(exempt);
        // 100 ms of CPU in child_spin at 499 Hz: ~50 samples, whatever the start-up before it
        // took (20 ms in November, 150 ms on a host three times slower: a share of the
        // child's samples would measure the host). 25 of them must be named child_spin
        // (measured 40-53 of ~50 per child alone; 29 and 30 in 2 of 10 children while a build
        // ran beside the CI run: where the others went was not traced; an unnamed or misnamed
        // child_spin would have none).
        if !exempt && *samples >= 20 && (*spin as f64) < 0.5 * 0.1 * 499.0 {
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
                "child {pid}: only {spin} of its {samples} samples have child_spin (<string>), \
                 of ~50 in its 100 ms of CPU; its other samples, leaf first:\n{}",
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
