//! Helpers for spanprof's integration tests, which run the real `spanprof`
//! binary as root against the bundled C workloads in `tests/workloads/`.
//!
//! Overview: `cargo xtask test` builds the binary (`SPANPROF_BIN`), the
//! workloads (`SPANPROF_WORKLOADS`) and a Python venv with `protobuf`
//! (`SPANPROF_PYTHON`) for the independent pprof decoder
//! `tests/tools/decode_pprof.py`, then runs `cargo test`. Without those
//! variables the helpers fall back to the paths under `target/`. The Python
//! tests also use py-spy from that venv (`SPANPROF_PYSPY`) and the CPython
//! builds of pyenv (`PYENV_ROOT`, default `/root/.pyenv`).
//!
//! Design constraints: a test whose prerequisites are missing (not root, no
//! binary, no workloads) fails with a message saying what is missing and how
//! to get it; it never passes by skipping. Tests that sample take
//! [`profiling_lock`] so that two sessions in one test binary do not compete
//! for the machine's two CPUs.

use std::ffi::OsStr;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub mod daemon;
pub mod otlp;
pub mod rootfs;

/// A `Vec<OsString>` of command-line arguments from anything string- or path-like:
/// `args!["profile", "--pid", pid.to_string(), "-o", &path]`.
#[macro_export]
macro_rules! args {
    ($($arg:expr),* $(,)?) => {
        vec![$(::std::ffi::OsString::from(
            ::std::convert::AsRef::<::std::ffi::OsStr>::as_ref(&$arg),
        )),*]
    };
}

/// How long any one spanprof run may take before the test kills it: the
/// longest session in the tests is 5 s, loading and symbolizing take a few.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives inside the workspace")
        .to_path_buf()
}

/// True when running in CI (`CI=true`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Fails the test with a message about a missing prerequisite. Missing
/// prerequisites are failures everywhere; in CI the message says the CI
/// machine itself is broken.
#[track_caller]
pub fn missing_prerequisite(what: &str, fix: &str) -> ! {
    let context = if in_ci() {
        "CI=true: the CI run must provide this; failing instead of skipping"
    } else {
        "failing instead of skipping"
    };
    panic!("spanprof integration test prerequisite missing: {what}\n  fix: {fix}\n  ({context})");
}

pub(crate) fn path_from_env(var: &str, fallback: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => workspace_root().join(fallback),
    }
}

/// True when the effective uid is 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Fails unless running as root: loading eBPF needs CAP_BPF and CAP_PERFMON.
#[track_caller]
pub fn require_root() {
    if !is_root() {
        missing_prerequisite(
            "root (the tests load eBPF programs and drop privileges with setpriv)",
            "run the tests as root: `cargo xtask test` as root",
        );
    }
}

/// The spanprof binary: `SPANPROF_BIN`, else `target/release/spanprof`.
#[track_caller]
pub fn spanprof_bin() -> PathBuf {
    let bin = path_from_env("SPANPROF_BIN", "target/release/spanprof");
    if !bin.is_file() {
        missing_prerequisite(
            &format!("the spanprof binary at {}", bin.display()),
            "`cargo build --release -p spanprof`, or `cargo xtask test` which builds it",
        );
    }
    bin
}

/// The directory of the built workloads: `SPANPROF_WORKLOADS`, else `target/workloads`.
pub fn workloads_dir() -> PathBuf {
    path_from_env("SPANPROF_WORKLOADS", "target/workloads")
}

/// The path of one built workload (`cpu_split`, `syscall_heavy`, `forker`).
#[track_caller]
pub fn workload_path(name: &str) -> PathBuf {
    let path = workloads_dir().join(name);
    if !path.is_file() {
        missing_prerequisite(
            &format!("the workload {}", path.display()),
            "`cargo xtask workloads` (or `cargo xtask test`)",
        );
    }
    path
}

/// The Python with `protobuf` and `grpcio-tools`: `SPANPROF_PYTHON`, else `target/venv/bin/python`.
#[track_caller]
pub fn python() -> PathBuf {
    let python = path_from_env("SPANPROF_PYTHON", "target/venv/bin/python");
    if !python.is_file() {
        missing_prerequisite(
            &format!("the Python venv interpreter {}", python.display()),
            "`cargo xtask deps` (creates target/venv with protobuf and grpcio-tools)",
        );
    }
    python
}

/// Checks everything a test that runs spanprof against a workload needs.
#[track_caller]
pub fn require_profiling() {
    require_root();
    spanprof_bin();
    for name in ["cpu_split", "syscall_heavy", "forker"] {
        workload_path(name);
    }
}

static PROFILING: Mutex<()> = Mutex::new(());

/// Serializes the tests of one test binary that sample (cargo runs test
/// binaries one after another, and the tests inside one in parallel threads).
pub fn profiling_lock() -> MutexGuard<'static, ()> {
    PROFILING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a fresh directory under the system temp dir, named after `label`.
    pub fn new(label: &str) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("spanprof-test-{label}-{}-{n}", std::process::id()));
        if path.exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Names of the entries in the directory, sorted.
    pub fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.path)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", self.path.display()))
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A running workload, killed and reaped on drop.
#[derive(Debug)]
pub struct Workload {
    pid: u32,
    child: Option<Child>,
    reaper: Option<JoinHandle<ExitStatus>>,
}

impl Workload {
    /// Starts `name` for `seconds` and waits for the pid it prints first.
    #[track_caller]
    pub fn start(name: &str, seconds: f64) -> Self {
        Self::start_with_args(name, seconds, &[])
    }

    /// Like [`Workload::start`], with `extra` arguments after the seconds.
    #[track_caller]
    pub fn start_with_args(name: &str, seconds: f64, extra: &[&str]) -> Self {
        let path = workload_path(name);
        let mut child = Command::new(&path)
            .arg(format!("{seconds}"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("cannot read the pid line of {name}: {e}"));
        let pid: u32 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} printed {line:?} instead of its pid"));
        assert_eq!(pid, child.id(), "{name} printed a pid that is not its own");
        Self {
            pid,
            child: Some(child),
            reaper: None,
        }
    }

    /// Starts `name` and reaps it from a thread as soon as it exits, as a
    /// parent normally would (so no zombie stays behind for the profiler to see).
    #[track_caller]
    pub fn start_reaped(name: &str, seconds: f64) -> Self {
        let mut workload = Self::start(name, seconds);
        let mut child = workload.child.take().expect("just started");
        workload.reaper = Some(std::thread::spawn(move || {
            child.wait().expect("waiting for the workload")
        }));
        workload
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits for the workload to exit by itself and returns its status.
    pub fn wait(mut self) -> ExitStatus {
        if let Some(mut child) = self.child.take() {
            return child.wait().expect("waiting for the workload");
        }
        self.reaper
            .take()
            .expect("a workload has a child or a reaper")
            .join()
            .expect("the reaper thread panicked")
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(reaper) = self.reaper.take() {
            // SAFETY: kill(2) with a pid we started; at worst ESRCH if it
            // exited already. The reaper thread holds the child, so the pid
            // cannot have been reused before it is joined below.
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            }
            let _ = reaper.join();
        }
    }
}

