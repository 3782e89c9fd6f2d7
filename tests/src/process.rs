//! Running things: temporary directories, the C workloads, spanprof runs with a timeout and
//! their output, processes in the background, and spanprof's error contract.

use std::ffi::OsStr;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{spanprof_bin, workload_path};

/// How long any one spanprof run may take before the test kills it: the
/// longest session in the tests is 5 s, loading and symbolizing take a few.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

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

pub(crate) fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// The lines of `pipe` (each with its newline, if it had one) as they come.
pub(crate) fn lines(pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
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

/// The CPU time (utime + stime, clock ticks) of `/proc/…/stat` at `path`: a process's (all its
/// threads) or, under `task/TID/`, one thread's; `None` when it cannot be read.
pub fn stat_cpu_ticks(path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After `comm)`: state is field 3, utime 14, stime 15.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unused_pid_is_unused() {
        let pid = unused_pid();
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}
