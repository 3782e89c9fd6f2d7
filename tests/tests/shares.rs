//! The profile of a workload with a known 3:1 split of CPU time is right
//! within ±5 points, with the full call path, and the session summary
//! reports it.

use spanprof_tests::{
    args, folded_count, folded_summary, folded_total, profiling_lock, read_folded,
    require_profiling, run_spanprof, TempDir, Workload,
};

#[test]
fn cpu_split_shares_match_the_3_to_1_truth() {
    require_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("shares");
    let folded = tmp.join("cpu_split.folded");
    let workload = Workload::start("cpu_split", 10.0);

    let out = run_spanprof(args![
        "profile",
        "--pid",
        workload.pid().to_string(),
        "--duration",
        "3s",
        "--frequency",
        "499",
        "-o",
        folded,
    ]);
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

    // The summary at the end: samples, lost samples, top functions.
    let stderr = &out.stderr;
    assert!(
        stderr.contains(&total.to_string()),
        "the summary does not show the sample count {total}:\n{out}"
    );
    assert!(
        stderr.to_lowercase().contains("lost"),
        "the summary does not mention lost samples:\n{out}"
    );
    assert!(
        stderr.contains("hot_alpha") && stderr.contains("hot_beta"),
        "the summary's top functions miss hot_alpha/hot_beta:\n{out}"
    );
    drop(workload);
}
