//! `cargo xtask bench --only daemon`: what `spanprof daemon` costs the host it profiles, side by
//! side with the equivalent always-on `perf record`.
//!
//! Method (also in BENCHMARKS.md, block `bench-daemon`):
//! - Load: two busy Python processes, `tests/workloads/py_split.py` (a pure-Python loop, three
//!   functions), run by a pyenv CPython (3.12 by default, `--python`, as the other Python parts),
//!   started afresh for every run of every configuration: on this 2-CPU machine they keep both
//!   CPUs busy, so every sampling tick lands on a Python thread.
//! - Configurations, interleaved in each of `--rounds` rounds (order reversed every other round):
//!   `spanprof daemon --config FILE` with no `[scope]` (the whole host), `frequency = 19`,
//!   `window = "10s"`, exporting over OTLP/HTTP (`http/protobuf`, gzip, the defaults) to a local
//!   receiver, `tests/tools/otlp_http_sink.py` run by the venv's Python (`cargo xtask deps`
//!   installs its opentelemetry-proto), which decodes and saves every request, so every export
//!   succeeds; and `perf record -F 19 -a -g -e cpu-clock -o FILE`, perf's host-wide sampling at
//!   the same rate with frame-pointer call graphs (it writes raw samples and symbolizes nothing;
//!   the daemon also unwinds Python stacks, symbolizes and exports every window, so `perf
//!   script` is then run on the whole run's perf.data for what symbolizing costs perf).
//! - Each run: the workers start, then the profiler; the daemon is ready when it prints
//!   `spanprof daemon: profiling` (perf prints nothing). After [`WARMUP`] (the daemon's start-up,
//!   its first scan of the host and first symbolizations are behind it) the bench takes a
//!   snapshot, waits `--daemon-seconds` (default 30: three 10 s windows close in it, whatever
//!   their phase), and takes a second one. Then SIGTERM (the daemon flushes its window and
//!   exits; the bench checks it says every window was exported) or SIGINT (perf).
//! - Figures, from the two snapshots: the profiler's own CPU time (utime + stime of
//!   `/proc/PID/stat`, every thread, independent of what the daemon says) as a share of one core,
//!   and the same from the threads' `schedstat` (ns resolution: perf's is below the ticks);
//!   for the daemon also its own figure (`spanprof_cpu_seconds_total` of its `/metrics`), and
//!   the in-kernel time of its BPF programs (BPF statistics, `kernel.bpf_stats_enabled=1`, read
//!   from the daemon's own program fds, [`NamedProg`]), a cost the interrupted processes pay; its
//!   peak and end RSS (`VmHWM` and `VmRSS` of `/proc/PID/status` at the second snapshot, and
//!   `VmHWM` at the first, before any window closed; the daemon's
//!   `spanprof_resident_memory_bytes` beside them); samples per second
//!   (`spanprof_samples_total`; perf's closing count over its whole run), samples lost and
//!   dropped, windows exported and export failures; the workers' own CPU over the interval, to
//!   show the machine was busy. Medians over the rounds, with the lowest and highest.
//!
//! Every round's raw measurements go to `target/bench/daemon_rounds.txt`; the daemon's and
//! perf's stderr of the last run to `target/bench/daemon.err` and `daemon_perf.err`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::measure::{lowest_highest, machine, mb, median, rounds, version, wait_ready, NamedProg};

/// What to run and how long.
#[derive(Debug, Clone)]
pub struct Config {
    pub rounds: usize,
    /// The interpreter of the two busy workers (a pyenv CPython).
    pub python: PathBuf,
    /// The venv's interpreter, which has opentelemetry-proto for the OTLP receiver.
    pub venv_python: PathBuf,
    /// Seconds measured in each run, after [`WARMUP`].
    pub seconds: u64,
}

/// The default measured interval: three windows.
pub const DEFAULT_SECONDS: u64 = 30;

/// The daemon's rate (its default) and the peer's.
const HZ: u32 = 19;
/// The daemon's window.
const WINDOW_SECS: u64 = 10;
/// From the profiler's start (the daemon's ready line) to the first snapshot.
const WARMUP: Duration = Duration::from_secs(5);
/// The busy Python processes.
const WORKERS: usize = 2;
const WORKER_FILE: &str = "py_split.py";
/// How long the daemon may take to say it is profiling, and to flush and exit.
const READY_WITHIN: Duration = Duration::from_secs(60);
const EXIT_WITHIN: Duration = Duration::from_secs(60);

