//! Decoded profiles: the samples of a session's pprof by thread, function and reason, the
//! table of them, and the checks against the measured times.

use std::collections::BTreeMap;
use std::path::Path;

use spanprof_tests::{
    decode_pprof, sample_functions, sample_num_label, sample_str_labels, RunOutput,
};

use crate::common::{ms, reason_frame, REASONS, REASON_LABEL};

/// One decoded pprof sample, reduced to what the checks here need.
#[derive(Debug)]
pub(super) struct Sample {
    /// The `thread.id` label.
    tid: Option<i64>,
    /// Function names, root first (Python frames by qualname, without their location).
    functions: Vec<String>,
    /// The `off_cpu.reason` label.
    pub(super) reason: Option<String>,
    /// The values, by sample type (`samples`, `cpu`, `off_cpu`, `wall`).
    values: BTreeMap<String, i64>,
}

impl Sample {
    pub(super) fn value(&self, kind: &str) -> i64 {
        self.values.get(kind).copied().unwrap_or(0)
    }

    /// Its `thread.id` label.
    pub(super) fn tid(&self) -> Option<i64> {
        self.tid
    }

    /// Whether a function of its stack has `part` in its name.
    pub(super) fn has_function(&self, part: &str) -> bool {
        self.functions.iter().any(|f| f.contains(part))
    }

    fn root(&self) -> &str {
        self.functions
            .first()
            .map_or("<empty stack>", String::as_str)
    }
}

/// A decoded profile.
#[derive(Debug)]
pub(super) struct Profile {
    /// `(type, unit)` of each sample type, in order.
    sample_types: Vec<(String, String)>,
    pub(super) period: i64,
    /// The session's start, Unix time in nanoseconds (`time_nanos`).
    pub(super) start_ns: i64,
    pub(super) samples: Vec<Sample>,
}

impl Profile {
    #[track_caller]
    pub(super) fn read(path: &Path) -> Self {
        let json = decode_pprof(path);
        let pair = |v: &serde_json::Value| {
            (
                v["type"].as_str().unwrap_or("?").to_owned(),
                v["unit"].as_str().unwrap_or("?").to_owned(),
            )
        };
        let sample_types: Vec<(String, String)> = json["sample_types"]
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
                let values = sample_types
                    .iter()
                    .zip(s["values"].as_array().expect("values"))
                    .map(|((kind, _), v)| (kind.clone(), v.as_i64().expect("integer value")))
                    .collect();
                Sample {
                    tid: sample_num_label(s, "thread.id"),
                    functions,
                    reason: sample_str_labels(s).remove(REASON_LABEL),
                    values,
                }
            })
            .collect();
        Self {
            sample_types,
            period: json["period"].as_i64().unwrap_or(0),
            start_ns: json["time_nanos"].as_i64().unwrap_or(0),
            samples,
        }
    }

    /// The sample types as `type/unit` strings.
    pub(super) fn type_names(&self) -> Vec<String> {
        self.sample_types
            .iter()
            .map(|(t, u)| format!("{t}/{u}"))
            .collect()
    }
}

/// What a sample is in the table: on CPU, or off CPU for a reason.
fn column(sample: &Sample) -> String {
    match &sample.reason {
        Some(reason) => reason.clone(),
        None if sample.root().starts_with("[off-cpu") => "(no label)".into(),
        None => "on-CPU".into(),
    }
}

/// The functions of the workloads a sample is put under: the innermost of these on its stack.
pub(super) const FUNCTIONS: [&str; 12] = [
    "longsleep",
    "idle_wait",
    "waiter",
    "sleeper",
    "wait_lock",
    "spin",
    "holder",
    "run_rounds",
    "nap",
    "sleep_rounds",
    "start_and_join",
    "<module>",
];

fn function_of(sample: &Sample) -> &'static str {
    sample
        .functions
        .iter()
        .rev()
        .find_map(|f| FUNCTIONS.iter().find(|known| *known == f).copied())
        .unwrap_or("(other)")
}

