//! PLT stubs, end to end: `plt_calls` spends a good part of its time in the stub through
//! which it calls `plt_tiny` of `libspanprof_plt.so`. The stub is named `plt_tiny@plt`, as
//! perf names stubs, never after the symbol before it (`_init`, in `.init` just before
//! `.plt`): in the lazy-binding `.plt` (`plt_calls`) and in `.plt.sec` (`plt_calls_ibt`, built
//! with `-z ibtplt -z now`).

use spanprof_tests::{
    args, folded_count, folded_summary, folded_total, profiling_lock, read_folded,
    require_profiling, run_spanprof, workload_path, TempDir,
};

fn stub_is_named(program: &str) {
    require_profiling();
    let path = workload_path(program);
    workload_path("libspanprof_plt.so");
    let _lock = profiling_lock();
    let tmp = TempDir::new("plt");
    let folded = tmp.join("out.folded");
    let out = run_spanprof(args![
        "profile",
        "--frequency",
        "499",
        "-o",
        &folded,
        "--",
        &path,
        "1.5"
    ]);
    out.assert_success();
    let stacks = read_folded(&folded);
    let total = folded_total(&stacks);
    let leaf = |name: &'static str| {
        move |s: &spanprof_tests::FoldedStack| s.frames.last().map(String::as_str) == Some(name)
    };
    let stub = folded_count(&stacks, leaf("plt_tiny@plt"));
    let tiny = folded_count(&stacks, leaf("plt_tiny"));
    let init = folded_count(&stacks, |s| s.frames.iter().any(|f| f == "_init"));
    let context = format!(
        "{program}: {total} samples, {stub} in plt_tiny@plt, {tiny} in plt_tiny, {init} with \
         _init\n{}\n{out}",
        folded_summary(&stacks, 8)
    );
    println!("{context}");
    assert_eq!(init, 0, "a stub named after its neighbour\n{context}");
    // The stub is a jump: a few percent of the loop's time at least (~20% measured).
    assert!(
        stub >= 10 && stub * 50 >= total,
        "too few samples in plt_tiny@plt\n{context}"
    );
    let under_caller = folded_count(&stacks, |s| {
        s.frames
            .ends_with(&["call_loop".to_string(), "plt_tiny@plt".to_string()])
    });
    assert!(
        under_caller * 10 >= stub * 9,
        "plt_tiny@plt not under call_loop: {under_caller} of {stub}\n{context}"
    );
}

#[test]
fn lazy_plt_stub_is_named_after_its_function() {
    stub_is_named("plt_calls");
}

#[test]
fn ibt_plt_sec_stub_is_named_after_its_function() {
    stub_is_named("plt_calls_ibt");
}