/// A child process that is killed (SIGKILL) and reaped if it was not stopped otherwise.
#[derive(Debug)]
struct Running {
    child: Child,
    reaped: bool,
}

impl Running {
    fn new(child: Child) -> Self {
        Running {
            child,
            reaped: false,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails (with `log`'s text) if the process has exited.
    fn check_running(&mut self, what: &str, log: &Path) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            self.reaped = true;
            bail!(
                "{what} exited early ({status}):\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Sends `signal` and waits up to `limit` for the exit; returns the wait status and the
    /// process's CPU seconds over its whole life (`wait4`).
    fn stop(&mut self, signal: libc::c_int, limit: Duration) -> Result<(i32, f64)> {
        // SAFETY: signals our own child, not yet reaped.
        unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
        self.wait_within(limit)
    }

    /// Waits up to `limit` for the exit; returns the wait status and the process's CPU seconds
    /// over its whole life, its waited-for children's included (`wait4`).
    fn wait_within(&mut self, limit: Duration) -> Result<(i32, f64)> {
        let pid = self.pid() as libc::pid_t;
        let deadline = Instant::now() + limit;
        loop {
            let mut status = 0;
            // SAFETY: zeroed rusage is a valid out-parameter.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: polls our own child; both pointers are valid.
            let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
            if r < 0 {
                bail!("wait4 failed: {}", std::io::Error::last_os_error());
            }
            if r == pid {
                self.reaped = true;
                let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
                return Ok((status, tv(ru.ru_utime) + tv(ru.ru_stime)));
            }
            if Instant::now() >= deadline {
                bail!("pid {pid} did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The OTLP/HTTP receiver, `tests/tools/otlp_http_sink.py`; SIGTERM when dropped (its stdin, a
/// pipe we hold, also ends it if the bench dies).
#[derive(Debug)]
struct Sink {
    proc: Running,
    port: u16,
}

impl Sink {
    fn start(root: &Path, venv_python: &Path, out_dir: &Path) -> Result<Sink> {
        let dir = out_dir.join("daemon_sink");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let script = root.join("tests/tools/otlp_http_sink.py");
        let err_path = out_dir.join("daemon_sink.err");
        let mut child = Command::new(venv_python)
            .arg(&script)
            .arg("--out")
            .arg(&dir)
            .args(["--port", "0", "--exit-on-stdin-eof"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(File::create(&err_path)?)
            .spawn()
            .with_context(|| format!("failed to start {}", venv_python.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        let mut proc = Running::new(child);
        let Some(port) = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
        else {
            let _ = proc.stop(libc::SIGTERM, Duration::from_secs(5));
            bail!(
                "{} printed no `listening PORT` (first line {line:?}; `cargo xtask deps` \
                 installs its opentelemetry-proto):\n{}",
                script.display(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        };
        Ok(Sink { proc, port })
    }

    /// The number of requests it accepted (`NNNN.bin` files).
    fn saved(&self, out_dir: &Path) -> usize {
        std::fs::read_dir(out_dir.join("daemon_sink"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".bin"))
                    .count()
            })
            .unwrap_or(0)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.proc.stop(libc::SIGTERM, Duration::from_secs(5));
    }
}

/// The busy Python processes of one run.
#[derive(Debug)]
struct Workers(Vec<Running>);

impl Workers {
    fn start(python: &Path, script: &Path, seconds: u64) -> Result<Workers> {
        let mut all = Vec::new();
        for _ in 0..WORKERS {
            let mut child = Command::new(python)
                .arg(script)
                .arg(seconds.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .with_context(|| format!("failed to start {}", python.display()))?;
            let stderr = child.stderr.take().expect("piped");
            all.push(Running::new(child));
            // `ready PID` on stderr once it starts its loop.
            wait_ready(stderr, "ready").context("a py_split.py worker did not start")?;
        }
        Ok(Workers(all))
    }

    /// The workers' CPU seconds so far, together.
    fn cpu(&self) -> Result<f64> {
        self.0.iter().map(|w| proc_cpu(w.pid())).sum()
    }
}

/// utime + stime of `/proc/PID/stat` (every thread of the process), in seconds.
fn proc_cpu(pid: u32) -> Result<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("pid {pid} is gone"))?;
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    parse_stat_ticks(&text)
        .map(|t| t as f64 / tck)
        .with_context(|| format!("unexpected /proc/{pid}/stat: {text}"))
}

/// utime + stime (fields 14 and 15, clock ticks) of a `/proc/PID/stat` line; the command name
/// (field 2, in parentheses) may hold spaces and parentheses.
fn parse_stat_ticks(text: &str) -> Option<u64> {
    let (_, rest) = text.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The run time so far of each thread of `pid` (the first field of
/// `/proc/PID/task/TID/schedstat`, ns), by thread id.
fn thread_ns(pid: u32) -> BTreeMap<u32, u64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| {
            dir.filter_map(|e| {
                let e = e.ok()?;
                let tid = e.file_name().to_str()?.parse().ok()?;
                let text = std::fs::read_to_string(e.path().join("schedstat")).ok()?;
                Some((tid, text.split_whitespace().next()?.parse().ok()?))
            })
            .collect()
        })
        .unwrap_or_default()
}

/// The threads' run time from `start` to `end` in seconds (a thread new at `end` counts from 0),
/// and how many threads of `start` were gone at `end` (their last run time is not counted).
fn threads_delta(start: &BTreeMap<u32, u64>, end: &BTreeMap<u32, u64>) -> (f64, usize) {
    let ns: u64 = end
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(start.get(tid).copied().unwrap_or(0)))
        .sum();
    let gone = start.keys().filter(|tid| !end.contains_key(tid)).count();
    (ns as f64 / 1e9, gone)
}

/// A `kB` field of `/proc/PID/status` (`VmHWM`, `VmRSS`), in KiB.
fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("pid {pid} is gone"))?;
    parse_status_kib(&text, field).with_context(|| format!("no {field} in /proc/{pid}/status"))
}

fn parse_status_kib(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The daemon's `/metrics`, each sample by name (they have no labels).
fn scrape(addr: SocketAddr) -> Result<BTreeMap<String, f64>> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("cannot connect to the daemon's metrics on {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("not an HTTP response from {addr}: {text:?}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("/metrics on {addr} answered {head}");
    }
    Ok(parse_metrics(body))
}

fn parse_metrics(body: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The `N` of perf's closing `[ perf record: Captured and wrote X MB FILE (N samples) ]`.
fn parse_perf_samples(text: &str) -> Option<u64> {
    let (head, _) = text.rsplit_once(" samples)")?;
    head.rsplit_once('(')?.1.trim().parse().ok()
}

/// A free TCP port on 127.0.0.1 for the daemon's metrics (free when this returns).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits up to [`READY_WITHIN`] for `needle` in the file `log` (a child's stderr).
fn wait_log(proc: &mut Running, what: &str, log: &Path, needle: &str) -> Result<()> {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains(needle)
        {
            return Ok(());
        }
        proc.check_running(what, log)?;
        if Instant::now() >= deadline {
            bail!(
                "{what} did not print `{needle}` within {READY_WITHIN:?}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `kernel.bpf_stats_enabled` is on (the in-kernel counters run).
fn bpf_stats_on() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|s| s.trim() == "1")
}

/// One measured interval of the daemon.
#[derive(Debug, Default)]
struct DaemonRun {
    /// The interval between the snapshots, seconds.
    secs: f64,
    /// Own CPU seconds over the interval, from `/proc/PID/stat`.
    cpu: f64,
    /// The same from `spanprof_cpu_seconds_total`.
    metric_cpu: f64,
    /// The same from its threads' schedstat (ns resolution), and the threads that exited in
    /// the interval (not counted).
    sched_cpu: f64,
    threads_gone: usize,
    /// Run time of all its BPF programs over the interval, ns, and their runs; `None` when
    /// the BPF statistics were off or unreadable.
    kernel_ns: Option<u64>,
    kernel_runs: u64,
    /// `VmHWM` at the first snapshot: start-up and sampling, before the first window closed.
    hwm_start_kib: u64,
    hwm_kib: u64,
    rss_kib: u64,
    /// `spanprof_resident_memory_bytes` at the second snapshot.
    metric_rss: f64,
    samples: f64,
    lost: f64,
    dropped: f64,
    windows: f64,
    exported: f64,
    export_failures: f64,
    windows_dropped: f64,
    /// `spanprof_targets` and `spanprof_processes` at the second snapshot.
    targets: f64,
    processes: f64,
    /// The workers' CPU seconds over the interval, together.
    workers_cpu: f64,
    /// The daemon's whole life: CPU seconds (`wait4`) and wall seconds, start to exit.
    life_cpu: f64,
    life_wall: f64,
    /// The daemon said every window was exported when it stopped.
    flushed: bool,
}

/// One measured interval of `perf record -a -g`.
#[derive(Debug, Default)]
struct PerfRun {
    secs: f64,
    cpu: f64,
    sched_cpu: f64,
    threads_gone: usize,
    /// CPU seconds of `perf script` on the whole run's perf.data afterwards (`wait4`).
    script_cpu: f64,
    hwm_kib: u64,
    rss_kib: u64,
    /// Its closing sample count, over its whole run, and that run's wall seconds.
    samples: u64,
    life_wall: f64,
    life_cpu: f64,
    data_bytes: u64,
    workers_cpu: f64,
}

#[derive(Debug, Default)]
struct DaemonRound {
    daemon: DaemonRun,
    perf: PerfRun,
}

/// Paths and settings shared by the runs.
struct Setup<'a> {
    spanprof: &'a Path,
    script: PathBuf,
    out_dir: &'a Path,
    cfg: &'a Config,
    sink_port: u16,
}

impl Setup<'_> {
    fn workers(&self) -> Result<Workers> {
        // Long enough for the warm-up, the interval and the profiler's exit; killed after.
        let seconds = WARMUP.as_secs() + self.cfg.seconds + EXIT_WITHIN.as_secs() + 30;
        Workers::start(&self.cfg.python, &self.script, seconds)
    }

    fn interval(&self) -> Duration {
        Duration::from_secs(self.cfg.seconds)
    }
}

fn run_daemon(s: &Setup) -> Result<DaemonRun> {
    let workers = s.workers()?;
    let metrics_addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
    let config = s.out_dir.join("daemon.toml");
    std::fs::write(
        &config,
        format!(
            "[sampling]\nfrequency = {HZ}\nwindow = \"{WINDOW_SECS}s\"\n\n\
             [export]\nprotocol = \"http/protobuf\"\nendpoint = \"http://127.0.0.1:{}\"\n\n\
             [metrics]\nlisten = \"{metrics_addr}\"\n",
            s.sink_port
        ),
    )?;
    let log = s.out_dir.join("daemon.err");
    let mut cmd = Command::new(s.spanprof);
    cmd.args(["daemon", "--config"]).arg(&config);
    // The file's [export] settings, not the environment's.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OTEL_") {
            cmd.env_remove(key);
        }
    }
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log)?)
        .spawn()
        .with_context(|| format!("failed to start {}", s.spanprof.display()))?;
    let mut daemon = Running::new(child);
    let pid = daemon.pid();
    wait_log(
        &mut daemon,
        "spanprof daemon",
        &log,
        "spanprof daemon: profiling",
    )?;
    let progs = NamedProg::all_of(pid);
    std::thread::sleep(WARMUP);
    daemon.check_running("spanprof daemon", &log)?;

    let snapshot = || -> Result<_> {
        let at = Instant::now();
        let stats_on = bpf_stats_on();
        let kernel: Option<Vec<(u64, u64)>> = progs.iter().map(NamedProg::stats).collect();
        Ok((
            at,
            (proc_cpu(pid)?, thread_ns(pid)),
            workers.cpu()?,
            kernel.filter(|k| stats_on && !k.is_empty()),
            scrape(metrics_addr)?,
        ))
    };
    let (t0, (cpu0, th0), w0, k0, m0) = snapshot()?;
    let hwm_start_kib = proc_status_kib(pid, "VmHWM")?;
    std::thread::sleep(s.interval());
    let (t1, (cpu1, th1), w1, k1, m1) = snapshot()?;
    let (sched_cpu, threads_gone) = threads_delta(&th0, &th1);
    let hwm_kib = proc_status_kib(pid, "VmHWM")?;
    let rss_kib = proc_status_kib(pid, "VmRSS")?;
    let (status, life_cpu) = daemon.stop(libc::SIGTERM, EXIT_WITHIN)?;
    let life_wall = started.elapsed().as_secs_f64();
    drop(workers);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if status != 0 {
        bail!("spanprof daemon failed (wait status {status}):\n{text}");
    }
    let delta = |name: &str| -> Result<f64> {
        let get = |m: &BTreeMap<String, f64>| {
            m.get(name)
                .copied()
                .with_context(|| format!("the daemon's /metrics has no {name}"))
        };
        Ok(get(&m1)? - get(&m0)?)
    };
    let gauge = |name: &str| m1.get(name).copied().unwrap_or(f64::NAN);
    let kernel = match (k0, k1) {
        (Some(a), Some(b)) => Some(a.iter().zip(&b).fold((0, 0), |(ns, runs), (a, b)| {
            (ns + (b.0 - a.0), runs + (b.1 - a.1))
        })),
        _ => None,
    };
    Ok(DaemonRun {
        secs: (t1 - t0).as_secs_f64(),
        cpu: cpu1 - cpu0,
        metric_cpu: delta("spanprof_cpu_seconds_total")?,
        sched_cpu,
        threads_gone,
        kernel_ns: kernel.map(|k| k.0),
        kernel_runs: kernel.map_or(0, |k| k.1),
        hwm_start_kib,
        hwm_kib,
        rss_kib,
        metric_rss: gauge("spanprof_resident_memory_bytes"),
        samples: delta("spanprof_samples_total")?,
        lost: delta("spanprof_samples_lost_total")?,
        dropped: delta("spanprof_samples_dropped_total")?,
        windows: delta("spanprof_windows_total")?,
        exported: delta("spanprof_windows_exported_total")?,
        export_failures: delta("spanprof_export_failures_total")?,
        windows_dropped: delta("spanprof_windows_dropped_total")?,
        targets: gauge("spanprof_targets"),
        processes: gauge("spanprof_processes"),
        workers_cpu: w1 - w0,
        life_cpu,
        life_wall,
        flushed: text.contains("stopped; every window exported"),
    })
}

fn run_perf(s: &Setup) -> Result<PerfRun> {
    let workers = s.workers()?;
    let data = s.out_dir.join("daemon_perf.data");
    let log = s.out_dir.join("daemon_perf.err");
    let _ = std::fs::remove_file(&data);
    let started = Instant::now();
    let child = Command::new("perf")
        .arg("record")
        .args(["-F", &HZ.to_string(), "-a", "-g", "-e", "cpu-clock", "-o"])
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log)?)
        .spawn()
        .context("failed to start perf (Debian package linux-perf)")?;
    let mut perf = Running::new(child);
    let pid = perf.pid();
    // perf prints nothing when it is attached.
    std::thread::sleep(WARMUP);
    perf.check_running("perf record", &log)?;
    let (t0, cpu0, th0, w0) = (
        Instant::now(),
        proc_cpu(pid)?,
        thread_ns(pid),
        workers.cpu()?,
    );
    std::thread::sleep(s.interval());
    let (t1, cpu1, th1, w1) = (
        Instant::now(),
        proc_cpu(pid)?,
        thread_ns(pid),
        workers.cpu()?,
    );
    let (sched_cpu, threads_gone) = threads_delta(&th0, &th1);
    let hwm_kib = proc_status_kib(pid, "VmHWM")?;
    let rss_kib = proc_status_kib(pid, "VmRSS")?;
    let (status, life_cpu) = perf.stop(libc::SIGINT, EXIT_WITHIN)?;
    let life_wall = started.elapsed().as_secs_f64();
    drop(workers);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let samples = parse_perf_samples(&text)
        .with_context(|| format!("perf printed no sample count (wait status {status}):\n{text}"))?;
    // What the daemon does and `perf record` does not: symbolize the samples.
    let script = Command::new("perf")
        .arg("script")
        .arg("-i")
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("failed to start perf script")?;
    let (status, script_cpu) = Running::new(script).wait_within(Duration::from_secs(600))?;
    if status != 0 {
        bail!(
            "perf script -i {} failed (wait status {status})",
            data.display()
        );
    }
    Ok(PerfRun {
        secs: (t1 - t0).as_secs_f64(),
        cpu: cpu1 - cpu0,
        sched_cpu,
        threads_gone,
        script_cpu,
        hwm_kib,
        rss_kib,
        samples,
        life_wall,
        life_cpu,
        data_bytes: std::fs::metadata(&data).map(|m| m.len()).unwrap_or(0),
        workers_cpu: w1 - w0,
    })
}

/// The daemon benchmark: `cfg.rounds` interleaved rounds of the daemon and perf; the markdown
/// of its figures (for the `bench-daemon` block of BENCHMARKS.md). Needs root; the in-kernel
/// figure needs `kernel.bpf_stats_enabled=1`, which [`crate::bench::run`] sets for the run.
pub fn run(root: &Path, spanprof: &Path, out_dir: &Path, cfg: &Config) -> Result<String> {
    if cfg.rounds == 0 || cfg.seconds == 0 {
        bail!("the daemon bench needs at least one round and one second");
    }
    let script = root.join("tests/workloads").join(WORKER_FILE);
    if !script.is_file() {
        bail!("{} is missing", script.display());
    }
    let perf_version = version(Path::new("perf"), &["--version"])
        .context("perf (Debian package linux-perf) is needed")?;
    let python_version = version(
        &cfg.python,
        &["-c", "import platform; print(platform.python_version())"],
    )?;
    std::fs::create_dir_all(out_dir)?;
    let sink = Sink::start(root, &cfg.venv_python, out_dir)?;
    let setup = Setup {
        spanprof,
        script,
        out_dir,
        cfg,
        sink_port: sink.port,
    };
    let results = rounds("daemon", cfg.rounds, |i| {
        let mut r = DaemonRound::default();
        if i % 2 == 0 {
            r.daemon = run_daemon(&setup)?;
            r.perf = run_perf(&setup)?;
        } else {
            r.perf = run_perf(&setup)?;
            r.daemon = run_daemon(&setup)?;
        }
        Ok(r)
    })?;
    let saved = sink.saved(out_dir);
    drop(sink);
    std::fs::write(out_dir.join("daemon_rounds.txt"), format!("{results:#?}\n"))?;
    Ok(table(&results, cfg, &python_version, &perf_version, saved))
}

/// "median (lowest–highest)" of `values`, each printed by `fmt`.
fn spread(values: &[f64], fmt: impl Fn(f64) -> String) -> String {
    let (lo, hi) = lowest_highest(values);
    format!("{} ({}–{})", fmt(median(values.to_vec())), fmt(lo), fmt(hi))
}

/// The markdown of the figures.
fn table(
    results: &[DaemonRound],
    cfg: &Config,
    python_version: &str,
    perf_version: &str,
    saved: usize,
) -> String {
    let n = results.len();
    let d =
        |f: &dyn Fn(&DaemonRun) -> f64| results.iter().map(|r| f(&r.daemon)).collect::<Vec<_>>();
    let p = |f: &dyn Fn(&PerfRun) -> f64| results.iter().map(|r| f(&r.perf)).collect::<Vec<_>>();
    let pct = |x: f64| format!("{x:.2}%");
    let mbs = |x: f64| format!("{x:.1} MB");
    let int = |x: f64| format!("{x:.0}");
    let one = |x: f64| format!("{x:.1}");
    let us = |x: f64| format!("{x:.0} µs");
    let secs2 = |x: f64| format!("{x:.2} s");
    let kb = |x: f64| format!("{x:.1} kB");
    let whole = |x: f64| format!("{x:.0}%");
    let kernel_rounds: Vec<&DaemonRun> = results
        .iter()
        .map(|r| &r.daemon)
        .filter(|r| r.kernel_ns.is_some())
        .collect();
    let kernel = |f: &dyn Fn(&DaemonRun, f64) -> f64| -> Vec<f64> {
        kernel_rounds
            .iter()
            .map(|r| f(r, r.kernel_ns.unwrap_or(0) as f64 / 1e9))
            .collect()
    };
    let (kernel_row, total_row) = if kernel_rounds.is_empty() {
        let na = "n/a (BPF statistics off)".to_string();
        (na.clone(), na)
    } else {
        let runs: u64 = kernel_rounds.iter().map(|r| r.kernel_runs).sum();
        let ns: u64 = kernel_rounds.iter().filter_map(|r| r.kernel_ns).sum();
        (
            format!(
                "{}; {:.2} µs per run ({runs} runs in {} rounds)",
                spread(&kernel(&|r, k| 100.0 * k / r.secs), pct),
                ns as f64 / runs.max(1) as f64 / 1e3,
                kernel_rounds.len()
            ),
            spread(&kernel(&|r, k| 100.0 * (r.cpu + k) / r.secs), pct),
        )
    };
    // perf's samples over the interval, estimated from its rate over its whole run.
    let p_interval_samples = |r: &PerfRun| (r.samples as f64 / r.life_wall * r.secs).max(1.0);
    let sum = |f: &dyn Fn(&DaemonRun) -> f64| results.iter().map(|r| f(&r.daemon)).sum::<f64>();
    let gone = |n: usize| match n {
        0 => "no thread exited in the intervals".to_string(),
        n => format!("{n} threads that exited in the intervals not counted"),
    };
    let flushed = results.iter().filter(|r| r.daemon.flushed).count();
    let hwm_max = results.iter().map(|r| r.daemon.hwm_kib).max().unwrap_or(0);
    format!(
        "Run of `cargo xtask bench --only daemon --rounds {n} --daemon-seconds {secs}` on {machine}, \
         {perf_version}: two `{WORKER_FILE}` workers (CPython {python_version}) busy on the CPUs; \
         `spanprof daemon` host-wide (no `[scope]`) at {HZ} Hz with {WINDOW_SECS} s windows \
         exported over OTLP/HTTP to a local receiver ({saved} requests accepted in all), \
         against `perf record -F {HZ} -a -g -e cpu-clock`; each measured for {secs} s after \
         {warm} s of warm-up. Medians of {n} interleaved rounds (lowest–highest).\n\n\
         | figure | spanprof daemon | perf record -F {HZ} -a -g | goal |\n\
         |---|---|---|---|\n\
         | **own CPU, % of one core** (utime + stime of `/proc/PID/stat` over the interval, 10 ms ticks) | **{d_cpu}** | {p_cpu} | ≤ 0.5% |\n\
         | the same from its threads' run time (`/proc/PID/task/*/schedstat`, ns; daemon: {d_gone}; perf: {p_gone}) | {d_sched} | {p_sched} | |\n\
         | own CPU as the daemon reports it (`spanprof_cpu_seconds_total`), % of one core | {d_metric} | n/a | |\n\
         | in-kernel time of its BPF programs, % of one core (BPF statistics; paid by the interrupted processes) | {kernel_row} | n/a (not measured: perf copies stacks in the interrupt) | |\n\
         | own CPU + in-kernel, % of one core | {total_row} | n/a | |\n\
         | symbolizing afterwards: `perf script` on the whole run's perf.data, CPU per second of the run, % of one core | n/a (in its own CPU: every window is symbolized, encoded and exported) | {p_script} | |\n\
         | own CPU per sample over the interval (schedstat; perf's samples estimated from its rate) | {d_per_sample} | {p_per_sample} | |\n\
         | **peak RSS** (`VmHWM` at the end of the interval; highest {hwm_max_mb:.1} MB) | **{d_hwm}** | {p_hwm} | ≤ 100 MB |\n\
         | peak RSS at the start of the interval (`VmHWM` after start-up and {warm} s of sampling, before the first window closed) | {d_hwm_start} | n/a | |\n\
         | RSS at the end of the interval (`VmRSS`) | {d_rss} | {p_rss} | |\n\
         | RSS as the daemon reports it (`spanprof_resident_memory_bytes`) | {d_metric_rss} | n/a | |\n\
         | samples per second (daemon: `spanprof_samples_total` over the interval; perf: its closing count over its whole run) | {d_rate} | {p_rate} | |\n\
         | samples lost; dropped by the window limits (intervals, all rounds) | {lost:.0}; {dropped:.0} | n/a | |\n\
         | windows closed; exported; export failures; windows dropped (intervals, all rounds) | {windows:.0}; {exported:.0}; {failures:.0}; {wdropped:.0} | n/a | |\n\
         | every window exported at SIGTERM (rounds) | {flushed} of {n} | n/a | |\n\
         | processes in scope (`spanprof_targets`); with samples in the last window (`spanprof_processes`) | {targets}; {processes} | n/a | |\n\
         | the two workers' CPU over the interval, % of one core | {d_workers} | {p_workers} | |\n\
         | whole run (start-up, warm-up, interval, flush and exit): own CPU (`wait4`) | {d_life} in {d_life_wall:.1} s | {p_life} in {p_life_wall:.1} s | |\n\
         | perf.data written per second of its run | n/a | {p_bytes} | |\n",
        secs = cfg.seconds,
        machine = machine(),
        warm = WARMUP.as_secs(),
        d_cpu = spread(&d(&|r| 100.0 * r.cpu / r.secs), pct),
        p_cpu = spread(&p(&|r| 100.0 * r.cpu / r.secs), pct),
        d_sched = spread(&d(&|r| 100.0 * r.sched_cpu / r.secs), pct),
        p_sched = spread(&p(&|r| 100.0 * r.sched_cpu / r.secs), pct),
        d_gone = gone(results.iter().map(|r| r.daemon.threads_gone).sum()),
        p_gone = gone(results.iter().map(|r| r.perf.threads_gone).sum()),
        d_metric = spread(&d(&|r| 100.0 * r.metric_cpu / r.secs), pct),
        p_script = spread(&p(&|r| 100.0 * r.script_cpu / r.life_wall), pct),
        d_per_sample = spread(&d(&|r| 1e6 * r.sched_cpu / r.samples.max(1.0)), us),
        p_per_sample = spread(&p(&|r| 1e6 * r.sched_cpu / p_interval_samples(r)), us),
        hwm_max_mb = mb(hwm_max),
        d_hwm = spread(&d(&|r| mb(r.hwm_kib)), mbs),
        d_hwm_start = spread(&d(&|r| mb(r.hwm_start_kib)), mbs),
        p_hwm = spread(&p(&|r| mb(r.hwm_kib)), mbs),
        d_rss = spread(&d(&|r| mb(r.rss_kib)), mbs),
        p_rss = spread(&p(&|r| mb(r.rss_kib)), mbs),
        d_metric_rss = spread(&d(&|r| r.metric_rss / (1024.0 * 1024.0)), mbs),
        d_rate = spread(&d(&|r| r.samples / r.secs), one),
        p_rate = spread(&p(&|r| r.samples as f64 / r.life_wall), one),
        lost = sum(&|r| r.lost),
        dropped = sum(&|r| r.dropped),
        windows = sum(&|r| r.windows),
        exported = sum(&|r| r.exported),
        failures = sum(&|r| r.export_failures),
        wdropped = sum(&|r| r.windows_dropped),
        targets = spread(&d(&|r| r.targets), int),
        processes = spread(&d(&|r| r.processes), int),
        d_workers = spread(&d(&|r| 100.0 * r.workers_cpu / r.secs), whole),
        p_workers = spread(&p(&|r| 100.0 * r.workers_cpu / r.secs), whole),
        d_life = spread(&d(&|r| r.life_cpu), secs2),
        d_life_wall = median(d(&|r| r.life_wall)),
        p_life = spread(&p(&|r| r.life_cpu), secs2),
        p_life_wall = median(p(&|r| r.life_wall)),
        p_bytes = spread(&p(&|r| r.data_bytes as f64 / r.life_wall / 1e3), kb),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_files() {
        let stat = "4242 (py thon) (x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    1234 56 0 0 20 0 3 0 100 1000000 2000 18446744073709551615";
        assert_eq!(parse_stat_ticks(stat), Some(1290));
        assert_eq!(parse_stat_ticks("4242 (x) S 1"), None);
        let status =
            "Name:\tspanprof\nVmPeak:\t  300000 kB\nVmHWM:\t   51234 kB\nVmRSS:\t   49000 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(51234));
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(49000));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
    }

    #[test]
    fn reads_metrics_and_perf() {
        let body = "# HELP spanprof_samples_total Samples aggregated.\n\
                    # TYPE spanprof_samples_total counter\n\
                    spanprof_samples_total 1234\n\
                    spanprof_cpu_seconds_total 0.512000\n";
        let m = parse_metrics(body);
        assert_eq!(m.get("spanprof_samples_total"), Some(&1234.0));
        assert_eq!(m.get("spanprof_cpu_seconds_total"), Some(&0.512));
        assert_eq!(m.len(), 2);
        assert_eq!(
            parse_perf_samples(
                "[ perf record: Woken up 1 times to write data ]\n\
                 [ perf record: Captured and wrote 0.512 MB /tmp/p.data (1368 samples) ]\n"
            ),
            Some(1368)
        );
        assert_eq!(parse_perf_samples("nothing"), None);
        assert_eq!(
            spread(&[3.0, 1.0, 2.0], |x| format!("{x:.1}")),
            "2.0 (1.0–3.0)"
        );
    }
}
