//! Off-CPU profiling (`--event offcpu`, `--event cpu,offcpu`, `--event wall`) against the
//! times the workloads measure themselves.
//!
//! `tests/workloads/py_offcpu.py` runs 5 rounds on its main thread of `sleeper` (time.sleep
//! 0.1 s), `wait_lock` (a `threading.Lock` its `holder` thread holds for 0.1 s) and `spin` (0.1 s
//! of CPU in pure Python), each measured around the call; `offcpu_sleep` (built by `cargo xtask
//! workloads` from `xtask/workloads/offcpu_sleep.c`) sleeps in nanosleep 100 ms × 5. Every
//! profile is decoded by the independent decoder (`tests/tools/decode_pprof.py`).
//! - `cpu_and_offcpu_*` (pyenv 3.9, 3.11, 3.12, 3.13 and Debian's python3.11, `--event
//!   cpu,offcpu --frequency 499`): sample types `[samples/count, cpu/nanoseconds,
//!   off_cpu/nanoseconds]`; every sample is on-CPU (a count, `cpu` = count × period) or off-CPU
//!   (nanoseconds only, label `off_cpu.reason` one of sleep/lock/io/gil/other, root frame
//!   `[off-cpu: REASON]`); on the main thread the off-CPU ns of `sleeper` with reason sleep and
//!   of `wait_lock` with reason lock are within ±10% of the measured waits, at most 5% of each
//!   goes to the other one's reason, `spin`'s on-CPU time (count × period) is within ±25% of its
//!   measured CPU time; the holder's sleep in `holder` is within ±10% of its measured sleeps;
//!   the folded output of the same session weighs in nanoseconds (its total is the pprof's
//!   on-CPU plus off-CPU nanoseconds) and roots off-CPU stacks at the same pseudo-frames.
//! - `wall_*` (pyenv 3.12, Debian's python3.11, `--event wall --frequency 499`): sample type
//!   `[wall/nanoseconds]`; the main thread's wall time under `run_rounds` within ±10% of the
//!   rounds' wall time less the time `spin` waited for a CPU (not in a wall profile built of
//!   on-CPU ticks and blocked intervals), its whole wall time no more than the process lived;
//!   the holder thread's wall time within ±10% of its life; `sleeper`'s and `wait_lock`'s
//!   blocked time still named by their reasons.
//! - `native_nanosleep_is_sleep` (`--event offcpu`): sample type `[off_cpu/nanoseconds]`, the
//!   off-CPU ns under `nap` with reason sleep within ±10% of the measured sleeps, nothing of
//!   `nap` under another reason beyond 5%; `native_short_sleeps_are_sampled_without_bias`: the
//!   same with 4000 sleeps of 500 µs, each shorter than the 2 ms period, so only about one in
//!   3.5 is kept (weighing a period): the total is still within ±15% (5 standard deviations).
//!
//! - `last_wait_named_*` (pyenv 3.11, 3.13): a process whose main thread ends joining its
//!   workers, or sleeping (then exiting normally or by `os._exit`), keeps the wait's Python
//!   names in 10 of 10 runs (`last_wait.rs`).
//! - `asyncio_idle_*` (pyenv 3.8, 3.11, 3.13): an asyncio loop's waits in its selector are
//!   `[off-cpu: asyncio_idle]`, not `io` (`asyncio_idle.rs`).
//!
//! Failure messages carry the per-thread, per-function, per-reason table (also printed by
//! `--nocapture` runs, with the off-CPU time that went to other reasons and functions).
//!
//! The tests are declared here; the decoded profiles and their checks are in `profile`, the
//! parts' checks in `py_workload`, `native` and `gil`, what they share in `common`.

use spanprof_tests::{profile_pid, profiling_lock, py_workload_source, Background, TempDir};

use asyncio_idle::asyncio_idle;
use common::{ms, require_offcpu_profiling, Interp, FREQUENCY, ROUNDS};
use gil::gil_waits;
use idle::idle_threads_fill_a_wall_profile;
use last_wait::last_wait_named;
use native::native_sleeps;
use profile::{check_reasons, offcpu_summary, Profile, Table};
use py_workload::{cpu_and_offcpu, wall};

