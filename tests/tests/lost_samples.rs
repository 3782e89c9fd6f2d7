//! Lost samples are counted and reported, never silent: spanprof is stopped (SIGSTOP, as when
//! it is descheduled on a loaded host) while the kernel keeps sampling into a small ring buffer.

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use spanprof_tests::{profiling_lock, require_profiling, spanprof_command, TempDir, Workload};

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child we started and have not reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

#[test]
fn ring_buffer_overflow_is_counted_and_reported() {
    require_profiling();
    let _lock = profiling_lock();
    let dir = TempDir::new("lost");
    let workload = Workload::start("cpu_split", 6.0);
    let out = dir.join("lost.folded");
    let mut child = spanprof_command([
        "profile",
        "--frequency",
        "1000",
        "--ring-buffer-size",
        "8192",
        "--duration",
        "3s",
        "--pid",
        &workload.pid().to_string(),
        "-o",
    ])
    .arg(&out)
    .stderr(Stdio::piped())
    .spawn()
    .expect("spanprof starts");
    std::thread::sleep(Duration::from_millis(800));
    // An 8 KiB ring holds ~90 records of cpu_split's 5-frame stacks; at 1000 Hz a one-second
    // stop overflows it ~10 times over.
    signal(child.id(), libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(1));
    signal(child.id(), libc::SIGCONT);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{stderr}");

    let summary = stderr
        .lines()
        .find(|l| l.contains(" samples, ") && l.contains(" lost"))
        .unwrap_or_else(|| panic!("no summary line:\n{stderr}"));
    let lost: u64 = summary
        .split(" samples, ")
        .nth(1)
        .and_then(|rest| rest.split(" lost").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no lost count in {summary:?}"));
    assert!(lost >= 500, "expected hundreds of lost samples:\n{stderr}");
    assert!(
        stderr.contains("ring buffer was full"),
        "a warning names the cause:\n{stderr}"
    );
    // What was gathered is still written.
    assert!(std::fs::metadata(&out).unwrap().len() > 0);
}
