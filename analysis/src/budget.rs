//! Budgets (`--max`, `--max-self`, `--span-max`): parsed, and measured against a profile.

use super::pattern::Pattern;
use super::shares::{FunctionWeight, Functions};
use super::spans::SpanTime;
use super::text::percent_text;
use crate::profile::Profile;
use crate::wording::{function_name, NO_STACK};

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
