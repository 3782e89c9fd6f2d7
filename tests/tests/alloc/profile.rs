//! Decoded profiles: the samples of a session's pprof per function, the table of them against
//! the truth, and the sessions that make them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use spanprof_tests::{
    args, decode_pprof, run_spanprof, sample_functions, spanprof_command, start_py_workload,
    Background, FoldedStack, RunOutput, RUN_TIMEOUT,
};

use crate::common::MIN_SIGMAS;

/// One decoded pprof sample, reduced to what the checks here need.
#[derive(Debug)]
pub(super) struct Sample {
    /// Function names, root first (Python frames by qualname, without their location).
    pub(super) functions: Vec<String>,
    /// The values, by sample type (`alloc_objects`, `alloc_space`, `inuse_objects`, …).
    values: BTreeMap<String, i64>,
}

impl Sample {
    pub(super) fn value(&self, kind: &str) -> i64 {
        self.values.get(kind).copied().unwrap_or(0)
    }
}

/// A decoded profile.
#[derive(Debug)]
pub(super) struct Profile {
    /// `type/unit` of each sample type, in order.
    types: Vec<String>,
    period_type: String,
    period: i64,
    pub(super) samples: Vec<Sample>,
}

impl Profile {
    #[track_caller]
    pub(super) fn read(path: &Path) -> Self {
        let json = decode_pprof(path);
        let pair = |v: &serde_json::Value| {
            format!(
                "{}/{}",
                v["type"].as_str().unwrap_or("?"),
                v["unit"].as_str().unwrap_or("?")
            )
        };
        let types: Vec<String> = json["sample_types"]
            .as_array()
            .expect("sample_types")
            .iter()
            .map(pair)
            .collect();
        let samples = json["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .map(|s| {
                let mut functions = sample_functions(s);
                functions.reverse();
                let values = types
                    .iter()
                    .zip(s["values"].as_array().expect("values"))
                    .map(|(t, v)| {
                        let kind = t.split('/').next().unwrap_or(t).to_owned();
                        (kind, v.as_i64().expect("integer value"))
                    })
                    .collect();
                Sample { functions, values }
            })
            .collect();
        Self {
            types,
            period_type: if json["period_type"].is_null() {
                "(none)".into()
            } else {
                pair(&json["period_type"])
            },
            period: json["period"].as_i64().unwrap_or(0),
            samples,
        }
    }

    /// The sum of `kind` over every sample.
    pub(super) fn total(&self, kind: &str) -> f64 {
        self.samples.iter().map(|s| s.value(kind)).sum::<i64>() as f64
    }

    /// Checks the sample types, the period type and the period.
    pub(super) fn check_shape(&self, types: &[&str], rate: u64, problems: &mut Vec<String>) {
        if self.types != types {
            problems.push(format!("sample types {:?}, expected {types:?}", self.types));
        }
        if self.period_type != "space/bytes" {
            problems.push(format!(
                "period type {:?}, expected \"space/bytes\"",
                self.period_type
            ));
        }
        if self.period != rate as i64 {
            problems.push(format!("period {}, expected the rate {rate}", self.period));
        }
        let negative = self
            .samples
            .iter()
            .filter(|s| s.values.values().any(|v| *v < 0))
            .count();
        if negative > 0 {
            problems.push(format!("{negative} sample(s) with a negative value"));
        }
    }
}

/// The innermost of `known` on a stack (root first), `(other)` if none.
pub(super) fn innermost<'a, S: AsRef<str>>(frames: &[S], known: &[&'a str]) -> &'a str {
    frames
        .iter()
        .rev()
        .find_map(|f| known.iter().find(|k| **k == f.as_ref()).copied())
        .unwrap_or("(other)")
}

