//! `spanprof report`: one run's line, its functions' shares and its spans' times, as text
//! and as JSON.

use std::fmt::Write;

use super::shares::{FunctionWeight, Functions, Unit};
use super::spans::{SpanTime, MIN_PERIODS_PER_SPAN};
use super::text::{duration_text, percent_text};
use crate::profile::Profile;

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
    let amount = |w: u64| crate::wording::amount(profile, w);
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
        let period = super::spans::count_period(profile);
        for t in &spans[..shown] {
            let mean = if t.timed(period) {
                duration_text(t.mean_ns())
            } else {
                "n/a".to_string()
            };
            let _ = writeln!(
                s,
                "{:>7} {:>10} {:>10}  {}",
                t.spans,
                mean,
                duration_text(t.total_ns),
                t.name
            );
        }
        if shown < spans.len() {
            let _ = writeln!(s, "({} more span names)", spans.len() - shown);
        }
        if spans[..shown].iter().any(|t| !t.timed(period)) {
            let _ = writeln!(
                s,
                "(n/a: fewer than {MIN_PERIODS_PER_SPAN} samples a span at {} Hz: spans this \
                 short cannot be timed at this rate)",
                profile.meta.frequency
            );
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
pub(super) fn run_json(profile: &Profile, functions: &Functions) -> serde_json::Value {
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
/// "total_ns", "mean_ns", "samples_per_span"}…]}`, weights in the profile's `unit`, shares as
/// fractions, every span name; `mean_ns` is null when the spans are too short to time at the
/// profile's rate ([`SpanTime::timed`]).
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
    let period = super::spans::count_period(profile);
    let spans: Vec<serde_json::Value> = spans
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name,
                "spans": t.spans,
                "total_ns": t.total_ns,
                "mean_ns": t.timed(period).then(|| t.mean_ns()),
                "samples_per_span": t.periods(period),
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
pub(super) fn limit(top: usize, len: usize) -> usize {
    if top == 0 {
        len
    } else {
        top.min(len)
    }
}
