//! `spanprof top`: a live view of where the targets spend their CPU time, refreshed every
//! second: functions by self and total share over a sliding window, and a line per span name.
//!
//! # Overview
//! The collector runs as in a session (on-CPU samples); every second the samples of that second
//! are taken as a window (`Aggregator::take_window`), symbolized into a `Profile`, and reduced
//! to per-function and per-span counts ([`Second`]). The view sums the last [`Options::window`]
//! of them. In a terminal it is drawn with ratatui (keys below); otherwise a block of plain
//! lines is printed every second.
//!
//! Functions: the Python view by default (`--view`, [`profile::View`]: in a sample with Python
//! frames, the interpreter's own native frames are left out, their time the self time of the
//! function that called them; native code outside the interpreter stays); `n` switches to
//! every frame. Kernel frames are left out.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Row, Table};
use spanprof_collect::{self as collect, signals, Collector, EventSet};
use spanprof_pipeline::aggregate;
use spanprof_profile::profile::{self, FrameKind, Profile};

use crate::preflight;

/// What `top` watches, and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The processes.
    pub pids: Vec<u32>,
    /// Or a command to run (its children are followed); its output is discarded in the
    /// terminal view.
    pub command: Vec<std::ffi::OsString>,
    /// Samples per second on each CPU.
    pub frequency: u64,
    /// The sliding window the shares are of.
    pub window: Duration,
    /// Read span contexts.
    pub spans: bool,
    /// Plain lines even on a terminal.
    pub plain: bool,
    /// The frames shown at first (`n` switches).
    pub view: profile::View,
}

/// One second's counts.
#[derive(Debug, Default, Clone)]
pub struct Second {
    samples: u64,
    /// By function (Python view): (self, total).
    python: HashMap<String, (u64, u64)>,
    /// By function (every frame): (self, total).
    all: HashMap<String, (u64, u64)>,
    /// By span name (the OpenTelemetry span's, else the OSProfiler point's).
    spans: HashMap<String, u64>,
}

impl Second {
    /// The counts of `profile` (one second's samples).
    pub fn of(profile: &Profile) -> Second {
        let mut s = Second::default();
        // A sample's names (root first), kernel frames left out.
        let names = |profile: &Profile, sample: &profile::Sample| -> Vec<String> {
            sample
                .frames
                .iter()
                .filter_map(|&i| profile.frames.get(i as usize))
                .filter(|f| f.kind != FrameKind::Kernel)
                .map(|f| f.display_name())
                .collect()
        };
        let viewed = profile.in_view(profile::View::Python);
        for sample in viewed.samples.iter().filter(|s| s.count > 0) {
            add(&mut s.python, &names(&viewed, sample), sample.count);
        }
        for sample in &profile.samples {
            let n = sample.count;
            if n == 0 {
                continue;
            }
            s.samples += n;
            add(&mut s.all, &names(profile, sample), n);
            if let Some(span) = profile.span_of(sample) {
                let name = span
                    .span_name
                    .or(span.osprofiler_name)
                    .map(|n| n.as_str().to_string())
                    .unwrap_or_else(|| "[span without a name]".to_string());
                *s.spans.entry(name).or_default() += n;
            }
        }
        s
    }
}

/// Adds a stack of names (root first) to `by`: its last is self, each distinct one total.
fn add(by: &mut HashMap<String, (u64, u64)>, stack: &[String], n: u64) {
    let mut seen = HashSet::new();
    for name in stack {
        if seen.insert(name.as_str()) {
            by.entry(name.clone()).or_default().1 += n;
        }
    }
    if let Some(leaf) = stack.last() {
        by.entry(leaf.clone()).or_default().0 += n;
    }
}

/// How the functions are sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    /// By self share.
    SelfShare,
    /// By total share.
    Total,
}

/// The view: the last seconds, and the viewer's choices.
#[derive(Debug)]
pub struct View {
    seconds: VecDeque<Second>,
    keep: usize,
    /// Sort order.
    pub sort: Sort,
    /// Every frame rather than the Python view (`n`).
    pub native: bool,
    /// Not refreshed while paused.
    pub paused: bool,
}

/// One function's line: self and total shares in percent, and its name.
pub type FunctionLine = (f64, f64, String);

impl View {
    /// A view of the last `window` (whole seconds, at least one).
    pub fn new(window: Duration) -> View {
        View {
            seconds: VecDeque::new(),
            keep: (window.as_secs().max(1)) as usize,
            sort: Sort::SelfShare,
            native: false,
            paused: false,
        }
    }

