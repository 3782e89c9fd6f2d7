//! The Python workload (`py_offcpu.py`) under `--event cpu,offcpu` and `--event wall`.

use std::path::Path;

use spanprof_tests::{
    args, folded_total, last_json_line, profiling_lock, py_workload_source, read_folded,
    run_spanprof, RunOutput, TempDir,
};

use crate::common::{
    ms, reason_frame, require_offcpu_profiling, Interp, FREQUENCY, REASONS, ROUNDS,
};
use crate::profile::{
    check_at_most, check_close, check_reasons, offcpu_summary, Profile, Table, FUNCTIONS,
};

/// What `py_offcpu.py` measured, in nanoseconds.
#[derive(Debug)]
struct Truth {
    main_tid: i64,
    holder_tid: i64,
    /// In sleeper, wait_lock; spin's CPU time and wall time.
    sleep: f64,
    lock: f64,
    spin: f64,
    spin_wall: f64,
    /// The holder's sleeps while it held the lock.
    hold: f64,
    /// run_rounds's wall time, the holder thread's, the process's age at the end.
    wall_rounds: f64,
    wall_holder: f64,
    wall_process: f64,
}

impl Truth {
    #[track_caller]
    fn of(out: &RunOutput) -> Self {
        let json = last_json_line(&out.stdout);
        let ns = |section: &str, key: &str| {
            json[section][key]
                .as_f64()
                .unwrap_or_else(|| panic!("no {section}.{key} in {json}\n{out}"))
                * 1e9
        };
        let tid = |key: &str| {
            json["tids"][key]
                .as_i64()
                .unwrap_or_else(|| panic!("no tids.{key} in {json}\n{out}"))
        };
        assert_eq!(
            json["rounds"].as_u64(),
            Some(u64::from(ROUNDS)),
            "rounds in {json}"
        );
        Self {
            main_tid: tid("main"),
            holder_tid: tid("holder"),
            sleep: ns("seconds", "sleep"),
            lock: ns("seconds", "lock"),
            spin: ns("seconds", "spin"),
            spin_wall: ns("seconds", "spin_wall"),
            hold: ns("seconds", "hold"),
            wall_rounds: ns("wall", "rounds"),
            wall_holder: ns("wall", "holder"),
            wall_process: ns("wall", "process"),
        }
    }

