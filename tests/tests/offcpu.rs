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
//! Failure messages carry the per-thread, per-function, per-reason table (also printed by
//! `--nocapture` runs, with the off-CPU time that went to other reasons and functions).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use spanprof_tests::{
    args, decode_pprof, folded_total, last_json_line, profile_pid, profiling_lock,
    py_workload_source, pyenv_python, read_folded, require_root, run_spanprof, sample_functions,
    sample_num_label, sample_str_labels, spanprof_bin, system_python, workload_path, Background,
    RunOutput, TempDir,
};

/// Sampling rate of every session here: a 2 ms period, for on-CPU figures within a few %.
const FREQUENCY: u32 = 499;
/// Rounds of each workload.
const ROUNDS: u32 = 5;
/// The reasons spanprof names.
const REASONS: [&str; 5] = ["sleep", "lock", "io", "gil", "other"];
/// The label of an off-CPU sample's reason.
const REASON_LABEL: &str = "off_cpu.reason";

/// A CPython interpreter under test.
struct Interp {
    path: PathBuf,
    label: String,
    /// Run by `chroot` into this Debian sid rootfs (`path` is the rootfs's).
    chroot: Option<PathBuf>,
}

impl Interp {
    #[track_caller]
    fn pyenv(minor: u8) -> Self {
        let path = pyenv_python(minor);
        let label = format!("pyenv {}", path.display());
        Self {
            path,
            label,
            chroot: None,
        }
    }

    /// Debian sid's stripped python3.`minor`, in a chroot of the rootfs.
    #[track_caller]
    fn sid_chroot(minor: u8) -> Self {
        Self {
            path: PathBuf::from(format!("/usr/bin/python3.{minor}")),
            label: format!("Debian sid python3.{minor} in a chroot"),
            chroot: Some(spanprof_tests::rootfs::rootfs()),
        }
    }

    #[track_caller]
    fn debian_3_11() -> Self {
        Self {
            path: system_python("/usr/bin/python3.11", "python3.11"),
            label: "Debian /usr/bin/python3.11".into(),
            chroot: None,
        }
    }
}

/// Everything a test here needs before it takes the lock.
#[track_caller]
fn require_offcpu_profiling() {
    require_root();
    spanprof_bin();
}

/// The pseudo-frame at the root of an off-CPU stack.
fn reason_frame(reason: &str) -> String {
    format!("[off-cpu: {reason}]")
}

fn ms(ns: f64) -> f64 {
    ns / 1e6
}

// ---------------------------------------------------------------------------
// Decoded profiles
// ---------------------------------------------------------------------------

/// One decoded pprof sample, reduced to what the checks here need.
#[derive(Debug)]
struct Sample {
    /// The `thread.id` label.
    tid: Option<i64>,
    /// Function names, root first (Python frames by qualname, without their location).
    functions: Vec<String>,
    /// The `off_cpu.reason` label.
    reason: Option<String>,
    /// The values, by sample type (`samples`, `cpu`, `off_cpu`, `wall`).
    values: BTreeMap<String, i64>,
}

impl Sample {
    fn value(&self, kind: &str) -> i64 {
        self.values.get(kind).copied().unwrap_or(0)
    }

    fn root(&self) -> &str {
        self.functions
            .first()
            .map_or("<empty stack>", String::as_str)
    }
}

/// A decoded profile.
#[derive(Debug)]
struct Profile {
    /// `(type, unit)` of each sample type, in order.
    sample_types: Vec<(String, String)>,
    period: i64,
    /// The session's start, Unix time in nanoseconds (`time_nanos`).
    start_ns: i64,
    samples: Vec<Sample>,
}

impl Profile {
    #[track_caller]
    fn read(path: &Path) -> Self {
        let json = decode_pprof(path);
        let pair = |v: &serde_json::Value| {
            (
                v["type"].as_str().unwrap_or("?").to_owned(),
                v["unit"].as_str().unwrap_or("?").to_owned(),
            )
        };
        let sample_types: Vec<(String, String)> = json["sample_types"]
            .as_array()
            .expect("sample_types")
            .iter()
            .map(pair)
            .collect();
        let samples = json["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .map(|s| {
                let mut functions = sample_functions(s);
                functions.reverse();
                let values = sample_types
                    .iter()
                    .zip(s["values"].as_array().expect("values"))
                    .map(|((kind, _), v)| (kind.clone(), v.as_i64().expect("integer value")))
                    .collect();
                Sample {
                    tid: sample_num_label(s, "thread.id"),
                    functions,
                    reason: sample_str_labels(s).remove(REASON_LABEL),
                    values,
                }
            })
            .collect();
        Self {
            sample_types,
            period: json["period"].as_i64().unwrap_or(0),
            start_ns: json["time_nanos"].as_i64().unwrap_or(0),
            samples,
        }
    }

    /// The sample types as `type/unit` strings.
    fn type_names(&self) -> Vec<String> {
        self.sample_types
            .iter()
            .map(|(t, u)| format!("{t}/{u}"))
            .collect()
    }
}

