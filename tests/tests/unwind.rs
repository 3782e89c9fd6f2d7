//! Native stacks of code built without frame pointers, unwound with `.eh_frame` (issue 5):
//! the default `--unwind dwarf` copies the user stack in the kernel and unwinds it in user
//! space with the modules' call frame information.
//!
//! Every workload here is built with `-fomit-frame-pointer -momit-leaf-frame-pointer`, and
//! `cargo xtask workloads` checks that their hot paths set up no frame pointer; Debian's libc
//! and python3.11 have none either. A frame-pointer walk (`perf record -g`, or
//! `--unwind fp`) gets only the leaf of these stacks (0 of ~1000 cpu_split_nofp samples had
//! main;dispatcher;hot_* with `perf record -g`), so the full paths checked here come from
//! `.eh_frame`:
//! - cpu_split (3:1 split) as a PIE and as a non-PIE executable: full paths, the split within
//!   ±5 points, and `--stats` counting nearly every stack complete; with `--unwind fp` the
//!   stats say every stack is unchecked and the full paths are lost;
//! - a callback called by libc's `qsort` (libc frames between the caller and the callback);
//! - a shared object `dlopen`ed after the session started (its `.eh_frame` is found late);
//! - Debian's python3.11 calling a C extension: the native frames from the process's root
//!   through the interpreter, the Python frames, then the extension's C frames.

use std::path::{Path, PathBuf};

use spanprof_tests::{
    args, assert_cpu_split_truth, cext_dir, decode_pprof, folded_count, folded_summary,
    folded_total, native_stacks_line, parse_py_frame, profile_pid, profiling_lock, pyenv_python,
    read_folded, read_unwind_stats, require_profiling, run_with_timeout, spanprof_command,
    start_py_workload, system_python, workload_path, FoldedStack, ProcessUnwindStats, RunOutput,
    TempDir, UnwindStats, Workload, RUN_TIMEOUT, SYSTEM_PYTHON_3_11,
};

/// The outputs of one session: folded stacks, the `--stats` JSON, and the run itself.
struct Session {
    stacks: Vec<FoldedStack>,
    stats: UnwindStats,
    out: RunOutput,
}

impl Session {
    /// Reads the outputs of a finished session; panics if it failed.
    #[track_caller]
    fn read(out: RunOutput, folded: &Path, stats: &Path) -> Self {
        out.assert_success();
        Self {
            stacks: read_folded(folded),
            stats: read_unwind_stats(stats),
            out,
        }
    }

    /// The heaviest stacks, the stats and the run, for failure messages.
    fn context(&self) -> String {
        format!(
            "heaviest stacks:\n{}\nstats: {:?}\n{}",
            folded_summary(&self.stacks, 12),
            self.stats,
            self.out
        )
    }

    /// The stats of `pid`, which must be the only process in them.
    #[track_caller]
    fn only_process(&self, pid: u32) -> &ProcessUnwindStats {
        assert_eq!(
            self.stats.processes.len(),
            1,
            "expected the stats of one process, pid {pid}\n{}",
            self.context()
        );
        self.stats
            .process(pid)
            .unwrap_or_else(|| panic!("the stats have no process {pid}\n{}", self.context()))
    }

    /// Checks what holds of any session's stats: the summary has a `native stacks:` line, the
    /// stats name the `unwind` mode, and every sample of `pid` is counted in one kind of
    /// stack, as many samples as the folded output has when `pid` is the only process.
    #[track_caller]
    fn check_stats(&self, pid: u32, unwind: &str) -> &ProcessUnwindStats {
        assert!(
            native_stacks_line(&self.out.stderr).is_some(),
            "the summary has no `native stacks:` line\n{}",
            self.context()
        );
        assert_eq!(
            self.stats.unwind,
            unwind,
            "stats.unwind\n{}",
            self.context()
        );
        let process = self
            .stats
            .process(pid)
            .unwrap_or_else(|| panic!("the stats have no process {pid}\n{}", self.context()));
        assert!(
            process.samples > 0,
            "no samples of {pid}\n{}",
            self.context()
        );
        assert_eq!(
            process.classified(),
            process.samples,
            "complete + truncated + failed + unchecked is not the sample count of {pid}\n{}",
            self.context()
        );
        if self.stats.processes.len() == 1 {
            assert_eq!(
                process.samples,
                folded_total(&self.stacks),
                "the stats count other samples than the folded output\n{}",
                self.context()
            );
        }
        process
    }
}