    fn threads(&self) -> [(i64, &'static str); 2] {
        [(self.main_tid, "main"), (self.holder_tid, "holder")]
    }

    fn render(&self) -> String {
        format!(
            "workload's truth (ms): sleeper {:.1}, wait_lock {:.1}, spin CPU {:.1} (wall {:.1}), \
             holder's sleeps {:.1}; wall: run_rounds {:.1}, holder thread {:.1}, process {:.1}\n",
            ms(self.sleep),
            ms(self.lock),
            ms(self.spin),
            ms(self.spin_wall),
            ms(self.hold),
            ms(self.wall_rounds),
            ms(self.wall_holder),
            ms(self.wall_process)
        )
    }
}

/// `spanprof profile --event EVENT --frequency 499 -o OUTPUT… -- PYTHON py_offcpu.py 5`.
#[track_caller]
fn profile_py_offcpu(interp: &Interp, event: &str, outputs: &[&Path]) -> RunOutput {
    let mut args = args![
        "profile",
        "--event",
        event,
        "--frequency",
        FREQUENCY.to_string()
    ];
    for out in outputs {
        args.extend(args!["-o", out]);
    }
    args.extend(args![
        "--",
        interp.path,
        py_workload_source("py_offcpu.py"),
        ROUNDS.to_string()
    ]);
    let out = run_spanprof(args);
    out.assert_success();
    out
}

/// `--event cpu,offcpu` on `py_offcpu.py`; see the module documentation.
pub(super) fn cpu_and_offcpu(interp: &Interp) {
    require_offcpu_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("offcpu-py");
    let pprof = tmp.join("offcpu.pb.gz");
    let folded = tmp.join("offcpu.folded");
    let out = profile_py_offcpu(interp, "cpu,offcpu", &[&pprof, &folded]);
    let truth = Truth::of(&out);
    let profile = Profile::read(&pprof);
    let mut problems = Vec::new();

    let expected = ["samples/count", "cpu/nanoseconds", "off_cpu/nanoseconds"];
    if profile.type_names() != expected {
        problems.push(format!(
            "sample types {:?}, expected {expected:?}",
            profile.type_names()
        ));
    }
    let period = profile.period;
    let expected_period = 1e9 / f64::from(FREQUENCY);
    if (period as f64 - expected_period).abs() > 1.0 {
        problems.push(format!(
            "period {period} ns, expected 1e9/{FREQUENCY} = {expected_period:.0}"
        ));
    }
    check_reasons(&profile, &mut problems);
    // Each sample is one or the other: on CPU (a count, its nanoseconds = count × period) or
    // off CPU (nanoseconds blocked, a reason).
    let has_cpu_type = profile.type_names().iter().any(|t| t == "cpu/nanoseconds");
    let mut mixed = 0;
    let mut bad_cpu = 0;
    let mut off_without_reason = 0;
    let mut on_with_reason = 0;
    for s in &profile.samples {
        let (count, cpu, off) = (s.value("samples"), s.value("cpu"), s.value("off_cpu"));
        if (count != 0 || cpu != 0) && off != 0 || count < 0 || cpu < 0 || off < 0 {
            mixed += 1;
        }
        if has_cpu_type && (cpu - count * period).abs() > count {
            bad_cpu += 1;
        }
        if off > 0 && s.reason.is_none() {
            off_without_reason += 1;
        }
        if off == 0 && s.reason.is_some() {
            on_with_reason += 1;
        }
    }
    for (n, what) in [
        (
            mixed,
            "have both on-CPU and off-CPU values, or a negative one",
        ),
        (bad_cpu, "have cpu/nanoseconds other than count × period"),
        (
            off_without_reason,
            "have off-CPU time but no off_cpu.reason",
        ),
        (on_with_reason, "have an off_cpu.reason but no off-CPU time"),
    ] {
        if n > 0 {
            problems.push(format!("{n} sample(s) {what}"));
        }
    }

    // Off-CPU nanoseconds and on-CPU nanoseconds (count × period) in one table.
    let table = Table::of(&profile, &truth.threads(), |s| {
        s.value("off_cpu") + s.value("samples") * period
    });
    check_close(
        "main thread, sleeper, reason sleep",
        table.get("main", "sleeper", "sleep"),
        truth.sleep,
        0.10,
        &mut problems,
    );
    check_close(
        "main thread, wait_lock, reason lock",
        table.get("main", "wait_lock", "lock"),
        truth.lock,
        0.10,
        &mut problems,
    );
    check_at_most(
        "main thread, sleeper, reason lock",
        table.get("main", "sleeper", "lock"),
        truth.sleep,
        0.05,
        &mut problems,
    );
    check_at_most(
        "main thread, wait_lock, reason sleep",
        table.get("main", "wait_lock", "sleep"),
        truth.lock,
        0.05,
        &mut problems,
    );
    // On-CPU sampling at 499 Hz: ~250 samples of spin, whose count varies with the machine's
    // load and the ticks' phase; ±25% is a sanity bound, not a precision figure.
    check_close(
        "main thread, spin, on-CPU (count × period)",
        table.get("main", "spin", "on-CPU"),
        truth.spin,
        0.25,
        &mut problems,
    );
    check_close(
        "holder thread, holder, reason sleep",
        table.get("holder", "holder", "sleep"),
        truth.hold,
        0.10,
        &mut problems,
    );

    // The folded output of the same session: nanoseconds, the same pseudo-frames.
    let stacks = read_folded(&folded);
    let pprof_total: i64 = profile
        .samples
        .iter()
        .map(|s| s.value("off_cpu") + s.value("cpu"))
        .sum();
    let folded_ns = folded_total(&stacks) as f64;
    // Rounding: at most 1 ns per folded line and per pprof sample.
    let slack = (stacks.len() + profile.samples.len()) as f64;
    if (folded_ns - pprof_total as f64).abs() > slack {
        problems.push(format!(
            "the folded output weighs {folded_ns:.0} in all, the pprof's on-CPU + off-CPU \
             nanoseconds are {pprof_total}: folded weights should be nanoseconds"
        ));
    }
    let folded_sleep = stacks
        .iter()
        .filter(|s| {
            s.frames.first().map(String::as_str) == Some(reason_frame("sleep").as_str())
                && s.frames
                    .iter()
                    .any(|f| f.split(" (").next() == Some("sleeper"))
        })
        .map(|s| s.count as f64)
        .sum::<f64>()
        + 0.0;
    check_close(
        "folded output, [off-cpu: sleep] stacks with sleeper (both threads)",
        folded_sleep,
        truth.sleep,
        0.10,
        &mut problems,
    );

    // What else the main thread was off CPU for, for the record.
    let main_off: f64 = REASONS
        .iter()
        .map(|r| {
            FUNCTIONS
                .iter()
                .chain(["(other)"].iter())
                .map(|f| table.get("main", f, r))
                .sum::<f64>()
        })
        .sum();
    let expected_off =
        table.get("main", "sleeper", "sleep") + table.get("main", "wait_lock", "lock");
    let report = format!(
        "{}: {} samples\n{}{}main thread off CPU {:.1} ms in all, {:.1} ms of it elsewhere than \
         sleeper/sleep and wait_lock/lock\nsummary:\n{}\n",
        interp.label,
        profile.samples.len(),
        truth.render(),
        table.render(),
        ms(main_off),
        ms(main_off - expected_off),
        offcpu_summary(&out)
    );
    println!("{report}");
    assert!(
        problems.is_empty(),
        "{}:\n- {}\n{report}\n{out}",
        interp.label,
        problems.join("\n- ")
    );
}

/// `--event wall` on `py_offcpu.py`.
///
/// Bounds: under `run_rounds` the main thread is asleep (0.5 s), blocked on the lock (0.5 s)
/// or spinning (0.5 s of CPU): the blocked intervals are each longer than the 2 ms period, so
/// they are recorded whole, and the spin is counted in 2 ms ticks, so the wall time there is
/// within a few ms of the truth. A wall profile made of on-CPU ticks and blocked intervals
/// (spanprof's: a thread switched out while still runnable is not blocked) does not hold the
/// time the thread waited for a CPU: on an idle machine a few ms, on a loaded one up to the
/// whole run (with two CPU hogs on this 2-CPU VM, 1.1 s of the 2.6 s of `run_rounds`). Nearly
/// all of it is in `spin`, the one place where the thread is runnable for long, and the
/// workload measures it there (spin's wall time less its CPU time), so the expected wall time
/// is `run_rounds`'s less that; ±10% leaves room for the rest (waits for a CPU after each
/// wake-up, blocks shorter than `--offcpu-min`). The whole main thread cannot weigh more than
/// the process lived (`wall.process`, 10 ms resolution, which also counts the time before the
/// exec); the holder thread, blocked nearly all its life, weighs its function's wall time
/// within -10% (waits for a CPU after its wake-ups) and +10% + 20 ms (its start and exit).
pub(super) fn wall(interp: &Interp) {
    require_offcpu_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("offcpu-wall");
    let pprof = tmp.join("wall.pb.gz");
    let out = profile_py_offcpu(interp, "wall", &[&pprof]);
    let truth = Truth::of(&out);
    let profile = Profile::read(&pprof);
    let mut problems = Vec::new();

    if profile.type_names() != ["wall/nanoseconds"] {
        problems.push(format!(
            "sample types {:?}, expected [\"wall/nanoseconds\"]",
            profile.type_names()
        ));
    }
    check_reasons(&profile, &mut problems);
    let negative = profile
        .samples
        .iter()
        .filter(|s| s.value("wall") <= 0)
        .count();
    if negative > 0 {
        problems.push(format!("{negative} sample(s) with a wall time ≤ 0"));
    }
    let table = Table::of(&profile, &truth.threads(), |s| s.value("wall"));
    let under_rounds: f64 = ["run_rounds", "sleeper", "wait_lock", "spin"]
        .iter()
        .map(|f| table.function_total("main", f))
        .sum();
    let waited_in_spin = truth.spin_wall - truth.spin;
    check_close(
        "main thread, wall time under run_rounds (expected: run_rounds's wall time less spin's \
         wait for a CPU)",
        under_rounds,
        truth.wall_rounds - waited_in_spin,
        0.10,
        &mut problems,
    );
    let main_total = table.thread_total("main");
    if main_total > truth.wall_process + 20e6 {
        problems.push(format!(
            "main thread: {:.1} ms of wall time, more than the process lived ({:.1} ms)",
            ms(main_total),
            ms(truth.wall_process)
        ));
    }
    let holder_total = table.thread_total("holder");
    if holder_total < 0.9 * truth.wall_holder || holder_total > 1.1 * truth.wall_holder + 20e6 {
        problems.push(format!(
            "holder thread: {:.1} ms of wall time, its function ran {:.1} ms (allowed -10% to \
             +10% + 20 ms)",
            ms(holder_total),
            ms(truth.wall_holder)
        ));
    }
    check_close(
        "main thread, sleeper, reason sleep",
        table.get("main", "sleeper", "sleep"),
        truth.sleep,
        0.10,
        &mut problems,
    );
    check_close(
        "main thread, wait_lock, reason lock",
        table.get("main", "wait_lock", "lock"),
        truth.lock,
        0.10,
        &mut problems,
    );

    let report = format!(
        "{} --event wall: {} samples\n{}{}main thread {:.1} ms in all, {:.1} ms under \
         run_rounds ({:.1} ms of spin's wait for a CPU not expected in it); holder thread \
         {:.1} ms\nsummary:\n{}\n",
        interp.label,
        profile.samples.len(),
        truth.render(),
        table.render(),
        ms(main_total),
        ms(under_rounds),
        ms(waited_in_spin),
        ms(holder_total),
        offcpu_summary(&out)
    );
    println!("{report}");
    assert!(
        problems.is_empty(),
        "{}:\n- {}\n{report}\n{out}",
        interp.label,
        problems.join("\n- ")
    );
}
