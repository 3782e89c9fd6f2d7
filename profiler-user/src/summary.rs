//! The end-of-session summary: samples, losses, processes and the top functions.

use std::collections::HashSet;
use std::fmt::Write;

use profiler_common::{ErrorCode, ERROR_COUNT};
use rustc_hash::FxHashMap;

use crate::profile::Profile;
use crate::session::Overhead;
use std::time::Duration;

/// Functions by self samples (the leaf frame's display name), most first, ties by name.
pub fn top_self(profile: &Profile, n: usize) -> Vec<(String, u64)> {
    let mut by_name: FxHashMap<String, u64> = FxHashMap::default();
    for s in &profile.samples {
        if let Some(&leaf) = s.frames.last() {
            *by_name
                .entry(profile.frames[leaf as usize].display_name())
                .or_insert(0) += s.count;
        }
    }
    let mut v: Vec<(String, u64)> = by_name.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(n);
    v
}

/// spanprof's own CPU time: setup, per sample while sampling, and symbolizing plus writing.
pub fn overhead_line(profile: &Profile, o: &Overhead, symbolize_and_write: Duration) -> String {
    let total = profile.total_samples() + profile.meta.lost_samples;
    let per_sample = if total > 0 {
        format!("{:.1} µs", o.sampling.as_secs_f64() * 1e6 / total as f64)
    } else {
        "n/a".to_string()
    };
    format!(
        "spanprof own CPU: {:.1} ms setup, {per_sample} per sample while sampling ({:.1} ms), \
         {:.1} ms symbolizing and writing",
        o.setup.as_secs_f64() * 1e3,
        o.sampling.as_secs_f64() * 1e3,
        symbolize_and_write.as_secs_f64() * 1e3,
    )
}

/// What the samples' span contexts add up to, or `None` when no sample has one: e.g.
/// `spans: 1234 of 2000 samples in 12 OpenTelemetry spans (3 traces), 0 in OSProfiler traces`,
/// with the number of distinct trace points after the OSProfiler traces when there are some.
pub fn spans_line(profile: &Profile) -> Option<String> {
    let (mut otel, mut osp) = (0u64, 0u64);
    let mut spans = HashSet::new();
    let mut traces = HashSet::new();
    let mut osp_traces = HashSet::new();
    let mut osp_points = HashSet::new();
    let mut any = false;
    for s in &profile.samples {
        let Some(span) = profile.span_of(s) else {
            continue;
        };
        any = true;
        if span.trace_id.is_some() || span.span_id.is_some() {
            otel += s.count;
            spans.insert((span.trace_id, span.span_id));
            if let Some(t) = span.trace_id {
                traces.insert(t);
            }
        }
        if let Some(o) = &span.osprofiler {
            osp += s.count;
            osp_traces.insert(o.base_id);
            osp_points.insert(o.trace_id);
        }
    }
    if !any {
        return None;
    }
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let osp = if osp_traces.is_empty() {
        "0 in OSProfiler traces".to_string()
    } else {
        format!(
            "{osp} in {} ({})",
            plural(osp_traces.len(), "OSProfiler trace", "OSProfiler traces"),
            plural(osp_points.len(), "trace point", "trace points")
        )
    };
    let published = match profile.meta.python.published_spans {
        0 => String::new(),
        n => format!("; {n} read from the thread context the process publishes"),
    };
    Some(format!(
        "spans: {otel} of {} samples in {} ({}), {osp}{published}",
        profile.total_samples(),
        plural(spans.len(), "OpenTelemetry span", "OpenTelemetry spans"),
        plural(traces.len(), "trace", "traces"),
    ))
}

/// The summary text printed at the end of a session.
pub fn render(profile: &Profile, errors: &[u64; ERROR_COUNT as usize]) -> String {
    let total = profile.total_samples();
    let m = &profile.meta;
    let mut out = String::new();
    let procs: Vec<String> = profile
        .processes
        .iter()
        .map(|p| format!("{} ({})", p.pid, p.name))
        .collect();
    let _ = writeln!(
        out,
        "spanprof: {total} samples, {} lost, from {} process{} in {:.1} s at {} Hz: {}",
        m.lost_samples,
        procs.len(),
        if procs.len() == 1 { "" } else { "es" },
        m.duration.as_secs_f64(),
        m.frequency,
        m.target,
    );
    if procs.len() > 1 || (procs.len() == 1 && !m.target.contains(&procs[0])) {
        let _ = writeln!(out, "processes: {}", procs.join(", "));
    }
    let py = &m.python;
    if py.processes > 0 {
        let _ = writeln!(
            out,
            "python: {} process{}; samples with python frames: {}, of threads without a python \
             thread state: {}, whose walk failed at a read: {}; stacks truncated: {}",
            py.processes,
            if py.processes == 1 { "" } else { "es" },
            py.with_frames,
            py.no_thread,
            py.read_failed,
            py.truncated,
        );
    }
    if let Some(line) = spans_line(profile) {
        let _ = writeln!(out, "{line}");
    } else if py.processes > 0 && py.spans_enabled {
        // Say why a profile has no span labels.
        let _ = writeln!(
            out,
            "spans: none; OpenTelemetry, OSProfiler or a published thread context found in {} \
             of {} python process{}",
            py.span_processes,
            py.processes,
            if py.processes == 1 { "" } else { "es" },
        );
    }
    for line in crate::stats::summary_lines(profile) {
        let _ = writeln!(out, "{line}");
    }
    for note in &py.notes {
        let _ = writeln!(out, "warning: {note}");
    }
    // Lost samples get their own warning below, with what to do about them.
    for code in ErrorCode::ALL
        .into_iter()
        .filter(|&c| c != ErrorCode::RingbufFull)
    {
        let n = errors[code as usize];
        if n > 0 {
            let _ = writeln!(out, "warning: {}: {n}", code.describe());
        }
    }
    if m.lost_samples > 0 {
        let _ = writeln!(
            out,
            "warning: {} samples were lost because the ring buffer was full; \
             raise --ring-buffer-size or lower --frequency",
            m.lost_samples
        );
    }
    let top = top_self(profile, 10);
    if top.is_empty() {
        let _ = writeln!(
            out,
            "no samples: the target did not run on a CPU while profiled"
        );
        return out;
    }
    let _ = writeln!(out, "top functions (self):");
    for (name, n) in top {
        let _ = writeln!(
            out,
            "  {:>5.1}%  {:>7}  {name}",
            100.0 * n as f64 / total as f64,
            n
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixture;

    #[test]
    fn spans_line_counts_samples_spans_and_traces() {
        assert_eq!(spans_line(&fixture::profile()), None);
        assert_eq!(
            spans_line(&fixture::with_spans()).unwrap(),
            "spans: 7 of 11 samples in 2 OpenTelemetry spans (1 trace), 5 in 1 OSProfiler trace \
             (2 trace points)"
        );
        let text = render(&fixture::with_spans(), &[0; ERROR_COUNT as usize]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("spanprof: 11 samples, 4 lost, from 1 process in 2.5 s"));
        assert!(lines[1].starts_with("spans: 7 of 11"), "{text}");
        assert!(!render(&fixture::profile(), &[0; ERROR_COUNT as usize]).contains("spans:"));
        let mut otel_only = fixture::with_spans();
        otel_only.spans.truncate(1);
        otel_only.samples[1].span = None;
        otel_only.samples[2].span = None;
        assert_eq!(
            spans_line(&otel_only).unwrap(),
            "spans: 5 of 11 samples in 1 OpenTelemetry span (1 trace), 0 in OSProfiler traces"
        );
    }
}