/// Profiles `pid` for 3 s at 499 Hz with `--stats` and `extra` arguments.
#[track_caller]
fn profile_with_stats(pid: u32, extra: &[&str]) -> Session {
    let tmp = TempDir::new("unwind");
    let folded = tmp.join("out.folded");
    let stats = tmp.join("stats.json");
    let stats_arg = stats.to_str().expect("temporary paths are UTF-8");
    let mut args = vec!["--stats", stats_arg];
    args.extend_from_slice(extra);
    let out = profile_pid(pid, "3s", 499, &[&folded], &args);
    Session::read(out, &folded, &stats)
}

/// The samples whose user leaf is `leaf`, and those of them for which `ok` holds.
fn of_leaf(stacks: &[FoldedStack], leaf: &str, ok: impl Fn(&FoldedStack) -> bool) -> (u64, u64) {
    let n = folded_count(stacks, |s| s.user_leaf() == Some(leaf));
    let good = folded_count(stacks, |s| s.user_leaf() == Some(leaf) && ok(s));
    (n, good)
}

// ---------------------------------------------------------------------------
// a, b. cpu_split without frame pointers
// ---------------------------------------------------------------------------

/// `cpu_split` built without frame pointers (`workload`: PIE or not), default unwinding:
/// the same truths as `shares.rs` checks with frame pointers, and nearly every stack
/// complete in the stats.
fn cpu_split_full_paths(workload: &str) {
    require_profiling();
    let _lock = profiling_lock();
    let running = Workload::start(workload, 10.0);
    let pid = running.pid();
    let session = profile_with_stats(pid, &[]);
    drop(running);
    let stacks = &session.stacks;
    let context = session.context();

    // ~1500 samples in 3 s at 499 Hz; half of that leaves room for a busy machine.
    assert_cpu_split_truth(stacks, 700, workload, &context);

    let process = session.check_stats(pid, "dwarf");
    session.only_process(pid);
    assert_eq!(
        process.unchecked, 0,
        "{workload}: unchecked stacks with --unwind dwarf\n{context}"
    );
    assert!(
        process.complete_share() >= 95.0,
        "{workload}: only {:.1}% of the stacks are complete ({} of {})\n{context}",
        process.complete_share(),
        process.complete,
        process.samples
    );
}

#[test]
fn cpu_split_nofp_pie_full_paths() {
    cpu_split_full_paths("cpu_split_nofp");
}

#[test]
fn cpu_split_nofp_nopie_full_paths() {
    cpu_split_full_paths("cpu_split_nofp_nopie");
}

/// `--unwind fp` on the same workload: the option exists, the stats count every stack as
/// unchecked, and the frame-pointer walk loses the path (`perf record -g` gets only the leaf
/// of every sample; below half is what is asserted).
#[test]
fn cpu_split_nofp_with_frame_pointer_walk() {
    require_profiling();
    let _lock = profiling_lock();
    let running = Workload::start("cpu_split_nofp", 10.0);
    let pid = running.pid();
    let session = profile_with_stats(pid, &["--unwind", "fp"]);
    drop(running);
    let stacks = &session.stacks;
    let context = session.context();

    let process = session.check_stats(pid, "fp");
    session.only_process(pid);
    assert_eq!(
        process.unchecked + left_mapped_code(process),
        process.samples,
        "--unwind fp: not every stack is unchecked or cut where the walk left mapped code\n\
         {context}"
    );
    assert_no_invented_frames(stacks, process, &context);
    let hot = folded_count(stacks, |s| {
        matches!(s.user_leaf(), Some("hot_alpha" | "hot_beta"))
    });
    let full = folded_count(stacks, |s| {
        s.contains_seq(&["main", "dispatcher", "hot_alpha"])
            || s.contains_seq(&["main", "dispatcher", "hot_beta"])
    });
    assert!(
        hot >= 700,
        "--unwind fp: only {hot} samples in hot_alpha or hot_beta\n{context}"
    );
    assert!(
        (full as f64) < 0.5 * hot as f64,
        "--unwind fp: {full} of {hot} hot samples have main;dispatcher;hot_*: the workload \
         has frame pointers after all, so it cannot tell .eh_frame unwinding from a \
         frame-pointer walk\n{context}"
    );
}

