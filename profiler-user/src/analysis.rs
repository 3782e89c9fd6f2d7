//! What `spanprof report`, `diff` and `check` compute from profiles: each function's share,
//! how shares changed between two runs, and budgets that fail a build.
//!
//! # Shares
//!
//! A function's *self* weight is the weight ([`Profile::weight`]: samples, nanoseconds once
//! off-CPU time is in the profile, bytes for a memory profile) of the samples whose leaf frame
//! is that function; its *total* weight that of the samples with the function anywhere in their
//! stack, each sample counted once however deep the recursion. Shares are those weights over
//! the profile's total, so two runs of different lengths compare: a function that takes 25% of
//! one run and 40% of the next got slower relative to the rest of the program.
//!
//! A function is named as in flame graphs ([`crate::wording::frame_name`]), except that
//! a Python function is one function whatever its line: `handle (app.py)`, not
//! `handle (app.py:12)` ([`function_name`]).
//!
//! # Noise
//!
//! A sampled share is an estimate. With `n` samples and a true share `p`, its standard error is
//! `sqrt(p (1 - p) / n)`; the change between two runs has the error
//! `sqrt(p1 (1 - p1) / n1 + p2 (1 - p2) / n2)` ([`Change::sigma_self`]). A change is counted as
//! a regression only when it is over the threshold *and* over [`Z_LIMIT`] times its error, so
//! two runs of one build pass even with a low threshold, and a short run that cannot tell says
//! so instead of failing by chance. For a time or memory profile, `n` is the total over one
//! sampling period (or the allocation sampling rate): the number of samples it stands for. That
//! overstates the independent samples when a few long off-CPU waits (one 2 s sleep counts as
//! 200 samples at 99 Hz) or large allocations make most of the total.
//!
//! # Budgets
//!
//! `--max 'PATTERN=PERCENT%'` bounds the total share of the functions a pattern matches (the
//! samples with any of them in the stack, counted once), `--max-self` their self share.
//! Patterns are globs (`*` any run of characters, `?` one) matched against the whole function
//! name, or against the name before its first ` (` (so `handle` matches `handle (app.py)`).
//!
//! `--span-max 'NAME=DURATION'` bounds the mean time of the spans of each name its glob
//! matches ([`span_times`]: the time their own samples stand for).
//!
//! Everything here is deterministic: rows are sorted by weight, then by name.

use std::collections::HashMap;
use std::fmt::Write;

use crate::profile::Profile;
use crate::wording::{function_name, NO_STACK};

/// A change must be this many standard errors to count as a regression.
pub const Z_LIMIT: f64 = 3.0;

/// What a profile's weights count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// On-CPU samples.
    Samples,
    /// Nanoseconds (on-CPU time plus off-CPU time).
    Nanoseconds,
    /// Bytes (allocated, or in use at the end).
    Bytes,
}

impl Unit {
    /// The unit of `profile`'s weights.
    pub fn of(profile: &Profile) -> Unit {
        let events = profile.meta.events;
        if events.in_bytes() {
            Unit::Bytes
        } else if events.in_nanoseconds() {
            Unit::Nanoseconds
        } else {
            Unit::Samples
        }
    }

    /// Its name in JSON reports: `samples`, `nanoseconds`, `bytes`.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Samples => "samples",
            Unit::Nanoseconds => "nanoseconds",
            Unit::Bytes => "bytes",
        }
    }
}

/// One function of a profile and its weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionWeight {
    /// [`function_name`].
    pub name: String,
    /// Weight of the samples whose leaf frame is this function.
    pub self_weight: u64,
    /// Weight of the samples with this function anywhere in the stack.
    pub total_weight: u64,
}

/// Every function of a profile, most self weight first (then most total, then by name).
#[derive(Debug, Clone, PartialEq)]
pub struct Functions {
    /// What the weights count.
    pub unit: Unit,
    /// The profile's total weight.
    pub total: u64,
    /// How many samples the total stands for (see the module's Noise section).
    pub events: f64,
    /// The functions.
    pub rows: Vec<FunctionWeight>,
}

impl Functions {
    /// The functions of `profile`.
    pub fn of(profile: &Profile) -> Functions {
        // Frame index -> function index, each name made once.
        let mut index: HashMap<String, u32> = HashMap::new();
        let mut rows: Vec<FunctionWeight> = Vec::new();
        let mut intern = |name: String, rows: &mut Vec<FunctionWeight>| {
            *index.entry(name.clone()).or_insert_with(|| {
                rows.push(FunctionWeight {
                    name,
                    self_weight: 0,
                    total_weight: 0,
                });
                (rows.len() - 1) as u32
            })
        };
        let function_of: Vec<u32> = profile
            .frames
            .iter()
            .map(|f| intern(function_name(f), &mut rows))
            .collect();
        let no_stack = intern(NO_STACK.to_string(), &mut rows);
        // The last sample that counted each function, so recursion counts once.
        let mut counted: Vec<usize> = vec![usize::MAX; rows.len()];
        let mut total = 0u64;
        for (i, s) in profile.samples.iter().enumerate() {
            let w = profile.weight(s);
            if w == 0 {
                continue;
            }
            total = total.saturating_add(w);
            let leaf = s
                .frames
                .last()
                .map_or(no_stack, |&f| function_of[f as usize]);
            let row = &mut rows[leaf as usize];
            row.self_weight = row.self_weight.saturating_add(w);
            if s.frames.is_empty() {
                row.total_weight = row.total_weight.saturating_add(w);
            }
            for &f in &s.frames {
                let func = function_of[f as usize] as usize;
                if counted[func] != i {
                    counted[func] = i;
                    rows[func].total_weight = rows[func].total_weight.saturating_add(w);
                }
            }
        }
        rows.retain(|r| r.total_weight > 0);
        rows.sort_by(|a, b| {
            b.self_weight
                .cmp(&a.self_weight)
                .then(b.total_weight.cmp(&a.total_weight))
                .then_with(|| a.name.cmp(&b.name))
        });
        let unit = Unit::of(profile);
        let per_sample = match unit {
            Unit::Samples => 1,
            Unit::Nanoseconds => profile.meta.period_ns(),
            Unit::Bytes => profile.meta.events.alloc_rate,
        }
        .max(1);
        Functions {
            unit,
            total,
            events: total as f64 / per_sample as f64,
            rows,
        }
    }