    /// Adds a second, dropping the oldest beyond the window.
    pub fn push(&mut self, s: Second) {
        self.seconds.push_back(s);
        while self.seconds.len() > self.keep {
            self.seconds.pop_front();
        }
    }

    /// Samples in the window.
    pub fn samples(&self) -> u64 {
        self.seconds.iter().map(|s| s.samples).sum()
    }

    /// Whether the Python view is shown.
    pub fn python_view(&self) -> bool {
        !self.native
    }

    /// The functions, sorted, at most `limit`.
    pub fn functions(&self, limit: usize) -> Vec<FunctionLine> {
        let python = self.python_view();
        let mut sum: HashMap<&str, (u64, u64)> = HashMap::new();
        for s in &self.seconds {
            for (name, &(own, total)) in if python { &s.python } else { &s.all } {
                let e = sum.entry(name.as_str()).or_default();
                e.0 += own;
                e.1 += total;
            }
        }
        let all = self.samples().max(1) as f64;
        let mut lines: Vec<FunctionLine> = sum
            .into_iter()
            .map(|(name, (own, total))| {
                (
                    100.0 * own as f64 / all,
                    100.0 * total as f64 / all,
                    name.to_string(),
                )
            })
            .collect();
        let key = |l: &FunctionLine| match self.sort {
            Sort::SelfShare => (l.0, l.1),
            Sort::Total => (l.1, l.0),
        };
        lines.sort_by(|a, b| {
            key(b)
                .partial_cmp(&key(a))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.2.cmp(&b.2))
        });
        lines.truncate(limit);
        lines
    }

    /// The span names: (samples, share of the window's samples in percent, name), most first.
    pub fn spans(&self, limit: usize) -> Vec<(u64, f64, String)> {
        let mut sum: HashMap<&str, u64> = HashMap::new();
        for s in &self.seconds {
            for (name, &n) in &s.spans {
                *sum.entry(name.as_str()).or_default() += n;
            }
        }
        let all = self.samples().max(1) as f64;
        let mut lines: Vec<(u64, f64, String)> = sum
            .into_iter()
            .map(|(name, n)| (n, 100.0 * n as f64 / all, name.to_string()))
            .collect();
        lines.sort_by(|a, b| b.0.cmp(&a.0).then(a.2.cmp(&b.2)));
        lines.truncate(limit);
        lines
    }

    /// The heading: what, how long, how many samples, the keys.
    fn heading(&self, what: &str, frequency: u64) -> String {
        format!(
            "spanprof top: {what} at {frequency} Hz, last {} s: {} samples{}{}",
            self.seconds.len(),
            self.samples(),
            if self.python_view() {
                ", Python view"
            } else {
                ", every frame"
            },
            if self.paused { " (paused)" } else { "" }
        )
    }

    /// The view as plain lines (not a terminal).
    pub fn plain(&self, what: &str, frequency: u64, limit: usize) -> String {
        let mut out = format!(
            "{}\n  %self  %total  function\n",
            self.heading(what, frequency)
        );
        for (own, total, name) in self.functions(limit) {
            out.push_str(&format!("{own:7.1} {total:7.1}  {name}\n"));
        }
        let spans = self.spans(limit);
        if !spans.is_empty() {
            out.push_str("  samples %samples  span\n");
            for (n, share, name) in spans {
                out.push_str(&format!("{n:9} {share:6.1}  {name}\n"));
            }
        }
        out
    }

    fn draw(&self, frame: &mut ratatui::Frame<'_>, what: &str, frequency: u64) {
        let spans = self.spans(5);
        // The spans under the heading, then as many functions as fit.
        let [head, foot, body] = Layout::vertical([
            Constraint::Length(2),
            Constraint::Length(if spans.is_empty() {
                0
            } else {
                spans.len() as u16 + 2
            }),
            Constraint::Min(3),
        ])
        .areas(frame.area());
        let keys = format!(
            "keys: q quit  p {}  s sort by {}  n {}",
            if self.paused { "resume" } else { "pause" },
            match self.sort {
                Sort::SelfShare => "total",
                Sort::Total => "self",
            },
            if self.native {
                "Python view"
            } else {
                "every frame"
            }
        );
        frame.render_widget(
            Paragraph::new(vec![
                Line::from(self.heading(what, frequency)),
                Line::from(keys),
            ]),
            head,
        );
        let bold = Style::default().add_modifier(Modifier::BOLD);
        let rows: Vec<Row> = self
            .functions(body.height.saturating_sub(1) as usize)
            .into_iter()
            .map(|(own, total, name)| {
                Row::new(vec![format!("{own:6.1}"), format!("{total:6.1}"), name])
            })
            .collect();
        let (own_title, total_title) = match self.sort {
            Sort::SelfShare => ("%SELF*", "%TOTAL"),
            Sort::Total => ("%SELF", "%TOTAL*"),
        };
        frame.render_widget(
            Table::new(
                rows,
                [
                    Constraint::Length(7),
                    Constraint::Length(8),
                    Constraint::Fill(1),
                ],
            )
            .header(Row::new(vec![own_title, total_title, "FUNCTION"]).style(bold)),
            body,
        );
        if !spans.is_empty() {
            let rows: Vec<Row> = spans
                .into_iter()
                .map(|(n, share, name)| Row::new(vec![n.to_string(), format!("{share:6.1}"), name]))
                .collect();
            frame.render_widget(
                Table::new(
                    rows,
                    [
                        Constraint::Length(9),
                        Constraint::Length(7),
                        Constraint::Fill(1),
                    ],
                )
                .header(Row::new(vec!["SAMPLES", "%SAMPLES", "SPAN"]).style(bold)),
                foot,
            );
        }
    }
}

