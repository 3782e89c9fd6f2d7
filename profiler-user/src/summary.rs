//! The end-of-session summary: samples, losses, processes and the top functions.
//!
//! A plain on-CPU profile counts samples. When off-CPU time is in the profile
//! ([`Events::in_nanoseconds`](crate::profile::Events::in_nanoseconds)), the amounts that mix
//! both (top functions, spans) are milliseconds of [`Profile::weight`], and an `off-CPU:` line
//! gives the time blocked per reason.

use std::collections::HashSet;
use std::fmt::Write;

use profiler_common::{ErrorCode, ERROR_COUNT};
use rustc_hash::FxHashMap;

use crate::offcpu::OffCpuReason;
use crate::output::{millis, no_samples_text};
use crate::profile::Profile;
use crate::session::Overhead;
use std::time::Duration;

/// Functions by self weight (the leaf frame's display name; [`Profile::weight`]: samples, or
/// nanoseconds with off-CPU time), most first, ties by name.
pub fn top_self(profile: &Profile, n: usize) -> Vec<(String, u64)> {
    let mut by_name: FxHashMap<String, u64> = FxHashMap::default();
    for s in &profile.samples {
        if let Some(&leaf) = s.frames.last() {
            let total = by_name
                .entry(profile.frames[leaf as usize].display_name())
                .or_insert(0);
            *total = total.saturating_add(profile.weight(s));
        }
    }
    by_name.retain(|_, w| *w > 0);
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

/// The sum of [`Profile::weight`]: samples, or nanoseconds when off-CPU time is in the profile.
pub fn total_weight(profile: &Profile) -> u64 {
    profile
        .samples
        .iter()
        .fold(0u64, |t, s| t.saturating_add(profile.weight(s)))
}

/// A weight as the summary writes it: `11` (samples) for an on-CPU profile, else `405.5 ms`.
pub fn amount(profile: &Profile, weight: u64) -> String {
    if profile.meta.events.in_nanoseconds() {
        millis(weight)
    } else {
        weight.to_string()
    }
}

/// The off-CPU time and its reasons, or `None` without off-CPU events: e.g. `off-CPU: 295.5 ms
/// blocked: sleep 250.0 ms (84.6%), lock 45.5 ms (15.4%)`, reasons in [`OffCpuReason::ALL`]
/// order, those with time only.
pub fn off_cpu_line(profile: &Profile) -> Option<String> {
    if !profile.meta.events.in_nanoseconds() {
        return None;
    }
    let mut by_reason = [0u64; OffCpuReason::ALL.len()];
    for s in &profile.samples {
        if let Some(reason) = s.off_cpu {
            let slot = &mut by_reason[OffCpuReason::ALL
                .iter()
                .position(|&r| r == reason)
                .unwrap_or(0)];
            *slot = slot.saturating_add(s.off_cpu_ns);
        }
    }
    let total = by_reason.iter().fold(0u64, |t, &ns| t.saturating_add(ns));
    let mut line = format!("off-CPU: {} blocked", millis(total));
    let reasons: Vec<String> = OffCpuReason::ALL
        .iter()
        .zip(by_reason)
        .filter(|&(_, ns)| ns > 0)
        .map(|(r, ns)| {
            format!(
                "{} {} ({:.1}%)",
                r.name(),
                millis(ns),
                100.0 * ns as f64 / total as f64
            )
        })
        .collect();
    if !reasons.is_empty() {
        line.push_str(": ");
        line.push_str(&reasons.join(", "));
    }
    Some(line)
}

/// What the samples' span contexts add up to, or `None` when no sample has one: e.g.
/// `spans: 1234 of 2000 samples in 12 OpenTelemetry spans (3 traces), 0 in OSProfiler traces`,
/// with the number of distinct trace points after the OSProfiler traces when there are some.
/// With off-CPU time in the profile, amounts are milliseconds of [`Profile::weight`]:
/// `spans: 123.4 ms of 2000.0 ms in 12 OpenTelemetry spans (3 traces), …`.
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
        let w = profile.weight(s);
        if span.trace_id.is_some() || span.span_id.is_some() {
            otel += w;
            spans.insert((span.trace_id, span.span_id));
            if let Some(t) = span.trace_id {
                traces.insert(t);
            }
        }
        if let Some(o) = &span.osprofiler {
            osp += w;
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
            "{} in {} ({})",
            amount(profile, osp),
            plural(osp_traces.len(), "OSProfiler trace", "OSProfiler traces"),
            plural(osp_points.len(), "trace point", "trace points")
        )
    };
    let published = match profile.meta.python.published_spans {
        0 => String::new(),
        n => format!("; {n} read from the thread context the process publishes"),
    };
    let total = if profile.meta.events.in_nanoseconds() {
        millis(total_weight(profile))
    } else {
        format!("{} samples", profile.total_samples())
    };
    Some(format!(
        "spans: {} of {total} in {} ({}), {osp}{published}",
        amount(profile, otel),
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
    // NB: without on-CPU events there are no samples to count; the header gives the time.
    let amount = if m.events.cpu || m.events.wall {
        format!("{total} samples")
    } else {
        format!("{} off-CPU", millis(profile.total_off_cpu_ns()))
    };
    let _ = writeln!(
        out,
        "spanprof: {amount}, {} lost, from {} process{} in {:.1} s at {} Hz: {}",
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
    if let Some(line) = off_cpu_line(profile) {
        let _ = writeln!(out, "{line}");
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
        let _ = writeln!(out, "{}", no_samples_text(m.events));
        return out;
    }
    let _ = writeln!(out, "top functions (self):");
    let all = total_weight(profile);
    for (name, w) in top {
        let share = 100.0 * w as f64 / all as f64;
        if m.events.in_nanoseconds() {
            let _ = writeln!(out, "  {share:>5.1}%  {:>10}  {name}", millis(w));
        } else {
            let _ = writeln!(out, "  {share:>5.1}%  {w:>7}  {name}");
        }
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

    #[test]
    fn on_cpu_summary_unchanged() {
        assert_eq!(off_cpu_line(&fixture::profile()), None);
        let text = render(&fixture::profile(), &[0; ERROR_COUNT as usize]);
        // NB: the native stacks line is `stats`' own.
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("native stacks: "))
            .collect();
        assert_eq!(
            lines,
            [
                "spanprof: 11 samples, 4 lost, from 1 process in 2.5 s at 100 Hz: pid 100 (app)",
                "warning: 4 samples were lost because the ring buffer was full; raise \
                 --ring-buffer-size or lower --frequency",
                "top functions (self):",
                "   72.7%        8  compute",
                "   18.2%        2  do_syscall_64_[k]",
                "    9.1%        1  [unknown] (libfoo.so+0x1234)",
            ]
        );
    }

    #[test]
    fn off_cpu_totals_per_reason() {
        let errors = [0; ERROR_COUNT as usize];
        // 30 + 15.5 ms on locks, 250 ms asleep.
        let line = "off-CPU: 295.5 ms blocked: sleep 250.0 ms (84.6%), lock 45.5 ms (15.4%)";
        assert_eq!(off_cpu_line(&fixture::off_cpu()).unwrap(), line);
        assert_eq!(off_cpu_line(&fixture::wall()).unwrap(), line);
        assert_eq!(off_cpu_line(&fixture::off_cpu_only()).unwrap(), line);
        let p = fixture::off_cpu();
        assert_eq!(amount(&p, total_weight(&p)), "405.5 ms");
        let p = fixture::profile();
        assert_eq!(amount(&p, total_weight(&p)), "11");

        let text = render(&fixture::off_cpu(), &errors);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "spanprof: 11 samples, 4 lost, from 1 process in 2.5 s at 100 Hz: pid 100 (app)"
        );
        assert_eq!(lines[1], line);
        // Spans in milliseconds: span 0 has 50 ms on CPU and 30 ms on a lock, span 2 20 ms;
        // OSProfiler: span 1 30 ms + 15.5 ms, span 2.
        assert_eq!(
            lines[2],
            "spans: 100.0 ms of 405.5 ms in 2 OpenTelemetry spans (1 trace), 65.5 ms in 1 \
             OSProfiler trace (2 trace points)"
        );
        // Of 405.5 ms, by leaf: the sleeper's `main` first.
        let top = text.split_once("top functions (self):\n").unwrap().1;
        assert_eq!(
            top,
            "   61.7%    250.0 ms  main\n\
             \x20  23.6%     95.5 ms  compute\n\
             \x20  12.3%     50.0 ms  do_syscall_64_[k]\n\
             \x20   2.5%     10.0 ms  [unknown] (libfoo.so+0x1234)\n"
        );

        let text = render(&fixture::off_cpu_only(), &errors);
        assert!(
            text.starts_with(
                "spanprof: 295.5 ms off-CPU, 4 lost, from 1 process in 2.5 s at 100 Hz: \
                 pid 100 (app)\n\
                 off-CPU: 295.5 ms blocked: sleep 250.0 ms (84.6%), lock 45.5 ms (15.4%)\n"
            ),
            "{text}"
        );
        assert!(text.contains("\n   84.6%    250.0 ms  main\n"), "{text}");

        let mut idle = fixture::off_cpu_only();
        idle.samples.clear();
        assert_eq!(off_cpu_line(&idle).unwrap(), "off-CPU: 0.0 ms blocked");
        let text = render(&idle, &errors);
        assert!(
            text.ends_with("no samples: the target did not block while profiled\n"),
            "{text}"
        );
    }
}