/// The sum of each sample type per function (the innermost of `known` on each stack).
pub(super) fn per_function(
    profile: &Profile,
    known: &[&'static str],
) -> BTreeMap<&'static str, Sums> {
    let mut out: BTreeMap<&'static str, Sums> = BTreeMap::new();
    for s in &profile.samples {
        let sums = out.entry(innermost(&s.functions, known)).or_default();
        for (kind, v) in &s.values {
            *sums.0.entry(kind.clone()).or_default() += *v as f64;
        }
        sums.1 += 1;
    }
    out
}

/// Per sample type, the sum of the values; and the number of pprof samples (distinct stacks).
#[derive(Debug, Default, Clone)]
pub(super) struct Sums(BTreeMap<String, f64>, u64);

impl Sums {
    pub(super) fn get(&self, kind: &str) -> f64 {
        self.0.get(kind).copied().unwrap_or(0.0)
    }
}

pub(super) fn sums_of(table: &BTreeMap<&'static str, Sums>, function: &str) -> Sums {
    table.get(function).cloned().unwrap_or_default()
}

/// The weight of each function (the innermost of `known`) in folded output.
pub(super) fn folded_per_function(
    stacks: &[FoldedStack],
    known: &[&'static str],
) -> BTreeMap<&'static str, f64> {
    let mut out = BTreeMap::new();
    for s in stacks {
        let names: Vec<&str> = s
            .frames
            .iter()
            .map(|f| f.split(" (").next().unwrap_or(f))
            .collect();
        *out.entry(innermost(&names, known)).or_default() += s.count as f64;
    }
    out
}

/// The samples lost, from the summary's first line (`spanprof: …, N lost, from …`).
pub(super) fn lost(out: &RunOutput) -> Option<u64> {
    out.stderr.lines().find_map(|l| {
        let (head, _) = l.strip_prefix("spanprof: ")?.split_once(" lost, from ")?;
        head.rsplit(", ").next()?.trim().parse().ok()
    })
}