/// Watches until `q` (or Ctrl-C, or the targets exit); with a command, returns its exit
/// status once it has exited (`None`: it was stopped with the view, SIGTERM, or still runs).
pub fn run(opts: &Options) -> Result<Option<std::process::ExitStatus>> {
    collect::preflight()?;
    let mut what = Vec::new();
    for &pid in &opts.pids {
        let stat = preflight::check_pid(pid)?;
        what.push(format!("pid {pid} ({})", stat.comm));
    }
    let command = !opts.command.is_empty();
    if command {
        what.push(
            opts.command
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    let what = what.join(", ");
    let sampling = collect::Options {
        frequency: opts.frequency,
        events: EventSet::parse(["cpu"]).expect("cpu is an event"),
        spans: opts.spans,
        follow_children: command,
        ..collect::Options::default()
    };
    let mut c = Collector::load(
        &sampling,
        aggregate::Options {
            kernel: false,
            lines: false,
            ..aggregate::Options::default()
        },
    )?;
    let mut pids = opts.pids.clone();
    for &pid in &pids {
        c.discover(pid)?;
        c.flush_discovered();
        c.add_target(pid)?;
    }
    let tui = !opts.plain && std::io::stdout().is_terminal();
    let mut child = None;
    if command {
        let null = tui
            .then(|| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/null")
            })
            .transpose()
            .context("opening /dev/null for the command's output")?;
        let mut cmd =
            crate::command::GatedCommand::spawn_with_output(&opts.command, null.as_ref())?;
        c.add_target(cmd.pid())?;
        cmd.release()?;
        pids.push(cmd.pid());
        child = Some(cmd);
    }
    let mut terminal = tui.then(ratatui::init);
    let result = watch(&mut c, opts, &pids, &what, terminal.as_mut());
    if terminal.is_some() {
        ratatui::restore();
    }
    let Some(mut cmd) = child else {
        return result.map(|_| None);
    };
    if !matches!(result, Ok(true)) && cmd.wait(false)?.is_none() {
        // Quit with the view (or failed): the command was started for it, and stops with it.
        stop(&mut cmd)?;
        return result.map(|_| None);
    }
    // Its exit was seen in the kernel: it is a zombie at once, or about to be.
    let status = cmd.wait(true)?;
    result.map(|_| status)
}

/// How long a command has after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Stops the command: SIGTERM, then SIGKILL after [`STOP_GRACE`]; reaps it.
fn stop(cmd: &mut crate::command::GatedCommand) -> Result<()> {
    cmd.signal(libc::SIGTERM);
    let start = Instant::now();
    while cmd.wait(false)?.is_none() {
        if start.elapsed() >= STOP_GRACE {
            cmd.signal(libc::SIGKILL);
            cmd.wait(true)?;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The loop: tick, a window every second, keys. True when it ended because the targets
/// exited.
fn watch(
    c: &mut Collector,
    opts: &Options,
    pids: &[u32],
    what: &str,
    mut terminal: Option<&mut ratatui::DefaultTerminal>,
) -> Result<bool> {
    let mut view = View::new(opts.window);
    view.native = opts.view == profile::View::Full;
    let mut waiter = c.waiter(pids);
    let mut second = Instant::now();
    let mut redraw = true;
    loop {
        waiter.wait(Duration::from_millis(50));
        c.tick();
        if second.elapsed() >= Duration::from_secs(1) {
            second = Instant::now();
            let window = c.agg.take_window();
            let meta = c.meta(
                what.to_string(),
                SystemTime::now(),
                Duration::from_secs(1),
                0,
            );
            let profile = window.into_profile(&mut c.symbolizer, &c.python, meta);
            if !view.paused {
                view.push(Second::of(&profile));
                redraw = true;
            }
            if terminal.is_none() && !view.paused {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", view.plain(what, opts.frequency, 10))
                    .and_then(|()| out.flush())
                    .context("writing to standard output")?;
            }
        }
        if let Some(t) = terminal.as_deref_mut() {
            while event::poll(Duration::ZERO).context("reading the terminal")? {
                if let Event::Key(key) = event::read().context("reading the terminal")? {
                    if key.kind != KeyEventKind::Press {
                        continue;
                    }
                    match key.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(false),
                        KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                            return Ok(false)
                        }
                        KeyCode::Char('p') => view.paused = !view.paused,
                        KeyCode::Char('s') => {
                            view.sort = match view.sort {
                                Sort::SelfShare => Sort::Total,
                                Sort::Total => Sort::SelfShare,
                            }
                        }
                        KeyCode::Char('n') => view.native = !view.native,
                        _ => continue,
                    }
                    redraw = true;
                }
            }
            if redraw {
                t.draw(|f| view.draw(f, what, opts.frequency))
                    .context("drawing the view")?;
                redraw = false;
            }
        }
        if signals::stop_signal().is_some() {
            return Ok(false);
        }
        let gone = waiter.exited();
        for pid in gone {
            c.programs.remove_target(pid);
        }
        if !c.programs.has_targets() {
            if terminal.is_none() {
                println!("spanprof top: the targets exited");
            }
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spanprof_profile::format::fixture;
    use spanprof_profile::profile::{SpanContext, SpanName};

    fn rounded(lines: Vec<FunctionLine>) -> Vec<(String, f64, f64)> {
        lines
            .into_iter()
            .map(|(own, total, name)| {
                (
                    name,
                    (own * 10.0).round() / 10.0,
                    (total * 10.0).round() / 10.0,
                )
            })
            .collect()
    }

    /// The fixture: `main;compute` 5 + 3 (compute at two addresses) + 2 (a kernel frame under
    /// it, left out), `main;[unknown] (libfoo.so+0x1234)` 1.
    #[test]
    fn shares_are_of_the_window_s_samples_sorted_by_self_or_total() {
        let mut p = fixture::profile();
        p.spans = vec![SpanContext {
            span_name: SpanName::new("GET /x"),
            ..SpanContext::default()
        }];
        p.samples[0].span = Some(0);
        let mut view = View::new(Duration::from_secs(2));
        view.push(Second::of(&p));
        assert!(view.python_view(), "the Python view by default");
        let unknown = "[unknown] (libfoo.so+0x1234)".to_string();
        // No Python frame: the Python view is every frame.
        let every = vec![
            ("compute".to_string(), 90.9, 90.9),
            (unknown.clone(), 9.1, 9.1),
            ("main".to_string(), 0.0, 100.0),
        ];
        assert_eq!(rounded(view.functions(10)), every);
        view.sort = Sort::Total;
        assert_eq!(view.functions(1)[0].2, "main");
        assert_eq!(view.spans(5), vec![(5, 500.0 / 11.0, "GET /x".to_string())]);

        // A second in which `main` is a Python function and `compute` the interpreter's: in
        // the Python view, compute's time is main's own (over both seconds, 22 samples).
        p.frames[0].kind = FrameKind::Python;
        p.frames[0].file = None;
        p.frames[1].interpreter = true;
        p.frames[4].interpreter = true;
        view.push(Second::of(&p));
        view.sort = Sort::SelfShare;
        let lines = rounded(view.functions(10));
        // main: the second second's 10 samples in compute; compute: the first second's 10.
        assert_eq!(lines[0], ("main".to_string(), 45.5, 100.0));
        assert_eq!(lines[1], ("compute".to_string(), 45.5, 45.5));
        view.native = true;
        assert!(!view.python_view());
        assert_eq!(
            rounded(view.functions(1))[0],
            ("compute".to_string(), 90.9, 90.9)
        );
        // A third second pushes the first out of the 2-second window.
        view.push(Second::of(&p));
        assert_eq!(view.samples(), 22);
        let text = view.plain("pid 100 (app)", 99, 3);
        assert!(
            text.starts_with(
                "spanprof top: pid 100 (app) at 99 Hz, last 2 s: 22 samples, every frame"
            ),
            "{text}"
        );
        assert!(text.contains("GET /x"), "{text}");
    }
}
