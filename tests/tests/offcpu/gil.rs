//! Python threads waiting for the GIL (`gil`) and joining (`lock`).

use spanprof_tests::{args, profiling_lock, py_workload_source, run_spanprof, TempDir};

use crate::common::{ms, require_offcpu_profiling, Interp, FREQUENCY};
use crate::profile::{check_reasons, offcpu_summary, Profile, Table};

/// Three Python threads spinning on two CPUs wait for the GIL: that time is `gil`, whatever
/// symbols the interpreter has (Debian's python3.11 is stripped: its GIL waits are known by
/// their callers in the interpreter's module), and the main thread's `join()` is `lock`.
/// Bounds: of each spinner's off-CPU time at least 80% is `gil` (the rest: waits at start and
/// exit, I/O at import); of the main thread's, at least 90% `lock`.
pub(super) fn gil_waits(interp: &Interp) {
    require_offcpu_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("offcpu-gil");
    let pprof = tmp.join("gil.pb.gz");
    let mut command: Vec<std::ffi::OsString> = Vec::new();
    let _in_rootfs = match &interp.chroot {
        // `chroot` execs the interpreter: the same process, profiled from its first
        // instruction as any command.
        Some(root) => {
            let dir = spanprof_tests::rootfs::RootfsDir::new(root, "gil");
            command.extend(["chroot".into(), root.into(), (&interp.path).into()]);
            command.push(dir.workload("py_gil.py").into());
            Some(dir)
        }
        None => {
            command.extend([
                (&interp.path).into(),
                py_workload_source("py_gil.py").into(),
            ]);
            None
        }
    };
    command.push("1".into());
    let mut args = args![
        "profile",
        "--event",
        "offcpu",
        "--frequency",
        FREQUENCY.to_string(),
        "-o",
        &pprof,
        "--"
    ];
    args.extend(command);
    let out = run_spanprof(args);
    out.assert_success();
    let truth: serde_json::Value = out
        .stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line from py_gil.py\n{out}"));
    let main = truth["main"].as_i64().expect("main tid");
    let spinners: Vec<i64> = truth["spinners"]
        .as_array()
        .expect("spinners")
        .iter()
        .filter_map(|t| t.as_i64())
        .collect();
    let profile = Profile::read(&pprof);
    let mut problems = Vec::new();
    check_reasons(&profile, &mut problems);
    let mut threads: Vec<(i64, &str)> = vec![(main, "main")];
    let names = ["spinner 1", "spinner 2", "spinner 3"];
    threads.extend(spinners.iter().copied().zip(names));
    let table = Table::of(&profile, &threads, |s| s.value("off_cpu"));
    for name in &names[..spinners.len()] {
        let total = table.thread_total(name);
        let gil = table
            .cells
            .iter()
            .filter(|((t, _), _)| t == name)
            .filter_map(|(_, cols)| cols.get("gil"))
            .sum::<i64>() as f64;
        if total < 100e6 || gil < 0.8 * total {
            problems.push(format!(
                "{name}: {:.1} ms of {:.1} ms off-CPU is gil (expected at least 80%, and at \
                 least 100 ms off-CPU)",
                ms(gil),
                ms(total)
            ));
        }
    }
    // NB: only main's waits inside start_and_join() count: its start-up before is I/O (imports,
    // reading files; a CI run in a fresh chroot: 418 ms) and the workload's 0.5 s sleep (for
    // spanprof to find the interpreter before main blocks: without it, a fresh pyenv 3.9 or 3.12
    // was found after main's one join began, and the join had no Python frames).
    let main_total = table.function_total("main", "start_and_join");
    let main_lock = table.get("main", "start_and_join", "lock");
    let main_gil = table.get("main", "start_and_join", "gil");
    // NB: main also waits for the GIL while it starts the spinners, longer on a loaded machine
    // (a CI run: 140.7 ms of 1014.9): its join is most of its waits, the GIL the rest.
    if main_total < 500e6
        || main_lock < 0.8 * main_total
        || main_lock + main_gil < 0.95 * main_total
    {
        problems.push(format!(
            "main in start_and_join: {:.1} ms of {:.1} ms off-CPU is lock (join; expected 80%, \
             and at least 500 ms off-CPU), {:.1} ms gil (expected the two to make 95%)",
            ms(main_lock),
            ms(main_total),
            ms(main_gil)
        ));
    }
    assert!(
        problems.is_empty(),
        "{}: GIL waits\n- {}\n{}\n{}",
        interp.label,
        problems.join("\n- "),
        table.render(),
        offcpu_summary(&out)
    );
}
