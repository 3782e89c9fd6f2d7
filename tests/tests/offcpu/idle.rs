//! py-spy's `longsleep --idle` and `thread_names --idle` shapes: a process none of whose threads
//! wakes during a `--pid --event wall` session. Each blocked interval is counted from the
//! session's start (threads asleep when it attached) to its end (threads still asleep then),
//! so the profile holds every thread for the whole session, with its stack and reason.

use std::collections::BTreeSet;

use spanprof_tests::{
    decode_pprof, profile_pid, profiling_lock, py_workload_source, sample_num_label,
    sample_str_labels, Background, TempDir,
};

use crate::common::{ms, require_offcpu_profiling, Interp};
use crate::profile::{offcpu_summary, Profile, Table};

/// Ten threads named idle-0 .. idle-9 waiting on an Event and the main thread sleeping in
/// `longsleep`, for the whole of a 2 s wall session (with `extra` flags): every thread's wall
/// time is at least 95% of the session's length and at most 102% (plus 5 ms); the main thread's
/// is at least 95% under `longsleep`, reason `sleep`, and as much with the C library's sleep on
/// its stack (native frames, `--unwind fp` too), each idle thread's at least 95%
/// under `idle_wait`; the eleven names (`MainThread`, `idle-N`) are the `thread.name` labels of
/// their own thread ids.
pub(super) fn idle_threads_fill_a_wall_profile(interp: &Interp, extra: &[&str]) {
    require_offcpu_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("offcpu-idle");
    let pprof = tmp.join("idle.pb.gz");
    let mut cmd = std::process::Command::new(&interp.path);
    cmd.arg(py_workload_source("py_idle_threads.py")).arg("60");
    let mut workload = Background::spawn(cmd);
    let ready = workload.wait_for_stderr("ready", std::time::Duration::from_secs(20));
    let tids: Vec<i64> = ready
        .split_whitespace()
        .skip(2)
        .filter_map(|t| t.parse().ok())
        .collect();
    assert_eq!(tids.len(), 11, "thread ids: {ready}");
    let mut flags = vec!["--event", "wall"];
    flags.extend_from_slice(extra);
    let out = profile_pid(workload.pid(), "2s", 99, &[&pprof], &flags);
    drop(workload);
    out.assert_success();

    let names: Vec<String> = std::iter::once("MainThread".to_owned())
        .chain((0..10).map(|i| format!("idle-{i}")))
        .collect();
    let threads: Vec<(i64, &str)> = tids
        .iter()
        .copied()
        .zip(names.iter().map(String::as_str))
        .collect();
    let profile = Profile::read(&pprof);
    let json = decode_pprof(&pprof);
    let session = json["duration_nanos"].as_f64().unwrap_or(0.0);
    let table = Table::of(&profile, &threads, |s| s.value("wall"));
    let mut problems = Vec::new();
    if session < 1.9e9 {
        problems.push(format!("the session lasted {:.1} ms", ms(session)));
    }
    for (i, (tid, name)) in threads.iter().enumerate() {
        let all = table.thread_total(name);
        let (function, reason) = if i == 0 {
            ("longsleep", Some("sleep"))
        } else {
            ("idle_wait", None)
        };
        let inside = match reason {
            Some(r) => table.get(name, function, r),
            None => table.function_total(name, function),
        };
        if all < 0.95 * session || all > 1.02 * session + 5e6 {
            problems.push(format!(
                "{name} (tid {tid}): {:.1} ms of wall time in a {:.1} ms session",
                ms(all),
                ms(session)
            ));
        }
        if inside < 0.95 * all {
            problems.push(format!(
                "{name}: {:.1} of its {:.1} ms under {function}{}",
                ms(inside),
                ms(all),
                reason.map(|r| format!(" as {r}")).unwrap_or_default()
            ));
        }
    }
    let native_sleep: i64 = profile
        .samples
        .iter()
        .filter(|s| {
            s.tid() == Some(tids[0]) && (s.has_function("nanosleep") || s.has_function("select"))
        })
        .map(|s| s.value("wall"))
        .sum();
    let main_all = table.thread_total("MainThread");
    if (native_sleep as f64) < 0.95 * main_all {
        problems.push(format!(
            "MainThread: {:.1} of its {:.1} ms have the C library's sleep (clock_nanosleep, or \
             3.8's select) on their stack",
            ms(native_sleep as f64),
            ms(main_all)
        ));
    }
    let mut labelled = BTreeSet::new();
    for sample in json["samples"].as_array().expect("samples") {
        let Some(tid) = sample_num_label(sample, "thread.id") else {
            continue;
        };
        if let Some(name) = sample_str_labels(sample).get("thread.name") {
            labelled.insert((tid, name.clone()));
        }
    }
    for (tid, name) in &threads {
        if !labelled.contains(&(*tid, (*name).to_owned())) {
            problems.push(format!(
                "no sample of tid {tid} is labelled thread.name={name}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{}: idle threads in a wall profile\n- {}\nlabels: {labelled:?}\n{}\n{}",
        interp.label,
        problems.join("\n- "),
        table.render(),
        offcpu_summary(&out)
    );
    println!("{}: idle threads\n{}", interp.label, table.render());
}
