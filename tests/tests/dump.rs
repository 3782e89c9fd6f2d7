//! `spanprof dump` against threads in known places (`tests/workloads/py_dump.py`): a thread
//! sleeping in an OpenTelemetry span, one waiting for a lock in an OSProfiler trace point, one
//! waiting for the GIL, and one holding the GIL in a C call inside another span. Each thread's
//! state, innermost Python function, name and span must be the workload's truth, on pyenv's
//! CPython 3.8, 3.11 and 3.13 and on Debian sid's 3.14 in a container; a native process and a
//! missing pid are checked too.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use spanprof_tests::rootfs::{rootfs, start_confined_py_with_env, Confinement, RootfsDir};
use spanprof_tests::{
    profiling_lock, pyenv_python, require_root, require_span_libs, run_spanprof, span_libs,
    spanprof_bin, start_py_workload_with_libs, stat_cpu_ticks, Background, TempDir,
};

const WORKLOAD: &str = "py_dump.py";

/// CPU time the GIL holder must have used before the dump (1.2 s): it has held the GIL for that
/// long, so the GIL thread, whose sleep ends after 1 s, is waiting for it.
const HOLDER_CPU_TICKS: u64 = 120;

/// The workload started (in the rootfs for `container`), its truth, and its rootfs directory.
fn start(python: &Path, libs: &Path, container: bool) -> (Background, Value, Option<RootfsDir>) {
    let tmp = TempDir::new("dump");
    let (workload, truth, dir) = if container {
        let root = rootfs();
        let dir = RootfsDir::new(&root, "dump");
        let inside = dir.inside.join("truth.json");
        let workload = start_confined_py_with_env(
            &root,
            &dir,
            Confinement::Container,
            python.to_str().expect("UTF-8"),
            &[
                ("PYTHONPATH", libs.to_str().expect("UTF-8")),
                ("PYTHONNOUSERSITE", "1"),
            ],
            WORKLOAD,
            &[inside.to_str().expect("UTF-8")],
        );
        let truth = dir.host.join("truth.json");
        (workload, truth, Some(dir))
    } else {
        let truth = tmp.join("truth.json");
        let workload =
            start_py_workload_with_libs(python, libs, WORKLOAD, &[truth.to_str().expect("UTF-8")]);
        (workload, truth, None)
    };
    let text = std::fs::read_to_string(&truth).expect("the workload wrote its truth");
    let truth: Value = serde_json::from_str(&text).expect("truth is JSON");
    // Wait until the holder has had the GIL a while (it takes it within milliseconds).
    let holder = truth["spinner"]["tid"].as_u64().expect("spinner tid");
    let deadline = Instant::now() + Duration::from_secs(30);
    while stat_cpu_ticks(&format!("/proc/{}/task/{holder}/stat", workload.pid())).unwrap_or(0)
        < HOLDER_CPU_TICKS
    {
        assert!(
            Instant::now() < deadline,
            "the GIL holder did not run: {}",
            workload.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (workload, truth, dir)
}

/// The thread of `threads` with id `tid`.
fn thread(threads: &[Value], tid: u64) -> &Value {
    threads
        .iter()
        .find(|t| t["tid"].as_u64() == Some(tid))
        .unwrap_or_else(|| panic!("no thread {tid} in the dump: {threads:#?}"))
}

/// The innermost Python function of a dumped thread.
fn python_leaf(t: &Value) -> Option<&str> {
    t["frames"]
        .as_array()?
        .iter()
        .find(|f| f["kind"] == "python")?["function"]
        .as_str()
}

/// Dumps the workload run by `python` and checks every thread against the truth.
fn dump_matches_truth(python: PathBuf, libs: PathBuf, container: bool, label: &str) {
    require_root();
    spanprof_bin();
    if container {
        rootfs();
    } else {
        require_span_libs(&python, &libs);
    }
    let _lock = profiling_lock();
    let (workload, truth, _dir) = start(&python, &libs, container);
    let pid = workload.pid();
    let out = run_spanprof(["dump", "--pid", &pid.to_string(), "--json"]);
    out.assert_success();
    let dump: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{label}: the dump is not JSON ({e}):\n{}", out.stdout));
    let processes = dump["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1, "{label}: {dump:#}");
    assert_eq!(processes[0]["pid"].as_u64(), Some(u64::from(pid)));
    let threads = processes[0]["threads"].as_array().expect("threads");
    assert_eq!(threads.len(), 5, "{label}: main and four threads: {dump:#}");

    let mut problems = Vec::new();
    for (role, state, leaf) in [
        ("sleeper", "sleep", "sleeper_wait"),
        ("locker", "lock", "lock_wait"),
        ("gil", "gil", "gil_wanter"),
        ("spinner", "running", "spin"),
    ] {
        let t = thread(threads, truth[role]["tid"].as_u64().expect("tid"));
        if t["state"] != state {
            problems.push(format!("{role}: state {} (expected {state})", t["state"]));
        }
        if python_leaf(t) != Some(leaf) {
            problems.push(format!(
                "{role}: innermost Python function {:?} (expected {leaf})",
                python_leaf(t)
            ));
        }
        if t["name"] != role {
            problems.push(format!("{role}: thread name {}", t["name"]));
        }
        let want = &truth[role];
        let (span, osp) = (&t["span"], &t["osprofiler"]);
        match role {
            "sleeper" | "spinner" => {
                for key in ["trace_id", "span_id", "name"] {
                    if span[key] != want[key] {
                        problems.push(format!(
                            "{role}: span {key} {} (expected {})",
                            span[key], want[key]
                        ));
                    }
                }
                if !osp.is_null() {
                    problems.push(format!("{role}: an OSProfiler point {osp}"));
                }
            }
            "locker" => {
                for key in ["base_id", "trace_id", "name"] {
                    if osp[key] != want[key] {
                        problems.push(format!(
                            "{role}: OSProfiler {key} {} (expected {})",
                            osp[key], want[key]
                        ));
                    }
                }
                if !span.is_null() {
                    problems.push(format!("{role}: an OpenTelemetry span {span}"));
                }
            }
            _ => {
                if !span.is_null() || !osp.is_null() {
                    problems.push(format!("{role}: a span outside any: {span} {osp}"));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{label}: the dump differs from the truth:\n  {}\n--- dump ---\n{}\n--- stderr ---\n{}",
        problems.join("\n  "),
        serde_json::to_string_pretty(&dump).unwrap_or_default(),
        out.stderr
    );
    drop(workload);
}

#[test]
fn dump_of_cpython_3_8_matches_its_threads() {
    dump_matches_truth(pyenv_python(8), span_libs(8), false, "pyenv 3.8");
}

#[test]
fn dump_of_cpython_3_11_matches_its_threads() {
    dump_matches_truth(pyenv_python(11), span_libs(11), false, "pyenv 3.11");
}

#[test]
fn dump_of_cpython_3_13_matches_its_threads() {
    dump_matches_truth(pyenv_python(13), span_libs(13), false, "pyenv 3.13");
}

#[test]
fn dump_of_debian_sid_3_14_in_a_container_matches_its_threads() {
    dump_matches_truth(
        PathBuf::from("/usr/bin/python3.14"),
        PathBuf::from("/opt/span-libs/3.14"),
        true,
        "Debian sid python3.14 in a container",
    );
}

/// The text output says the same as the JSON: each thread's heading with its state, its span
/// line, and its innermost Python frame.
#[test]
fn dump_text_names_each_thread_s_state_span_and_frames() {
    let (python, libs) = (pyenv_python(11), span_libs(11));
    require_root();
    spanprof_bin();
    require_span_libs(&python, &libs);
    let _lock = profiling_lock();
    let (workload, truth, _dir) = start(&python, &libs, false);
    let out = run_spanprof(["dump", "--pid", &workload.pid().to_string()]);
    out.assert_success();
    let text = &out.stdout;
    let spinner = &truth["spinner"];
    for needle in [
        format!("Thread {} \"spinner\" running", spinner["tid"]),
        format!(
            "span \"spin-span\": trace {} span {}",
            spinner["trace_id"].as_str().unwrap(),
            spinner["span_id"].as_str().unwrap()
        ),
        format!(
            "Thread {} \"sleeper\" blocked: sleep",
            truth["sleeper"]["tid"]
        ),
        format!("Thread {} \"locker\" blocked: lock", truth["locker"]["tid"]),
        format!(
            "osprofiler point \"lock-point\": base {} point {}",
            truth["locker"]["base_id"].as_str().unwrap(),
            truth["locker"]["trace_id"].as_str().unwrap()
        ),
        format!("Thread {} \"gil\" blocked: gil", truth["gil"]["tid"]),
        "    sleeper_wait (py_dump.py:".to_string(),
    ] {
        assert!(text.contains(&needle), "no {needle:?} in:\n{text}");
    }
}

/// A process without Python: its one thread's state and kernel and C library frames.
#[test]
fn dump_of_a_native_process_shows_where_it_sleeps() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("600");
    let sleeper = Background::spawn(cmd);
    // `sleep` is in nanosleep once its loader is done: wait for its state to say so.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{}/wchan", sleeper.pid()))
        .is_ok_and(|w| w.contains("nanosleep"))
    {
        assert!(Instant::now() < deadline, "sleep never slept");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = run_spanprof(["dump", "--pid", &sleeper.pid().to_string(), "--json"]);
    out.assert_success();
    let dump: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let t = &dump["processes"][0]["threads"][0];
    assert_eq!(
        t["tid"].as_u64(),
        Some(u64::from(sleeper.pid())),
        "{dump:#}"
    );
    assert_eq!(t["state"], "sleep", "{dump:#}");
    let frames = t["frames"].as_array().expect("frames");
    let has = |kind: &str, part: &str| {
        frames
            .iter()
            .any(|f| f["kind"] == kind && f["function"].as_str().is_some_and(|n| n.contains(part)))
    };
    assert!(
        has("kernel", "nanosleep"),
        "no kernel nanosleep frame: {dump:#}"
    );
    assert!(
        has("native", "nanosleep"),
        "no C library nanosleep frame: {dump:#}"
    );
    assert!(
        has("native", "main"),
        "no frame of main (libc start or sleep's own): {dump:#}"
    );
    assert!(frames.iter().all(|f| f["kind"] != "python"), "{dump:#}");
}

/// `--children`: the processes the target started are dumped too, each with its threads.
#[test]
fn dump_with_children_shows_the_processes_the_target_started() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", "sleep 600 & sleep 600 & wait"]);
    let shell = Background::spawn(cmd);
    let pid = shell.pid();
    // Both children asleep (found by their parent in /proc).
    let deadline = Instant::now() + Duration::from_secs(10);
    let children = loop {
        let kids: Vec<u32> = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|k| k.parse().ok())
            .collect();
        let asleep = kids.iter().all(|k| {
            std::fs::read_to_string(format!("/proc/{k}/wchan"))
                .is_ok_and(|w| w.contains("nanosleep"))
        });
        if kids.len() == 2 && asleep {
            break kids;
        }
        assert!(
            Instant::now() < deadline,
            "the shell's children did not start: {kids:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = run_spanprof(["dump", "--pid", &pid.to_string(), "--children", "--json"]);
    out.assert_success();
    let dump: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let processes = dump["processes"].as_array().expect("processes");
    let mut pids: Vec<u64> = processes.iter().filter_map(|p| p["pid"].as_u64()).collect();
    pids.sort_unstable();
    let mut want: Vec<u64> = children.iter().map(|&k| u64::from(k)).collect();
    want.push(u64::from(pid));
    want.sort_unstable();
    assert_eq!(pids, want, "{dump:#}");
    for p in processes {
        let state = &p["threads"][0]["state"];
        if p["pid"].as_u64() == Some(u64::from(pid)) {
            assert!(
                state != "unknown" && state != "running",
                "the shell waits: {dump:#}"
            );
        } else {
            assert_eq!(state, "sleep", "{dump:#}");
        }
    }
    // Without --children, the shell alone.
    let out = run_spanprof(["dump", "--pid", &pid.to_string(), "--json"]);
    out.assert_success();
    let dump: Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(
        dump["processes"].as_array().map(Vec::len),
        Some(1),
        "{dump:#}"
    );
}

/// A pid that does not exist: an error that names it, exit status 1.
#[test]
fn dump_of_a_missing_pid_fails_and_says_so() {
    require_root();
    // Pids above pid_max are never used.
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("a number");
    let out = run_spanprof(["dump", "--pid", &(max + 1).to_string()]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains(&(max + 1).to_string()),
        "the error names the pid: {}",
        out.stderr
    );
}

/// Two threads computing in pure Python share the GIL (`py_gil_pair.py`): in at least 9 of 10
/// dumps one of them is `running` and holds the GIL (the process's `gil.holder`, read from the
/// interpreter), and the other waits for it (`gil`). Each dump's wall time is printed.
fn dump_shows_which_thread_waits_for_the_gil(minor: u8) {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let mut cmd = std::process::Command::new(pyenv_python(minor));
    cmd.arg(spanprof_tests::py_workload_source("py_gil_pair.py"));
    let mut workload = Background::spawn(cmd);
    let ready = workload.wait_for_stderr("ready", Duration::from_secs(20));
    let tids: Vec<u64> = ready
        .split_whitespace()
        .skip(2)
        .filter_map(|t| t.parse().ok())
        .collect();
    assert_eq!(tids.len(), 2, "spinner ids: {ready}");
    let (mut right, mut seen, mut times) = (0, Vec::new(), Vec::new());
    for _ in 0..10 {
        let began = Instant::now();
        let out = run_spanprof(["dump", "--pid", &workload.pid().to_string(), "--json"]);
        times.push(began.elapsed().as_secs_f64());
        out.assert_success();
        let dump: Value = serde_json::from_str(&out.stdout).expect("JSON");
        let process = &dump["processes"][0];
        let threads = process["threads"].as_array().expect("threads");
        let shown: Vec<(u64, &str, bool)> = tids
            .iter()
            .map(|&tid| {
                let t = thread(threads, tid);
                (
                    tid,
                    t["state"].as_str().unwrap_or("?"),
                    t["holds_gil"] == true,
                )
            })
            .collect();
        let holder = process["gil"]["holder"].as_u64();
        let running: Vec<u64> = shown
            .iter()
            .filter(|s| s.1 == "running")
            .map(|s| s.0)
            .collect();
        let waiting = shown.iter().filter(|s| s.1 == "gil").count();
        let holders: Vec<u64> = shown.iter().filter(|s| s.2).map(|s| s.0).collect();
        if running.len() == 1 && waiting == 1 && holder == Some(running[0]) && holders == running {
            right += 1;
        }
        seen.push(format!(
            "{} (holder {holder:?})",
            shown
                .iter()
                .map(|s| format!("{}{}", s.1, if s.2 { "+holds" } else { "" }))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    workload.signal(libc::SIGKILL);
    println!("3.{minor}: {right} of 10 dumps one running with the GIL, one gil: {seen:?}; seconds {times:.2?}");
    assert!(
        right >= 9,
        "3.{minor}: {right} of 10 dumps show one spinner running with the GIL and the other \
         waiting for it: {seen:?}"
    );
}

#[test]
fn dump_shows_which_thread_waits_for_the_gil_3_8() {
    dump_shows_which_thread_waits_for_the_gil(8);
}

#[test]
fn dump_shows_which_thread_waits_for_the_gil_3_11() {
    dump_shows_which_thread_waits_for_the_gil(11);
}

#[test]
fn dump_shows_which_thread_waits_for_the_gil_3_13() {
    dump_shows_which_thread_waits_for_the_gil(13);
}
