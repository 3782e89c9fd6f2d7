//! Faults: memory (see main.rs). The daemon samples while 200 distinct binaries (copies of
//! `short_children_big`, a few MB of symbols, DWARF and unwind tables each, every copy with its
//! own build id) run for a quarter of a second each and exit, four at a time. Before, what it
//! kept per distinct binary (unwind tables, parsed symbols, the module file) stayed until the
//! symbolizer was rebuilt every 10 minutes: +0.5 MB per distinct 6.8 MB binary, 84 → 346 MB in 7
//! minutes on a busy shared host. Now the parsed symbols are bounded by
//! `limits.symbol_cache_bytes` and a binary's tables go once its processes exited and their
//! samples were symbolized: the daemon's peak stays under the bound + 80 MB and its resident
//! memory comes back to within 10% of where it started.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spanprof_tests::otlp::{self, GrpcSink};
use spanprof_tests::{
    profiling_lock, require_root, spanprof_bin, spanprof_command, workload_path, Background,
    TempDir, Workload,
};

use crate::children::distinct_copies;

/// Distinct binaries run.
const BINARIES: usize = 200;
/// The daemon's `limits.symbol_cache_bytes` here.
const CACHE_LIMIT: u64 = 16 << 20;
/// What the daemon may hold at its peak besides the cache and the file pages it had at the
/// start (its code; its ring buffer of 16 MiB, whose data pages are mapped twice, 32 MiB of
/// RssFile): BPF maps, the exporter, the window's aggregate, and the pages of the children's
/// binaries it maps while it reads their symbols and unwind tables.
const SLACK: u64 = 80 << 20;
/// How much more anonymous memory the daemon may keep once the children are gone than at
/// the start: what its tables keep of their grown capacity and the allocator of its
/// fragments. A leak of what it read of each binary would be ~75 KiB each, 15 MiB for 200.
const KEPT: u64 = 4 << 20;

/// A free local TCP port (free when this returns; the daemon binds it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `spanprof daemon` (the few lines of `tests/tests/daemon.rs`'s helper needed here).
struct Daemon {
    process: Background,
    metrics_port: u16,
}

impl Daemon {
    fn start(dir: &TempDir, config: &str) -> Daemon {
        let metrics_port = free_port();
        let path = dir.join("spanprof.toml");
        std::fs::write(
            &path,
            format!("{config}\n[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"),
        )
        .unwrap();
        let mut cmd = spanprof_command(["daemon", "--config"]);
        cmd.arg(&path);
        let mut process = Background::spawn(cmd);
        process.wait_for_stderr("spanprof daemon: profiling", Duration::from_secs(60));
        Daemon {
            process,
            metrics_port,
        }
    }