mod asyncio_idle;
mod common;
mod gil;
mod idle;
mod last_wait;
mod native;
mod profile;
mod py_workload;

// ---------------------------------------------------------------------------
// Decoded profiles
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// The Python workload
// ---------------------------------------------------------------------------

#[test]
fn cpu_and_offcpu_3_9() {
    cpu_and_offcpu(&Interp::pyenv(9));
}

#[test]
fn cpu_and_offcpu_3_11() {
    cpu_and_offcpu(&Interp::pyenv(11));
}

#[test]
fn cpu_and_offcpu_3_12() {
    cpu_and_offcpu(&Interp::pyenv(12));
}

#[test]
fn cpu_and_offcpu_3_13() {
    cpu_and_offcpu(&Interp::pyenv(13));
}

/// Debian's own python3.11: stripped, no frame pointers, statically linked interpreter.
#[test]
fn cpu_and_offcpu_debian_3_11() {
    cpu_and_offcpu(&Interp::debian_3_11());
}

#[test]
fn wall_3_12() {
    wall(&Interp::pyenv(12));
}

#[test]
fn wall_debian_3_11() {
    wall(&Interp::debian_3_11());
}

// ---------------------------------------------------------------------------
// Native
// ---------------------------------------------------------------------------

/// nanosleep 100 ms × 5: every sleep is longer than the 2 ms period, so each is recorded whole.
#[test]
fn native_nanosleep_is_sleep() {
    native_sleeps(ROUNDS, 100_000, 0.10);
}

/// nanosleep 500 µs × 4000 (each ~0.55–0.6 ms with the timer slack): every sleep is shorter
/// than the 2 ms period, so about one in 3.5 is kept, weighing a period. The count kept is
/// binomial (n = 4000, p ≈ 0.29, ~1160 kept): its standard deviation is 2.5% of the mean. The
/// truth, timed around each call, also holds the call's own microseconds and the wake-up's wait
/// for a CPU, which are not blocked time (about 2% here). So ±15% is more than 5 standard
/// deviations away on either side (a spurious failure is a one-in-ten-million draw), and still
/// fails a sampler that is biased, e.g. one that keeps intervals with probability d/P but
/// weighs them d (~29% of the truth), or keeps every one at weight P (~3.5 times it).
#[test]
fn native_short_sleeps_are_sampled_without_bias() {
    native_sleeps(4000, 500, 0.15);
}

#[test]
fn last_wait_named_3_11() {
    last_wait_named(&Interp::pyenv(11));
}

#[test]
fn last_wait_named_3_13() {
    last_wait_named(&Interp::pyenv(13));
}

#[test]
fn asyncio_idle_3_8() {
    asyncio_idle(&Interp::pyenv(8));
}

#[test]
fn asyncio_idle_3_11() {
    asyncio_idle(&Interp::pyenv(11));
}

#[test]
fn asyncio_idle_3_13() {
    asyncio_idle(&Interp::pyenv(13));
}

#[test]
fn gil_waits_3_12() {
    gil_waits(&Interp::pyenv(12));
}

#[test]
fn gil_waits_3_9() {
    gil_waits(&Interp::pyenv(9));
}

/// Debian sid's stripped 3.14 and 3.15 in a chroot.
#[test]
fn gil_waits_sid_3_14_in_a_chroot() {
    gil_waits(&Interp::sid_chroot(14));
}

#[test]
fn gil_waits_sid_3_15_in_a_chroot() {
    gil_waits(&Interp::sid_chroot(15));
}

/// Stripped: `take_gil` is an unknown address in python3.11.
#[test]
fn gil_waits_debian_3_11() {
    gil_waits(&Interp::debian_3_11());
}

