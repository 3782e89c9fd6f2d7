//! `spanprof top` against a Python process whose one busy thread runs `spin` inside the
//! OpenTelemetry span "spin-span" (`tests/workloads/py_dump.py`): in a tmux terminal the view
//! shows `spin` first and the span's line after three seconds, `s` sorts by total share and back,
//! `p` pauses and resumes it, and `q` exits with status 0;
//! with `--plain`, the same as lines every second, and SIGTERM ends it with status 0.

use std::process::Command;
use std::time::{Duration, Instant};

use spanprof_tests::{
    profiling_lock, pyenv_python, require_root, require_span_libs, span_libs, spanprof_bin,
    spanprof_command, start_py_workload_with_libs, stat_cpu_ticks, Background, TempDir,
    RUN_TIMEOUT,
};

/// The workload, once its GIL holder has run a while (its truth file is not needed here).
fn busy_workload(tmp: &TempDir) -> Background {
    let (python, libs) = (pyenv_python(11), span_libs(11));
    require_span_libs(&python, &libs);
    let truth = tmp.join("truth.json");
    let workload = start_py_workload_with_libs(
        &python,
        &libs,
        "py_dump.py",
        &[truth.to_str().expect("UTF-8")],
    );
    // The process's CPU time: the GIL holder's, once it holds it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ticks =
            stat_cpu_ticks(&format!("/proc/{}/stat", workload.pid())).expect("the workload runs");
        if ticks >= 50 {
            return workload;
        }
        assert!(Instant::now() < deadline, "the workload did not get busy");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `i`-th number of a line of the view (a share in percent), or -1.
fn share(line: &str, i: usize) -> f64 {
    line.split_whitespace()
        .filter_map(|w| w.parse::<f64>().ok())
        .nth(i)
        .unwrap_or(-1.0)
}

/// tmux on a socket of its own, killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").output();
    }
}

