//! The profile of a workload with a known 3:1 split of CPU time is right
//! within ±5 points, with the full call path, and the session summary
//! reports it.

use spanprof_tests::{
    folded_count, folded_summary, folded_total, parse_summary, profile_pid, profiling_lock,
    read_folded, require_profiling, TempDir, Workload,
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

    let dispatcher = folded_count(&stacks, |s| s.contains("dispatcher"));
    let alpha = folded_count(&stacks, |s| {
        s.contains_seq(&["main", "dispatcher", "hot_alpha"])
    });
    let beta = folded_count(&stacks, |s| {
        s.contains_seq(&["main", "dispatcher", "hot_beta"])
    });

    // 499 Hz for 3 s is ~1500 samples of a process that is always on CPU;
    // half of that leaves room for a busy machine.
    assert!(
        dispatcher >= 700,
        "only {dispatcher} of {total} samples are under dispatcher:\n{top}\n{out}"
    );
    // Every sample under dispatcher should be in one of the two hot
    // functions, reached through main -> dispatcher (the full path).
    assert!(
        (alpha + beta) as f64 >= 0.95 * dispatcher as f64,
        "{alpha} + {beta} of {dispatcher} dispatcher samples have the full path \
         main;dispatcher;hot_*:\n{top}"
    );
    // The process does little but dispatch.
    assert!(
        dispatcher as f64 >= 0.90 * total as f64,
        "{dispatcher} of {total} samples are under dispatcher:\n{top}"
    );

    let alpha_share = 100.0 * alpha as f64 / (alpha + beta) as f64;
    assert!(
        (alpha_share - 75.0).abs() <= 5.0,
        "hot_alpha has {alpha_share:.1}% of the hot samples ({alpha} vs hot_beta {beta}), \
         expected 75 ± 5:\n{top}"
    );

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
