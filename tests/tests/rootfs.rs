//! Where fleets run: Debian sid's stripped distro builds of CPython 3.13, 3.14 and 3.15, in a
//! container (own mount namespace after `pivot_root`) and in a chroot, profiled from outside
//! by pid (`tests/src/rootfs.rs` makes both; `cargo xtask rootfs` makes the rootfs).
//!
//! For each version and confinement, `py_split31.py` (a 3:1 CPU split of `hot_a` and `hot_b`)
//! must come out:
//! - within ±5 points of the split the workload measured for itself;
//! - with Python frames on ≥ 95% of its samples, and ≥ 95% of the native stacks complete
//!   (`--stats`), the Python frames in place of the interpreter's native frame (below
//!   `PyEval_EvalCode`, not at the root: the loop's cold part, where Debian's PGO builds run
//!   much of it, is found without symbols);
//! - with the hot line of each function equal to the line the interpreter reports for itself;
//! - with every native function name present in the symbol tables (`nm -D`, `nm`) of the
//!   files the target maps, read from the rootfs, or of their debug files there (sid's
//!   `libc6-dbg` and `python3.14-dbg`, by build id; inlined functions by the strings of those
//!   debug files, as `strings` finds them): a name taken from the host's file of the same path (the host's
//!   libc, or its `libc6-dbg`, for the container's) fails this;
//! - with each C library frame of the pprof, by its module offset, the function the rootfs's
//!   libc (or its debug file) has at that address (`nm -S`, `readelf -l`);
//! - with the C library's local `__libc_start_call_main` (in its debug file only) on most
//!   stacks: the debug file is found in the target's root.
//!
//! And sid's debug build of 3.14 and pyenv's 3.6 each get one warning naming the build or
//! version, and no Python frame. `py_callbacks.py` (C calling back into Python) keeps its
//! callers on sid's 3.14 and 3.15 in a chroot, as the python suite checks it on 3.8-3.13.

use std::path::Path;

use spanprof_tests::rootfs::{
    exec_mapped_files, file_strings, load_segments, nm_ranges, nm_symbols, rootfs,
    rootfs_debug_files, start_confined_py, Confinement, RootfsDir,
};
use spanprof_tests::*;

