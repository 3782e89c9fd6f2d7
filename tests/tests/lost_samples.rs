//! Lost samples are counted and reported, never silent: spanprof is stopped (SIGSTOP, as when
//! it is descheduled on a loaded host) while the kernel keeps sampling into a small ring buffer.

use std::time::Duration;

use spanprof_tests::{
    parse_summary, profiling_lock, require_profiling, spanprof_command, Background, TempDir,
    Workload,
};

#[test]
fn ring_buffer_overflow_is_counted_and_reported() {
    require_profiling();
    let _lock = profiling_lock();
    let dir = TempDir::new("lost");
    let workload = Workload::start("cpu_split", 6.0);
    let out = dir.join("lost.folded");
    let mut cmd = spanprof_command([
        "profile",
        "--frequency",
        "1000",
        // Frame pointers: with --unwind dwarf a record is ~16 KiB and so small a ring is refused.
        "--unwind",
        "fp",
        "--ring-buffer-size",
        "8192",
        "--duration",
        "3s",
        "--pid",
        &workload.pid().to_string(),
        "-o",
    ]);
    cmd.arg(&out);
    let mut run = Background::spawn(cmd);
    run.wait_for_stderr("spanprof: profiling", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    // An 8 KiB ring holds ~90 records of cpu_split's 5-frame stacks; at 1000 Hz a one-second
    // stop overflows it ~10 times over.
    run.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(1));
    run.signal(libc::SIGCONT);
    let result = run.finish(Duration::from_secs(30));
    result.assert_success();
    let stderr = &result.stderr;

    let lost = parse_summary(stderr)
        .unwrap_or_else(|e| panic!("{e}\n{stderr}"))
        .lost;
    assert!(lost >= 500, "expected hundreds of lost samples:\n{stderr}");
    assert!(
        stderr.contains("ring buffer was full"),
        "a warning names the cause:\n{stderr}"
    );
    // What was gathered is still written.
    assert!(std::fs::metadata(&out).unwrap().len() > 0);
}