    /// `weight` as a share of the total (0 for an empty profile).
    pub fn share(&self, weight: u64) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            weight as f64 / self.total as f64
        }
    }

    /// The row of the function named `name`.
    pub fn get(&self, name: &str) -> Option<&FunctionWeight> {
        self.rows.iter().find(|r| r.name == name)
    }
}

/// A glob: `*` matches any run of characters, `?` one character, anything else itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(Vec<char>);

impl Pattern {
    /// The glob `text`.
    pub fn new(text: &str) -> Pattern {
        Pattern(text.chars().collect())
    }

    /// Whether the glob matches all of `name`, or all of the part before its first ` (`.
    pub fn matches_function(&self, name: &str) -> bool {
        self.matches(name)
            || name
                .split_once(" (")
                .is_some_and(|(head, _)| self.matches(head))
    }

    /// Whether the glob matches all of `text`: the usual matcher that remembers only the last
    /// `*` and how much it swallowed, so it takes at most `len(pattern) * len(text)` steps
    /// (no exponential backtracking).
    pub fn matches(&self, text: &str) -> bool {
        let (p, t): (&[char], Vec<char>) = (&self.0, text.chars().collect());
        let (mut pi, mut ti) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while ti < t.len() {
            match p.get(pi) {
                Some('*') => {
                    star = Some((pi, ti));
                    pi += 1;
                }
                Some(&c) if c == '?' || c == t[ti] => {
                    pi += 1;
                    ti += 1;
                }
                _ => match star {
                    Some((sp, st)) => {
                        pi = sp + 1;
                        ti = st + 1;
                        star = Some((sp, st + 1));
                    }
                    None => return false,
                },
            }
        }
        p[pi..].iter().all(|&c| c == '*')
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.iter().collect::<String>())
    }
}

/// Parses a share, `20%` or `2.5%` (percent of the profile; the `%` is required, so that
/// `0.05` is not taken for 5%), into a fraction.
pub fn parse_percent(text: &str) -> Option<f64> {
    let n: f64 = text.trim().strip_suffix('%')?.trim().parse().ok()?;
    (n.is_finite() && n > 0.0 && n <= 100.0).then_some(n / 100.0)
}

/// `PATTERN=VALUE` split at its last `=`, both sides trimmed; an error naming `form` when
/// either side is empty.
fn split_budget<'a>(text: &'a str, form: &str) -> Result<(&'a str, &'a str), String> {
    text.rsplit_once('=')
        .map(|(p, v)| (p.trim(), v.trim()))
        .filter(|(p, v)| !p.is_empty() && !v.is_empty())
        .ok_or_else(|| format!("invalid budget {text:?}: expected {form}"))
}

/// `--max` (total share) or `--max-self` (self share).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareKind {
    /// The samples with a matching function anywhere in the stack.
    Total,
    /// The samples whose leaf frame matches.
    Self_,
}

/// One `--max`/`--max-self` budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Which functions.
    pub pattern: Pattern,
    /// Which share.
    pub kind: ShareKind,
    /// The largest share allowed, a fraction.
    pub max: f64,
}

impl Budget {
    /// Parses `PATTERN=PERCENT%`; the error says what is wrong.
    pub fn parse(text: &str, kind: ShareKind) -> Result<Budget, String> {
        let (pattern, max) = split_budget(text, "PATTERN=PERCENT%")?;
        let max = parse_percent(max).ok_or_else(|| {
            format!("invalid budget {text:?}: {max:?} is not a share (0 to 100%)")
        })?;
        Ok(Budget {
            pattern: Pattern::new(pattern),
            kind,
            max,
        })
    }

    /// The budget as given on the command line.
    pub fn option(&self) -> String {
        let flag = match self.kind {
            ShareKind::Total => "--max",
            ShareKind::Self_ => "--max-self",
        };
        format!("{flag} '{}={}%'", self.pattern, percent_text(self.max))
    }
}

/// What a budget found in a profile.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetResult {
    /// The budget.
    pub budget: Budget,
    /// The share of the samples it covers.
    pub share: f64,
    /// The functions it matched, most weight first (at most 5).
    pub functions: Vec<String>,
    /// How many functions it matched.
    pub matched: usize,
}

impl BudgetResult {
    /// Whether the share is over the budget.
    pub fn crossed(&self) -> bool {
        self.share > self.budget.max
    }
}