    fn metrics(&self) -> BTreeMap<String, f64> {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics_port)).expect("metrics port");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        assert!(head.contains(" 200 "), "{head}");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    fn metric(&self, name: &str) -> f64 {
        *self
            .metrics()
            .get(name)
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    fn wait_metric(&self, name: &str, at_least: f64, timeout: Duration) {
        let end = Instant::now() + timeout;
        while self.metric(name) < at_least {
            assert!(
                Instant::now() < end,
                "{name} < {at_least} after {timeout:?}; stderr:\n{}",
                self.process.stderr_so_far()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `RssAnon` and `VmHWM` of the daemon, in bytes. Anonymous memory (heap, stacks) is what
    /// a leak grows; `VmRSS` also counts file pages (its code, as more of it runs; the ring
    /// buffer's pages; the binaries it maps to read), which say nothing of what it keeps.
    fn memory(&self) -> (u64, u64) {
        (self.status_bytes("RssAnon:"), self.status_bytes("VmHWM:"))
    }

    /// A field of the daemon's /proc/PID/status given in kB, in bytes.
    fn status_bytes(&self, name: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.pid()))
            .expect("the daemon runs");
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{status}"))
            * 1024
    }

    fn stop(self) -> String {
        self.process.signal(libc::SIGTERM);
        // NB: `finish` counts from the start; the daemon gets 60 s from the SIGTERM.
        let limit = self.process.elapsed() + Duration::from_secs(60);
        let out = self.process.finish(limit);
        assert!(out.status.success(), "daemon exit: {out}");
        out.stderr
    }
}

/// A `short_children start …` parent waiting for SIGUSR1, with its pid.
fn start_parent(args: &[&str]) -> (std::process::Child, u32) {
    let mut child = Command::new(workload_path("short_children"))
        .arg("start")
        .args(args)
        .arg("usr1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("short_children starts");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = line.trim().parse().expect("the parent's pid");
    (child, pid)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// The daemon's RssAnon over its next two windows: the median of readings every 200 ms, the
/// level it works at. One reading may fall just after glibc trimmed the heap's top (2.4 MiB was
/// read then where the daemon works at 9.8 MiB) or while a window is symbolized and encoded (up
/// to 24 MiB), and the bound on what the daemon keeps is not on when the allocator last trimmed.
fn working_rss(daemon: &Daemon) -> u64 {
    let windows = daemon.metric("spanprof_windows_total");
    let waited = Instant::now();
    let mut readings = vec![daemon.memory().0];
    while daemon.metric("spanprof_windows_total") < windows + 2.0 {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "spanprof_windows_total < {} after 20 s; stderr:\n{}",
            windows + 2.0,
            daemon.process.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(200));
        readings.push(daemon.memory().0);
    }
    readings.sort_unstable();
    readings[readings.len() / 2]
}

#[test]
fn daemon_memory_is_bounded_while_distinct_binaries_come_and_go() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let dir = TempDir::new("faults-memory");
    let big = workload_path("short_children_big");
    let size = std::fs::metadata(&big).map(|m| m.len()).unwrap_or(0);
    assert!(size > 2 << 20, "{} is only {size} bytes", big.display());
    let prefix = distinct_copies(&big, dir.path(), "big_", BINARIES);
    let prefix = prefix.to_str().unwrap().to_string();
    let warm_prefix = distinct_copies(&big, dir.path(), "warm_", 8);
    // The daemon is warmed up first, the same way on a smaller scale (8 distinct binaries),
    // after two busy children whose samples make its ring buffer (16 MiB of 16 KiB stack
    // copies) go round: the start is measured once it holds what it always holds.
    let (mut busy, busy_pid) = start_parent(&["2", "6000", "2", "fork"]);
    let (mut warm, warm_pid) = start_parent(&["8", "250", "4", warm_prefix.to_str().unwrap()]);
    let (mut parent, ppid) = start_parent(&[&BINARIES.to_string(), "250", "4", &prefix]);
    // Kernel frames in the warm-up: the daemon keeps the kernel's symbols it parsed (about
    // 7 MiB of RssAnon) until it names kernel frames again a minute later, so without them the
    // start would lack what the children's exec and exit frames make it load (2.2 MiB at start
    // against 10.1 after, where 9.4-9.9 at start were read when the warm-up had them).
    let kernel = Workload::start("syscall_heavy", 4.0);
    let kernel_pid = kernel.pid();
    let server = GrpcSink::start();
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nfrequency = 99\nwindow = \"2s\"\n[scope]\npids = [{busy_pid}, {warm_pid}, {ppid}, {kernel_pid}]\n\
             [limits]\nsymbol_cache_bytes = {CACHE_LIMIT}\n[export]\nendpoint = \"{}\"\n",
            server.endpoint()
        ),
    );
    daemon.wait_metric("spanprof_targets", 4.0, Duration::from_secs(15));
    assert_eq!(
        daemon.metric("spanprof_symbol_cache_limit_bytes"),
        CACHE_LIMIT as f64
    );
    for (child, pid) in [(&mut busy, busy_pid), (&mut warm, warm_pid)] {
        Command::new("kill")
            .args(["-USR1", &pid.to_string()])
            .status()
            .unwrap();
        assert!(child.wait().unwrap().success());
    }
    // Two windows after the warm-up: its tables are gone, the ring buffer went round.
    let start = working_rss(&daemon);
    let file_at_start = daemon.status_bytes("RssFile:");
    let modules_at_start = daemon.metric("spanprof_modules");
    let requests_at_start = server.requests().len();
    let cache_at_start = daemon.metric("spanprof_window_symbol_cache_peak_bytes");

    let begun = Instant::now();
    Command::new("kill")
        .args(["-USR1", &ppid.to_string()])
        .status()
        .unwrap();
    let (mut peak_cache, mut peak_modules, mut peak_tables, mut peak_rss) =
        (0.0f64, 0.0f64, 0.0f64, 0u64);
    let status = loop {
        let m = daemon.metrics();
        // Kept between windows, and the most held during the last window's symbolization
        // (the first is read once the exited children's modules were dropped: with children
        // of 250 ms it is mostly 0).
        for name in [
            "spanprof_symbol_cache_bytes",
            "spanprof_window_symbol_cache_peak_bytes",
        ] {
            let cache = m[name];
            assert!(
                cache <= CACHE_LIMIT as f64,
                "{name} {cache} above the bound {CACHE_LIMIT}"
            );
            peak_cache = peak_cache.max(cache);
        }
        peak_modules = peak_modules.max(m["spanprof_modules"]);
        peak_tables = peak_tables.max(m["spanprof_unwind_tables_bytes"]);
        peak_rss = peak_rss.max(daemon.memory().0);
        if let Some(status) = parent.try_wait().unwrap() {
            break status;
        }
        assert!(
            begun.elapsed() < Duration::from_secs(120),
            "the children did not finish"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(status.success(), "short_children: {status}");
    let ran = begun.elapsed();
    // Once they are gone (two windows and two sweeps later), so is what was kept of them:
    // the modules are closed, then the level is read as at the start.
    let settle = Instant::now();
    while daemon.metric("spanprof_modules") > modules_at_start
        && settle.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(500));
    }
    let after = working_rss(&daemon);
    let (_, hwm) = daemon.memory();
    let m = daemon.metrics();
    eprintln!(
        "{BINARIES} distinct binaries of {:.1} MiB in {:.1} s: daemon RssAnon {:.1} MiB at start \
         (RssFile {:.1} MiB), \
         {:.1} MiB at most while they ran (VmHWM {:.1} MiB), {:.1} MiB after {:.1} s; symbol \
         cache at most {:.1} MiB ({:.1} at start, bound {:.1}), unwind tables at most {:.1} MiB, modules open at \
         most {peak_modules} ({modules_at_start} at start, {} after); at the end VmRSS {:.1} MiB, \
         RssFile {:.1} MiB, RssShmem {:.1} MiB",
        mib(size),
        ran.as_secs_f64(),
        mib(start),
        mib(file_at_start),
        mib(peak_rss),
        mib(hwm),
        mib(after),
        settle.elapsed().as_secs_f64(),
        peak_cache / f64::from(1 << 20),
        cache_at_start / f64::from(1 << 20),
        mib(CACHE_LIMIT),
        peak_tables / f64::from(1 << 20),
        m["spanprof_modules"],
        mib(daemon.status_bytes("VmRSS:")),
        mib(daemon.status_bytes("RssFile:")),
        mib(daemon.status_bytes("RssShmem:")),
    );
    assert!(
        peak_cache > cache_at_start,
        "the symbol cache never held the children's symbols ({cache_at_start} bytes at start; \
         at most {peak_modules} modules open and {peak_tables} bytes of unwind tables); the \
         metrics at the end: {m:?}"
    );
    assert!(
        peak_modules >= modules_at_start + 4.0,
        "spanprof_modules never counted the children's binaries"
    );
    assert!(
        peak_rss <= start + CACHE_LIMIT + SLACK,
        "RssAnon {:.1} MiB at its peak, above the start + the cache bound + 80 MiB",
        mib(peak_rss)
    );
    assert!(
        hwm <= file_at_start + CACHE_LIMIT + SLACK,
        "VmHWM {:.1} MiB above RssFile at start + the cache bound + 80 MiB",
        mib(hwm)
    );
    assert!(
        after <= start + KEPT,
        "RssAnon {:.1} MiB {:.1} s after the binaries exited, {:.1} MiB at start (+4 MiB allowed)",
        mib(after),
        settle.elapsed().as_secs_f64(),
        mib(start)
    );
    assert!(
        m["spanprof_modules"] <= modules_at_start,
        "{} modules still open, {modules_at_start} at start",
        m["spanprof_modules"]
    );

    // And the binaries were named, a small cache notwithstanding: the samples with a stack
    // (those of a child that had exited before its first sample was drained have none: four
    // busy children on two CPUs leave the daemon little time to symbolize ~15 distinct
    // binaries a second, and it does not drain while it parses one) are in short_child_work.
    let stderr = daemon.stop();
    assert!(stderr.contains("every window exported"), "{stderr}");
    let (mut with_stack, mut named, mut no_stack) = (0i64, 0i64, 0i64);
    let mut others: BTreeMap<String, i64> = BTreeMap::new();
    for (request, _) in server.requests().into_iter().skip(requests_at_start) {
        let decoded = otlp::decode_grpc(&request);
        otlp::assert_valid(&decoded);
        for sample in otlp::samples(&decoded, "samples/count") {
            let f = otlp::functions(sample);
            let weight = otlp::sample_weight(sample);
            if f.contains(&"[no stack]") {
                no_stack += weight;
                continue;
            }
            with_stack += weight;
            if f.contains(&"short_child_work") {
                named += weight;
            } else {
                *others.entry(f.join(";")).or_default() += weight;
            }
        }
    }
    let mut others: Vec<(i64, String)> = others.into_iter().map(|(s, w)| (w, s)).collect();
    others.sort_unstable_by(|a, b| b.cmp(a));
    eprintln!(
        "{named} of {with_stack} samples with a stack in short_child_work ({no_stack} without \
         a stack); elsewhere, most first: {:?}",
        &others[..others.len().min(5)]
    );
    assert!(
        named as f64 >= 0.9 * with_stack as f64 && named >= 200,
        "{named} of {with_stack} samples with a stack in short_child_work; elsewhere, most \
         first: {:?}",
        &others[..others.len().min(10)]
    );
}