/// Nanoseconds per (thread, function) and column ([`column`]): the weight of each sample is
/// `weight(sample)`.
pub(super) struct Table {
    pub(super) cells: BTreeMap<(String, &'static str), BTreeMap<String, i64>>,
}

impl Table {
    pub(super) fn of(
        profile: &Profile,
        threads: &[(i64, &str)],
        weight: impl Fn(&Sample) -> i64,
    ) -> Self {
        let mut cells: BTreeMap<(String, &'static str), BTreeMap<String, i64>> = BTreeMap::new();
        for sample in &profile.samples {
            let thread = match sample.tid {
                Some(tid) => threads
                    .iter()
                    .find(|(t, _)| *t == tid)
                    .map_or_else(|| format!("tid {tid}"), |(_, name)| (*name).to_owned()),
                None => "(no thread.id)".to_owned(),
            };
            *cells
                .entry((thread, function_of(sample)))
                .or_default()
                .entry(column(sample))
                .or_default() += weight(sample);
        }
        Self { cells }
    }

    /// Nanoseconds of `thread` in `function` in column `column` (`on-CPU` or a reason).
    pub(super) fn get(&self, thread: &str, function: &str, column: &str) -> f64 {
        self.cells
            .iter()
            .filter(|((t, f), _)| t == thread && *f == function)
            .filter_map(|(_, cols)| cols.get(column))
            .sum::<i64>() as f64
    }

    /// Nanoseconds of `thread` in `function`, every column.
    pub(super) fn function_total(&self, thread: &str, function: &str) -> f64 {
        self.cells
            .iter()
            .filter(|((t, f), _)| t == thread && *f == function)
            .flat_map(|(_, cols)| cols.values())
            .sum::<i64>() as f64
    }

    /// Nanoseconds of `thread`, everything.
    pub(super) fn thread_total(&self, thread: &str) -> f64 {
        self.cells
            .iter()
            .filter(|((t, _), _)| t == thread)
            .flat_map(|(_, cols)| cols.values())
            .sum::<i64>() as f64
    }

    /// The table in milliseconds, one row per (thread, function), one column per kind of time.
    pub(super) fn render(&self) -> String {
        let mut columns = vec!["on-CPU".to_owned()];
        columns.extend(REASONS.iter().map(|r| (*r).to_owned()));
        for cols in self.cells.values() {
            for c in cols.keys() {
                if !columns.contains(c) {
                    columns.push(c.clone());
                }
            }
        }
        let mut text = format!("{:<16} {:<14}", "thread", "function");
        for c in &columns {
            text.push_str(&format!(" {c:>10}"));
        }
        text.push_str("   (ms; off-CPU by reason)\n");
        for ((thread, function), cols) in &self.cells {
            text.push_str(&format!("{thread:<16} {function:<14}"));
            for c in &columns {
                match cols.get(c) {
                    Some(ns) => text.push_str(&format!(" {:>10.1}", ms(*ns as f64))),
                    None => text.push_str(&format!(" {:>10}", "-")),
                }
            }
            text.push('\n');
        }
        text
    }
}

/// Checks what holds of every sample of a profile with off-CPU samples: an off-CPU sample (one
/// with the reason label, or whose root is an `[off-cpu: …]` frame) has a known reason, and its
/// root frame is that reason's pseudo-frame.
pub(super) fn check_reasons(profile: &Profile, problems: &mut Vec<String>) {
    let mut bad = BTreeMap::<String, usize>::new();
    for sample in &profile.samples {
        let root = sample.root();
        match &sample.reason {
            Some(reason) => {
                if !REASONS.contains(&reason.as_str()) {
                    *bad.entry(format!("unknown reason {reason:?}")).or_default() += 1;
                }
                if root != reason_frame(reason) {
                    *bad.entry(format!(
                        "reason {reason} with root frame {root:?}, not {:?}",
                        reason_frame(reason)
                    ))
                    .or_default() += 1;
                }
            }
            None if root.starts_with("[off-cpu") => {
                *bad.entry(format!(
                    "root frame {root:?} without a {REASON_LABEL} label"
                ))
                .or_default() += 1;
            }
            None => {}
        }
        if sample
            .functions
            .iter()
            .skip(1)
            .any(|f| f.starts_with("[off-cpu"))
        {
            *bad.entry("an [off-cpu: …] frame below the root".into())
                .or_default() += 1;
        }
    }
    for (what, n) in bad {
        problems.push(format!("{n} sample(s): {what}"));
    }
}

/// `measured` within ±`tolerance` (a fraction) of `truth`; a problem naming `what` otherwise.
pub(super) fn check_close(
    what: &str,
    measured: f64,
    truth: f64,
    tolerance: f64,
    problems: &mut Vec<String>,
) {
    let off = (measured - truth) / truth;
    // NB: a NaN (no truth) fails too.
    if off.is_nan() || off.abs() > tolerance {
        problems.push(format!(
            "{what}: {:.1} ms, truth {:.1} ms ({:+.1}%, allowed ±{:.0}%)",
            ms(measured),
            ms(truth),
            100.0 * off,
            100.0 * tolerance
        ));
    }
}

/// `measured` at most `share` of `truth`.
pub(super) fn check_at_most(
    what: &str,
    measured: f64,
    truth: f64,
    share: f64,
    problems: &mut Vec<String>,
) {
    if measured > share * truth {
        problems.push(format!(
            "{what}: {:.1} ms, more than {:.0}% of {:.1} ms",
            ms(measured),
            100.0 * share,
            ms(truth)
        ));
    }
}

/// The off-CPU lines of the summary (for `--nocapture` runs).
pub(super) fn offcpu_summary(out: &RunOutput) -> String {
    out.stderr
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("off-cpu") || l.contains("off_cpu")
        })
        .collect::<Vec<_>>()
        .join("\n")
}