/// Measures `budget` in `profile` (whose functions are `functions`).
pub fn measure(profile: &Profile, functions: &Functions, budget: &Budget) -> BudgetResult {
    let matched: Vec<&FunctionWeight> = functions
        .rows
        .iter()
        .filter(|r| budget.pattern.matches_function(&r.name))
        .collect();
    let weight = match budget.kind {
        ShareKind::Self_ => matched
            .iter()
            .fold(0u64, |t, r| t.saturating_add(r.self_weight)),
        // Samples with any matching frame, once each (two matching functions can share a stack).
        ShareKind::Total => {
            let hit: Vec<bool> = profile
                .frames
                .iter()
                .map(|f| budget.pattern.matches_function(&function_name(f)))
                .collect();
            let no_stack = budget.pattern.matches_function(NO_STACK);
            profile
                .samples
                .iter()
                .filter(|s| {
                    s.frames.iter().any(|&f| hit[f as usize]) || (s.frames.is_empty() && no_stack)
                })
                .map(|s| profile.weight(s))
                .fold(0u64, u64::saturating_add)
        }
    };
    let mut names: Vec<&FunctionWeight> = matched.clone();
    names.sort_by(|a, b| {
        let key = |r: &FunctionWeight| match budget.kind {
            ShareKind::Self_ => r.self_weight,
            ShareKind::Total => r.total_weight,
        };
        key(b).cmp(&key(a)).then_with(|| a.name.cmp(&b.name))
    });
    BudgetResult {
        budget: budget.clone(),
        share: functions.share(weight),
        functions: names.iter().take(5).map(|r| r.name.clone()).collect(),
        matched: matched.len(),
    }
}

/// The sampled time of the spans of one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanTime {
    /// The span's name (OpenTelemetry), or the trace point's (OSProfiler).
    pub name: String,
    /// How many spans of that name have samples.
    pub spans: u64,
    /// The time their samples stand for, nanoseconds.
    pub total_ns: u64,
}

impl SpanTime {
    /// Mean nanoseconds per span.
    pub fn mean_ns(&self) -> u64 {
        self.total_ns / self.spans.max(1)
    }
}

/// A span context's name and the id of the span it names, for [`span_times`]: the OpenTelemetry
/// span's name and id, else the OSProfiler trace point's name and id.
pub fn span_name_and_id(c: &crate::profile::SpanContext) -> Option<(&str, [u8; 16])> {
    if let (Some(name), Some(id)) = (c.span_name.as_ref(), c.span_id) {
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&id);
        return Some((name.as_str(), key));
    }
    match (c.osprofiler_name.as_ref(), c.osprofiler.as_ref()) {
        (Some(name), Some(o)) => Some((name.as_str(), o.trace_id)),
        _ => None,
    }
}

/// The time the samples show in each named span, by name, most total time first (then by
/// name): a span is one OpenTelemetry span id, or one OSProfiler trace point id when the
/// sample has no OpenTelemetry span name. A sample's time is its weight in nanoseconds (an
/// on-CPU sample stands for one period). It is the span's own time: samples in a child span
/// count for the child. `name_of` gives a span context's name and which id keys it.
///
/// A memory profile has no time: an error.
pub fn span_times<'p>(
    profile: &'p Profile,
    name_of: impl Fn(&'p crate::profile::SpanContext) -> Option<(&'p str, [u8; 16])>,
) -> Result<Vec<SpanTime>, String> {
    if profile.meta.events.in_bytes() {
        return Err(
            "span durations need a time profile (cpu, offcpu or wall), not a memory one".into(),
        );
    }
    let per_count = if profile.meta.events.in_nanoseconds() {
        None
    } else {
        Some(profile.meta.period_ns())
    };
    // Name -> (ids seen, nanoseconds).
    let mut by_name: HashMap<&str, (std::collections::HashSet<[u8; 16]>, u64)> = HashMap::new();
    for s in &profile.samples {
        let Some((name, id)) = profile.span_of(s).and_then(&name_of) else {
            continue;
        };
        let ns = match per_count {
            Some(period) => s.count.saturating_mul(period),
            None => profile.weight(s),
        };
        let entry = by_name.entry(name).or_default();
        entry.0.insert(id);
        entry.1 = entry.1.saturating_add(ns);
    }
    let mut out: Vec<SpanTime> = by_name
        .into_iter()
        .map(|(name, (ids, total_ns))| SpanTime {
            name: name.to_string(),
            spans: ids.len() as u64,
            total_ns,
        })
        .collect();
    out.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(out)
}

/// One `--span-max 'NAME=DURATION'` budget: the spans whose name matches the glob may take at
/// most this long on average.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanBudget {
    /// Which span names.
    pub pattern: Pattern,
    /// The largest mean allowed, nanoseconds.
    pub max_ns: u64,
    /// As given.
    pub text: String,
}

impl SpanBudget {
    /// Parses `NAME=DURATION` (`GET /servers=30ms`).
    pub fn parse(text: &str) -> Result<SpanBudget, String> {
        let (pattern, max) = split_budget(text, "NAME=DURATION")?;
        let max_ns = humantime::parse_duration(max)
            .ok()
            .filter(|d| !d.is_zero())
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .ok_or_else(|| {
                format!("invalid budget {text:?}: {max:?} is not a duration (e.g. 30ms)")
            })?;
        Ok(SpanBudget {
            pattern: Pattern::new(pattern),
            max_ns,
            text: text.to_string(),
        })
    }

    /// The names it matches in `times`, each with whether its mean is over the budget.
    pub fn measure<'t>(&self, times: &'t [SpanTime]) -> Vec<(&'t SpanTime, bool)> {
        times
            .iter()
            .filter(|t| self.pattern.matches(&t.name))
            .map(|t| (t, t.mean_ns() > self.max_ns))
            .collect()
    }
}

/// Nanoseconds as text: `31.2 ms`, `850 us`, `1.50 s`.
pub fn duration_text(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else {
        format!("{} us", ns / 1000)
    }
}

/// A share as text: `25.0` for 0.25 (one decimal, two below 1%).
pub fn percent_text(share: f64) -> String {
    hundredths(share, false)
}