/// One session of `py_split31.py` under `python` in the rootfs, and what it found.
fn split_in_rootfs(minor: u8, how: Confinement) -> Vec<String> {
    let rootfs = rootfs();
    let python = format!("/usr/bin/python3.{minor}");
    let dir = RootfsDir::new(&rootfs, "split");
    let workload = start_confined_py(&rootfs, &dir, how, &python, "py_split31.py", &["5"]);
    let pid = workload.pid();
    let files = exec_mapped_files(pid, &rootfs, how);
    let tmp = TempDir::new("rootfs");
    let folded = tmp.join("out.folded");
    let pprof = tmp.join("out.pb.gz");
    let stats = tmp.join("stats.json");
    let out = profile_pid(
        pid,
        "3s",
        499,
        &[&folded, &pprof],
        // Every frame: the checks below follow the native stack through the interpreter.
        &["--stats", stats.to_str().expect("UTF-8"), "--view", "full"],
    );
    let result = workload.finish(std::time::Duration::from_secs(30));
    result.assert_success();
    out.assert_success();
    let truth = last_json_line(&result.stdout);
    let stacks = read_folded(&folded);
    let stats = read_unwind_stats(&stats);
    let label = format!("3.{minor} in a {}", how.name());
    let context = format!(
        "{label}\nheaviest stacks:\n{}\nspanprof: {}",
        folded_summary(&stacks, 8),
        out.stderr
    );
    let mut problems = Vec::new();
    if truth["version"].as_str() != Some(&format!("3.{minor}")) {
        problems.push(format!("the workload ran {:?}", truth["version"]));
    }

    // Python frames and the split.
    let total = folded_total(&stacks);
    let with_python = folded_count(&stacks, |s| !s.py_frames().is_empty());
    if total < 500 || (with_python as f64) < 0.95 * total as f64 {
        problems.push(format!(
            "{with_python} of {total} samples have Python frames (want >= 95% of >= 500)"
        ));
    }
    let in_fn = |name: &'static str| {
        folded_count(&stacks, move |s| {
            s.py_qualnames().last() == Some(&name) || {
                // The probe call on the hot line is a frame of its own.
                let q = s.py_qualnames();
                q.len() >= 2 && q[q.len() - 2] == name && q[q.len() - 1] == "probe"
            }
        })
    };
    let (a, b) = (in_fn("hot_a"), in_fn("hot_b"));
    let share = 100.0 * a as f64 / (a + b).max(1) as f64;
    let want = 100.0 * truth["truth"]["hot_a"].as_f64().unwrap_or(f64::NAN);
    if a + b < 400 || (share - want).abs().is_nan() || (share - want).abs() > 5.0 {
        problems.push(format!(
            "hot_a has {share:.1}% of {} samples in the two functions, the workload measured \
             {want:.1}% (want within 5 points)",
            a + b
        ));
    }

    // Lines: the line each function's frame is on most often.
    for name in ["hot_a", "hot_b"] {
        let mut per_line: std::collections::BTreeMap<u32, u64> = Default::default();
        for s in &stacks {
            if let Some(f) = s.py_frames().iter().rev().find(|f| f.qualname == name) {
                *per_line.entry(f.line.unwrap_or(0)).or_default() += s.count;
            }
        }
        let hot = per_line.iter().max_by_key(|(_, n)| **n).map(|(l, _)| *l);
        let want = truth["lines"][name].as_u64().map(|l| l as u32);
        if hot.is_none() || hot != want {
            problems.push(format!(
                "{name}: hottest line {hot:?} ({per_line:?}), the interpreter says {want:?}"
            ));
        }
    }

    // Python frames in place of the interpreter's native frame, not at the root: the stack
    // starts at `_start`, and the first Python frame follows `PyEval_EvalCode`'s frames.
    let in_place = folded_count(&stacks, |s| {
        let first_py = s.frames.iter().position(|f| is_py_frame(f));
        s.frames.first().map(String::as_str) == Some("_start")
            && first_py
                .is_some_and(|i| i > 0 && s.frames[..i].iter().any(|f| f == "PyEval_EvalCode"))
    });
    if (in_place as f64) < 0.95 * with_python as f64 {
        problems.push(format!(
            "only {in_place} of {with_python} samples with Python frames have them inside the \
             native stack (from _start, below PyEval_EvalCode)"
        ));
    }

    // Native stacks complete.
    match stats.process(pid) {
        Some(p) if p.complete_share() >= 95.0 => {}
        Some(p) => problems.push(format!(
            "only {:.1}% of the native stacks are complete ({:?})",
            p.complete_share(),
            p.reasons
        )),
        None => problems.push("the stats have no entry for the target".into()),
    }

    // Every native name is one of the target's own files, or of their debug files in the
    // rootfs (sid's libc6-dbg, by build id).
    let debug_files = rootfs_debug_files(&rootfs, &files);
    let dwarf_names = file_strings(&debug_files);
    if !debug_files.iter().any(|d| {
        files
            .iter()
            .any(|f| f.to_string_lossy().contains("libc.so"))
            && d.to_string_lossy().contains(".build-id")
    }) {
        problems.push(format!(
            "no debug file of the C library in the rootfs for {files:?}"
        ));
    }
    let mut all_files = files.clone();
    all_files.extend(debug_files);
    let mut symbols = nm_symbols(&all_files);
    symbols.extend(dwarf_names);
    // The C library's local functions are only in its debug file, sid's own: found in the
    // target's root by build id (the host's libc6-dbg is another build's).
    let local = "__libc_start_call_main";
    if folded_count(&stacks, |s| s.contains(local)) < total / 2 {
        problems.push(format!(
            "{local} (a local symbol of the rootfs's libc, in its debug file) names fewer than \
             half of the stacks"
        ));
    }
    let mut foreign: std::collections::BTreeMap<String, u64> = Default::default();
    let mut native = 0u64;
    for s in &stacks {
        for f in &s.frames {
            // An inlined function (`name (file.c:LINE, inlined)`) is DWARF's, in no symbol
            // table; the function it was inlined into, the frame before it, is checked.
            if is_kernel_frame(f) || is_py_frame(f) || f.starts_with('[') || f.ends_with("inlined)")
            {
                continue;
            }
            native += s.count;
            // A PLT stub is named after the function it jumps to (`memcpy@plt`): a symbol the
            // module imports, which `nm -D` lists as undefined.
            let name = f.strip_suffix("@plt").unwrap_or(f);
            if !symbols.contains(name) {
                *foreign.entry(f.clone()).or_default() += s.count;
            }
        }
    }
    if native == 0 {
        problems.push("no native frame was named".into());
    }
    if !foreign.is_empty() {
        problems.push(format!(
            "native names not in the symbol tables of {files:?}: {foreign:?}"
        ));
    }

    // Address by address, the C library's frames are the rootfs's functions at those
    // addresses (the pprof's module offsets, by the rootfs's libc and its debug file as
    // binutils reads them): a name from the host's libc of the same path is another
    // function's.
    let libc = files
        .iter()
        .find(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .cloned();
    if let Some(libc) = libc {
        let loads = load_segments(&libc);
        let mut ranges = nm_ranges(&libc, true);
        for debug in rootfs_debug_files(&rootfs, std::slice::from_ref(&libc)) {
            if debug.to_string_lossy().contains(".build-id") {
                ranges.extend(nm_ranges(&debug, false));
            }
        }
        let (mut checked, mut wrong) = (0u64, std::collections::BTreeMap::<String, u64>::new());
        for sample in decode_pprof(&pprof)["samples"].as_array().expect("samples") {
            let stack = sample["stack"].as_array().expect("stack");
            for (i, frame) in stack.iter().enumerate() {
                // Of a location's lines (leaf first) only the last is the function at its
                // address: the others were inlined into it.
                if stack
                    .get(i + 1)
                    .is_some_and(|next| next["location_id"] == frame["location_id"])
                {
                    continue;
                }
                let (Some(module), Some(name), Some(offset)) = (
                    frame["mapping"].as_str(),
                    frame["function"].as_str(),
                    frame["address"].as_u64(),
                ) else {
                    continue;
                };
                if !module
                    .rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with("libc.so"))
                {
                    continue;
                }
                let vaddr = loads
                    .iter()
                    .find(|&&(off, _, size)| off <= offset && offset < off + size)
                    .map(|&(off, va, _)| va + offset - off);
                let at = vaddr.and_then(|va| {
                    ranges
                        .iter()
                        .filter(|(s, e, _)| *s <= va && va < *e)
                        .map(|(_, _, n)| n.as_str())
                        .find(|n| *n == name)
                        .or_else(|| {
                            ranges
                                .iter()
                                .find(|(s, e, _)| *s <= va && va < *e)
                                .map(|r| r.2.as_str())
                        })
                });
                checked += 1;
                if at != Some(name) {
                    *wrong
                        .entry(format!("{name} at {offset:#x}, the rootfs has {at:?}"))
                        .or_default() += 1;
                }
            }
        }
        if checked == 0 || !wrong.is_empty() {
            problems.push(format!(
                "C library frames checked by address: {checked}, wrong: {wrong:?}"
            ));
        }
    }
    problems
        .into_iter()
        .map(|p| format!("{p}\n{context}"))
        .collect()
}

