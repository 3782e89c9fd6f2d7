//! `spanprof verify`: evidence that profiling works on this host before a team relies on it.
//!
//! # Overview
//! Without a target, [`run`] profiles calibrated workloads whose truth is known and compares:
//! a native one built into the spanprof binary (two functions sharing the CPU 3:1, measured
//! with the thread's CPU clock; and one allocating a known number of bytes), and, when a
//! Python 3 is found, the embedded `verify_workload.py` (two functions sharing the CPU 2:1, and
//! requests traced with OpenTelemetry and OSProfiler whose span ids it writes down). With a
//! target (`--pid`, `-- CMD`), it profiles that target and reports what it can without a
//! truth. Each [`Check`] has a status and the figure it measured; any failure makes the
//! command exit non-zero.
//!
//! # Design constraints
//! The workloads run as children through the same session code as `spanprof profile`, so a
//! pass means the path users take works, not a test double of it. A check whose prerequisite
//! is missing (no Python, no tracing libraries, no CAP_SYS_ADMIN for the allocation probes) is
//! skipped with the reason, not failed.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::collect::{EventSet, Memory};
use crate::export::ExporterConfig;
use crate::profile::{FrameKind, Profile};
use crate::session::{self, Options, Outcome, Target};
use crate::summary::Cost;

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// As expected.
    Pass,
    /// Not as expected: the figure says how.
    Fail,
    /// Not run: its prerequisite is missing (the figure says which).
    Skip,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        }
    }
}

/// One line of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// The verdict.
    pub status: Status,
    /// What was measured, and against what.
    pub figure: String,
}

impl Check {
    fn new(name: &str, status: Status, figure: impl Into<String>) -> Check {
        Check {
            name: name.to_string(),
            status,
            figure: figure.into(),
        }
    }

    fn judged(name: &str, ok: bool, figure: impl Into<String>) -> Check {
        let status = if ok { Status::Pass } else { Status::Fail };
        Check::new(name, status, figure)
    }
}

/// What `spanprof verify` was asked.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// A target to check instead of the built-in workloads.
    pub target: Option<Target>,
    /// How long the target is profiled (the built-in workloads take about 3 s each; the native
    /// split 3 s of its own CPU).
    pub duration: Duration,
    /// How every session samples (`--frequency`; children followed); each check sets the
    /// events.
    pub sampling: crate::collect::Options,
    /// The Python for the Python workloads; default `python3` on `PATH`.
    pub python: Option<PathBuf>,
    /// Send the profile there and check the answer.
    pub exporter: Option<ExporterConfig>,
}

/// Seconds each built-in workload runs.
const WORKLOAD_SECONDS: f64 = 3.0;
/// How far a share may be from its truth, in points.
const SHARE_TOLERANCE: f64 = 5.0;
/// How far the estimated allocated bytes may be from the truth.
const ALLOC_TOLERANCE: f64 = 0.15;
/// The overhead a check passes with: spanprof's CPU over its targets' CPU (from /proc), at the
/// default 499 Hz over the native split's 3 s of CPU (measured here: 2.5%, own CPU dominating).
const MAX_OVERHEAD: f64 = 0.10;