/// The stats' count of stacks cut at a return address in no mapped code.
fn left_mapped_code(process: &ProcessUnwindStats) -> u64 {
    process.reasons.get(LEFT_MAPPED_CODE).copied().unwrap_or(0)
}

const LEFT_MAPPED_CODE: &str = "return address in no mapped code";
const UNKNOWN_CALLERS: &str = "[unknown callers: the walk left mapped code]";

/// No frame of an address in no mapping (`[unknown] (?+0x…)`): a stack is cut at the first,
/// `[unknown callers: …]` at its root, and the stats count the cut stacks as failed for it.
#[track_caller]
fn assert_no_invented_frames(stacks: &[FoldedStack], process: &ProcessUnwindStats, context: &str) {
    let invented = folded_count(stacks, |s| s.frames.iter().any(|f| f.contains("(?+0x")));
    let example = stacks
        .iter()
        .find(|s| s.frames.iter().any(|f| f.contains("(?+0x")))
        .map(|s| s.frames.join(";"));
    assert_eq!(
        invented, 0,
        "{invented} samples have a frame in no mapping, e.g. {example:?}\n{context}"
    );
    let misplaced = folded_count(stacks, |s| {
        s.frames.iter().skip(1).any(|f| f == UNKNOWN_CALLERS)
    });
    assert_eq!(
        misplaced, 0,
        "{misplaced} samples have {UNKNOWN_CALLERS} below their root\n{context}"
    );
    let cut = folded_count(stacks, |s| {
        s.frames.first().is_some_and(|f| f == UNKNOWN_CALLERS)
    });
    assert_eq!(
        cut,
        left_mapped_code(process),
        "the stats count other cut stacks than the folded output has\n{context}"
    );
}

