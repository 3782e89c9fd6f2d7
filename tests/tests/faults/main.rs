//! The fault-injection suite: the failures a fault-injection run found (issue 18), each kept as
//! a test so it stays fixed. One module per kind of fault:
//! - `io`: outputs that are device nodes or FIFOs, inputs that are FIFOs, devices or huge files;
//! - `overhead`: the self-reported overhead of a session with lost records, against `/proc`;
//! - `backoff`: the daemon's export backoff with its collector down and its queue full;
//! - `memory`: the daemon's memory while hundreds of distinct binaries come and go;
//! - `children`: short-lived children of `profile -- CMD`, named though they have exited;
//! - `decode`: small profile files that would decode into gigabytes;
//! - `modules`: module files whose debug sections would make the symbolizer allocate without bound.

mod backoff;
mod children;
mod decode;
mod io;
mod memory;
mod modules;
mod overhead;

use std::time::Duration;

/// Runs spanprof with `args` under a small Python parent that reports the peak RSS of its child
/// (`RUSAGE_CHILDREN`; measured from a parent of our own, a child of this test process would
/// carry the test's own peak into its figure), killed after `limit`: (exit status, stderr, time
/// taken, peak RSS in bytes).
pub(crate) fn run_bounded(
    args: &[&std::ffi::OsStr],
    limit: Duration,
) -> (i32, String, Duration, u64) {
    const PARENT: &str = "import resource, subprocess, sys, time\n\
        t = time.monotonic()\n\
        try:\n    p = subprocess.run(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, \
        stderr=subprocess.PIPE, timeout=float(sys.argv[1]))\n\
        except subprocess.TimeoutExpired:\n    print('timeout'); sys.exit(0)\n\
        took = time.monotonic() - t\n\
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n\
        sys.stderr.buffer.write(p.stderr)\n\
        print(p.returncode, took, rss * 1024)\n";
    let mut cmd = std::process::Command::new(spanprof_tests::python());
    cmd.args(["-c", PARENT])
        .arg(format!("{}", limit.as_secs_f64()))
        .arg(spanprof_tests::spanprof_bin())
        .args(args);
    let out = spanprof_tests::run_with_timeout(cmd, limit + Duration::from_secs(30));
    let words: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_ne!(
        words,
        ["timeout"],
        "{args:?} still ran after {limit:?}: {out}"
    );
    let [code, took, rss] = words[..] else {
        panic!("the measuring parent printed {:?}: {out}", out.stdout)
    };
    (
        code.parse().unwrap(),
        out.stderr.clone(),
        Duration::from_secs_f64(took.parse().unwrap()),
        rss.parse().unwrap(),
    )
}