/// The table: one line per check, figures aligned.
pub fn table(checks: &[Check]) -> String {
    let width = checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = String::new();
    let _ = writeln!(out, "{:<width$}  result  figure", "check");
    for c in checks {
        let _ = writeln!(
            out,
            "{:<width$}  {:<6}  {}",
            c.name,
            c.status.name(),
            c.figure
        );
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    let skipped = checks.iter().filter(|c| c.status == Status::Skip).count();
    let _ = writeln!(
        out,
        "{} checks: {} passed, {failed} failed, {skipped} skipped",
        checks.len(),
        checks.len() - failed - skipped
    );
    out
}

/// Runs every check; the caller prints [`table`] and fails when any check failed.
pub fn run(opts: &VerifyOptions) -> Vec<Check> {
    let mut checks = Vec::new();
    let caps = crate::preflight::check_capabilities();
    checks.push(match &caps {
        Ok(()) => Check::new("capabilities", Status::Pass, held_capabilities()),
        Err(e) => Check::new("capabilities", Status::Fail, e.to_string()),
    });
    let btf = opts.sampling.btf_path.is_file();
    checks.push(Check::judged(
        "kernel BTF",
        btf,
        if btf {
            opts.sampling.btf_path.display().to_string()
        } else {
            format!(
                "{} missing (CONFIG_DEBUG_INFO_BTF)",
                opts.sampling.btf_path.display()
            )
        },
    ));
    checks.push(match crate::preflight::kernel_symbols_warning() {
        None => Check::new(
            "kernel symbols",
            Status::Pass,
            "/proc/kallsyms has addresses",
        ),
        Some(w) => Check::new("kernel symbols", Status::Fail, w),
    });
    if caps.is_err() || !btf {
        return checks;
    }
    match &opts.target {
        Some(target) => check_target(opts, target.clone(), &mut checks),
        None => builtin(opts, &mut checks),
    }
    checks
}

/// The capabilities that matter, as held.
fn held_capabilities() -> String {
    let names = [
        "CAP_BPF",
        "CAP_PERFMON",
        "CAP_SYS_PTRACE",
        "CAP_DAC_READ_SEARCH",
        "CAP_SYSLOG",
        "CAP_SYS_ADMIN",
    ];
    let held: Vec<&str> = names
        .into_iter()
        .filter(|n| crate::preflight::holds(n))
        .collect();
    held.join(", ")
}

fn options(
    opts: &VerifyOptions,
    target: Target,
    events: EventSet,
    duration: Option<Duration>,
) -> Options {
    Options {
        target,
        duration,
        sampling: crate::collect::Options {
            events,
            ..opts.sampling.clone()
        },
        aggregate: crate::aggregate::Options {
            timestamps: opts.exporter.is_some(),
            ..crate::aggregate::Options::default()
        },
        progress: false,
        redact_paths: None,
        debuginfod: false,
    }
}

/// Profiles `argv` to its end; its exit status must be 0 (3: a Python library is missing).
fn profile_command(
    opts: &VerifyOptions,
    argv: Vec<OsString>,
    events: EventSet,
) -> Result<(Outcome, i32)> {
    let mut outcome = session::run(&options(opts, Target::Command(argv), events, None))?;
    let status = outcome.wait_command()?.and_then(|s| s.code()).unwrap_or(-1);
    Ok((outcome, status))
}

/// A private temporary directory for the workloads' truth files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        // NB: create_dir fails on anything already there (a planted directory or link): a new
        // name is tried.
        let mut last = None;
        for attempt in 0..16u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = std::env::temp_dir().join(format!(
                "spanprof-verify-{}-{nanos:09}-{attempt}",
                std::process::id()
            ));
            match std::fs::create_dir(&dir) {
                Ok(()) => return Scratch::private(dir),
                Err(e) => last = Some((dir, e)),
            }
        }
        let (dir, e) = last.expect("tried at least once");
        Err(anyhow::anyhow!("cannot create {}: {e}", dir.display()))
    }

    fn private(dir: PathBuf) -> Result<Scratch> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(Scratch(dir))
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("the workload wrote no {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

fn builtin(opts: &VerifyOptions, checks: &mut Vec<Check>) {
    let scratch = match Scratch::new() {
        Ok(s) => s,
        Err(e) => {
            checks.push(Check::new("workloads", Status::Fail, format!("{e:#}")));
            return;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            checks.push(Check::new(
                "workloads",
                Status::Fail,
                format!("no own executable: {e}"),
            ));
            return;
        }
    };
    let seconds = WORKLOAD_SECONDS.to_string();
    // Native: the CPU split.
    let truth = scratch.path("native.json");
    let argv = vec![
        exe.clone().into(),
        "__verify-workload".into(),
        "native".into(),
        truth.clone().into(),
        seconds.clone().into(),
    ];
    match profile_command(opts, argv, EventSet::Cpu) {
        Err(e) => checks.push(Check::new(
            "native: functions",
            Status::Fail,
            format!("{e:#}"),
        )),
        Ok((outcome, status)) => {
            let profile = &outcome.profile;
            checks.push(split_check(
                "native: functions",
                profile,
                &truth,
                status,
                ("verify_native_alpha", "verify_native_beta"),
            ));
            checks.push(names_resolved("native: frames named", profile));
            checks.push(stacks_complete("native: stacks complete", profile));
            checks.push(resource_check(profile));
            checks.push(overhead_check(&outcome));
            if let Some(exporter) = &opts.exporter {
                checks.push(export_check(profile, exporter.clone()));
            }
        }
    }
    // Native: allocations of a known size.
    if crate::preflight::has_sys_admin() {
        let truth = scratch.path("alloc.json");
        let argv = vec![
            exe.clone().into(),
            "__verify-workload".into(),
            "alloc".into(),
            truth.clone().into(),
            "1.5".into(),
        ];
        let events = EventSet::Memory(Memory::Alloc);
        checks.push(match profile_command(opts, argv, events) {
            Err(e) => Check::new("allocations", Status::Fail, format!("{e:#}")),
            Ok((outcome, status)) => alloc_check(&outcome.profile, &truth, status),
        });
    } else {
        checks.push(Check::new(
            "allocations",
            Status::Skip,
            "missing capability CAP_SYS_ADMIN (the allocation uprobes need it)",
        ));
    }
    // Python.
    let python = opts.python.clone().or_else(|| find_on_path("python3"));
    let Some(python) = python else {
        for name in ["python: functions", "spans"] {
            checks.push(Check::new(
                name,
                Status::Skip,
                "no python3 on PATH (give --python)",
            ));
        }
        return;
    };
    let script = scratch.path("verify_workload.py");
    if let Err(e) = std::fs::write(&script, include_str!("verify_workload.py")) {
        checks.push(Check::new("python: functions", Status::Fail, e.to_string()));
        return;
    }
    let py = |mode: &str, truth: &Path| -> Vec<OsString> {
        vec![
            python.clone().into(),
            script.clone().into(),
            mode.into(),
            truth.into(),
            seconds.clone().into(),
        ]
    };
    let truth = scratch.path("split.json");
    checks.push(
        match profile_command(opts, py("split", &truth), EventSet::Cpu) {
            Err(e) => Check::new("python: functions", Status::Fail, format!("{e:#}")),
            Ok((outcome, status)) => split_check(
                "python: functions",
                &outcome.profile,
                &truth,
                status,
                ("verify_alpha", "verify_beta"),
            ),
        },
    );
    let truth = scratch.path("traced.json");
    checks.push(
        match profile_command(opts, py("traced", &truth), EventSet::Cpu) {
            Err(e) => Check::new("spans", Status::Fail, format!("{e:#}")),
            Ok((_, 3)) => Check::new(
                "spans",
                Status::Skip,
                format!(
                    "{} cannot import the OpenTelemetry SDK and OSProfiler (pip install \
                 opentelemetry-sdk osprofiler, or set PYTHONPATH)",
                    python.display()
                ),
            ),
            Ok((outcome, status)) => span_check(&outcome.profile, &truth, status),
        },
    );
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Samples (weights) per function name found by `pred` anywhere in the stack.
fn samples_with(profile: &Profile, pred: impl Fn(&str) -> bool) -> u64 {
    profile
        .samples
        .iter()
        .filter(|s| {
            s.frames.iter().any(|&f| {
                profile.frames[f as usize]
                    .function
                    .as_deref()
                    .is_some_and(&pred)
            })
        })
        .map(|s| profile.weight(s))
        .sum()
}

/// Two functions' shares of their samples against the truth's.
fn share_check(
    name: &str,
    profile: &Profile,
    (a_name, a_truth): (&str, f64),
    (b_name, b_truth): (&str, f64),
) -> Check {
    let a = samples_with(profile, |f| f.contains(a_name)) as f64;
    let b = samples_with(profile, |f| f.contains(b_name)) as f64;
    if a + b < 100.0 {
        return Check::new(
            name,
            Status::Fail,
            format!("only {} samples in {a_name} and {b_name}", a + b),
        );
    }
    let share = 100.0 * a / (a + b);
    let truth = 100.0 * a_truth / (a_truth + b_truth).max(f64::MIN_POSITIVE);
    Check::judged(
        name,
        (share - truth).abs() <= SHARE_TOLERANCE,
        format!(
            "{a_name} {share:.1}% / {b_name} {:.1}% of {} samples; truth {truth:.1}% / {:.1}% \
             (±{SHARE_TOLERANCE} points)",
            100.0 - share,
            a + b,
            100.0 - truth
        ),
    )
}

fn workload_failed(name: &str, status: i32) -> Option<Check> {
    (status != 0).then(|| Check::new(name, Status::Fail, format!("the workload exited {status}")))
}

/// A split workload's check: the two functions' shares against the truth file's `alpha` and
/// `beta` CPU seconds.
fn split_check(
    name: &str,
    profile: &Profile,
    truth: &Path,
    status: i32,
    (alpha, beta): (&str, &str),
) -> Check {
    if let Some(c) = workload_failed(name, status) {
        return c;
    }
    match read_json(truth) {
        Err(e) => Check::new(name, Status::Fail, format!("{e:#}")),
        Ok(t) => share_check(
            name,
            profile,
            (alpha, t["alpha"].as_f64().unwrap_or(0.0)),
            (beta, t["beta"].as_f64().unwrap_or(0.0)),
        ),
    }
}

/// The share of frames (weighted by samples) that have a function name.
fn names_resolved(name: &str, profile: &Profile) -> Check {
    let (mut named, mut all) = (0u64, 0u64);
    for s in &profile.samples {
        for &f in &s.frames {
            let frame = &profile.frames[f as usize];
            // NB: pseudo-frames ([off-cpu: …], [native code]) are not symbolization results.
            if frame.kind == FrameKind::Python || frame.module.is_some() || frame.function.is_none()
            {
                all += s.count;
                named += u64::from(frame.function.is_some()) * s.count;
            }
        }
    }
    let share = 100.0 * named as f64 / all.max(1) as f64;
    Check::judged(
        name,
        all > 0 && share >= 90.0,
        format!("{share:.1}% of {all} frames have a function name (at least 90%)"),
    )
}

fn stacks_complete(name: &str, profile: &Profile) -> Check {
    let mut by_kind: HashMap<&str, u64> = HashMap::new();
    for s in &profile.samples {
        *by_kind.entry(s.unwind.kind()).or_default() += s.count;
    }
    let all: u64 = by_kind.values().sum();
    let complete = by_kind.get("complete").copied().unwrap_or(0);
    let share = 100.0 * complete as f64 / all.max(1) as f64;
    Check::judged(
        name,
        all > 0 && share >= 90.0,
        format!(
            "{share:.1}% of {all} stacks complete (at least 90%); truncated {}, failed {}",
            by_kind.get("truncated").copied().unwrap_or(0),
            by_kind.get("failed").copied().unwrap_or(0)
        ),
    )
}

fn resource_check(profile: &Profile) -> Check {
    let Some(p) = profile.processes.first() else {
        return Check::new(
            "resource attributes",
            Status::Fail,
            "no process in the profile",
        );
    };
    let attrs =
        crate::resource::resource_attributes(p.pid, &p.name, &p.info, profile.meta.host.as_ref());
    let get = |k: &str| {
        attrs
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| match v {
                crate::resource::Value::Str(s) => s.clone(),
                crate::resource::Value::Int(i) => i.to_string(),
            })
    };
    let service = get("service.name");
    let host = get("host.name");
    let figure =
        format!(
        "service.name={} process.executable.name={} process.pid={} host.name={} container.id={}",
        service.as_deref().unwrap_or("(none)"),
        get("process.executable.name").as_deref().unwrap_or("(none)"),
        p.pid,
        host.as_deref().unwrap_or("(none)"),
        get("container.id").as_deref().unwrap_or("(none: not in a container)"),
    );
    Check::judged(
        "resource attributes",
        service.is_some_and(|s| !s.is_empty()) && host.is_some_and(|h| !h.is_empty()),
        figure,
    )
}

fn overhead_check(outcome: &Outcome) -> Check {
    let cost = Cost::of(&outcome.profile, &outcome.overhead);
    let micros = |ns: Option<f64>| ns.map_or("n/a".to_string(), |n| format!("{:.1} µs", n / 1e3));
    let figure = format!(
        "{} in the kernel and {} of its own CPU per sample; {} of the target's CPU ({}; at \
         most {:.0}%){}",
        micros(cost.kernel_per_sample()),
        micros(cost.own_per_sample()),
        cost.share()
            .map_or("n/a".to_string(), |s| format!("{:.2}%", s * 100.0)),
        cost.source_text(),
        MAX_OVERHEAD * 100.0,
        if cost.kernel_ns.is_none() {
            " (in-kernel time not counted: CAP_SYS_ADMIN or sysctl kernel.bpf_stats_enabled=1)"
        } else {
            ""
        }
    );
    Check::judged(
        "overhead",
        cost.share().is_some_and(|s| s <= MAX_OVERHEAD),
        figure,
    )
}

fn alloc_check(profile: &Profile, truth: &Path, status: i32) -> Check {
    const NAME: &str = "allocations";
    if let Some(c) = workload_failed(NAME, status) {
        return c;
    }
    let t = match read_json(truth) {
        Ok(t) => t,
        Err(e) => return Check::new(NAME, Status::Fail, format!("{e:#}")),
    };
    let want = t["bytes"].as_f64().unwrap_or(0.0);
    let got = samples_with(profile, |f| f.contains("verify_native_alloc")) as f64;
    let error = (got - want) / want.max(1.0);
    Check::judged(
        NAME,
        error.abs() <= ALLOC_TOLERANCE,
        format!(
            "verify_native_alloc: {:.1} MiB estimated, {:.1} MiB allocated ({:+.1}%, ±{:.0}%)",
            got / 1048576.0,
            want / 1048576.0,
            error * 100.0,
            ALLOC_TOLERANCE * 100.0
        ),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn span_check(profile: &Profile, truth: &Path, status: i32) -> Check {
    const NAME: &str = "spans";
    if let Some(c) = workload_failed(NAME, status) {
        return c;
    }
    let t = match read_json(truth) {
        Ok(t) => t,
        Err(e) => return Check::new(NAME, Status::Fail, format!("{e:#}")),
    };
    let spans = t["spans"].as_array().cloned().unwrap_or_default();
    let known: HashMap<String, (String, String)> = spans
        .iter()
        .filter_map(|s| {
            Some((
                s["span_id"].as_str()?.to_string(),
                (
                    s["trace_id"].as_str()?.to_string(),
                    s["point_id"].as_str()?.to_string(),
                ),
            ))
        })
        .collect();
    let (mut traced, mut linked, mut with_osp) = (0u64, 0u64, 0u64);
    let mut per_span: HashMap<String, u64> = HashMap::new();
    for s in &profile.samples {
        let in_traced = s.frames.iter().any(|&f| {
            profile.frames[f as usize]
                .function
                .as_deref()
                .is_some_and(|n| n == "verify_traced")
        });
        if !in_traced {
            continue;
        }
        traced += s.count;
        let Some(ctx) = profile.span_of(s) else {
            continue;
        };
        let Some(span_id) = ctx.span_id.map(|i| hex(&i)) else {
            continue;
        };
        let Some((trace_id, point)) = known.get(&span_id) else {
            continue;
        };
        if ctx.trace_id.map(|t| hex(&t)).as_deref() == Some(trace_id.as_str()) {
            linked += s.count;
            *per_span.entry(span_id.clone()).or_default() += s.count;
            let osp = ctx
                .osprofiler
                .as_ref()
                .map(|o| crate::profile::uuid(&o.trace_id));
            if osp.as_deref() == Some(point.as_str()) {
                with_osp += s.count;
            }
        }
    }
    // A span retained from the workload (the middle one) found on its samples.
    let retained = spans
        .get(spans.len() / 2)
        .and_then(|s| s["span_id"].as_str())
        .unwrap_or("");
    let retained_samples = per_span.get(retained).copied().unwrap_or(0);
    let share = 100.0 * linked as f64 / traced.max(1) as f64;
    let osp_share = 100.0 * with_osp as f64 / traced.max(1) as f64;
    Check::judged(
        NAME,
        traced >= 50 && share >= 90.0 && osp_share >= 90.0 && retained_samples > 0,
        format!(
            "{linked} of {traced} samples in traced requests carry their OpenTelemetry span \
             ({share:.1}%), {with_osp} their OSProfiler trace point ({osp_share:.1}%), at least \
             90% each; span {retained} of {} requests: {retained_samples} samples",
            spans.len()
        ),
    )
}

fn export_check(profile: &Profile, config: ExporterConfig) -> Check {
    const NAME: &str = "OTLP export";
    let endpoint = format!("{} ({})", config.shown_endpoint(), config.protocol.name());
    let request = crate::format::otlp::request(profile);
    let profiles = crate::format::otlp::profile_count(&request);
    let result = crate::export::export_once(config, &request);
    match result {
        Ok(a) => Check::judged(
            NAME,
            a.rejected_profiles == 0,
            format!(
                "{endpoint} accepted the request of {profiles} profiles; partial success: {} \
                 rejected{}",
                a.rejected_profiles,
                if a.message.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", a.message)
                }
            ),
        ),
        Err(e) => Check::new(NAME, Status::Fail, format!("{endpoint}: {e}")),
    }
}

fn check_target(opts: &VerifyOptions, target: Target, checks: &mut Vec<Check>) {
    let command = matches!(target, Target::Command(_));
    let duration = (!command).then_some(opts.duration);
    let mut outcome = match session::run(&options(opts, target, EventSet::Cpu, duration)) {
        Ok(o) => o,
        Err(e) => {
            checks.push(Check::new("target", Status::Fail, format!("{e:#}")));
            return;
        }
    };
    if command {
        if let Err(e) = outcome.wait_command() {
            checks.push(Check::new("target", Status::Fail, format!("{e:#}")));
        }
    }
    let profile = &outcome.profile;
    let samples = profile.total_samples();
    checks.push(Check::judged(
        "target: samples",
        samples > 0,
        format!(
            "{samples} samples, {} lost, from {} processes in {:.1} s at {} Hz",
            profile.meta.lost_samples,
            profile.processes.len(),
            profile.meta.duration.as_secs_f64(),
            profile.meta.frequency
        ),
    ));
    if samples == 0 {
        return;
    }
    checks.push(names_resolved("target: frames named", profile));
    checks.push(stacks_complete("target: stacks complete", profile));
    let py = &profile.meta.python;
    if py.processes > 0 {
        let share = 100.0 * py.with_frames as f64 / samples.max(1) as f64;
        checks.push(Check::judged(
            "target: python frames",
            py.with_frames > 0,
            format!(
                "{} python processes; {share:.1}% of samples have Python frames",
                py.processes
            ),
        ));
        let in_spans: u64 = profile
            .samples
            .iter()
            .filter(|s| profile.span_of(s).is_some())
            .map(|s| s.count)
            .sum();
        checks.push(if in_spans > 0 {
            Check::new(
                "target: spans",
                Status::Pass,
                format!(
                    "{in_spans} of {samples} samples carry a span context ({} spans)",
                    profile.spans.len()
                ),
            )
        } else {
            Check::new(
                "target: spans",
                Status::Skip,
                "no sample in a span (no OpenTelemetry or OSProfiler span was active, or the \
                 libraries are not used)",
            )
        });
    }
    checks.push(resource_check(profile));
    checks.push(overhead_check(&outcome));
    if let Some(exporter) = &opts.exporter {
        checks.push(export_check(profile, exporter.clone()));
    }
}

// ---------------------------------------------------------------------------
// The native workloads, run as `spanprof __verify-workload KIND OUT SECONDS`.
// ---------------------------------------------------------------------------

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Work for the CPU split (3 of 4 parts).
#[inline(never)]
pub fn verify_native_alpha(n: u64) -> u64 {
    let mut x = 1u64;
    for i in 0..n {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

/// Work for the CPU split (1 of 4 parts).
#[inline(never)]
pub fn verify_native_beta(n: u64) -> u64 {
    let mut x = 7u64;
    for i in 0..n {
        x = std::hint::black_box(x.wrapping_mul(2862933555777941757).wrapping_add(i));
    }
    x
}

/// Allocates `blocks` blocks of 1 MiB with malloc and frees them.
#[inline(never)]
pub fn verify_native_alloc(blocks: usize) -> usize {
    let mut total = 0;
    for _ in 0..blocks {
        let v: Vec<u8> = Vec::with_capacity(1 << 20);
        total += std::hint::black_box(v).capacity();
    }
    total
}

/// Runs a native workload and writes its truth to `out` as JSON.
pub fn workload(kind: &str, out: &Path, seconds: f64) -> Result<()> {
    let seconds = Duration::from_secs_f64(seconds.clamp(0.1, 600.0));
    let end = Instant::now() + seconds;
    let truth = match kind {
        "native" => {
            let (mut alpha, mut beta) = (Duration::ZERO, Duration::ZERO);
            // NB: `seconds` of its own CPU, not of the clock (at most 4 times as long): on a
            // busy host a 3 s run got 0.72 s of CPU, and spanprof's fixed costs (reading the
            // unwind tables of this large binary) then made 12.5% of it, against 2.5% idle.
            let give_up = Instant::now() + 4 * seconds;
            // NB: chunks of random length, so that the alternation has no period for the
            // sampling period to alias with (fixed chunks gave 67% for a true 75%).
            let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
            while alpha + beta < seconds && Instant::now() < give_up {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let n = 50_000 + seed % 250_000;
                let t0 = thread_cpu();
                // The one furthest below its share (3:1) runs next.
                if alpha.as_secs_f64() <= 3.0 * beta.as_secs_f64() {
                    verify_native_alpha(n);
                    alpha += thread_cpu().saturating_sub(t0);
                } else {
                    verify_native_beta(n);
                    beta += thread_cpu().saturating_sub(t0);
                }
            }
            serde_json::json!({"alpha": alpha.as_secs_f64(), "beta": beta.as_secs_f64()})
        }
        "alloc" => {
            let (mut bytes, mut calls) = (0usize, 0usize);
            while Instant::now() < end {
                bytes += verify_native_alloc(16);
                calls += 16;
                std::thread::sleep(Duration::from_millis(2));
            }
            serde_json::json!({"bytes": bytes, "calls": calls})
        }
        other => anyhow::bail!("unknown workload {other:?}"),
    };
    std::fs::write(out, truth.to_string())
        .with_context(|| format!("cannot write {}", out.display()))
}
