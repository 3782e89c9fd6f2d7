//! 2. Threads, each spinning in its own function, also when they start after spanprof attached.

use std::collections::{BTreeMap, BTreeSet};

use spanprof_tests::{
    decode_pprof, folded_count, last_json_line, profile_pid, profiling_lock, read_folded,
    start_py_workload, TempDir, RUN_TIMEOUT,
};

use crate::common::{assert_no_problems, require_python_profiling, Interp};

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
pub(super) fn threads_carry_their_own_stacks(interp: &Interp) {
    check_threads(interp, None);
}

/// The same with threads that start 0.7 s after spanprof attached.
pub(super) fn threads_started_later_carry_their_own_stacks(interp: &Interp) {
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

/// A thread-per-request server (`py_thread_server.py`: http.server's ThreadingHTTPServer
/// under a client loop of 1500 requests, each in a thread that lives about a millisecond of
/// CPU) profiled from its start: at least 95% of the request threads' samples with Python
/// frames carry the thread's own `threading` name (the workload records each request thread's
/// native id and name; the kernel reads the name with the thread's first samples), and the
/// speedscope file groups them into few profiles. Prints the share of all their samples.
pub(super) fn thread_per_request_threads_carry_their_names(interp: &Interp) {
    require_python_profiling();
    let tmp = TempDir::new("py-thread-server");
    let pprof = tmp.join("server.pb.gz");
    let speedscope = tmp.join("server.speedscope.json");
    let out = {
        let _lock = profiling_lock();
        spanprof_tests::run_spanprof(spanprof_tests::args![
            "profile",
            "-F",
            "499",
            "-o",
            &pprof,
            "-o",
            &speedscope,
            "--",
            &interp.path,
            spanprof_tests::py_workload_source("py_thread_server.py"),
            "1500",
        ])
    };
    out.assert_success();
    let truth = last_json_line(&out.stdout);
    let names: BTreeMap<i64, String> = truth["threads"]
        .as_object()
        .expect("threads")
        .iter()
        .map(|(tid, name)| {
            (
                tid.parse().expect("a tid"),
                name.as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(names.len() >= 1000, "{} request threads", names.len());
    let prof = decode_pprof(&pprof);
    let (mut python, mut named_python, mut all, mut named_all) = (0u64, 0u64, 0u64, 0u64);
    let mut wrong = BTreeMap::new();
    for sample in prof["samples"].as_array().expect("samples") {
        let Some(tid) = spanprof_tests::sample_num_label(sample, "thread.id") else {
            continue;
        };
        let Some(truth_name) = names.get(&tid) else {
            continue;
        };
        let n = sample["values"][0].as_u64().expect("a count");
        let labels = spanprof_tests::sample_str_labels(sample);
        let name = labels.get("thread.name").map(String::as_str).unwrap_or("");
        let has_python = sample_functions_have_python(sample);
        all += n;
        if has_python {
            python += n;
        }
        if name == truth_name {
            named_all += n;
            if has_python {
                named_python += n;
            }
        } else if name.starts_with("Thread-") {
            *wrong
                .entry(format!("{tid}: {name} for {truth_name}"))
                .or_insert(0) += n;
        }
    }
    println!(
        "{}: request threads' samples named: {named_python} of {python} with Python frames, \
         {named_all} of {all} in all",
        interp.label
    );
    assert!(wrong.is_empty(), "another thread's name: {wrong:?}\n{out}");
    assert!(
        python >= 300 && named_python as f64 >= 0.95 * python as f64,
        "{named_python} of {python} request-thread samples with Python frames have their \
         thread's name ({named_all} of {all} in all)\n{out}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&speedscope).unwrap()).unwrap();
    let profiles = doc["profiles"].as_array().expect("profiles");
    assert!(
        profiles.len() <= 10,
        "{} speedscope profiles: {:?}",
        profiles.len(),
        profiles.iter().map(|p| &p["name"]).collect::<Vec<_>>()
    );
}

/// Whether a decoded pprof sample has a Python frame (a location in the `[python]` mapping).
fn sample_functions_have_python(sample: &serde_json::Value) -> bool {
    sample["stack"]
        .as_array()
        .is_some_and(|frames| frames.iter().any(|f| f["mapping"] == "[python]"))
}

/// A thread renamed halfway (`first-half`, then `second-half`, each for 2 s of its CPU, at
/// 999 Hz): of the samples taken in each half (told by the line of `work` that called `burn`,
/// in a folded output grouped by thread), at least 95% carry that half's name (the kernel reads
/// a name again at most every 50 ms: the first ~50 ms after the rename keep the old one); in
/// pprof, both names are on the thread's own id, and at most 2% of its samples carry another.
pub(super) fn a_renamed_thread_keeps_each_name_on_its_samples(interp: &Interp) {
    require_python_profiling();
    let tmp = TempDir::new("py-thread-rename");
    let pprof = tmp.join("rename.pb.gz");
    let folded = tmp.join("rename.folded");
    let script = spanprof_tests::py_workload_source("py_thread_rename.py");
    let out = {
        let _lock = profiling_lock();
        spanprof_tests::run_spanprof(spanprof_tests::args![
            "profile",
            "-F",
            "999",
            "-o",
            &pprof,
            "-o",
            &folded,
            "--group-by",
            "thread",
            "--",
            &interp.path,
            &script,
            "2",
        ])
    };
    out.assert_success();
    let truth = last_json_line(&out.stdout);
    let tid = truth["tid"].as_i64().expect("tid");
    let mut problems = Vec::new();

    // The line of each half's call of `burn`, from the workload itself.
    let source = std::fs::read_to_string(&script).expect("the workload's source");
    let line_of = |half: &str| {
        1 + source
            .lines()
            .position(|l| {
                l.contains(&format!("[\"{half}\"] = burn("))
                    || l.contains(&format!("{{\"{half}\": burn("))
            })
            .unwrap_or_else(|| panic!("no call of burn for {half} in the workload"))
    };
    let stacks = read_folded(&folded);
    let mut figures = Vec::new();
    for half in ["first-half", "second-half"] {
        let frame = format!("work (py_thread_rename.py:{})", line_of(half));
        let mut by_root: BTreeMap<&str, u64> = BTreeMap::new();
        for s in stacks.iter().filter(|s| s.frames.contains(&frame)) {
            *by_root.entry(s.frames[0].as_str()).or_default() += s.count;
        }
        let all: u64 = by_root.values().sum();
        let right = by_root
            .get(format!("[thread {half}]").as_str())
            .copied()
            .unwrap_or(0);
        figures.push(format!("{half}: {by_root:?}"));
        if all < 1000 || right * 100 < all * 95 {
            problems.push(format!(
                "{right} of the {all} samples in {frame} are under [thread {half}]: {by_root:?}"
            ));
        }
    }

    let prof = decode_pprof(&pprof);
    let mut by_name: BTreeMap<String, u64> = BTreeMap::new();
    for sample in prof["samples"].as_array().expect("samples") {
        if spanprof_tests::sample_num_label(sample, "thread.id") != Some(tid) {
            continue;
        }
        let labels = spanprof_tests::sample_str_labels(sample);
        let name = labels.get("thread.name").cloned().unwrap_or_default();
        *by_name.entry(name).or_default() += sample["values"][0].as_u64().expect("a count");
    }
    let n = |name: &str| by_name.get(name).copied().unwrap_or(0);
    let all: u64 = by_name.values().sum();
    let other = all - n("first-half") - n("second-half");
    if n("first-half") == 0 || n("second-half") == 0 || other * 50 > all {
        problems.push(format!(
            "pprof: the samples of thread.id={tid} by thread.name: {by_name:?}"
        ));
    }
    println!(
        "{}: {}; pprof {by_name:?}",
        interp.label,
        figures.join("; ")
    );
    assert!(
        problems.is_empty(),
        "{}: a renamed thread:\n- {}\n{out}",
        interp.label,
        problems.join("\n- ")
    );
}