/// `x` in percent or points: one decimal, two below 1, a sign if `signed`.
fn hundredths(x: f64, signed: bool) -> String {
    let v = x * 100.0;
    let decimals = if v != 0.0 && v.abs() < 1.0 { 2 } else { 1 };
    if signed {
        format!("{v:+.decimals$}")
    } else {
        format!("{v:.decimals$}")
    }
}

/// How one function's shares changed from a base run to a new one.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// [`function_name`].
    pub name: String,
    /// Self share in the base run.
    pub base_self: f64,
    /// Self share in the new run.
    pub new_self: f64,
    /// Total share in the base run.
    pub base_total: f64,
    /// Total share in the new run.
    pub new_total: f64,
    /// Standard error of the self share's change (infinite when a run has no samples).
    pub sigma_self: f64,
    /// Standard error of the total share's change.
    pub sigma_total: f64,
}

impl Change {
    /// New self share minus base self share.
    pub fn self_delta(&self) -> f64 {
        self.new_self - self.base_self
    }

    /// New total share minus base total share.
    pub fn total_delta(&self) -> f64 {
        self.new_total - self.base_total
    }
}

/// The change of every function between two runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Diff {
    /// The base run's functions.
    pub base: Functions,
    /// The new run's functions.
    pub new: Functions,
    /// Every function of either run, most grown self share first (then most grown total, then
    /// by name).
    pub changes: Vec<Change>,
}

/// Which share of a function crossed a regression threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Its self share.
    Self_,
    /// Its total share (itself and what it calls).
    Total,
}

/// A function whose share grew by more than the threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct Regression<'a> {
    /// The function.
    pub change: &'a Change,
    /// Which of its shares.
    pub which: Which,
    /// Whether the growth is over [`Z_LIMIT`] standard errors: only those fail a build.
    pub significant: bool,
}

fn sigma(p1: f64, n1: f64, p2: f64, n2: f64) -> f64 {
    if n1 <= 0.0 || n2 <= 0.0 {
        return f64::INFINITY;
    }
    (p1 * (1.0 - p1) / n1 + p2 * (1.0 - p2) / n2).sqrt()
}

impl Diff {
    /// Compares `base` with `new`; they must measure the same thing.
    pub fn of(base: &Profile, new: &Profile) -> Result<Diff, String> {
        let (b, n) = (Functions::of(base), Functions::of(new));
        let (eb, en) = (event_names(base), event_names(new));
        if eb != en {
            return Err(format!(
                "the profiles do not measure the same thing: the base has --event {}, the new \
                 one --event {} (profile both alike, or keep one measure with --event)",
                eb.join(","),
                en.join(",")
            ));
        }
        for (which, f) in [("base", &b), ("new", &n)] {
            if f.total == 0 {
                return Err(format!(
                    "the {which} profile has no samples: nothing to compare"
                ));
            }
        }
        let mut names: Vec<&str> = b
            .rows
            .iter()
            .chain(&n.rows)
            .map(|r| r.name.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        let (bi, ni): (
            HashMap<&str, &FunctionWeight>,
            HashMap<&str, &FunctionWeight>,
        ) = (
            b.rows.iter().map(|r| (r.name.as_str(), r)).collect(),
            n.rows.iter().map(|r| (r.name.as_str(), r)).collect(),
        );
        let shares = |f: &Functions, r: Option<&&FunctionWeight>| {
            r.map_or((0.0, 0.0), |r| {
                (f.share(r.self_weight), f.share(r.total_weight))
            })
        };
        let mut changes: Vec<Change> = names
            .into_iter()
            .map(|name| {
                let (base_self, base_total) = shares(&b, bi.get(name));
                let (new_self, new_total) = shares(&n, ni.get(name));
                Change {
                    name: name.to_string(),
                    base_self,
                    new_self,
                    base_total,
                    new_total,
                    sigma_self: sigma(base_self, b.events, new_self, n.events),
                    sigma_total: sigma(base_total, b.events, new_total, n.events),
                }
            })
            .collect();
        changes.sort_by(|x, y| {
            y.self_delta()
                .total_cmp(&x.self_delta())
                .then(y.total_delta().total_cmp(&x.total_delta()))
                .then_with(|| x.name.cmp(&y.name))
        });
        Ok(Diff {
            base: b,
            new: n,
            changes,
        })
    }

    /// Up to `n` functions whose self share grew, most first.
    pub fn grew(&self, n: usize) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(|c| c.self_delta() > 0.0).take(n)
    }

    /// Up to `n` functions whose self share shrank, most first.
    pub fn shrank(&self, n: usize) -> impl Iterator<Item = &Change> {
        self.changes
            .iter()
            .rev()
            .filter(|c| c.self_delta() < 0.0)
            .take(n)
    }

    /// The functions whose self or total share grew by more than `threshold` (a fraction),
    /// in [`Diff::changes`] order. A function whose two shares both grew is listed once: by a
    /// share whose growth is significant if one is (self first), else by its self share if
    /// that grew over the threshold. [`Regression::significant`] says which fail a build.
    pub fn regressions(&self, threshold: f64) -> Vec<Regression<'_>> {
        let mut out = Vec::new();
        for c in &self.changes {
            let over = |d: f64, sigma: f64| (d > threshold).then_some(d > Z_LIMIT * sigma);
            let shares = [
                (Which::Self_, over(c.self_delta(), c.sigma_self)),
                (Which::Total, over(c.total_delta(), c.sigma_total)),
            ];
            let found = shares
                .iter()
                .find(|(_, o)| *o == Some(true))
                .or_else(|| shares.iter().find(|(_, o)| o.is_some()))
                .map(|&(which, o)| (which, o == Some(true)));
            if let Some((which, significant)) = found {
                out.push(Regression {
                    change: c,
                    which,
                    significant,
                });
            }
        }
        out
    }
}

