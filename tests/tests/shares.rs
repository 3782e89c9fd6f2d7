//! The profile of a workload with a known 3:1 split of CPU time is right
//! within ±5 points, with the full call path, and the session summary
//! reports it.

use spanprof_tests::{
    assert_cpu_split_truth, folded_summary, folded_total, parse_summary, profile_pid,
    profiling_lock, read_folded, require_profiling, TempDir, Workload,
};

#[test]
fn cpu_split_shares_match_the_3_to_1_truth() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("shares");
    let folded = tmp.join("cpu_split.folded");
    let workload = Workload::start("cpu_split", 10.0);

    let out = profile_pid(workload.pid(), "3s", 499, &[&folded], &[]);
    out.assert_success();
    let stacks = read_folded(&folded);
    let total = folded_total(&stacks);
    let top = folded_summary(&stacks, 15);

    // 499 Hz for 3 s is ~1500 samples of a process that is always on CPU;
    // half of that leaves room for a busy machine.
    assert_cpu_split_truth(&stacks, 700, "cpu_split", &format!("{top}\n{out}"));

    // The summary at the end: samples and lost samples as in the output,
    // then the top functions.
    let stderr = &out.stderr;
    let summary = parse_summary(stderr).unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert_eq!(
        summary.samples, total,
        "the summary's sample count differs from the folded total\n{out}"
    );
    assert_eq!(summary.lost, 0, "samples were lost\n{out}");
    assert_eq!(
        (summary.processes, summary.frequency),
        (1, 499),
        "the summary's process count and frequency\n{out}"
    );
    // `  75.1%     1123  hot_alpha`: the name is the last field.
    let top_functions: Vec<&str> = stderr
        .lines()
        .skip_while(|l| *l != "top functions (self):")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(
        top_functions.get(..2),
        Some(&["hot_alpha", "hot_beta"][..]),
        "the summary's top functions do not start with hot_alpha, hot_beta\n{out}"
    );
    drop(workload);
}
