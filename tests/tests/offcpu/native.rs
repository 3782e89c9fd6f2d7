//! Native: `offcpu_sleep` under `--event offcpu`.

use spanprof_tests::{args, last_json_line, profiling_lock, run_spanprof, workload_path, TempDir};

use crate::common::{ms, require_offcpu_profiling, FREQUENCY, REASONS, REASON_LABEL};
use crate::profile::{check_at_most, check_close, check_reasons, offcpu_summary, Profile, Table};

/// `--event offcpu --frequency 499 -- offcpu_sleep ROUNDS US`: the off-CPU time under `nap`
/// with reason sleep within ±`tolerance` of the time the workload measured around its
/// nanosleeps, at most 5% of it under another reason.
pub(super) fn native_sleeps(rounds: u32, us: u32, tolerance: f64) {
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
