//! How shares changed between two runs, which changes are regressions, the diff's text and
//! JSON, and the verdict of `spanprof check`.

use std::collections::HashMap;
use std::fmt::Write;

use super::report::{event_names, limit, run_json, run_line};
use super::shares::{FunctionWeight, Functions};
use super::text::{percent_text, points_text};
use crate::profile::Profile;

/// A change must be this many standard errors to count as a regression.
pub const Z_LIMIT: f64 = 3.0;

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

    /// The share that grew more, and by how much (self on a tie): what ranks the function
    /// among those that grew, as a regression check fails on either share.
    pub fn growth(&self) -> (Which, f64) {
        let (s, t) = (self.self_delta(), self.total_delta());
        if t > s {
            (Which::Total, t)
        } else {
            (Which::Self_, s)
        }
    }

    /// The share that shrank more, and by how much (negative; self on a tie).
    pub fn shrinkage(&self) -> (Which, f64) {
        let (s, t) = (self.self_delta(), self.total_delta());
        if t < s {
            (Which::Total, t)
        } else {
            (Which::Self_, s)
        }
    }
}

/// The change of every function between two runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Diff {
    /// The base run's functions.
    pub base: Functions,
    /// The new run's functions.
    pub new: Functions,
    /// Every function of either run, most grown first by [`Change::growth`] (then most grown
    /// self share, then by name).
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
            y.growth()
                .1
                .total_cmp(&x.growth().1)
                .then(y.self_delta().total_cmp(&x.self_delta()))
                .then_with(|| x.name.cmp(&y.name))
        });
        Ok(Diff {
            base: b,
            new: n,
            changes,
        })
    }

    /// Up to `n` functions whose self or total share grew, most first by [`Change::growth`].
    pub fn grew(&self, n: usize) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(|c| c.growth().1 > 0.0).take(n)
    }

    /// Up to `n` functions whose self or total share shrank, most first by
    /// [`Change::shrinkage`] (then most shrunk self share, then by name).
    pub fn shrank(&self, n: usize) -> impl Iterator<Item = &Change> {
        let mut shrank: Vec<&Change> = self
            .changes
            .iter()
            .filter(|c| c.shrinkage().1 < 0.0)
            .collect();
        shrank.sort_by(|x, y| {
            x.shrinkage()
                .1
                .total_cmp(&y.shrinkage().1)
                .then(x.self_delta().total_cmp(&y.self_delta()))
                .then_with(|| x.name.cmp(&y.name))
        });
        shrank.into_iter().take(n)
    }

    /// The functions whose self or total share grew by more than `threshold` (a fraction),
    /// most grown first by the share each is listed by. A function whose two shares both grew
    /// is listed once: by the share whose growth is significant if one is, by the one that grew
    /// more if both are (self on a tie), else by the one that grew more over the threshold.
    /// [`Regression::significant`] says which fail a build.
    pub fn regressions(&self, threshold: f64) -> Vec<Regression<'_>> {
        let mut out = Vec::new();
        for c in &self.changes {
            let over = |d: f64, sigma: f64| (d > threshold).then_some(d > Z_LIMIT * sigma);
            let shares = [
                (
                    Which::Self_,
                    c.self_delta(),
                    over(c.self_delta(), c.sigma_self),
                ),
                (
                    Which::Total,
                    c.total_delta(),
                    over(c.total_delta(), c.sigma_total),
                ),
            ];
            // The larger growth among those that are `wanted`; self on a tie.
            let pick = |wanted: fn(Option<bool>) -> bool| {
                shares.iter().filter(|&&(_, _, o)| wanted(o)).fold(
                    None,
                    |best: Option<&(Which, f64, Option<bool>)>, s| match best {
                        Some(b) if b.1 >= s.1 => Some(b),
                        _ => Some(s),
                    },
                )
            };
            let found = pick(|o| o == Some(true))
                .or_else(|| pick(|o| o.is_some()))
                .map(|&(which, _, o)| (which, o == Some(true)));
            if let Some((which, significant)) = found {
                out.push(Regression {
                    change: c,
                    which,
                    significant,
                });
            }
        }
        // Stable: ties keep the order of `changes`.
        out.sort_by(|x, y| y.delta_and_sigma().0.total_cmp(&x.delta_and_sigma().0));
        out
    }
}

/// One line of the diff's table, `(which, delta)` the figure it is ranked by:
/// `  +15.0 self   render_output  25.0% -> 40.0% self, 25.0% -> 40.0% total`.
pub fn change_line(c: &Change, (which, delta): (Which, f64)) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "  {:>6} {:<5}  {}  {}% -> {}% self, {}% -> {}% total",
        points_text(delta),
        match which {
            Which::Self_ => "self",
            Which::Total => "total",
        },
        c.name,
        percent_text(c.base_self),
        percent_text(c.new_self),
        percent_text(c.base_total),
        percent_text(c.new_total),
    );
    s
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

/// The diff as JSON: both runs' facts and the `top` functions (0: all) whose self or total
/// share grew and shrank most (ranked by the larger change of the two), with the standard errors; with a threshold, the regressions over it
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

/// The diff as text: both runs, then the `top` functions (0: all) whose self or total share
/// grew most and those that shrank most, each ranked by the larger change of its two shares,
/// which a regression check fails on.
pub fn diff_text(base: (&Profile, &str), new: (&Profile, &str), diff: &Diff, top: usize) -> String {
    let n = limit(top, diff.changes.len());
    let mut s = String::new();
    let _ = writeln!(s, "spanprof diff: {} -> {}", base.1, new.1);
    let _ = writeln!(s, "  base: {}", run_line(base.0));
    let _ = writeln!(s, "  new:  {}", run_line(new.0));
    let amount = |p: &Profile, f: &Functions| crate::wording::amount(p, f.total);
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
    type Figure = fn(&Change) -> (Which, f64);
    let lists: [(&str, Vec<&Change>, Figure); 2] = [
        ("grew most", diff.grew(n).collect(), Change::growth),
        ("shrank most", diff.shrank(n).collect(), Change::shrinkage),
    ];
    for (title, changes, figure) in lists {
        let _ = writeln!(
            s,
            "{title}:{}",
            if changes.is_empty() { " none" } else { "" }
        );
        for c in changes {
            let _ = writeln!(s, "{}", change_line(c, figure(c)));
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