/// What a sample is in the table: on CPU, or off CPU for a reason.
fn column(sample: &Sample) -> String {
    match &sample.reason {
        Some(reason) => reason.clone(),
        None if sample.root().starts_with("[off-cpu") => "(no label)".into(),
        None => "on-CPU".into(),
    }
}

/// The functions of the workloads a sample is put under: the innermost of these on its stack.
const FUNCTIONS: [&str; 10] = [
    "waiter",
    "sleeper",
    "wait_lock",
    "spin",
    "holder",
    "run_rounds",
    "nap",
    "sleep_rounds",
    "start_and_join",
    "<module>",
];

fn function_of(sample: &Sample) -> &'static str {
    sample
        .functions
        .iter()
        .rev()
        .find_map(|f| FUNCTIONS.iter().find(|known| *known == f).copied())
        .unwrap_or("(other)")
}

/// Nanoseconds per (thread, function) and column ([`column`]): the weight of each sample is
/// `weight(sample)`.
struct Table {
    cells: BTreeMap<(String, &'static str), BTreeMap<String, i64>>,
}

impl Table {
    fn of(profile: &Profile, threads: &[(i64, &str)], weight: impl Fn(&Sample) -> i64) -> Self {
        let mut cells: BTreeMap<(String, &'static str), BTreeMap<String, i64>> = BTreeMap::new();
        for sample in &profile.samples {
            let thread = match sample.tid {
                Some(tid) => threads
                    .iter()
                    .find(|(t, _)| *t == tid)
                    .map_or_else(|| format!("tid {tid}"), |(_, name)| (*name).to_owned()),
                None => "(no thread.id)".to_owned(),
            };
            *cells
                .entry((thread, function_of(sample)))
                .or_default()
                .entry(column(sample))
                .or_default() += weight(sample);
        }
        Self { cells }
    }

    /// Nanoseconds of `thread` in `function` in column `column` (`on-CPU` or a reason).
    fn get(&self, thread: &str, function: &str, column: &str) -> f64 {
        self.cells
            .iter()
            .filter(|((t, f), _)| t == thread && *f == function)
            .filter_map(|(_, cols)| cols.get(column))
            .sum::<i64>() as f64
    }

    /// Nanoseconds of `thread` in `function`, every column.
    fn function_total(&self, thread: &str, function: &str) -> f64 {
        self.cells
            .iter()
            .filter(|((t, f), _)| t == thread && *f == function)
            .flat_map(|(_, cols)| cols.values())
            .sum::<i64>() as f64
    }

    /// Nanoseconds of `thread`, everything.
    fn thread_total(&self, thread: &str) -> f64 {
        self.cells
            .iter()
            .filter(|((t, _), _)| t == thread)
            .flat_map(|(_, cols)| cols.values())
            .sum::<i64>() as f64
    }

    /// The table in milliseconds, one row per (thread, function), one column per kind of time.
    fn render(&self) -> String {
        let mut columns = vec!["on-CPU".to_owned()];
        columns.extend(REASONS.iter().map(|r| (*r).to_owned()));
        for cols in self.cells.values() {
            for c in cols.keys() {
                if !columns.contains(c) {
                    columns.push(c.clone());
                }
            }
        }
        let mut text = format!("{:<16} {:<14}", "thread", "function");
        for c in &columns {
            text.push_str(&format!(" {c:>10}"));
        }
        text.push_str("   (ms; off-CPU by reason)\n");
        for ((thread, function), cols) in &self.cells {
            text.push_str(&format!("{thread:<16} {function:<14}"));
            for c in &columns {
                match cols.get(c) {
                    Some(ns) => text.push_str(&format!(" {:>10.1}", ms(*ns as f64))),
                    None => text.push_str(&format!(" {:>10}", "-")),
                }
            }
            text.push('\n');
        }
        text
    }
}

/// Checks what holds of every sample of a profile with off-CPU samples: an off-CPU sample (one
/// with the reason label, or whose root is an `[off-cpu: …]` frame) has a known reason, and its
/// root frame is that reason's pseudo-frame.
fn check_reasons(profile: &Profile, problems: &mut Vec<String>) {
    let mut bad = BTreeMap::<String, usize>::new();
    for sample in &profile.samples {
        let root = sample.root();
        match &sample.reason {
            Some(reason) => {
                if !REASONS.contains(&reason.as_str()) {
                    *bad.entry(format!("unknown reason {reason:?}")).or_default() += 1;
                }
                if root != reason_frame(reason) {
                    *bad.entry(format!(
                        "reason {reason} with root frame {root:?}, not {:?}",
                        reason_frame(reason)
                    ))
                    .or_default() += 1;
                }
            }
            None if root.starts_with("[off-cpu") => {
                *bad.entry(format!(
                    "root frame {root:?} without a {REASON_LABEL} label"
                ))
                .or_default() += 1;
            }
            None => {}
        }
        if sample
            .functions
            .iter()
            .skip(1)
            .any(|f| f.starts_with("[off-cpu"))
        {
            *bad.entry("an [off-cpu: …] frame below the root".into())
                .or_default() += 1;
        }
    }
    for (what, n) in bad {
        problems.push(format!("{n} sample(s): {what}"));
    }
}

/// `measured` within ±`tolerance` (a fraction) of `truth`; a problem naming `what` otherwise.
fn check_close(what: &str, measured: f64, truth: f64, tolerance: f64, problems: &mut Vec<String>) {
    let off = (measured - truth) / truth;
    // NB: a NaN (no truth) fails too.
    if off.is_nan() || off.abs() > tolerance {
        problems.push(format!(
            "{what}: {:.1} ms, truth {:.1} ms ({:+.1}%, allowed ±{:.0}%)",
            ms(measured),
            ms(truth),
            100.0 * off,
            100.0 * tolerance
        ));
    }
}

/// `measured` at most `share` of `truth`.
fn check_at_most(what: &str, measured: f64, truth: f64, share: f64, problems: &mut Vec<String>) {
    if measured > share * truth {
        problems.push(format!(
            "{what}: {:.1} ms, more than {:.0}% of {:.1} ms",
            ms(measured),
            100.0 * share,
            ms(truth)
        ));
    }
}

/// The off-CPU lines of the summary (for `--nocapture` runs).
fn offcpu_summary(out: &RunOutput) -> String {
    out.stderr
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("off-cpu") || l.contains("off_cpu")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------
// The Python workload
// ---------------------------------------------------------------------------

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
fn cpu_and_offcpu(interp: &Interp) {
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
fn wall(interp: &Interp) {
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

/// `--event offcpu --frequency 499 -- offcpu_sleep ROUNDS US`: the off-CPU time under `nap`
/// with reason sleep within ±`tolerance` of the time the workload measured around its
/// nanosleeps, at most 5% of it under another reason.
fn native_sleeps(rounds: u32, us: u32, tolerance: f64) {
    require_offcpu_profiling();
    let program = workload_path("offcpu_sleep");
    let _lock = profiling_lock();
    let tmp = TempDir::new("offcpu-native");
    let pprof = tmp.join("native.pb.gz");
    let out = run_spanprof(args![
        "profile",
        "--event",
        "offcpu",
        "--frequency",
        FREQUENCY.to_string(),
        "-o",
        pprof,
        "--",
        program,
        rounds.to_string(),
        us.to_string()
    ]);
    out.assert_success();
    let json = last_json_line(&out.stdout);
    let truth = json["nap_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("no nap_seconds in {json}\n{out}"))
        * 1e9;
    let pid = out
        .stdout
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<i64>().ok())
        .unwrap_or_else(|| panic!("offcpu_sleep printed no pid first\n{out}"));
    let profile = Profile::read(&pprof);
    let mut problems = Vec::new();
    if profile.type_names() != ["off_cpu/nanoseconds"] {
        problems.push(format!(
            "sample types {:?}, expected [\"off_cpu/nanoseconds\"]",
            profile.type_names()
        ));
    }
    check_reasons(&profile, &mut problems);
    let unlabelled = profile
        .samples
        .iter()
        .filter(|s| s.reason.is_none())
        .count();
    if unlabelled > 0 {
        problems.push(format!(
            "{unlabelled} sample(s) of an off-CPU-only profile without {REASON_LABEL}"
        ));
    }
    let table = Table::of(&profile, &[(pid, "main")], |s| s.value("off_cpu"));
    let nap_sleep = table.get("main", "nap", "sleep");
    check_close(
        "nap, reason sleep",
        nap_sleep,
        truth,
        tolerance,
        &mut problems,
    );
    let nap_other: f64 = REASONS
        .iter()
        .filter(|r| **r != "sleep")
        .map(|r| table.get("main", "nap", r))
        .sum::<f64>()
        + 0.0;
    check_at_most("nap, other reasons", nap_other, truth, 0.05, &mut problems);
    let period = 1e9 / f64::from(FREQUENCY);
    let report = format!(
        "offcpu_sleep {rounds} × {us} µs: {} samples, nanosleep measured {:.1} ms ({:.1} µs \
         each), recorded under nap/sleep {:.1} ms = {:.2} periods of {:.0} ns\n{}summary:\n{}\n",
        profile.samples.len(),
        ms(truth),
        truth / 1e3 / f64::from(rounds),
        ms(nap_sleep),
        nap_sleep / period,
        period,
        table.render(),
        offcpu_summary(&out)
    );
    println!("{report}");
    assert!(
        problems.is_empty(),
        "offcpu_sleep:\n- {}\n{report}\n{out}",
        problems.join("\n- ")
    );
}

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

/// Three Python threads spinning on two CPUs wait for the GIL: that time is `gil`, whatever
/// symbols the interpreter has (Debian's python3.11 is stripped: its GIL waits are known by
/// their callers in the interpreter's module), and the main thread's `join()` is `lock`.
/// Bounds: of each spinner's off-CPU time at least 80% is `gil` (the rest: waits at start and
/// exit, I/O at import); of the main thread's, at least 90% `lock`.
fn gil_waits(interp: &Interp) {
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
    // reading files; a CI run in a fresh chroot: 418 ms), which is not what this test is about.
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