/// Points of a share change: `+15.0` for 0.15.
pub fn points_text(delta: f64) -> String {
    hundredths(delta, true)
}

/// One line of the diff's table: `  +15.0  render_output  25.0% -> 40.0% (total 25.0% -> 40.0%)`.
pub fn change_line(c: &Change) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "  {:>6}  {}  {}% -> {}% self, {}% -> {}% total",
        points_text(c.self_delta()),
        c.name,
        percent_text(c.base_self),
        percent_text(c.new_self),
        percent_text(c.base_total),
        percent_text(c.new_total),
    );
    s
}

/// The facts of a run, for the reports' headers: `5.0 s at 99 Hz, 495 samples; started
/// 2026-12-01T08:00:00Z on ci-7; commit 9fceb02 (main)`.
pub fn run_line(profile: &Profile) -> String {
    let m = &profile.meta;
    // Folded stacks say nothing of the run: only the samples.
    if m.frequency == 0 && m.start == std::time::UNIX_EPOCH && !m.events.in_bytes() {
        return format!(
            "{} samples (no rate or time in the file)",
            profile.total_samples()
        );
    }
    let mut s = crate::wording::subtitle(profile);
    let _ = write!(
        s,
        "; started {}",
        humantime::format_rfc3339_seconds(m.start)
    );
    if let Some(h) = m.host.as_ref().filter(|h| !h.name.is_empty()) {
        let _ = write!(s, " on {}", h.name);
    }
    if let Some(c) = &m.build.commit {
        let _ = write!(s, "; commit {c}");
    }
    if let Some(b) = &m.build.branch {
        let _ = write!(s, " ({b})");
    }
    s
}

/// The header of the weight column: `samples`, `time` or `bytes`.
fn weight_header(unit: Unit) -> &'static str {
    match unit {
        Unit::Samples => "samples",
        Unit::Nanoseconds => "time",
        Unit::Bytes => "bytes",
    }
}

/// The top `top` functions (0: all) of `profile` as a text table: self and total shares, self
/// and total weights, the name; then the `top` span names by time, when `spans` has any.
pub fn report_text(
    profile: &Profile,
    functions: &Functions,
    spans: &[SpanTime],
    top: usize,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "spanprof report: {}",
        crate::wording::shown(&profile.meta)
    );
    let _ = writeln!(s, "{}", run_line(profile));
    if functions.rows.is_empty() {
        let _ = writeln!(s, "no samples");
        return s;
    }
    let rows = rows_shown(functions, top);
    let amount = |w: u64| crate::summary::amount(profile, w);
    let widths = rows.iter().fold((0, 0), |(a, b), r| {
        (
            a.max(amount(r.self_weight).len()),
            b.max(amount(r.total_weight).len()),
        )
    });
    let header = weight_header(functions.unit);
    let (ws, wt) = (
        widths.0.max(header.len() + 5),
        widths.1.max(header.len() + 6),
    );
    let _ = writeln!(
        s,
        "{:>7} {:>7} {:>ws$} {:>wt$}  function",
        "self%",
        "total%",
        format!("self {header}"),
        format!("total {header}"),
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:>6}% {:>6}% {:>ws$} {:>wt$}  {}",
            percent_text(functions.share(r.self_weight)),
            percent_text(functions.share(r.total_weight)),
            amount(r.self_weight),
            amount(r.total_weight),
            r.name,
        );
    }
    if top > 0 && functions.rows.len() > top {
        let _ = writeln!(
            s,
            "({} more functions; --top 0 shows them all)",
            functions.rows.len() - top
        );
    }
    if !spans.is_empty() {
        let _ = writeln!(s, "spans by name (time in their samples, mean per span):");
        let _ = writeln!(s, "{:>7} {:>10} {:>10}  name", "spans", "mean", "total");
        let shown = limit(top, spans.len());
        for t in &spans[..shown] {
            let _ = writeln!(
                s,
                "{:>7} {:>10} {:>10}  {}",
                t.spans,
                duration_text(t.mean_ns()),
                duration_text(t.total_ns),
                t.name
            );
        }
        if shown < spans.len() {
            let _ = writeln!(s, "({} more span names)", spans.len() - shown);
        }
    }
    s
}

fn rows_shown(functions: &Functions, top: usize) -> &[FunctionWeight] {
    &functions.rows[..limit(top, functions.rows.len())]
}