/// What a finished process left behind.
#[derive(Debug)]
pub struct RunOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    pub command: String,
}

impl RunOutput {
    /// The exit code, or a panic if the process died of a signal.
    #[track_caller]
    pub fn code(&self) -> i32 {
        match self.status.code() {
            Some(code) => code,
            None => panic!("{self}\nkilled by a signal"),
        }
    }

    /// Panics with the full output unless the exit code is 0.
    #[track_caller]
    pub fn assert_success(&self) {
        assert!(self.status.success(), "{self}\nexpected success");
    }
}

impl fmt::Display for RunOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "$ {}\nexit: {} after {:.1?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.status, self.elapsed, self.stdout, self.stderr
        )
    }
}

fn describe(cmd: &Command) -> String {
    let mut line = String::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            line.push_str(&format!(
                "{}={} ",
                key.to_string_lossy(),
                value.to_string_lossy()
            ));
        }
    }
    line.push_str(&cmd.get_program().to_string_lossy());
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `cmd` to completion with captured output. After `timeout` it kills
/// the command's whole process group (so a command that spanprof started
/// dies with it) and fails.
#[track_caller]
pub fn run_with_timeout(cmd: Command, timeout: Duration) -> RunOutput {
    Background::spawn(cmd).finish(timeout)
}

/// A process running in the background in its own process group, with its
/// output captured; its stderr can be read line by line while it runs. Drop
/// kills its process group.
#[derive(Debug)]
pub struct Background {
    child: Option<Child>,
    command: String,
    start: Instant,
    stdout: Option<JoinHandle<String>>,
    stderr_lines: mpsc::Receiver<String>,
    stderr: String,
}