/// The screen once it holds `want` (the view redraws at a key at once, or within a second).
fn screen_with(tmux: &Tmux, want: &dyn Fn(&str) -> bool, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let screen = tmux.screen();
        if want(&screen) {
            return screen;
        }
        assert!(Instant::now() < deadline, "{what}:\n{screen}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The (self, total) shares of the function rows, in screen order.
fn rows(screen: &str) -> Vec<(f64, f64)> {
    screen
        .lines()
        .skip_while(|l| !l.contains("FUNCTION"))
        .skip(1)
        .take_while(|l| share(l, 1) >= 0.0)
        .map(|l| (share(l, 0), share(l, 1)))
        .collect()
}

/// The heading's sample count ("…: N samples, …"); `None` in a screen caught mid-draw.
fn heading_samples(screen: &str) -> Option<u64> {
    let head = screen.lines().next().unwrap_or_default();
    head.split(": ")
        .nth(2)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
}

/// `s` sorts by total share and back, `p` pauses the view (its figures stay) and resumes it.
fn check_keys(tmux: &Tmux) {
    let sorted = |screen: &str, by_total: bool| {
        let r = rows(screen);
        r.len() >= 2
            && r.windows(2).all(|w| {
                if by_total {
                    w[0].1 >= w[1].1
                } else {
                    w[0].0 >= w[1].0
                }
            })
    };
    // The rows are checked as part of the wait: a screen caught mid-draw is not a failure.
    tmux.run(&["send-keys", "-t", "top", "s"]);
    screen_with(
        tmux,
        &|s| s.contains("%TOTAL*") && s.contains("s sort by self") && sorted(s, true),
        "s did not sort the rows by total share",
    );
    tmux.run(&["send-keys", "-t", "top", "s"]);
    screen_with(
        tmux,
        &|s| s.contains("%SELF*") && s.contains("s sort by total") && sorted(s, false),
        "s did not sort the rows by self share again",
    );

    tmux.run(&["send-keys", "-t", "top", "p"]);
    let paused = screen_with(
        tmux,
        &|s| s.contains("(paused)") && s.contains("p resume") && heading_samples(s).is_some(),
        "p did not pause",
    );
    let before = heading_samples(&paused);
    // Two seconds of samples are taken and not shown: the heading's count stays.
    std::thread::sleep(Duration::from_millis(2200));
    let still = tmux.screen();
    assert_eq!(
        heading_samples(&still),
        before,
        "the paused view changed:\n{paused}\n{still}"
    );
    tmux.run(&["send-keys", "-t", "top", "p"]);
    screen_with(
        tmux,
        &|s| !s.contains("(paused)") && heading_samples(s).is_some_and(|n| Some(n) != before),
        "p did not resume the view",
    );
}

#[test]
fn top_in_a_terminal_shows_the_hottest_function_first_and_its_span_and_q_exits_0() {
    require_root();
    let bin = spanprof_bin();
    if Command::new("tmux").arg("-V").output().is_err() {
        spanprof_tests::missing_prerequisite("tmux", "apt-get install tmux (cargo xtask deps)");
    }
    let _lock = profiling_lock();
    let tmp = TempDir::new("top-tmux");
    let workload = busy_workload(&tmp);
    let status = tmp.join("status");
    let tmux = Tmux {
        socket: format!("spanprof-top-{}", std::process::id()),
    };
    let shell = format!(
        "{} top --pid {}; echo $? > {}; sleep 600",
        bin.display(),
        workload.pid(),
        status.display()
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "40",
        &shell,
    ]);
    // Three seconds of samples, then the view as it stands.
    let deadline = Instant::now() + Duration::from_secs(30);
    let screen = loop {
        let screen = tmux.screen();
        if screen.contains("last 3 s") {
            break screen;
        }
        assert!(
            Instant::now() < deadline,
            "no 3-second view within 30 s:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let lines: Vec<&str> = screen.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.contains("FUNCTION"))
        .unwrap_or_else(|| panic!("no function table:\n{screen}"));
    let first = lines.get(header + 1).copied().unwrap_or_default();
    assert!(
        first.contains("spin (py_dump.py)"),
        "the hottest function first: {first:?}\n{screen}"
    );
    // Its share: the GIL holder's samples, nearly all (the waiting thread runs a little).
    assert!(
        lines
            .iter()
            .any(|l| l.trim_end().ends_with("spin-span") && share(l, 1) >= 90.0),
        "the span's line, with its share:\n{screen}"
    );
    check_keys(&tmux);
    tmux.run(&["send-keys", "-t", "top", "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !status.exists() {
        assert!(
            Instant::now() < deadline,
            "q did not end top:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let code = std::fs::read_to_string(&status).expect("status");
    assert_eq!(code.trim(), "0", "top's exit status");
}

#[test]
fn top_not_on_a_terminal_prints_the_view_every_second_and_ends_at_sigterm() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let tmp = TempDir::new("top-plain");
    let workload = busy_workload(&tmp);
    let top = Background::spawn(spanprof_command([
        "top",
        "--pid",
        &workload.pid().to_string(),
        "--window",
        "2s",
    ]));
    // Its stdout is a pipe: plain lines. A view a second (after a load that can take a second
    // on a busy machine), then SIGTERM (not SIGINT: a test run started in the background by a
    // script has SIGINT ignored, and spanprof keeps an ignored signal ignored).
    std::thread::sleep(Duration::from_secs(5));
    top.signal(libc::SIGTERM);
    let out = top.finish(RUN_TIMEOUT);
    out.assert_success();
    let views: Vec<&str> = out.stdout.split("spanprof top: ").skip(1).collect();
    assert!(views.len() >= 2, "a view every second:\n{}", out.stdout);
    let last = views.last().unwrap();
    assert!(last.contains("last 2 s"), "the window is 2 s:\n{last}");
    let first_function = last.lines().nth(2).unwrap_or_default();
    assert!(
        share(first_function, 0) >= 90.0 && first_function.ends_with("spin (py_dump.py)"),
        "the hottest function first: {first_function:?}\n{last}"
    );
    assert!(
        last.lines().any(|l| l.ends_with("spin-span")),
        "a line for the span:\n{last}"
    );
}

/// `top -- CMD` runs the command (its output kept with `--plain`) and ends with its exit status.
#[test]
fn top_of_a_command_ends_with_it_and_its_exit_status() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let out = spanprof_tests::run_spanprof([
        "top",
        "--plain",
        "--",
        "sh",
        "-c",
        "echo from-the-command; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(out.stdout.contains("from-the-command"), "{}", out.stdout);
    assert!(
        out.stderr.contains("the command exited (exit status: 3)"),
        "{}",
        out.stderr
    );
}