/// `--unwind fp` through C++ and Rust built without frame pointers, whose `%rbp` holds heap
/// pointers: the walk reads data as frames (before: 411 distinct `[unknown] (?+0x…)` frames in
/// one C++ run); now each stack stops at its first address in no mapping (measured: 35% of
/// the C++ samples and 26% of the Rust ones cut, 0 invented frames), and `--unwind dwarf` cuts
/// none.
#[test]
fn frame_pointer_walk_through_code_without_them_invents_no_frame() {
    require_profiling();
    let _lock = profiling_lock();
    for (name, main_fn) in [("nofp_strings", "main"), ("nofp_rust", "nofp_rust::main")] {
        for unwind in ["fp", "dwarf"] {
            let running = Workload::start(name, 10.0);
            let pid = running.pid();
            let session = profile_with_stats(pid, &["--unwind", unwind]);
            drop(running);
            let stacks = &session.stacks;
            let context = format!("{name} --unwind {unwind}\n{}", session.context());
            let process = session.check_stats(pid, unwind);
            assert_no_invented_frames(stacks, process, &context);
            let cut = left_mapped_code(process);
            if unwind == "fp" {
                // 26-35% measured; a walk that never leaves mapped code tests nothing here.
                assert!(
                    cut * 20 >= process.samples,
                    "only {cut} of {} stacks were cut: the workload's %rbp holds no data \
                     pointers\n{context}",
                    process.samples
                );
            } else {
                assert_eq!(cut, 0, "a stack unwound by .eh_frame was cut\n{context}");
                let through_main = folded_count(stacks, |s| s.contains(main_fn));
                assert!(
                    through_main as f64 >= 0.95 * process.samples as f64,
                    "only {through_main} of {} stacks go through {main_fn}\n{context}",
                    process.samples
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// c. A callback below libc's qsort
// ---------------------------------------------------------------------------

/// `qsort_callback`: of the samples in `cmp_items`, at least 90% have `main;sort_rounds`
/// above it and at least one frame (libc's `qsort_r`, `msort_with_tmp`: Debian's libc has no
/// frame pointers) between `sort_rounds` and `cmp_items`.
#[test]
fn callback_below_libc_qsort() {
    require_profiling();
    let _lock = profiling_lock();
    let running = Workload::start("qsort_callback", 10.0);
    let pid = running.pid();
    let session = profile_with_stats(pid, &[]);
    drop(running);
    let stacks = &session.stacks;
    let context = session.context();

    let through_libc = |s: &FoldedStack| {
        let user = s.user_frames();
        let Some(i) = user
            .windows(2)
            .position(|w| w[0] == "main" && w[1] == "sort_rounds")
        else {
            return false;
        };
        // `i + 1` is sort_rounds, the last frame cmp_items; something in between.
        user.len() >= i + 4
    };
    let (n, good) = of_leaf(stacks, "cmp_items", through_libc);
    // cmp_items has ~98% of the CPU time (983 of 996 samples in 2 s by hand), so ~1500 in
    // 3 s at 499 Hz; fewer leaves room for a busy machine.
    assert!(
        n >= 500,
        "only {n} of {} samples are in cmp_items\n{context}",
        folded_total(stacks)
    );
    assert!(
        good as f64 >= 0.9 * n as f64,
        "{good} of {n} cmp_items samples have main;sort_rounds;…;cmp_items with libc's frames \
         between\n{context}"
    );
    let process = session.check_stats(pid, "dwarf");
    assert!(
        process.complete_share() >= 90.0,
        "only {:.1}% of the stacks are complete\n{context}",
        process.complete_share()
    );
}

// ---------------------------------------------------------------------------
// d. A shared object loaded after the session started
// ---------------------------------------------------------------------------

/// `dlopen_late` run by spanprof (`-- CMD`, so the session is attached before its first
/// instruction): half a second in `warm_up`, then it dlopens `libspanprof_plugin.so` and
/// spins in the plugin's static `plugin_hot`. At least 90% of the samples in `plugin_hot`
/// have main;run_plugin;plugin_run;plugin_hot.
#[test]
fn shared_object_loaded_late() {
    require_profiling();
    let program = workload_path("dlopen_late");
    workload_path("libspanprof_plugin.so");
    let _lock = profiling_lock();
    let tmp = TempDir::new("unwind-dlopen");
    let folded = tmp.join("out.folded");
    let stats = tmp.join("stats.json");
    let cmd = spanprof_command(args![
        "profile",
        "--duration",
        "20s",
        "--frequency",
        "499",
        "-o",
        &folded,
        "--stats",
        &stats,
        "--",
        &program,
        "3"
    ]);
    let out = run_with_timeout(cmd, RUN_TIMEOUT);
    let session = Session::read(out, &folded, &stats);
    let stacks = &session.stacks;
    let context = session.context();
    // The workload's pid is the first line of its stdout, which is spanprof's.
    let pid: u32 = session
        .out
        .stdout
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("dlopen_late printed no pid first\n{context}"));

    let warm_up = folded_count(stacks, |s| s.contains_seq(&["main", "warm_up"]));
    assert!(
        warm_up >= 100,
        "only {warm_up} samples in main;warm_up: was the session attached before the \
         dlopen?\n{context}"
    );
    let (n, good) = of_leaf(stacks, "plugin_hot", |s| {
        s.contains_seq(&["main", "run_plugin", "plugin_run", "plugin_hot"])
    });
    // ~1250 samples in 2.5 s at 499 Hz; fewer leaves room for a busy machine.
    assert!(n >= 500, "only {n} samples in plugin_hot\n{context}");
    assert!(
        good as f64 >= 0.9 * n as f64,
        "{good} of {n} plugin_hot samples have main;run_plugin;plugin_run;plugin_hot\n{context}"
    );
    let process = session.check_stats(pid, "dwarf");
    assert!(
        process.complete_share() >= 90.0,
        "only {:.1}% of the stacks are complete\n{context}",
        process.complete_share()
    );
}

// ---------------------------------------------------------------------------
// e. Debian's python3.11 calling a C extension
// ---------------------------------------------------------------------------

/// Native frames on the root side of Debian's python3.11, any of which shows the walk got
/// through the interpreter to the process's start: libc's start-up and the interpreter's
/// exported entry points (`Py_BytesMain`, `Py_RunMain` are in its `.dynsym`; its `main` is
/// not, and is a tail call to `Py_BytesMain`). `perf record --call-graph dwarf` shows
/// `_start;__libc_start_main_impl (inlined);__libc_start_call_main;Py_BytesMain;Py_RunMain;
/// _PyRun_AnyFileObject;_PyRun_SimpleFileObject;[unknown]×3;PyEval_EvalCode;
/// _PyEval_EvalFrameDefault;crunch;crunch_outer;crunch_inner`.
const PYTHON_ROOT_FRAMES: &[&str] = &[
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "main",
    "Py_BytesMain",
    "Py_RunMain",
];

/// `py_cext.py` under Debian's `/usr/bin/python3.11` (no frame pointers), which calls
/// `outer -> middle -> spanprof_cext.crunch -> crunch_outer -> crunch_inner`: at least 90%
/// of the samples in `crunch_inner` have, root to leaf, a native frame of the process's
/// start-up, then the Python frames `outer (py_cext.py:N);middle (py_cext.py:N)`, then the
/// extension's `crunch_outer;crunch_inner` at the leaf; and at least 90% of the process's
/// stacks are complete.
#[test]
fn python_calling_a_c_extension() {
    require_profiling();
    let python = system_python(SYSTEM_PYTHON_3_11, "python3.11-dev");
    let cext: PathBuf = cext_dir();
    let cext_arg = cext.to_str().expect("workload paths are UTF-8");
    let _lock = profiling_lock();
    let workload = start_py_workload(&python, "py_cext.py", &["4.5", cext_arg]);
    let pid = workload.pid();
    let session = profile_with_stats(pid, &[]);
    let workload_out = workload.finish(RUN_TIMEOUT);
    workload_out.assert_success();
    let stacks = &session.stacks;
    let context = session.context();

    let whole = |s: &FoldedStack| {
        let user = s.user_frames();
        let Some(first_py) = user.iter().position(|f| parse_py_frame(f).is_some()) else {
            return false;
        };
        let root_side = user[..first_py]
            .iter()
            .any(|f| PYTHON_ROOT_FRAMES.contains(&f.as_str()));
        let py_cext = |f: &String, name: &str| {
            parse_py_frame(f).is_some_and(|p| p.qualname == name && p.file == "py_cext.py")
        };
        let Some(middle) = user
            .windows(2)
            .position(|w| py_cext(&w[0], "outer") && py_cext(&w[1], "middle"))
            .map(|i| i + 1)
        else {
            return false;
        };
        let leaf_side = user.ends_with(&["crunch_outer".to_owned(), "crunch_inner".to_owned()])
            && user.len() - 2 > middle;
        root_side && leaf_side
    };
    let (n, good) = of_leaf(stacks, "crunch_inner", whole);
    assert!(
        n >= 500,
        "only {n} of {} samples are in crunch_inner\n{context}",
        folded_total(stacks)
    );
    assert!(
        good as f64 >= 0.9 * n as f64,
        "{good} of {n} crunch_inner samples have one of {PYTHON_ROOT_FRAMES:?}, then \
         outer;middle (py_cext.py), then crunch_outer;crunch_inner\n{context}"
    );
    let process = session.check_stats(pid, "dwarf");
    assert!(
        process.complete_share() >= 90.0,
        "only {:.1}% of the stacks are complete ({} of {})\n{context}",
        process.complete_share(),
        process.complete,
        process.samples
    );
}

/// The lines of `spanprof_cext.c` that hold `text`.
fn cext_lines(text: &str) -> Vec<u32> {
    let path = spanprof_tests::workspace_root().join("tests/workloads/spanprof_cext.c");
    let source = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<u32> = (1..)
        .zip(source.lines())
        .filter(|(_, l)| l.contains(text))
        .map(|(n, _)| n)
        .collect();
    assert!(!lines.is_empty(), "no {text} in {}", path.display());
    lines
}

/// `py_cext.py ... mix`: `spanprof_cext.mix -> mix_outer`, into which the compiler inlined
/// `mix_rounds`, into which it inlined `mix_step` (`always_inline`, built `-O2 -g`). The
/// functions and their source lines are the truth of the workload's own source:
/// - folded stacks: at least 90% of the samples in `mix_outer` end `mix_outer;mix_rounds
///   (spanprof_cext.c:N, inlined)`, N a line of `mix_rounds`, or that and `mix_step
///   (spanprof_cext.c:M, inlined)`, N then the line where `mix_rounds` calls `mix_step` and M a
///   line of `mix_step`; at least 30% reach `mix_step` (measured 65%);
/// - pprof, read by the independent decoder: those are one location whose lines, innermost
///   first, are `mix_step`, `mix_rounds` and `mix_outer` at the line where it calls
///   `mix_rounds`, its mapping saying it has inline frames;
/// - the flame graph names them so.
#[test]
fn inlined_c_functions_and_their_lines() {
    require_profiling();
    let python = system_python(SYSTEM_PYTHON_3_11, "python3.11-dev");
    let cext: PathBuf = cext_dir();
    let cext_arg = cext.to_str().expect("workload paths are UTF-8");
    let _lock = profiling_lock();
    let workload = start_py_workload(&python, "py_cext.py", &["4.5", cext_arg, "mix"]);
    let tmp = TempDir::new("inlined");
    let (folded, pprof, svg) = (
        tmp.join("out.folded"),
        tmp.join("out.pb.gz"),
        tmp.join("out.svg"),
    );
    let out = profile_pid(workload.pid(), "3s", 499, &[&folded, &pprof, &svg], &[]);
    workload.finish(RUN_TIMEOUT).assert_success();
    out.assert_success();
    let stacks = read_folded(&folded);
    let context = folded_summary(&stacks, 12);

    let step_lines = cext_lines("/* MIX-STEP */");
    let [calls_step] = cext_lines("INLINED-CALL mix_step")[..] else {
        panic!("one call of mix_step")
    };
    let [calls_rounds] = cext_lines("INLINED-CALL mix_rounds")[..] else {
        panic!("one call of mix_rounds")
    };
    // mix_rounds: from its definition to mix_outer's.
    let [rounds_start] = cext_lines("static inline uint64_t mix_rounds(")[..] else {
        panic!("one mix_rounds")
    };
    let [outer_start] = cext_lines("static uint64_t mix_outer(")[..] else {
        panic!("one mix_outer")
    };
    let rounds_lines = rounds_start..outer_start;
    let inlined = |frame: &str, name: &str| -> Option<u32> {
        let rest = frame
            .strip_prefix(name)?
            .strip_prefix(" (spanprof_cext.c:")?;
        rest.strip_suffix(", inlined)")?.parse().ok()
    };
    let (mut in_outer, mut right, mut in_step) = (0, 0, 0);
    for s in &stacks {
        let user = s.user_frames();
        let Some(at) = user.iter().position(|f| f == "mix_outer") else {
            continue;
        };
        in_outer += s.count;
        match &user[at + 1..] {
            [rounds]
                if inlined(rounds, "mix_rounds").is_some_and(|n| rounds_lines.contains(&n)) =>
            {
                right += s.count
            }
            [rounds, step]
                if inlined(rounds, "mix_rounds") == Some(calls_step)
                    && inlined(step, "mix_step").is_some_and(|m| step_lines.contains(&m)) =>
            {
                right += s.count;
                in_step += s.count;
            }
            _ => {}
        }
    }
    assert!(
        in_outer >= 500,
        "only {in_outer} samples in mix_outer\n{context}"
    );
    assert!(
        right as f64 >= 0.9 * in_outer as f64,
        "{right} of {in_outer} samples in mix_outer end in mix_rounds (lines {rounds_lines:?}) \
         or mix_rounds (line {calls_step});mix_step (lines {step_lines:?})\n{context}"
    );
    assert!(
        in_step as f64 >= 0.3 * in_outer as f64,
        "only {in_step} of {in_outer} in mix_step\n{context}"
    );

    let decoded = decode_pprof(&pprof);
    let mut located = 0;
    for sample in decoded["samples"].as_array().unwrap() {
        let stack = sample["stack"].as_array().unwrap();
        if stack.first().and_then(|f| f["function"].as_str()) != Some("mix_step") {
            continue;
        }
        let lines: Vec<(&str, u64, u64)> = stack[..3]
            .iter()
            .map(|f| {
                (
                    f["function"].as_str().unwrap_or("?"),
                    f["line"].as_u64().unwrap_or(0),
                    f["location_id"].as_u64().unwrap(),
                )
            })
            .collect();
        let location = lines[0].2;
        assert!(step_lines.contains(&(lines[0].1 as u32)), "{lines:?}");
        assert_eq!(
            lines[1..],
            [
                ("mix_rounds", u64::from(calls_step), location),
                ("mix_outer", u64::from(calls_rounds), location)
            ],
            "one location, innermost line first"
        );
        located += 1;
    }
    assert!(located > 0, "no pprof sample ends in mix_step");
    let mapping = decoded["mappings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| {
            m["filename"]
                .as_str()
                .is_some_and(|f| f.contains("spanprof_cext"))
        })
        .expect("the extension's mapping");
    assert_eq!(mapping["has_inline_frames"], true, "{mapping}");

    let svg = std::fs::read_to_string(&svg).unwrap();
    for name in [
        format!("mix_rounds (spanprof_cext.c:{calls_step}, inlined)"),
        "mix_outer".to_string(),
    ] {
        assert!(svg.contains(&name), "the flame graph has no {name}");
    }
}

// ---------------------------------------------------------------------------
// f. A stack deeper than the default copy
// ---------------------------------------------------------------------------

/// CPython 3.9 recursing 45 Python calls deep uses about 18 KiB of C stack (every Python call
/// is a C call of the interpreter there: 40 calls fit in 16 KiB, 45 do not), more than the
/// default 16 KiB copy: spanprof says so, copies 32 KiB for that process from then on, and
/// nearly every stack is complete, from `_start` through the 46 Python frames (about 110 native
/// and Python frames in all, under the 127 kept).
#[test]
fn a_stack_deeper_than_the_copy_gets_a_bigger_one() {
    require_profiling();
    let python = pyenv_python(9);
    let _lock = profiling_lock();
    let workload = start_py_workload(&python, "py_recurse.py", &["45", "4.5"]);
    let pid = workload.pid();
    let session = profile_with_stats(pid, &[]);
    workload.finish(RUN_TIMEOUT).assert_success();
    let context = session.context();
    assert!(
        session.out.stderr.contains(&format!(
            "16384 bytes of stack cut short the stacks of 1 process ({pid}): 32768 bytes"
        )),
        "no word of the bigger copy\n{context}"
    );
    let process = session.check_stats(pid, "dwarf");
    // The samples before the first drain (≤ 50 ms) are cut short: they say why.
    assert!(
        process.truncated > 0
            && process.reasons.get("stack copy too small") == Some(&process.truncated),
        "the first stacks are truncated by the copy\n{context}"
    );
    assert!(
        process.complete_share() >= 90.0,
        "only {:.1}% of the stacks are complete ({} of {})\n{context}",
        process.complete_share(),
        process.complete,
        process.samples
    );
    let whole = folded_count(&session.stacks, |s| {
        let user = s.user_frames();
        user.first().map(String::as_str) == Some("_start")
            && user
                .iter()
                .filter(|f| parse_py_frame(f).is_some_and(|p| p.qualname == "f"))
                .count()
                == 46
    });
    let total = folded_total(&session.stacks);
    assert!(
        whole as f64 >= 0.85 * total as f64,
        "{whole} of {total} samples go from _start through 46 frames of f\n{context}"
    );
}