/// Threads already blocked when a `--pid` session starts are counted from its start, with their
/// whole stacks: three threads wait on an Event set 3 s after the workload is ready, the session
/// starts right after, so each waits about 3 s less spanprof's start-up inside the session.
/// Without that, a thread that does not block again in the session is not in it at all. Bound:
/// each waiter has at least 80% of its wait inside the session (from the profile's start time to
/// the Unix time the workload set the Event) as `lock` with Python frames, and never more than
/// its measured wait. Start-up is outside the session and varies with load (0.3 s idle, 1.1 s in
/// a CI run), hence the bound on the part inside it; a start-up leaving under 1 s is a failure.
#[test]
fn threads_blocked_before_the_session_count_from_its_start() {
    require_offcpu_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("offcpu-before");
    let pprof = tmp.join("before.pb.gz");
    let interp = Interp::pyenv(12);
    let mut cmd = std::process::Command::new(&interp.path);
    cmd.arg(py_workload_source("py_wake_later.py")).arg("3.0");
    let mut workload = Background::spawn(cmd);
    let ready = workload.wait_for_stderr("ready", std::time::Duration::from_secs(20));
    let tids: Vec<i64> = ready
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    assert_eq!(tids.len(), 3, "waiter tids: {ready}");
    let out = profile_pid(
        workload.pid(),
        "6s",
        FREQUENCY,
        &[&pprof],
        &["--event", "offcpu"],
    );
    out.assert_success();
    let finished = workload.finish(std::time::Duration::from_secs(30));
    let truth: serde_json::Value = finished
        .stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON from py_wake_later.py\n{finished}"));
    let profile = Profile::read(&pprof);
    let mut problems = Vec::new();
    check_reasons(&profile, &mut problems);
    let set_at_ns = truth["set_at"].as_f64().unwrap_or(0.0) * 1e9;
    let in_session = set_at_ns - profile.start_ns as f64;
    if in_session < 1e9 {
        problems.push(format!(
            "the Event was set {:.1} ms after the session started: too little of the 3 s wait \
             is in the session to check",
            ms(in_session)
        ));
    }
    let names = ["waiter 1", "waiter 2", "waiter 3"];
    let threads: Vec<(i64, &str)> = tids.iter().copied().zip(names).collect();
    let table = Table::of(&profile, &threads, |s| s.value("off_cpu"));
    for (tid, name) in &threads {
        let wait = truth["waits"][tid.to_string()].as_f64().unwrap_or(0.0) * 1e9;
        let lock: f64 = table
            .cells
            .iter()
            .filter(|((t, _), _)| t == name)
            .filter_map(|(_, cols)| cols.get("lock"))
            .sum::<i64>() as f64;
        let all = table.thread_total(name);
        if lock < 0.8 * in_session.min(wait) || all > wait * 1.02 + 5e6 {
            problems.push(format!(
                "{name} (tid {tid}): {:.1} ms lock, {:.1} ms in all, of a {:.1} ms wait, \
                 {:.1} ms of it in the session (expected at least 80% of that, lock, and \
                 never more than the wait)",
                ms(lock),
                ms(all),
                ms(wait),
                ms(in_session)
            ));
        }
        let under_waiter = table
            .cells
            .iter()
            .filter(|((t, f), _)| t == name && *f != "(other)")
            .count();
        if lock > 0.0 && under_waiter == 0 {
            problems.push(format!("{name}: its lock time has no Python frames"));
        }
    }
    assert!(
        problems.is_empty(),
        "threads blocked before the session\n- {}\n{}\n{}",
        problems.join("\n- "),
        table.render(),
        offcpu_summary(&out)
    );
}

// ---------------------------------------------------------------------------
// A process none of whose threads wakes in the session
// ---------------------------------------------------------------------------

#[test]
fn idle_threads_fill_a_wall_profile_3_8() {
    idle_threads_fill_a_wall_profile(&Interp::pyenv(8), &[]);
}

#[test]
fn idle_threads_fill_a_wall_profile_3_12() {
    idle_threads_fill_a_wall_profile(&Interp::pyenv(12), &[]);
}

#[test]
fn idle_threads_fill_a_wall_profile_unwind_fp_3_12() {
    idle_threads_fill_a_wall_profile(&Interp::pyenv(12), &["--unwind", "fp"]);
}