/// What a profile measures, as `--event` names: `cpu`, `offcpu`, `wall`, `alloc`, `heap`.
pub fn event_names(profile: &Profile) -> Vec<&'static str> {
    let e = profile.meta.events;
    [
        (e.cpu && !e.wall, "cpu"),
        (e.off_cpu && !e.wall, "offcpu"),
        (e.wall, "wall"),
        (e.alloc, "alloc"),
        (e.heap, "heap"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect()
}

/// The facts of a run as JSON.
fn run_json(profile: &Profile, functions: &Functions) -> serde_json::Value {
    let m = &profile.meta;
    let e = m.events;
    let events = event_names(profile);
    let start_ns = m
        .start
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    serde_json::json!({
        "target": m.target,
        "start": humantime::format_rfc3339_seconds(m.start).to_string(),
        "start_unix_nano": start_ns,
        "duration_ns": m.duration.as_nanos() as u64,
        "host": m.host.as_ref().map(|h| h.name.clone()),
        "commit": m.build.commit,
        "branch": m.build.branch,
        "events": events,
        "frequency_hz": (!e.in_bytes()).then_some(m.frequency),
        "alloc_rate_bytes": e.in_bytes().then_some(e.alloc_rate),
        "unit": functions.unit.name(),
        "total": functions.total,
        "lost_samples": m.lost_samples,
    })
}

/// The top `top` functions (0: all) as one JSON document: `{"profile": {…}, "functions":
/// [{"name", "self", "total", "self_share", "total_share"}…], "spans": [{"name", "spans",
/// "total_ns", "mean_ns"}…]}`, weights in the profile's `unit`, shares as fractions, every
/// span name.
pub fn report_json(
    profile: &Profile,
    functions: &Functions,
    spans: &[SpanTime],
    top: usize,
) -> String {
    let rows: Vec<serde_json::Value> = rows_shown(functions, top)
        .iter()
        .map(|r| {
            serde_json::json!({
                "name": r.name,
                "self": r.self_weight,
                "total": r.total_weight,
                "self_share": functions.share(r.self_weight),
                "total_share": functions.share(r.total_weight),
            })
        })
        .collect();
    let spans: Vec<serde_json::Value> = spans
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name,
                "spans": t.spans,
                "total_ns": t.total_ns,
                "mean_ns": t.mean_ns(),
            })
        })
        .collect();
    let doc = serde_json::json!({
        "profile": run_json(profile, functions),
        "functions": rows,
        "functions_not_shown": functions.rows.len() - rows.len(),
        "spans": spans,
    });
    let mut out = serde_json::to_string_pretty(&doc).unwrap_or_default();
    out.push('\n');
    out
}

/// `top` as a count of `len` items: all of them for 0.
fn limit(top: usize, len: usize) -> usize {
    if top == 0 {
        len
    } else {
        top.min(len)
    }
}

/// One regression as JSON.
fn regression_json(r: &Regression<'_>) -> serde_json::Value {
    let (delta, sigma) = r.delta_and_sigma();
    serde_json::json!({
        "name": r.change.name,
        "share": match r.which { Which::Self_ => "self", Which::Total => "total" },
        "delta": delta,
        "sigma": finite(sigma),
        "significant": r.significant,
    })
}

/// The diff as JSON: both runs' facts and the `top` functions (0: all) whose self share grew
/// and shrank most, with the standard errors; with a threshold, the regressions over it
/// (`significant` ones fail a build) and the verdict `failed`.
pub fn diff_json(
    base: &Profile,
    new: &Profile,
    diff: &Diff,
    top: usize,
    threshold: Option<f64>,
) -> String {
    let n = limit(top, diff.changes.len());
    let change = |c: &Change| {
        serde_json::json!({
            "name": c.name,
            "base_self_share": c.base_self,
            "new_self_share": c.new_self,
            "base_total_share": c.base_total,
            "new_total_share": c.new_total,
            "self_delta": c.self_delta(),
            "total_delta": c.total_delta(),
            "self_sigma": finite(c.sigma_self),
            "total_sigma": finite(c.sigma_total),
        })
    };
    let mut doc = serde_json::json!({
        "base": run_json(base, &diff.base),
        "new": run_json(new, &diff.new),
        "grew": diff.grew(n).map(change).collect::<Vec<_>>(),
        "shrank": diff.shrank(n).map(change).collect::<Vec<_>>(),
    });
    if let Some(t) = threshold {
        let r = diff.regressions(t);
        doc["threshold"] = t.into();
        doc["failed"] = r.iter().any(|r| r.significant).into();
        doc["regressions"] = r.iter().map(regression_json).collect::<Vec<_>>().into();
    }
    let mut out = serde_json::to_string_pretty(&doc).unwrap_or_default();
    out.push('\n');
    out
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// The diff as text: both runs, then the `top` functions (0: all) whose self share grew most
/// and those that shrank most.
pub fn diff_text(base: (&Profile, &str), new: (&Profile, &str), diff: &Diff, top: usize) -> String {
    let n = limit(top, diff.changes.len());
    let mut s = String::new();
    let _ = writeln!(s, "spanprof diff: {} -> {}", base.1, new.1);
    let _ = writeln!(s, "  base: {}", run_line(base.0));
    let _ = writeln!(s, "  new:  {}", run_line(new.0));
    let amount = |p: &Profile, f: &Functions| crate::summary::amount(p, f.total);
    if diff.base.total > 0 {
        let _ = writeln!(
            s,
            "  total: {} -> {} ({:+.1}%)",
            amount(base.0, &diff.base),
            amount(new.0, &diff.new),
            (diff.new.total as f64 / diff.base.total as f64 - 1.0) * 100.0
        );
    }
    let _ = writeln!(s, "Shares of each run's total, in points (new minus base):");
    let lists: [(&str, Vec<&Change>); 2] = [
        ("grew most", diff.grew(n).collect()),
        ("shrank most", diff.shrank(n).collect()),
    ];
    for (title, changes) in lists {
        let _ = writeln!(
            s,
            "{title}:{}",
            if changes.is_empty() { " none" } else { "" }
        );
        for c in changes {
            let _ = writeln!(s, "{}", change_line(c));
        }
    }
    s
}

impl Regression<'_> {
    /// The growth of the share it is about, and its standard error.
    pub fn delta_and_sigma(&self) -> (f64, f64) {
        let c = self.change;
        match self.which {
            Which::Self_ => (c.self_delta(), c.sigma_self),
            Which::Total => (c.total_delta(), c.sigma_total),
        }
    }

    /// `render_output: self share 26.0% -> 41.2% (+15.2 points; sampling error 1.2 points)`.
    pub fn describe(&self) -> String {
        let c = self.change;
        let (what, from, to) = match self.which {
            Which::Self_ => ("self", c.base_self, c.new_self),
            Which::Total => ("total", c.base_total, c.new_total),
        };
        let sigma = self.delta_and_sigma().1;
        format!(
            "{}: {what} share {}% -> {}% ({} points; sampling error {} points)",
            c.name,
            percent_text(from),
            percent_text(to),
            points_text(to - from),
            if sigma.is_finite() {
                format!("{:.1}", sigma * 100.0)
            } else {
                "unknown".to_string()
            }
        )
    }
}