impl Background {
    /// Starts `cmd` with stdin from /dev/null and stdout and stderr captured.
    #[track_caller]
    pub fn spawn(mut cmd: Command) -> Self {
        let command = describe(&cmd);
        let start = Instant::now();
        let mut child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{command}`: {e}"));
        let stdout = drain(child.stdout.take().expect("piped"));
        let stderr_lines = lines(child.stderr.take().expect("piped"));
        Self {
            child: Some(child),
            command,
            start,
            stdout: Some(stdout),
            stderr_lines,
            stderr: String::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("not finished").id()
    }

    /// Time since the process was started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// The stderr lines read so far.
    pub fn stderr_so_far(&self) -> &str {
        &self.stderr
    }

    /// Waits up to `timeout` for a stderr line containing `needle` and
    /// returns it; panics with the stderr so far when none comes.
    #[track_caller]
    pub fn wait_for_stderr(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_lines.recv_timeout(left) {
                Ok(line) => {
                    self.stderr.push_str(&line);
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "`{}`: no stderr line with {needle:?} within {timeout:?} ({e}); stderr so far:\n{}",
                    self.command, self.stderr
                ),
            }
        }
    }

    /// The exit status if the process has exited, without blocking.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .expect("not finished")
            .try_wait()
            .expect("waiting for the child")
    }

    /// Sends `signal` to the process (not to its group).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, which is not reaped before
        // `finish` or drop, so its pid cannot have been reused.
        let rc = unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({}, {signal}) failed", self.pid());
    }

    /// Waits for the process to exit and returns what it left behind. After
    /// `timeout` (counted from the start) it kills the process group and fails.
    #[track_caller]
    pub fn finish(mut self, timeout: Duration) -> RunOutput {
        let mut child = self.child.take().expect("not finished");
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for the child") {
                break status;
            }
            if self.start.elapsed() > timeout {
                kill_group(&mut child);
                let (stdout, stderr) = self.collect_output();
                panic!(
                    "`{}` did not finish within {timeout:?}; killed its process group\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
                    self.command,
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let elapsed = self.start.elapsed();
        let (stdout, stderr) = self.collect_output();
        RunOutput {
            status,
            stdout,
            stderr,
            elapsed,
            command: std::mem::take(&mut self.command),
        }
    }

    /// The whole stdout and stderr, once every writer closed them (or 10 s
    /// passed: a descendant that keeps them open does not hang the test).
    fn collect_output(&mut self) -> (String, String) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(line) = self
            .stderr_lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.stderr.push_str(&line);
        }
        let stdout = self
            .stdout
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        (stdout, std::mem::take(&mut self.stderr))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }
}

/// Kills the process group of `child` (its pgid is its pid) and reaps it.
fn kill_group(child: &mut Child) {
    // SAFETY: kill(2) on the process group we created for the child; it is
    // not reaped yet, so its pid (the pgid) cannot have been reused.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
    }
    let _ = child.wait();
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// The lines of `pipe` (each with its newline, if it had one) as they come.
fn lines(pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx
                        .send(String::from_utf8_lossy(&line).into_owned())
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// A `spanprof` command with `args`, not yet run.
#[track_caller]
pub fn spanprof_command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(spanprof_bin());
    cmd.args(args);
    cmd
}

/// Runs `spanprof` with `args` to completion.
#[track_caller]
pub fn run_spanprof<I, S>(args: I) -> RunOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_with_timeout(spanprof_command(args), RUN_TIMEOUT)
}

/// `spanprof profile --pid PID --duration DURATION --frequency HZ -o OUTPUT…` then `extra`,
/// run to completion: the session most tests run against a workload.
#[track_caller]
pub fn profile_pid(
    pid: u32,
    duration: &str,
    frequency: u32,
    outputs: &[&Path],
    extra: &[&str],
) -> RunOutput {
    let mut args = args![
        "profile",
        "--pid",
        pid.to_string(),
        "--duration",
        duration,
        "--frequency",
        frequency.to_string()
    ];
    for out in outputs {
        args.push("-o".into());
        args.push(out.into());
    }
    args.extend(extra.iter().map(std::ffi::OsString::from));
    run_spanprof(args)
}

/// The first line of spanprof's end-of-session summary:
/// `spanprof: N samples, M lost, from P process(es) in S s at F Hz: TARGET`,
/// and the pids of its `processes: PID (name), …` line when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub samples: u64,
    pub lost: u64,
    pub processes: u64,
    pub frequency: u64,
    pub target: String,
    /// The pids of the `processes:` line (empty without one).
    pub pids: Vec<u32>,
}

/// Finds and parses the summary in spanprof's stderr; `Err` says what is
/// missing or malformed.
pub fn parse_summary(stderr: &str) -> Result<Summary, String> {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("spanprof: ") && l.contains(" samples, ") && l.contains(" lost, "))
        .ok_or("no `spanprof: N samples, M lost, …` summary line")?;
    let bad = |what: &str| format!("summary line {line:?}: {what}");
    let rest = line.strip_prefix("spanprof: ").expect("checked");
    let (samples, rest) = rest
        .split_once(" samples, ")
        .ok_or_else(|| bad("no sample count"))?;
    let (lost, rest) = rest
        .split_once(" lost, from ")
        .ok_or_else(|| bad("no lost count"))?;
    let (processes, rest) = rest
        .split_once(" process")
        .ok_or_else(|| bad("no process count"))?;
    let (_, rest) = rest.split_once(" at ").ok_or_else(|| bad("no frequency"))?;
    let (frequency, target) = rest.split_once(" Hz: ").ok_or_else(|| bad("no target"))?;
    let number = |s: &str, what: &str| -> Result<u64, String> {
        s.parse()
            .map_err(|_| bad(&format!("{what} {s:?} is not a number")))
    };
    let mut pids = Vec::new();
    if let Some(procs) = stderr.lines().find_map(|l| l.strip_prefix("processes: ")) {
        for entry in procs.split(", ") {
            let pid = entry.split(' ').next().unwrap_or_default();
            pids.push(
                pid.parse()
                    .map_err(|_| format!("processes line {procs:?}: bad pid {pid:?}"))?,
            );
        }
    }
    Ok(Summary {
        samples: number(samples, "sample count")?,
        lost: number(lost, "lost count")?,
        processes: number(processes, "process count")?,
        frequency: number(frequency, "frequency")?,
        target: target.to_owned(),
        pids,
    })
}

/// The texts of the flame graph's title and subtitle elements (ids `title`
/// and `subtitle`), read with Python's XML parser.
#[track_caller]
pub fn svg_title_and_subtitle(path: &Path) -> (String, String) {
    let mut cmd = Command::new(python());
    cmd.args([
        "-c",
        "import sys, xml.etree.ElementTree as ET\n\
         root = ET.parse(sys.argv[1]).getroot()\n\
         by_id = {e.get('id'): ''.join(e.itertext()) for e in root.iter() if e.get('id')}\n\
         print(by_id.get('title', '<no title element>'))\n\
         print(by_id.get('subtitle', '<no subtitle element>'))",
    ])
    .arg(path);
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    out.assert_success();
    let mut lines = out.stdout.lines().map(str::to_owned);
    let title = lines.next().unwrap_or_default();
    let subtitle = lines.next().unwrap_or_default();
    (title, subtitle)
}

/// One line of folded output: frames root first, and a count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoldedStack {
    pub frames: Vec<String>,
    pub count: u64,
}

impl FoldedStack {
    /// True when `seq` appears as consecutive frames (root first).
    pub fn contains_seq(&self, seq: &[&str]) -> bool {
        contains_seq(&self.frames, seq)
    }

    pub fn contains(&self, frame: &str) -> bool {
        self.frames.iter().any(|f| f == frame)
    }

    /// The frame right after (called by) the first `frame`, if any.
    pub fn callee_of(&self, frame: &str) -> Option<&str> {
        let i = self.frames.iter().position(|f| f == frame)?;
        self.frames.get(i + 1).map(String::as_str)
    }
}

/// True when `seq` appears as consecutive elements of `frames`.
pub fn contains_seq<S: AsRef<str>>(frames: &[S], seq: &[&str]) -> bool {
    seq.is_empty()
        || frames
            .windows(seq.len())
            .any(|w| w.iter().zip(seq).all(|(a, b)| a.as_ref() == *b))
}

/// True for a kernel frame in folded output (`name_[k]`).
pub fn is_kernel_frame(frame: &str) -> bool {
    frame.ends_with("_[k]")
}

/// Checks one frame's spelling; `Err` says what is wrong.
fn check_frame(frame: &str) -> Result<(), String> {
    if frame.is_empty() {
        return Err("empty frame".into());
    }
    if frame.trim() != frame {
        return Err(format!("frame {frame:?} has surrounding whitespace"));
    }
    if frame.contains(['\n', '\r', '\t']) {
        return Err(format!("frame {frame:?} has a control character"));
    }
    if let Some(rest) = frame.strip_prefix("[unknown]") {
        // `[unknown]`, or `[unknown] (module+0xHEX)`.
        if rest.is_empty() {
            return Ok(());
        }
        let inner = rest
            .strip_prefix(" (")
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(|| format!("unknown frame {frame:?} is not `[unknown] (module+0x…)`"))?;
        let (module, offset) = inner
            .rsplit_once("+0x")
            .ok_or_else(|| format!("unknown frame {frame:?} has no `+0x` offset"))?;
        if module.is_empty() || offset.is_empty() || !offset.chars().all(|c| c.is_ascii_hexdigit())
        {
            return Err(format!(
                "unknown frame {frame:?} is not `[unknown] (module+0x…)`"
            ));
        }
    }
    Ok(())
}

/// Parses and checks folded output: every line is `frame(;frame)* COUNT`,
/// frames non-empty, count a positive decimal.
pub fn parse_folded(text: &str) -> Result<Vec<FoldedStack>, String> {
    let mut stacks = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.is_empty() {
            return Err(format!("line {n} is empty"));
        }
        let (stack, count) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("line {n} has no count: {line:?}"))?;
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "line {n}: count {count:?} is not a number: {line:?}"
            ));
        }
        let count: u64 = count
            .parse()
            .map_err(|e| format!("line {n}: count {count:?}: {e}"))?;
        if count == 0 {
            return Err(format!("line {n} has count 0: {line:?}"));
        }
        let frames: Vec<String> = stack.split(';').map(str::to_owned).collect();
        for frame in &frames {
            check_frame(frame).map_err(|e| format!("line {n}: {e}: {line:?}"))?;
        }
        stacks.push(FoldedStack { frames, count });
    }
    Ok(stacks)
}

/// Reads and parses a folded file, panicking with the reason when malformed.
#[track_caller]
pub fn read_folded(path: &Path) -> Vec<FoldedStack> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    parse_folded(&text).unwrap_or_else(|e| panic!("malformed folded file {}: {e}", path.display()))
}

/// The sum of the counts.
pub fn folded_total(stacks: &[FoldedStack]) -> u64 {
    stacks.iter().map(|s| s.count).sum()
}

/// The sum of the counts of the stacks for which `pred` holds.
pub fn folded_count(stacks: &[FoldedStack], pred: impl Fn(&FoldedStack) -> bool) -> u64 {
    stacks.iter().filter(|s| pred(s)).map(|s| s.count).sum()
}

/// The heaviest stacks, for failure messages.
/// Checks the truth of `cpu_split` (main → dispatcher → hot_alpha 75% / hot_beta 25%) on its
/// folded stacks: at least `min_dispatcher` samples under dispatcher, ≥ 95% of all samples
/// with the whole path main;dispatcher;hot_*, and hot_alpha's share 75 ± 5 points. `context` goes into the failure messages. Returns (hot_alpha, hot_beta).
#[track_caller]
pub fn assert_cpu_split_truth(
    stacks: &[FoldedStack],
    min_dispatcher: u64,
    label: &str,
    context: &str,
) -> (u64, u64) {
    let total = folded_total(stacks);
    let dispatcher = folded_count(stacks, |s| s.contains("dispatcher"));
    let alpha = folded_count(stacks, |s| {
        s.contains_seq(&["main", "dispatcher", "hot_alpha"])
    });
    let beta = folded_count(stacks, |s| {
        s.contains_seq(&["main", "dispatcher", "hot_beta"])
    });
    assert!(
        dispatcher >= min_dispatcher,
        "{label}: only {dispatcher} of {total} samples are under dispatcher\n{context}"
    );
    // The process does little but dispatch: at least 95% of all its samples are in one of
    // the two hot functions, reached through main -> dispatcher (the full path).
    assert!(
        (alpha + beta) as f64 >= 0.95 * total as f64,
        "{label}: {alpha} + {beta} of {total} samples ({dispatcher} under dispatcher) have the \
         full path main;dispatcher;hot_*\n{context}"
    );
    let alpha_share = 100.0 * alpha as f64 / (alpha + beta).max(1) as f64;
    assert!(
        (alpha_share - 75.0).abs() <= 5.0,
        "{label}: hot_alpha has {alpha_share:.1}% of the hot samples ({alpha} vs hot_beta \
         {beta}), expected 75 ± 5\n{context}"
    );
    (alpha, beta)
}

pub fn folded_summary(stacks: &[FoldedStack], n: usize) -> String {
    let mut sorted: Vec<&FoldedStack> = stacks.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.count));
    sorted
        .iter()
        .take(n)
        .map(|s| format!("  {} {}", s.frames.join(";"), s.count))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The decoder script, `tests/tools/decode_pprof.py`.
pub fn decoder_script() -> PathBuf {
    workspace_root().join("tests/tools/decode_pprof.py")
}

/// Decodes a pprof file with the independent Python decoder; `Err` has its
/// complaint when the file breaks an invariant of the format.
#[track_caller]
pub fn try_decode_pprof(path: &Path) -> Result<serde_json::Value, String> {
    let mut cmd = Command::new(python());
    cmd.arg(decoder_script()).arg(path);
    let out = run_with_timeout(cmd, Duration::from_secs(120));
    if !out.status.success() {
        return Err(out.to_string());
    }
    serde_json::from_str(&out.stdout).map_err(|e| format!("decoder printed invalid JSON: {e}"))
}

/// Decodes a pprof file, panicking with the decoder's complaint when invalid.
#[track_caller]
pub fn decode_pprof(path: &Path) -> serde_json::Value {
    try_decode_pprof(path).unwrap_or_else(|e| panic!("pprof {} is invalid:\n{e}", path.display()))
}

/// The permission bits of a file.
#[track_caller]
pub fn file_mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("cannot stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Asserts that an output file exists, is not empty and has mode 0600.
#[track_caller]
pub fn assert_private_output(path: &Path) {
    let meta = std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("output {} was not written: {e}", path.display()));
    assert!(meta.len() > 0, "output {} is empty", path.display());
    let mode = meta.permissions().mode() & 0o7777;
    assert_eq!(
        mode,
        0o600,
        "output {} has mode {mode:o}, expected 600",
        path.display()
    );
}

/// A pid that no process or thread has right now.
pub fn unused_pid() -> u32 {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    (1000..max)
        .rev()
        .find(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        .expect("some pid is unused")
}

/// Line numbers `(first, last)` of the definition of C function `name` in a
/// workload's source: from the line with `name(` to the next line that is `}`.
#[track_caller]
pub fn c_function_lines(source: &str, name: &str) -> (i64, i64) {
    let lines: Vec<&str> = source.lines().collect();
    let signature = format!(" {name}(");
    let start = lines
        .iter()
        .position(|l| l.contains(&signature) && !l.trim_end().ends_with(';'))
        .unwrap_or_else(|| panic!("no definition of {name} in the source"));
    let end = lines[start..]
        .iter()
        .position(|l| *l == "}")
        .map(|i| start + i)
        .unwrap_or_else(|| panic!("no end of {name} in the source"));
    (start as i64 + 1, end as i64 + 1)
}

/// Asserts spanprof's error contract: exit code `code`, no panic, exactly one non-empty stderr
/// line, starting with `error: ` and containing every one of `needles`.
#[track_caller]
pub fn assert_error(out: &RunOutput, code: i32, needles: &[&str]) {
    assert_eq!(out.code(), code, "exit code\n{out}");
    assert!(!out.stderr.contains("panicked"), "spanprof panicked\n{out}");
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr\n{out}");
    let line = lines[0];
    assert!(
        line.starts_with("error: "),
        "the line does not start with `error: `\n{out}"
    );
    for needle in needles {
        assert!(
            line.contains(needle),
            "the error does not mention {needle:?}\n{out}"
        );
    }
}

// ---------------------------------------------------------------------------
// Python: interpreters, py-spy, the Python workloads and Python frames in
// folded output (`qualname (file.py:LINE)`, or `qualname (file.py)` with
// `--no-lines`).
// ---------------------------------------------------------------------------

/// The pyenv root: `PYENV_ROOT`, else `/root/.pyenv`.
pub fn pyenv_root() -> PathBuf {
    match std::env::var_os("PYENV_ROOT") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from("/root/.pyenv"),
    }
}

/// The pyenv build of CPython 3.`minor`: `<pyenv root>/versions/3.<minor>.<patch>/bin/python3.<minor>`,
/// the highest patch release when there are several.
#[track_caller]
pub fn pyenv_python(minor: u8) -> PathBuf {
    let versions = pyenv_root().join("versions");
    let prefix = format!("3.{minor}.");
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(&versions)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let patch: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
                    let bin = entry.path().join(format!("bin/python3.{minor}"));
                    bin.is_file().then_some((patch, bin))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => missing_prerequisite(
            &format!(
                "CPython 3.{minor} from pyenv ({}/3.{minor}.*/bin/python3.{minor})",
                versions.display()
            ),
            &format!("`pyenv install 3.{minor}` (set PYENV_ROOT if pyenv lives elsewhere)"),
        ),
    }
}

/// An interpreter installed by the system's packages, e.g. Debian's `/usr/bin/python3.11`.
#[track_caller]
pub fn system_python(path: &str, package: &str) -> PathBuf {
    let bin = PathBuf::from(path);
    if !bin.is_file() {
        missing_prerequisite(
            &format!("the system interpreter {path}"),
            &format!("`apt-get install -y {package}`"),
        );
    }
    bin
}

/// py-spy, the reference for Python stacks: `SPANPROF_PYSPY`, else `target/venv/bin/py-spy`.
#[track_caller]
pub fn py_spy() -> PathBuf {
    let bin = path_from_env("SPANPROF_PYSPY", "target/venv/bin/py-spy");
    if !bin.is_file() {
        missing_prerequisite(
            &format!("py-spy at {}", bin.display()),
            "`cargo xtask deps` (installs py-spy from PyPI into target/venv)",
        );
    }
    bin
}

/// A Python workload's source, `tests/workloads/<name>` (Python workloads
/// are run from the source tree, not built).
#[track_caller]
pub fn py_workload_source(name: &str) -> PathBuf {
    let path = workspace_root().join("tests/workloads").join(name);
    if !path.is_file() {
        missing_prerequisite(
            &format!("the Python workload {}", path.display()),
            "restore it from the repository",
        );
    }
    path
}

/// Starts the Python workload `script` (in `tests/workloads`) under `python`
/// with `args`, and waits until it prints `ready PID` on stderr. Its stdout
/// (the workload's JSON result, if any) comes with [`Background::finish`];
/// dropping it kills it.
#[track_caller]
pub fn start_py_workload(python: &Path, script: &str, args: &[&str]) -> Background {
    let mut cmd = Command::new(python);
    cmd.arg(py_workload_source(script)).args(args);
    start_ready(cmd, script)
}

/// [`start_py_workload`] with environment variables.
#[track_caller]
pub fn start_py_workload_env(
    python: &Path,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Background {
    let mut cmd = Command::new(python);
    cmd.arg(py_workload_source(script))
        .args(args)
        .envs(env.iter().copied());
    start_ready(cmd, script)
}

/// Spawns a workload command and waits for its `ready PID` line on stderr.
#[track_caller]
pub(crate) fn start_ready(cmd: Command, script: &str) -> Background {
    let mut workload = Background::spawn(cmd);
    let line = workload.wait_for_stderr("ready ", Duration::from_secs(30));
    let pid: Option<u32> = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok());
    assert_eq!(
        pid,
        Some(workload.pid()),
        "{script} printed {line:?} instead of `ready {}`",
        workload.pid()
    );
    workload
}

/// Starts `py-spy record` on `pid` for `seconds` at `rate` Hz, writing its
/// raw (folded) output to `out`. It runs until done: call
/// [`Background::finish`], then read `out` with [`read_folded`].
#[track_caller]
pub fn start_py_spy(pid: u32, rate: u32, seconds: u32, out: &Path) -> Background {
    let mut cmd = Command::new(py_spy());
    cmd.args(["record", "--format", "raw", "--pid"])
        .arg(pid.to_string())
        .arg("--rate")
        .arg(rate.to_string())
        .arg("--duration")
        .arg(seconds.to_string())
        .arg("-o")
        .arg(out);
    Background::spawn(cmd)
}

/// The last line of `stdout` that is a JSON object, parsed.
#[track_caller]
pub fn last_json_line(stdout: &str) -> serde_json::Value {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in the output:\n{stdout}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON line {line:?}: {e}"))
}

/// One Python frame of folded output: `qualname (file.py:LINE)`, or
/// `qualname (file.py)` without a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyFrame<'a> {
    pub qualname: &'a str,
    pub file: &'a str,
    pub line: Option<u32>,
}

/// Parses a Python frame; `None` for native, kernel and marker frames. The
/// file is a `.py` file (a base name in spanprof's output, a package path in
/// py-spy's), or a pseudo-file such as
/// `<frozen importlib._bootstrap>` or `<string>`.
pub fn parse_py_frame(frame: &str) -> Option<PyFrame<'_>> {
    let inner = frame.strip_suffix(')')?;
    let (qualname, location) = inner.rsplit_once(" (")?;
    if qualname.is_empty() || qualname.starts_with('[') || qualname.ends_with("_[k]") {
        return None;
    }
    let (file, line) = match location.rsplit_once(':') {
        Some((file, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => {
            (file, Some(line.parse().ok()?))
        }
        _ => (location, None),
    };
    let python_file =
        file.ends_with(".py") && file.len() > 3 || file.starts_with('<') && file.ends_with('>');
    python_file.then_some(PyFrame {
        qualname,
        file,
        line,
    })
}

/// True for a Python frame (see [`parse_py_frame`]).
pub fn is_py_frame(frame: &str) -> bool {
    parse_py_frame(frame).is_some()
}

impl FoldedStack {
    /// The Python frames, root first.
    pub fn py_frames(&self) -> Vec<PyFrame<'_>> {
        self.frames
            .iter()
            .filter_map(|f| parse_py_frame(f))
            .collect()
    }

    /// The qualnames of the Python frames, root first.
    pub fn py_qualnames(&self) -> Vec<&str> {
        self.py_frames().iter().map(|f| f.qualname).collect()
    }

    /// The innermost Python frame.
    pub fn py_leaf(&self) -> Option<PyFrame<'_>> {
        self.frames.iter().rev().find_map(|f| parse_py_frame(f))
    }
}

// ---------------------------------------------------------------------------
// Trace correlation: the tracing libraries (OpenTelemetry's SDK, OSProfiler)
// the span workloads import, and the workloads run with them.
// ---------------------------------------------------------------------------

/// What a span workload imports, checked before it runs.
const SPAN_LIBS_PROBE: &str =
    "import opentelemetry.sdk.trace, opentelemetry.trace, osprofiler.profiler";

/// The directory of the tracing libraries for CPython 3.`minor`:
/// `<SPANPROF_SPAN_LIBS>/3.<minor>`, else `target/span-libs/3.<minor>`
/// (`cargo xtask deps` fills it with `pip install --target`).
#[track_caller]
pub fn span_libs(minor: u8) -> PathBuf {
    let dir = path_from_env("SPANPROF_SPAN_LIBS", "target/span-libs").join(format!("3.{minor}"));
    if !dir.join("spanprof-stamp").is_file() {
        missing_prerequisite(
            &format!(
                "the tracing libraries (opentelemetry-sdk, osprofiler) for CPython 3.{minor} in {}",
                dir.display()
            ),
            "`cargo xtask deps` (pip-installs them per pyenv CPython into target/span-libs/3.X)",
        );
    }
    dir
}

/// Fails unless `python` imports OpenTelemetry's SDK and OSProfiler from `libs`.
#[track_caller]
pub fn require_span_libs(python: &Path, libs: &Path) {
    let mut cmd = Command::new(python);
    cmd.args(["-c", SPAN_LIBS_PROBE])
        .env("PYTHONPATH", libs)
        .env("PYTHONNOUSERSITE", "1");
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    if !out.status.success() {
        missing_prerequisite(
            &format!(
                "{} cannot import the tracing libraries from {}:\n{out}",
                python.display(),
                libs.display()
            ),
            "`cargo xtask deps` (reinstalls target/span-libs/3.X when its import check fails)",
        );
    }
}

/// Like [`start_py_workload`], with `PYTHONPATH=libs` (and no user site-packages): a span
/// workload that imports the tracing libraries.
#[track_caller]
pub fn start_py_workload_with_libs(
    python: &Path,
    libs: &Path,
    script: &str,
    args: &[&str],
) -> Background {
    let mut cmd = Command::new(python);
    cmd.arg(py_workload_source(script))
        .args(args)
        .env("PYTHONPATH", libs)
        .env("PYTHONNOUSERSITE", "1");
    start_ready(cmd, script)
}

/// The `spans: …` line of spanprof's end-of-session summary, if any.
pub fn spans_summary_line(stderr: &str) -> Option<&str> {
    stderr.lines().find(|l| l.starts_with("spans: "))
}

/// The number of samples whose span context spanprof read from the thread context the process
/// publishes (OTEP 4947): the `N` of the `spans:` line's ending
/// `; N read from the thread context the process publishes`, 0 when the line has no such
/// ending; `Err` when there is no `spans:` line or `N` is not a number.
pub fn published_span_samples(stderr: &str) -> Result<u64, String> {
    const ENDING: &str = " read from the thread context the process publishes";
    let line = spans_summary_line(stderr).ok_or("no `spans: …` line in the summary")?;
    let Some(rest) = line.strip_suffix(ENDING) else {
        return Ok(0);
    };
    let (_, n) = rest
        .rsplit_once("; ")
        .ok_or_else(|| format!("spans line {line:?}: no `; N` before {ENDING:?}"))?;
    n.parse()
        .map_err(|_| format!("spans line {line:?}: {n:?} is not a number"))
}

/// The `spanprof-context` package's source (`python/spanprof-context`), the opt-in publisher of
/// the OTEP 4947/4719 contexts (`cargo xtask deps` installs it into `target/span-libs/3.X`).
pub fn spanprof_context_dir() -> PathBuf {
    workspace_root().join("python/spanprof-context")
}

/// Fails unless `python` imports `spanprof_context` and its C extension from `libs`.
#[track_caller]
pub fn require_spanprof_context(python: &Path, libs: &Path) {
    let mut cmd = Command::new(python);
    cmd.args(["-c", "import spanprof_context, spanprof_context._native"])
        .env("PYTHONPATH", libs)
        .env("PYTHONNOUSERSITE", "1");
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    if !out.status.success() {
        missing_prerequisite(
            &format!(
                "{} cannot import spanprof_context (python/spanprof-context) from {}:\n{out}",
                python.display(),
                libs.display()
            ),
            "`cargo xtask deps` (builds and installs it into target/span-libs/3.X)",
        );
    }
}

/// The string labels of a decoded pprof sample (see [`decode_pprof`]), by key.
pub fn sample_str_labels(sample: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    sample["labels"]
        .as_array()
        .map(|labels| {
            labels
                .iter()
                .filter_map(|l| {
                    Some((l["key"].as_str()?.to_owned(), l["str"].as_str()?.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The numeric label `key` of a decoded pprof sample.
pub fn sample_num_label(sample: &serde_json::Value, key: &str) -> Option<i64> {
    sample["labels"]
        .as_array()?
        .iter()
        .find(|l| l["key"] == key)
        .and_then(|l| l["num"].as_i64())
}

/// The function names of a decoded pprof sample, leaf first, each cut at ` (` (the bare
/// qualname of a Python frame).
pub fn sample_functions(sample: &serde_json::Value) -> Vec<String> {
    sample["stack_leaf_first"]
        .as_array()
        .map(|frames| {
            frames
                .iter()
                .filter_map(|f| f.as_str())
                .map(|f| f.split(" (").next().unwrap_or(f).to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_well_formed_folded() {
        let text = "_start;main;dispatcher;hot_alpha 30\n\
                    _start;main;dispatcher;hot_beta 10\n\
                    main;do_syscalls;entry_SYSCALL_64_[k];read_zero_[k] 7\n\
                    [unknown] (libc.so.6+0x2a1b0);main 2\n\
                    [unknown] 1\n";
        let stacks = parse_folded(text).unwrap();
        assert_eq!(stacks.len(), 5);
        assert_eq!(folded_total(&stacks), 50);
        assert!(stacks[0].contains_seq(&["main", "dispatcher", "hot_alpha"]));
        assert!(!stacks[0].contains_seq(&["main", "hot_alpha"]));
        assert_eq!(stacks[1].callee_of("dispatcher"), Some("hot_beta"));
        assert!(is_kernel_frame(&stacks[2].frames[3]));
        assert_eq!(
            folded_count(&stacks, |s| s.contains("dispatcher")),
            40,
            "dispatcher samples"
        );
    }

    #[test]
    fn rejects_malformed_folded() {
        for bad in [
            "main;hot 0\n",
            "main;hot\n",
            "main;;hot 3\n",
            "main;hot -3\n",
            "main;hot 3x\n",
            "\n",
            "main; hot 3\n",
            "[unknown] (libc.so.6) 1\n",
            "[unknown] (libc.so.6+0xzz) 1\n",
        ] {
            assert!(parse_folded(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn finds_c_function_lines() {
        let src = "int x;\n\nvoid f(void);\n__attribute__((noinline)) void f(void)\n{\n\tx++;\n}\n";
        assert_eq!(c_function_lines(src, "f"), (4, 7));
    }

    #[test]
    fn parses_the_summary() {
        let stderr = "spanprof: profiling pid 7 (a), pid 9 (b) at 99 Hz for 2s; Ctrl-C to stop early\n\
                      spanprof: 221 samples, 3 lost, from 2 processes in 2.0 s at 99 Hz: pid 7 (a), pid 9 (b)\n\
                      processes: 7 (a), 9 (b x)\n\
                      top functions (self):\n";
        assert_eq!(
            parse_summary(stderr).unwrap(),
            Summary {
                samples: 221,
                lost: 3,
                processes: 2,
                frequency: 99,
                target: "pid 7 (a), pid 9 (b)".into(),
                pids: vec![7, 9],
            }
        );
        let one = "spanprof: 0 samples, 0 lost, from 1 process in 0.1 s at 499 Hz: sh -c x\n";
        let summary = parse_summary(one).unwrap();
        assert_eq!((summary.samples, summary.processes), (0, 1));
        assert!(summary.pids.is_empty());
        assert!(
            parse_summary("spanprof: 12 samples, lots lost, from 1 process in 1 s at 9 Hz: x")
                .is_err()
        );
        assert!(parse_summary("error: nothing").is_err());
    }

    #[test]
    fn parses_the_published_span_count() {
        let with =
            "spanprof: 990 samples, 0 lost, from 1 process in 5.0 s at 199 Hz: pid 7 (python3)\n\
                    spans: 700 of 990 samples in 120 OpenTelemetry spans (80 traces), 0 in \
                    OSProfiler traces; 695 read from the thread context the process publishes\n";
        assert_eq!(published_span_samples(with), Ok(695));
        let without = "spans: 3 of 9 samples in 1 OpenTelemetry span (1 trace), 6 in 2 \
                       OSProfiler traces (4 trace points)\n";
        assert_eq!(published_span_samples(without), Ok(0));
        assert!(published_span_samples("spanprof: 9 samples, 0 lost, from 1 process").is_err());
        assert!(published_span_samples(
            "spans: 1 of 2 samples in 1 OpenTelemetry span (1 trace), 0 in OSProfiler traces; \
             x read from the thread context the process publishes"
        )
        .is_err());
    }

    #[test]
    fn subsequence() {
        let frames = ["a", "b", "c"];
        assert!(contains_seq(&frames, &["b", "c"]));
        assert!(contains_seq(&frames, &[]));
        assert!(!contains_seq(&frames, &["a", "c"]));
    }

    #[test]
    fn unused_pid_is_unused() {
        let pid = unused_pid();
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }

    /// The decoder's own checks on hand-made good and broken profiles.
    #[test]
    fn pprof_decoder_self_test() {
        let mut cmd = Command::new(python());
        cmd.arg(decoder_script()).arg("--self-test");
        let out = run_with_timeout(cmd, Duration::from_secs(120));
        out.assert_success();
        assert!(out.stdout.contains("self-test: ok"), "{out}");
    }
}

#[cfg(test)]
mod python_tests {
    use super::*;

    #[test]
    fn parses_python_frames() {
        assert_eq!(
            parse_py_frame("Worker.run (py_split.py:31)"),
            Some(PyFrame {
                qualname: "Worker.run",
                file: "py_split.py",
                line: Some(31)
            })
        );
        assert_eq!(
            parse_py_frame("<module> (py_split.py)"),
            Some(PyFrame {
                qualname: "<module>",
                file: "py_split.py",
                line: None
            })
        );
        assert_eq!(
            parse_py_frame("_find_and_load (<frozen importlib._bootstrap>:1176)").map(|f| f.line),
            Some(Some(1176))
        );
        for native in [
            "main",
            "_PyEval_EvalFrameDefault",
            "[unknown] (libc.so.6+0x2a1b0)",
            "[native code]",
            "[truncated]",
            "[no python frames]",
            "entry_SYSCALL_64_[k]",
            "operator() (foo.cc:12)",
        ] {
            assert_eq!(parse_py_frame(native), None, "{native}");
        }
        let stack = &parse_folded(
            "_start;main;<module> (a.py:3);f (a.py:7);PyObject_Call;g (a.py:9);malloc 2\n",
        )
        .unwrap()[0];
        assert_eq!(stack.py_qualnames(), ["<module>", "f", "g"]);
        assert_eq!(
            stack.py_leaf().map(|f| (f.qualname, f.line)),
            Some(("g", Some(9)))
        );
    }
}

// ---------------------------------------------------------------------------
// Native stacks unwound with .eh_frame: the `--stats` JSON, the summary's
// `native stacks:` line, and the workloads built without frame pointers
// (`cargo xtask workloads`: `cpu_split_nofp`, `qsort_callback`, `dlopen_late`,
// the `spanprof_cext` module of `py_cext.py`).
// ---------------------------------------------------------------------------

/// What `spanprof profile --stats PATH` says of one process's native stacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUnwindStats {
    pub pid: u32,
    pub name: String,
    pub samples: u64,
    /// Stacks unwound to their root.
    pub complete: u64,
    /// Stacks cut short (stack copy too small, too many frames, …).
    pub truncated: u64,
    /// Stacks the unwinder gave up on.
    pub failed: u64,
    /// Stacks whose completeness cannot be known (`--unwind fp`).
    pub unchecked: u64,
    /// Why stacks were truncated or failed, and how many.
    pub reasons: std::collections::BTreeMap<String, u64>,
}

impl ProcessUnwindStats {
    /// `complete` in percent of `samples` (0 without samples).
    pub fn complete_share(&self) -> f64 {
        100.0 * self.complete as f64 / self.samples.max(1) as f64
    }

    /// The four kinds of stacks together (each sample's stack is one of them).
    pub fn classified(&self) -> u64 {
        self.complete + self.truncated + self.failed + self.unchecked
    }
}

/// The `--stats` JSON: `{"unwind": "dwarf"|"fp", "processes": [{"pid", "name", "samples",
/// "stacks": {"complete", "truncated", "failed", "unchecked", "reasons": {REASON: N}}}]}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnwindStats {
    pub unwind: String,
    pub processes: Vec<ProcessUnwindStats>,
}

impl UnwindStats {
    /// The process `pid`, if the stats have it.
    pub fn process(&self, pid: u32) -> Option<&ProcessUnwindStats> {
        self.processes.iter().find(|p| p.pid == pid)
    }
}

/// Parses the `--stats` JSON; `Err` says which field is missing or malformed. Fields other
/// than those of [`UnwindStats`] are ignored; a missing `reasons` is an empty one.
pub fn parse_unwind_stats(text: &str) -> Result<UnwindStats, String> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let unwind = json["unwind"]
        .as_str()
        .ok_or("no string `unwind`")?
        .to_owned();
    let mut processes = Vec::new();
    for (i, p) in json["processes"]
        .as_array()
        .ok_or("no array `processes`")?
        .iter()
        .enumerate()
    {
        let number = |v: &serde_json::Value, what: &str| -> Result<u64, String> {
            v.as_u64()
                .ok_or_else(|| format!("processes[{i}]: `{what}` is not a non-negative integer"))
        };
        let stacks = &p["stacks"];
        if !stacks.is_object() {
            return Err(format!("processes[{i}]: no object `stacks`"));
        }
        let mut reasons = std::collections::BTreeMap::new();
        match &stacks["reasons"] {
            serde_json::Value::Null => {}
            serde_json::Value::Object(map) => {
                for (reason, n) in map {
                    reasons.insert(reason.clone(), number(n, &format!("reasons.{reason}"))?);
                }
            }
            _ => return Err(format!("processes[{i}]: `stacks.reasons` is not an object")),
        }
        let pid = number(&p["pid"], "pid")?;
        processes.push(ProcessUnwindStats {
            pid: u32::try_from(pid).map_err(|_| format!("processes[{i}]: pid {pid} too large"))?,
            name: p["name"]
                .as_str()
                .ok_or_else(|| format!("processes[{i}]: no string `name`"))?
                .to_owned(),
            samples: number(&p["samples"], "samples")?,
            complete: number(&stacks["complete"], "stacks.complete")?,
            truncated: number(&stacks["truncated"], "stacks.truncated")?,
            failed: number(&stacks["failed"], "stacks.failed")?,
            unchecked: number(&stacks["unchecked"], "stacks.unchecked")?,
            reasons,
        });
    }
    Ok(UnwindStats { unwind, processes })
}

/// Reads and parses a `--stats` file, panicking with its text when malformed.
#[track_caller]
pub fn read_unwind_stats(path: &Path) -> UnwindStats {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the stats file {}: {e}", path.display()));
    parse_unwind_stats(&text)
        .unwrap_or_else(|e| panic!("malformed stats file {}: {e}\n{text}", path.display()))
}

/// The `native stacks: …` line of spanprof's end-of-session summary, if any.
pub fn native_stacks_line(stderr: &str) -> Option<&str> {
    stderr.lines().find(|l| l.starts_with("native stacks:"))
}

impl FoldedStack {
    /// The frames without the kernel frames at the leaf end (an interrupt or a system call
    /// taken in the user code): the user stack, root first.
    pub fn user_frames(&self) -> &[String] {
        let kernel = self
            .frames
            .iter()
            .rev()
            .take_while(|f| is_kernel_frame(f))
            .count();
        &self.frames[..self.frames.len() - kernel]
    }

    /// The innermost frame that is not a kernel frame.
    pub fn user_leaf(&self) -> Option<&str> {
        self.user_frames().last().map(String::as_str)
    }
}

/// Debian's interpreter the C extension workload is built for.
pub const SYSTEM_PYTHON_3_11: &str = "/usr/bin/python3.11";

/// The directory of the `spanprof_cext` module (`<workloads>/cext`), checked by importing it
/// with Debian's `/usr/bin/python3.11`.
#[track_caller]
pub fn cext_dir() -> PathBuf {
    let python = system_python(SYSTEM_PYTHON_3_11, "python3.11-dev");
    let dir = workloads_dir().join("cext");
    let mut cmd = Command::new(&python);
    cmd.args([
        "-c",
        "import sys; sys.path.insert(0, sys.argv[1]); import spanprof_cext",
    ])
    .arg(&dir)
    .env("PYTHONNOUSERSITE", "1");
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    if !out.status.success() {
        missing_prerequisite(
            &format!(
                "the C extension module spanprof_cext in {}, importable by {}:\n{out}",
                dir.display(),
                python.display()
            ),
            "`cargo xtask workloads` (builds it with Debian's python3.11-dev, which \
             `cargo xtask deps` installs)",
        );
    }
    dir
}

#[cfg(test)]
mod unwind_tests {
    use super::*;

    #[test]
    fn parses_unwind_stats() {
        let text = r#"{"unwind":"dwarf","processes":[{"pid":123,"name":"cpu_split_nofp",
            "samples":1500,"stacks":{"complete":1490,"truncated":5,"failed":5,"unchecked":0,
            "reasons":{"stack copy too small":5,"no unwind info":5}}}]}"#;
        let stats = parse_unwind_stats(text).unwrap();
        assert_eq!(stats.unwind, "dwarf");
        let p = stats.process(123).unwrap();
        assert_eq!(
            (p.samples, p.complete, p.truncated, p.failed, p.unchecked),
            (1500, 1490, 5, 5, 0)
        );
        assert_eq!(p.classified(), 1500);
        assert_eq!(p.reasons["stack copy too small"], 5);
        assert!((p.complete_share() - 99.33).abs() < 0.01);
        assert!(stats.process(7).is_none());

        let fp = r#"{"unwind":"fp","processes":[{"pid":9,"name":"x","samples":3,
            "stacks":{"complete":0,"truncated":0,"failed":0,"unchecked":3}}]}"#;
        assert!(parse_unwind_stats(fp).unwrap().processes[0]
            .reasons
            .is_empty());
        for bad in [
            "",
            r#"{"processes":[]}"#,
            r#"{"unwind":"dwarf"}"#,
            r#"{"unwind":"dwarf","processes":[{"pid":1,"name":"x","samples":1}]}"#,
            r#"{"unwind":"dwarf","processes":[{"pid":1,"name":"x","samples":-1,
                "stacks":{"complete":0,"truncated":0,"failed":0,"unchecked":0}}]}"#,
            r#"{"unwind":"dwarf","processes":[{"pid":1,"name":"x","samples":1,
                "stacks":{"complete":1,"truncated":0,"failed":0}}]}"#,
        ] {
            assert!(parse_unwind_stats(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn user_frames_drop_the_kernel_leaf() {
        let stacks = parse_folded(
            "main;hot;asm_sysvec_apic_timer_interrupt_[k];handle_softirqs_[k] 2\n\
             main;hot 1\n\
             ret_from_fork_[k] 1\n",
        )
        .unwrap();
        assert_eq!(stacks[0].user_leaf(), Some("hot"));
        assert_eq!(stacks[0].user_frames(), &stacks[1].frames[..]);
        assert_eq!(stacks[2].user_leaf(), None);
        let line = "spanprof: 3 samples\nnative stacks: 3 complete\n";
        assert_eq!(native_stacks_line(line), Some("native stacks: 3 complete"));
    }
}

/// Debian's Chromium; a missing prerequisite without it.
pub fn chromium() -> &'static str {
    let path = "/usr/bin/chromium";
    if !Path::new(path).is_file() {
        missing_prerequisite(
            "Debian's chromium (/usr/bin/chromium)",
            "`cargo xtask deps` as root",
        );
    }
    path
}

/// A headless Chromium command with its profile in `profile_dir`, no network chatter and no
/// sandbox (the tests run as root).
pub fn chromium_command(profile_dir: &Path) -> Command {
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--user-data-dir={}", profile_dir.display()));
    cmd
}