fn check(minor: u8) {
    require_profiling();
    let _lock = profiling_lock();
    let mut problems = Vec::new();
    for how in Confinement::BOTH {
        problems.extend(split_in_rootfs(minor, how));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[test]
fn sid_python_3_13_in_a_container_and_a_chroot() {
    check(13);
}

#[test]
fn sid_python_3_14_in_a_container_and_a_chroot() {
    check(14);
}

#[test]
fn sid_python_3_15_in_a_container_and_a_chroot() {
    check(15);
}

/// A session of `python` on `py_split31.py` (`rootfs`: in a container), for the warnings.
fn unsupported_session(python: &Path, rootfs: Option<&Path>) -> RunOutput {
    let tmp = TempDir::new("unsupported");
    let folded = tmp.join("out.folded");
    let (workload, _dir) = match rootfs {
        Some(root) => {
            let dir = RootfsDir::new(root, "unsupported");
            let w = start_confined_py(
                root,
                &dir,
                Confinement::Container,
                python.to_str().expect("UTF-8"),
                "py_split31.py",
                &["3"],
            );
            (w, Some(dir))
        }
        None => (start_py_workload(python, "py_split31.py", &["3"]), None),
    };
    let out = profile_pid(workload.pid(), "1s", 199, &[&folded], &[]);
    drop(workload);
    out.assert_success();
    let stacks = read_folded(&folded);
    let python_samples = folded_count(&stacks, |s| !s.py_frames().is_empty());
    assert_eq!(
        python_samples,
        0,
        "{} was read as Python\n{}",
        python.display(),
        folded_summary(&stacks, 5)
    );
    assert!(folded_total(&stacks) > 0, "no samples\n{out}");
    out
}

/// The one warning line for the target: it names `needle` and says native only.
#[track_caller]
fn assert_one_warning(out: &RunOutput, needle: &str) {
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("not supported, profiled as native code only"))
        .collect();
    assert_eq!(lines.len(), 1, "want one `not supported` warning\n{out}");
    assert!(
        lines[0].contains(needle),
        "the warning does not say {needle:?}\n{out}"
    );
}

#[test]
fn python_3_6_and_a_debug_build_each_get_one_warning() {
    require_profiling();
    let _lock = profiling_lock();
    let out = unsupported_session(&pyenv_python(6), None);
    assert_one_warning(&out, "python 3.6");
    let root = rootfs();
    let out = unsupported_session(Path::new("/usr/bin/python3.14d"), Some(&root));
    assert_one_warning(&out, "debug build");
}

// ---------------------------------------------------------------------------
// Python thread names
// ---------------------------------------------------------------------------

/// The four spin functions of `py_threads.py` and their threads' Python names.
const SPINS: [(&str, &str); 4] = [
    ("spin_a", "spin-a"),
    ("spin_b", "spin-b"),
    ("spin_c", "spin-c"),
    ("spin_d", "spin-d"),
];

/// `py_threads.py` with every OS thread named `pyworker`: the four threads differ only by
/// their `threading.Thread` names, which must label their samples in pprof (`thread.name`),
/// root them in folded stacks (`--group-by thread`), and select them in `report --thread`.
fn thread_names(python: &str, container: bool) -> Vec<String> {
    let tmp = TempDir::new("thread-names");
    let pprof = tmp.join("out.pb.gz");
    let folded = tmp.join("out.folded");
    let env = [("OS_THREAD_NAME", "pyworker")];
    let (workload, _dir) = if container {
        let root = rootfs();
        let dir = RootfsDir::new(&root, "threads");
        let w = spanprof_tests::rootfs::start_confined_py_with_env(
            &root,
            &dir,
            Confinement::Container,
            python,
            &env,
            "py_threads.py",
            &["4"],
        );
        (w, Some(dir))
    } else {
        (
            start_py_workload_env(Path::new(python), "py_threads.py", &["4"], &env),
            None,
        )
    };
    let out = profile_pid(
        workload.pid(),
        "2s",
        199,
        &[&pprof, &folded],
        &["--group-by", "thread"],
    );
    drop(workload);
    out.assert_success();
    let mut problems = Vec::new();

    // pprof: the thread.name label of each spin function's samples.
    let profile = decode_pprof(&pprof);
    for (function, thread) in SPINS {
        let (mut all, mut named) = (0i64, 0i64);
        let mut seen = std::collections::BTreeSet::new();
        for s in profile["samples"].as_array().expect("samples") {
            let has = s["stack_root_first"]
                .as_array()
                .expect("stack")
                .iter()
                .filter_map(|f| f.as_str())
                .any(|f| f.split(" (").next() == Some(function));
            if !has {
                continue;
            }
            let value = s["values"][0].as_i64().unwrap_or(0);
            let name = sample_str_labels(s)
                .get("thread.name")
                .cloned()
                .unwrap_or_default();
            all += value;
            if name == thread {
                named += value;
            }
            seen.insert(name);
        }
        if all < 50 || (named as f64) < 0.95 * all as f64 {
            problems.push(format!(
                "pprof: {named} of {all} samples of {function} have thread.name {thread} \
                 (names seen: {seen:?})"
            ));
        }
    }

    // folded: the samples of each function are under its thread's root.
    let stacks = read_folded(&folded);
    for (function, thread) in SPINS {
        let root = format!("[thread {thread}]");
        let all = folded_count(&stacks, |s| s.py_qualnames().contains(&function));
        let rooted = folded_count(&stacks, |s| {
            s.py_qualnames().contains(&function) && s.frames.first() == Some(&root)
        });
        if all < 50 || (rooted as f64) < 0.95 * all as f64 {
            problems.push(format!(
                "folded: {rooted} of {all} samples of {function} are under {root}"
            ));
        }
    }

    // report --thread selects by the Python name.
    let selected = tmp.join("spin-b.folded");
    let report = run_spanprof(args![
        "report", &pprof, "--thread", "spin-b", "-o", &selected
    ]);
    if !report.status.success() {
        problems.push(format!("report --thread spin-b failed\n{report}"));
    } else {
        let stacks = read_folded(&selected);
        let total = folded_total(&stacks);
        let b = folded_count(&stacks, |s| s.py_qualnames().contains(&"spin_b"));
        if total == 0 || (b as f64) < 0.95 * total as f64 {
            problems.push(format!(
                "report --thread spin-b kept {total} samples, {b} of them in spin_b"
            ));
        }
    }
    problems
        .into_iter()
        .map(|p| format!("{python}: {p}\n{out}"))
        .collect()
}

#[test]
fn python_thread_names_label_pprof_folded_and_report() {
    require_profiling();
    let _lock = profiling_lock();
    let mut problems = Vec::new();
    for minor in [8, 12] {
        problems.extend(thread_names(
            pyenv_python(minor).to_str().expect("UTF-8"),
            false,
        ));
    }
    problems.extend(thread_names("/usr/bin/python3.14", true));
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// `py_callbacks.py` under sid's 3.`minor` in a chroot: C code calling back into Python keeps
/// its callers, the split between its two callers is within ±3 points of its own measure, no
/// stack under the frame limit reads `[truncated]`, and no sample in the interpreter loop is
/// silent (the checks of the python suite's callback test, on the
/// versions pyenv does not have).
fn callbacks_in_rootfs(minor: u8) {
    require_profiling();
    let _lock = profiling_lock();
    let rootfs = rootfs();
    let python = format!("/usr/bin/python3.{minor}");
    let dir = RootfsDir::new(&rootfs, "callbacks");
    let workload = start_confined_py(
        &rootfs,
        &dir,
        Confinement::Chroot,
        &python,
        "py_callbacks.py",
        &["4"],
    );
    let tmp = TempDir::new("rootfs-callbacks");
    let folded = tmp.join("out.folded");
    let (problems, stacks, out) = callback_session(workload, &folded, &format!("sid 3.{minor}"));
    assert!(
        problems.is_empty(),
        "sid 3.{minor}: {}\nheaviest stacks:\n{}\nspanprof: {}",
        problems.join("\n"),
        folded_summary(&stacks, 8),
        out.stderr
    );
}

#[test]
fn sid_python_3_14_callbacks_keep_their_callers() {
    callbacks_in_rootfs(14);
}

#[test]
fn sid_python_3_15_callbacks_keep_their_callers() {
    callbacks_in_rootfs(15);
}