/// What `diff --fail-on-regression` says on stderr, and whether the build fails: the
/// regressions that count, or that none does, and those over the threshold but within the
/// sampling noise.
pub fn verdict(diff: &Diff, threshold: f64) -> (String, bool) {
    let regressions = diff.regressions(threshold);
    let (failing, noisy): (Vec<_>, Vec<_>) = regressions.iter().partition(|r| r.significant);
    let limit = percent_text(threshold);
    let mut s = String::new();
    for r in &noisy {
        let _ = writeln!(
            s,
            "spanprof diff: not counted, within sampling noise (under {Z_LIMIT} standard \
             errors): {}",
            r.describe()
        );
    }
    if failing.is_empty() {
        let noise = if noisy.is_empty() {
            String::new()
        } else {
            format!(" ({} within sampling noise)", noisy.len())
        };
        let _ = writeln!(
            s,
            "spanprof diff: no significant regression over {limit} points{noise}"
        );
        return (s, false);
    }
    let _ = writeln!(
        s,
        "spanprof diff: regression: {} function{} grew by more than {limit} points of the total:",
        failing.len(),
        if failing.len() == 1 { "" } else { "s" }
    );
    for r in &failing {
        let _ = writeln!(s, "  {}", r.describe());
    }
    (s, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fixture;

    #[test]
    fn shares_count_recursion_once() {
        let mut profile = fixture::profile();
        // main;compute;main;compute: a recursion; 3 samples.
        let mut s = profile.samples[0].clone();
        s.frames = vec![0, 1, 0, 1];
        s.count = 3;
        profile.samples.push(s);
        let f = Functions::of(&profile);
        assert_eq!(f.total, 14);
        let main = f.get("main").unwrap();
        assert_eq!((main.self_weight, main.total_weight), (0, 14));
        let compute = f.get("compute").unwrap();
        assert_eq!(compute.total_weight, 13);
        assert_eq!(f.rows[0].name, "compute");
        assert_eq!(f.unit, Unit::Samples);
        assert_eq!(f.events, 14.0);
    }

    #[test]
    fn globs() {
        let p = Pattern::new("hot_*");
        assert!(p.matches("hot_alpha") && p.matches("hot_") && !p.matches("a_hot_alpha"));
        assert!(Pattern::new("*json*").matches("json_dumps") && Pattern::new("a?c").matches("abc"));
        assert!(!Pattern::new("a?c").matches("ac"));
        assert!(Pattern::new("handle").matches_function("handle (app.py)"));
        assert!(!Pattern::new("handle").matches_function("handler (app.py)"));
        assert!(Pattern::new("*a*a*a*b").matches(&format!("{}b", "a".repeat(40))));
        assert!(!Pattern::new("*a*a*a*b").matches(&"a".repeat(400)));
    }

    #[test]
    fn budgets_parse_and_measure() {
        assert!(Budget::parse("compute", ShareKind::Total).is_err());
        assert!(Budget::parse("=5%", ShareKind::Total).is_err());
        assert!(Budget::parse("x=150%", ShareKind::Total).is_err());
        assert!(Budget::parse("x=0", ShareKind::Total).is_err());
        let b = Budget::parse("comp*=50%", ShareKind::Total).unwrap();
        assert_eq!(b.max, 0.5);
        assert_eq!(b.option(), "--max 'comp*=50.0%'");
        let profile = fixture::profile();
        let f = Functions::of(&profile);
        // compute is in 10 of 11 samples; the kernel frame is the leaf of 2.
        let r = measure(&profile, &f, &b);
        assert!((r.share - 10.0 / 11.0).abs() < 1e-9, "{r:?}");
        assert!(r.crossed());
        assert_eq!(r.functions, ["compute"]);
        let s = measure(
            &profile,
            &f,
            &Budget::parse("compute=80%", ShareKind::Self_).unwrap(),
        );
        assert!((s.share - 8.0 / 11.0).abs() < 1e-9 && !s.crossed(), "{s:?}");
        let none = measure(
            &profile,
            &f,
            &Budget::parse("nothing=1%", ShareKind::Total).unwrap(),
        );
        assert_eq!((none.share, none.matched), (0.0, 0));
    }

    #[test]
    fn diff_ranks_the_grown_function_first() {
        let base = fixture::profile();
        let mut new = fixture::profile();
        // The unknown frame's stack gets 10 times the samples.
        let unknown = new
            .samples
            .iter_mut()
            .find(|s| s.frames.len() == 2 && s.frames[1] == 2)
            .unwrap();
        unknown.count = 10;
        let d = Diff::of(&base, &new).unwrap();
        let first = &d.changes[0];
        assert_eq!(first.name, "[unknown] (libfoo.so+0x1234)");
        assert!((first.base_self - 1.0 / 11.0).abs() < 1e-9);
        assert!((first.new_self - 10.0 / 20.0).abs() < 1e-9);
        assert_eq!(d.grew(5).count(), 1);
        assert_eq!(d.shrank(5).next().unwrap().name, "compute");
        // 41 points: over 5 points and over 3 standard errors of 11 and 20 samples? The error
        // is sqrt(.083/11 + .25/20) = 0.14, 3 of them 0.42: not significant.
        let r = d.regressions(0.05);
        assert_eq!(r[0].change.name, first.name);
        assert_eq!(r[0].which, Which::Self_);
        assert!(!r[0].significant);
        // Same profile: nothing grew.
        assert!(Diff::of(&base, &base)
            .unwrap()
            .regressions(0.0001)
            .is_empty());
        // Different units do not compare.
        assert!(Diff::of(&base, &fixture::off_cpu()).is_err());
    }

    #[test]
    fn a_significant_total_share_counts_when_the_self_share_is_noise() {
        let c = Change {
            name: "f".into(),
            base_self: 0.10,
            new_self: 0.16,
            base_total: 0.30,
            new_total: 0.50,
            sigma_self: 0.0274,
            sigma_total: 0.039,
        };
        let mut d = Diff::of(&fixture::profile(), &fixture::profile()).unwrap();
        d.changes = vec![c];
        let r = d.regressions(0.05);
        assert_eq!(
            (r.len(), r[0].which, r[0].significant),
            (1, Which::Total, true)
        );
        let (text, failed) = verdict(&d, 0.05);
        assert!(
            failed && text.contains("f: total share 30.0% -> 50.0%"),
            "{text}"
        );
        // Both noise: reported by self share, and the build passes, saying why.
        d.changes[0].new_total = 0.36;
        let r = d.regressions(0.05);
        assert_eq!((r[0].which, r[0].significant), (Which::Self_, false));
        let (text, failed) = verdict(&d, 0.05);
        assert!(!failed, "{text}");
        assert!(
            text.contains("not counted, within sampling noise")
                && text.contains(
                    "no significant regression over 5.0 points (1 within sampling noise)"
                ),
            "{text}"
        );
    }

    #[test]
    fn diffs_need_samples_and_the_same_measure() {
        let mut empty = fixture::profile();
        empty.samples.clear();
        let e = Diff::of(&fixture::profile(), &empty).unwrap_err();
        assert!(e.contains("the new profile has no samples"), "{e}");
        assert!(Diff::of(&empty, &fixture::profile()).is_err());
        // Both in bytes, but allocated and in use are not the same thing.
        let e = Diff::of(&fixture::alloc_only(), &fixture::heap_only()).unwrap_err();
        assert!(e.contains("--event alloc, the new one --event heap"), "{e}");
        assert!(Diff::of(&fixture::off_cpu(), &fixture::wall()).is_err());
    }

    #[test]
    fn many_samples_make_a_change_significant() {
        let mut base = fixture::profile();
        let mut new = fixture::profile();
        for s in &mut base.samples {
            s.count *= 1000;
        }
        for s in &mut new.samples {
            s.count *= 1000;
            if s.frames.len() == 2 && s.frames[1] == 2 {
                s.count *= 2;
            }
        }
        let d = Diff::of(&base, &new).unwrap();
        let r = d.regressions(0.05);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].significant);
    }

    #[test]
    fn span_times_and_budgets() {
        let profile = fixture::with_spans();
        // A name per OpenTelemetry span: its first byte.
        let times = span_times(&profile, |c| {
            let id = c.span_id?;
            let mut key = [0u8; 16];
            key[..8].copy_from_slice(&id);
            Some((if id[0] % 2 == 0 { "even" } else { "odd" }, key))
        })
        .unwrap();
        assert!(!times.is_empty());
        let total: u64 = times.iter().map(|t| t.total_ns).sum();
        let in_spans: u64 = profile
            .samples
            .iter()
            .filter(|s| profile.span_of(s).is_some_and(|c| c.span_id.is_some()))
            .map(|s| s.count * profile.meta.period_ns())
            .sum();
        assert_eq!(total, in_spans);
        for t in &times {
            assert_eq!(t.mean_ns(), t.total_ns / t.spans);
        }
        let b = SpanBudget::parse("GET /servers*=30ms").unwrap();
        assert_eq!(b.max_ns, 30_000_000);
        assert!(b.pattern.matches("GET /servers/123"));
        assert!(SpanBudget::parse("GET /servers").is_err());
        assert!(SpanBudget::parse("x=fast").is_err());
        assert!(SpanBudget::parse("x=0ms").is_err());
        let fake = [
            SpanTime {
                name: "GET /servers".into(),
                spans: 4,
                total_ns: 160_000_000,
            },
            SpanTime {
                name: "GET /flavors".into(),
                spans: 10,
                total_ns: 100_000_000,
            },
        ];
        let m = SpanBudget::parse("GET /*=30ms").unwrap().measure(&fake);
        assert_eq!(m.len(), 2);
        assert!(m[0].1 && !m[1].1, "40 ms over, 10 ms within");
        assert!(span_times(&fixture::memory(), |_| None).is_err());
        let text = report_text(&profile, &Functions::of(&profile), &fake, 1);
        assert!(
            text.contains("      4    40.0 ms   160.0 ms  GET /servers"),
            "{text}"
        );
        assert!(text.contains("(1 more span names)"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&report_json(&profile, &Functions::of(&profile), &fake, 0))
                .unwrap();
        assert_eq!(json["spans"][1]["mean_ns"], 10_000_000);
    }

    #[test]
    fn percents() {
        assert_eq!(parse_percent("20%"), Some(0.2));
        assert_eq!(parse_percent(" 2.5 % "), Some(0.025));
        assert_eq!(parse_percent("0.05"), None, "a % is required");
        assert_eq!(parse_percent("-1%"), None);
        assert_eq!(parse_percent("abc"), None);
        assert_eq!(percent_text(0.25), "25.0");
        assert_eq!(percent_text(0.0025), "0.25");
        assert_eq!(points_text(0.15), "+15.0");
        assert_eq!(points_text(-0.004), "-0.40");
    }
}