/// The lines of spanprof's stderr worth showing with the table.
pub(super) fn summary(out: &RunOutput) -> String {
    out.stderr
        .lines()
        .filter(|l| l.starts_with("spanprof") || l.contains("alloc") || l.contains("heap"))
        .take(12)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Prints a test's report, and fails with its problems, the report and spanprof's output when
/// there are any.
#[track_caller]
pub(super) fn conclude(label: &str, problems: &[String], report: &str, out: &RunOutput) {
    println!("{report}");
    assert!(
        problems.is_empty(),
        "{label}:\n- {}\n{report}\n{out}",
        problems.join("\n- ")
    );
}

/// One row of a table: a figure measured against its truth, with its σ and allowed error.
pub(super) struct Row {
    pub(super) what: String,
    pub(super) measured: f64,
    pub(super) truth: f64,
    pub(super) sigma: f64,
    pub(super) allowed: f64,
}

impl Row {
    fn ok(&self) -> bool {
        (self.measured - self.truth).abs() <= self.allowed
    }

    fn render(&self) -> String {
        let rel = |x: f64| {
            if self.truth != 0.0 {
                format!("{:+.1}%", 100.0 * x / self.truth)
            } else {
                "-".into()
            }
        };
        format!(
            "{:<44} {:>16.0} {:>16.0} {:>8} {:>8} {:>8}  {}",
            self.what,
            self.truth,
            self.measured,
            rel(self.measured - self.truth),
            if self.truth != 0.0 {
                format!("{:.1}%", 100.0 * self.sigma / self.truth)
            } else {
                format!("{:.0}", self.sigma)
            },
            if self.truth != 0.0 {
                format!("±{:.1}%", 100.0 * self.allowed / self.truth)
            } else {
                format!("≤{:.0}", self.allowed)
            },
            if self.ok() { "ok" } else { "FAIL" }
        )
    }
}

/// The table of rows, with a header.
pub(super) fn render(rows: &[Row]) -> String {
    let mut text = format!(
        "{:<44} {:>16} {:>16} {:>8} {:>8} {:>8}\n",
        "figure", "truth", "spanprof", "error", "σ", "allowed"
    );
    for r in rows {
        text.push_str(&r.render());
        text.push('\n');
    }
    text
}

/// A problem for each row outside its bound.
pub(super) fn row_problems(rows: &[Row], problems: &mut Vec<String>) {
    for r in rows.iter().filter(|r| !r.ok()) {
        problems.push(format!(
            "{}: {:.0}, truth {:.0}, allowed ±{:.0}",
            r.what, r.measured, r.truth, r.allowed
        ));
    }
}

/// A problem when a fixed relative bound is under [`MIN_SIGMAS`] σ: the workload is too
/// small for the bound to be trusted (a design error of the test, not of spanprof).
pub(super) fn check_design(what: &str, bound: f64, sigma: f64, problems: &mut Vec<String>) {
    if bound < MIN_SIGMAS * sigma {
        problems.push(format!(
            "test design: {what}: the bound {bound:.0} is only {:.1}σ (σ = {sigma:.0}); make the \
             workload bigger",
            bound / sigma
        ));
    }
}

/// `spanprof profile --event EVENT [--alloc-rate R] -o OUTPUT… -- PROGRAM ARGS…`, which must
/// succeed.
#[track_caller]
pub(super) fn profile_command(
    event: &str,
    rate: Option<u64>,
    outputs: &[&Path],
    command: &[&std::ffi::OsStr],
) -> RunOutput {
    let mut args = args!["profile", "--event", event];
    if let Some(rate) = rate {
        args.extend(args!["--alloc-rate", rate.to_string()]);
    }
    for out in outputs {
        args.extend(args!["-o", out]);
    }
    args.push("--".into());
    args.extend(command.iter().map(|a| a.to_os_string()));
    let out = run_spanprof(args);
    out.assert_success();
    out
}

/// `spanprof profile --event EVENT --pid PID -o OUTPUT…` on the Python workload `script`
/// started with `--wait` and `args` under `python`: the workload prints `ready PID` and waits
/// for SIGUSR1, which it gets once spanprof says it is profiling (its probes are attached and
/// the interpreter is known by then), so every allocation of the work is seen with its Python
/// frames; the session ends when the workload exits. Both must succeed; returns spanprof's run
/// and the workload's.
///
/// NB: not `-- PYTHON SCRIPT`: spanprof recognizes an interpreter it started only once it has
/// run for a while, and the allocations made before have no Python frames (in 2 of 6 runs by
/// hand of py_alloc.py under pyenv 3.11, 50 to 70 of big_buffers' first mallocs had none).
#[track_caller]
pub(super) fn profile_gated(
    python: &Path,
    script: &str,
    args: &[&str],
    event: &str,
    outputs: &[&Path],
) -> (RunOutput, RunOutput) {
    profile_gated_with(python, script, args, event, &[], outputs)
}

/// [`profile_gated`] with more of spanprof's arguments.
#[track_caller]
pub(super) fn profile_gated_with(
    python: &Path,
    script: &str,
    args: &[&str],
    event: &str,
    spanprof_extra: &[&str],
    outputs: &[&Path],
) -> (RunOutput, RunOutput) {
    let mut workload_args = vec!["--wait"];
    workload_args.extend(args);
    let workload = start_py_workload(python, script, &workload_args);
    let mut spanprof_args = args![
        "profile",
        "--event",
        event,
        "--pid",
        workload.pid().to_string()
    ];
    spanprof_args.extend(spanprof_extra.iter().map(std::ffi::OsString::from));
    for out in outputs {
        spanprof_args.extend(args!["-o", out]);
    }
    let mut prof = Background::spawn(spanprof_command(spanprof_args));
    prof.wait_for_stderr("spanprof: profiling", Duration::from_secs(30));
    workload.signal(libc::SIGUSR1);
    let workload_out = workload.finish(RUN_TIMEOUT);
    let out = prof.finish(RUN_TIMEOUT);
    workload_out.assert_success();
    out.assert_success();
    (out, workload_out)
}
