//! What `spanprof report`, `diff` and `check` compute from profiles: each function's share,
//! how shares changed between two runs, and budgets that fail a build.
//!
//! # Shares
//!
//! A function's *self* weight is the weight
//! ([`Profile::weight`](crate::profile::Profile::weight): samples, nanoseconds once off-CPU
//! time is in the profile, bytes for a memory profile) of the samples whose leaf frame is that
//! function; its *total* weight that of the samples with the function anywhere in their
//! stack, each sample counted once however deep the recursion. Shares are those weights over
//! the profile's total, so two runs of different lengths compare: a function that takes 25% of
//! one run and 40% of the next got slower relative to the rest of the program.
//!
//! A function is named as in flame graphs ([`crate::wording::frame_name`]), except that
//! a Python function is one function whatever its line: `handle (app.py)`, not
//! `handle (app.py:12)`, and an inlined one `read_buf (inlined)`
//! ([`function_name`](crate::wording::function_name)).
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
//! matches ([`span_times`]: the time their own samples stand for). A mean of fewer than
//! [`MIN_PERIODS_PER_SPAN`] sampling periods is no time ([`SpanTime::timed`]): `report` does
//! not give it and `check` refuses to judge it.
//!
//! Everything here is deterministic: rows are sorted by weight, then by name.
//!
//! One job a module, re-exported here: `shares` (function weights), `pattern` (globs),
//! `budget` (`--max`, `--max-self`, `--span-max`), `spans` (span times), `diff` (changes,
//! regressions, the verdict), `report` (`spanprof report`'s text and JSON) and `text` (numbers
//! as printed).
//!
//! Besides: [`filter`] keeps the samples of one trace, span, event or thread set of a profile
//! read back (`--span`, `--trace-id`, `--event`, `--thread`…), and [`stats`] says how complete
//! the native stacks of a profile are (the summary's `native stacks:` lines, `--stats`).

// The modules of the profile crate at this crate's root: the modules moved here from the one
// `spanprof` crate keep naming them `crate::profile`, `crate::format`… as before the split.
#[cfg(test)]
use spanprof_profile::format;
use spanprof_profile::{profile, wording};

mod budget;
mod diff;
pub mod filter;
mod pattern;
mod report;
mod shares;
mod spans;
pub mod stats;
#[cfg(test)]
mod tests;
mod text;

pub use budget::{measure, parse_percent, Budget, BudgetResult, ShareKind, SpanBudget};
pub use diff::{
    change_line, diff_json, diff_text, verdict, Change, Diff, Regression, Which, Z_LIMIT,
};
pub use pattern::Pattern;
pub use report::{event_names, report_json, report_text, run_line};
pub use shares::{FunctionWeight, Functions, Unit};
pub use spans::{
    count_period, rate_for, span_name_and_id, span_times, SpanTime, MIN_PERIODS_PER_SPAN,
};
pub use text::{duration_text, percent_text, points_text};
