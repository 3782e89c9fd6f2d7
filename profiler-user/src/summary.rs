//! The end-of-session summary: samples, losses, processes and the top functions.
//!
//! A plain on-CPU profile counts samples. When off-CPU time is in the profile
//! ([`Events::in_nanoseconds`](crate::profile::Events::in_nanoseconds)), the amounts that mix
//! both (top functions, spans) are milliseconds of [`Profile::weight`], and an `off-CPU:` line
//! gives the time blocked per reason.
//!
//! A memory profile ([`Events::in_bytes`](crate::profile::Events::in_bytes)) counts bytes: its
//! header gives the estimated totals (`spanprof: 1.2 GiB allocated in 34,567 allocations, 785.4
//! MiB in use at the end in 1,037 (estimated), …`), amounts are in binary units with one decimal
//! ([`size`]), and the top functions are by bytes: those in use at the end with `--event heap`,
//! those allocated with `--event alloc`, both lists with both events.

use std::collections::HashSet;
use std::fmt::Write;

use profiler_common::{ErrorCode, ERROR_COUNT};
use rustc_hash::FxHashMap;

use crate::profile::OffCpuReason;
use crate::profile::{Profile, Sample};
use crate::session::Overhead;
use crate::wording::{
    amount, estimated, memory_text, millis, no_samples_text, sampling, size, total_weight,
    unit_suffix,
};
use spanprof_pipeline::assemble::PYMALLOC_ARENA;
use std::time::Duration;

/// Functions by self weight (the leaf frame's display name; [`Profile::weight`]: samples,
/// nanoseconds with off-CPU time, or bytes), most first, ties by name.
pub fn top_self(profile: &Profile, n: usize) -> Vec<(String, u64)> {
    top_self_by(profile, n, |s| profile.weight(s))
}

/// Functions by the self `weight` of their samples, most first, ties by name; those with a zero
/// total are left out.
pub fn top_self_by(
    profile: &Profile,
    n: usize,
    weight: impl Fn(&Sample) -> u64,
) -> Vec<(String, u64)> {
    let mut by_name: FxHashMap<String, u64> = FxHashMap::default();
    for s in &profile.samples {
        if let Some(&leaf) = s.frames.last() {
            let total = by_name
                .entry(profile.frames[leaf as usize].display_name())
                .or_insert(0);
            *total = total.saturating_add(weight(s));
        }
    }
    by_name.retain(|_, w| *w > 0);
    let mut v: Vec<(String, u64)> = by_name.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(n);
    v
}

/// spanprof's own CPU time: setup, per sample while sampling, and symbolizing plus writing.
///
/// A sample here is a record the programs made, as in [`Cost::samples`]. A memory profile
/// does not know how many allocations were sampled (its samples are scaled estimates), so it
/// gives the time while sampling without a cost per sample.
pub fn overhead_line(profile: &Profile, o: &Overhead, symbolize_and_write: Duration) -> String {
    if profile.meta.events.in_bytes() {
        return format!(
            "spanprof own CPU: {:.1} ms setup, {:.1} ms while sampling, {:.1} ms symbolizing \
             and writing",
            o.setup.as_secs_f64() * 1e3,
            o.sampling.as_secs_f64() * 1e3,
            symbolize_and_write.as_secs_f64() * 1e3,
        );
    }
    let total = Cost::of(profile, o).samples;
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

/// Where the targets' CPU time of a [`Cost`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetCpuSource {
    /// `/proc/PID/stat` of the profiled processes ([`target_cpu`](spanprof_collect::target_cpu)); `unreadable`
    /// processes could not be read (gone before their first read).
    Proc {
        /// Processes read.
        processes: u32,
        /// Processes not read.
        unreadable: u32,
    },
    /// No target could be read: on-CPU samples × period, the lost ones only when every record
    /// is an on-CPU sample (the kernel counts lost records of every kind together).
    Samples,
}

/// spanprof's cost while sampling, next to the CPU time of what it profiled: the figures the
/// session summary, `spanprof verify` and the daemon's metrics give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Records the programs made: those read (on-CPU samples, off-CPU intervals, allocations)
    /// and those lost because the ring buffer was full (each is a program run all the same).
    pub samples: u64,
    /// Of them, lost.
    pub lost: u64,
    /// Run time of spanprof's programs in the kernel; `None` when the kernel did not count it.
    pub kernel_ns: Option<u64>,
    /// spanprof's own CPU time (user + system) while sampling.
    pub own_ns: u64,
    /// The targets' CPU time while sampling ([`Cost::target_cpu_source`] says from where);
    /// `None` for a memory profile, and without a /proc figure or on-CPU samples.
    pub target_cpu_ns: Option<u64>,
    /// Where [`Cost::target_cpu_ns`] comes from.
    pub target_cpu_source: TargetCpuSource,
}

impl Cost {
    /// The cost of a session that made `profile`.
    pub fn of(profile: &Profile, o: &Overhead) -> Cost {
        let lost = profile.meta.lost_samples;
        let samples = o.records.saturating_add(lost);
        let events = profile.meta.events;
        let (target_cpu_ns, target_cpu_source) = match o.targets {
            _ if events.in_bytes() => (None, TargetCpuSource::Samples),
            Some(m) => (
                Some(m.ns),
                TargetCpuSource::Proc {
                    processes: m.processes,
                    unreadable: m.unreadable,
                },
            ),
            None => {
                // A lost record may be an off-CPU interval: counted only when none can be.
                let lost_cpu = if events.in_nanoseconds() { 0 } else { lost };
                let on_cpu = profile.total_samples().saturating_add(lost_cpu);
                (
                    ((events.cpu || events.wall) && on_cpu > 0)
                        .then(|| on_cpu.saturating_mul(profile.meta.period_ns())),
                    TargetCpuSource::Samples,
                )
            }
        };
        Cost {
            samples,
            lost,
            kernel_ns: o.kernel.map(|k| k.total_ns),
            own_ns: u64::try_from(o.sampling.as_nanos()).unwrap_or(u64::MAX),
            target_cpu_ns,
            target_cpu_source,
        }
    }

    /// Nanoseconds in the kernel per sample.
    pub fn kernel_per_sample(&self) -> Option<f64> {
        let k = self.kernel_ns?;
        (self.samples > 0).then(|| k as f64 / self.samples as f64)
    }

    /// Nanoseconds of spanprof's own CPU per sample.
    pub fn own_per_sample(&self) -> Option<f64> {
        (self.samples > 0).then(|| self.own_ns as f64 / self.samples as f64)
    }

    /// spanprof's CPU (in the kernel and its own) as a fraction of the targets' CPU; without
    /// the kernel's figure, its own CPU alone.
    pub fn share(&self) -> Option<f64> {
        let target = self.target_cpu_ns.filter(|&t| t > 0)?;
        let spent = self.own_ns.saturating_add(self.kernel_ns.unwrap_or(0));
        Some(spent as f64 / target as f64)
    }

    /// Where the targets' CPU time came from, as the summary says it: `from /proc`, `from
    /// /proc, 2 processes not read`, or `estimated from the on-CPU samples: /proc unreadable`.
    pub fn source_text(&self) -> String {
        match self.target_cpu_source {
            TargetCpuSource::Proc { unreadable: 0, .. } => "from /proc".to_string(),
            TargetCpuSource::Proc { unreadable, .. } => format!(
                "from /proc; {unreadable} process{} gone before it could be read",
                if unreadable == 1 { "" } else { "es" }
            ),
            TargetCpuSource::Samples => {
                "estimated from the on-CPU samples: /proc unreadable".to_string()
            }
        }
    }

    /// `spanprof overhead while sampling: 2.1 µs in the kernel and 9.8 µs of its own CPU per
    /// sample (1500 samples, 3 lost); 3.2 ms and 14.7 ms in all, 0.61% of the targets' 2.95 s of
    /// CPU (from /proc)`. A sample is a record the programs made, kept or lost: with off-CPU
    /// events the intervals count too (`1500 on-CPU and off-CPU samples`).
    pub fn line(&self, events: &crate::profile::Events) -> String {
        let micros =
            |ns: Option<f64>| ns.map_or("n/a".to_string(), |ns| format!("{:.1} µs", ns / 1e3));
        let millis = |ns: u64| format!("{:.1} ms", ns as f64 / 1e6);
        let own = micros(self.own_per_sample());
        let kinds = if events.in_bytes() {
            "allocation "
        } else if events.in_nanoseconds() && (events.cpu || events.wall) {
            "on-CPU and off-CPU "
        } else if events.in_nanoseconds() {
            "off-CPU "
        } else {
            ""
        };
        let counted = format!("({} {kinds}samples, {} lost)", self.samples, self.lost);
        let (spent, all) = match self.kernel_ns {
            Some(k) => (
                format!(
                    "{} in the kernel and {own} of its own CPU per sample {counted}",
                    micros(self.kernel_per_sample())
                ),
                format!("{} and {} in all", millis(k), millis(self.own_ns)),
            ),
            None => (
                format!("{own} of its own CPU per sample {counted}"),
                format!("{} in all", millis(self.own_ns)),
            ),
        };
        let share = match (self.share(), self.target_cpu_ns) {
            (Some(share), Some(target)) => format!(
                ", {:.2}% of the targets' {:.2} s of CPU ({})",
                share * 100.0,
                target as f64 / 1e9,
                self.source_text()
            ),
            _ => String::new(),
        };
        let uncounted = if self.kernel_ns.is_none() {
            " (in-kernel time not counted: the kernel counts it for CAP_SYS_ADMIN, or with \
             sysctl kernel.bpf_stats_enabled=1)"
        } else {
            ""
        };
        format!("spanprof overhead while sampling: {spent}; {all}{share}{uncounted}")
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
/// `spans: 123.4 ms of 2000.0 ms in 12 OpenTelemetry spans (3 traces), …`; in a memory profile
/// bytes: `spans: 1.1 GiB of 1.2 GiB in …`.
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
    let total = format!(
        "{}{}",
        amount(profile, total_weight(profile)),
        unit_suffix(profile)
    );
    Some(format!(
        "spans: {} of {total} in {} ({}), {osp}{published}",
        amount(profile, otel),
        plural(spans.len(), "OpenTelemetry span", "OpenTelemetry spans"),
        plural(traces.len(), "trace", "traces"),
    ))
}

/// The warning of a `--python-only` session whose samples have no Python frame (the targets
/// run no CPython spanprof could read): `None` when one has, or there are no samples.
pub fn python_only_warning(profile: &Profile) -> Option<String> {
    let python = profile.samples.iter().any(|s| {
        s.frames.iter().any(|&f| {
            profile
                .frames
                .get(f as usize)
                .is_some_and(|f| f.kind == spanprof_profile::profile::FrameKind::Python)
        })
    });
    (!python && !profile.samples.is_empty()).then(|| {
        format!(
            "spanprof: warning: --python-only, but no sample has a Python frame: no CPython \
             spanprof could read in {}; profile without --python-only for the native stacks",
            profile.meta.target
        )
    })
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
    // NB: without on-CPU events there are no samples to count; the header gives the time, or
    // the memory.
    let amount = if m.events.in_bytes() {
        let estimate = if estimated(m.events) {
            " (estimated)"
        } else {
            ""
        };
        format!("{}{estimate}", memory_text(profile))
    } else if m.events.cpu || m.events.wall {
        format!("{total} samples")
    } else {
        format!("{} off-CPU", millis(profile.total_off_cpu_ns()))
    };
    let _ = writeln!(
        out,
        "spanprof: {amount}, {} lost, from {} process{} in {:.1} s {}: {}",
        m.lost_samples,
        procs.len(),
        if procs.len() == 1 { "" } else { "es" },
        m.duration.as_secs_f64(),
        sampling(m),
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
             thread state: {}, whose walk failed at a read: {}, in the interpreter before it \
             was found: {}; stacks truncated: {}",
            py.processes,
            if py.processes == 1 { "" } else { "es" },
            py.with_frames,
            py.no_thread,
            py.read_failed,
            py.not_found,
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
        // NB: a higher --alloc-rate samples fewer allocations, as a lower --frequency fewer
        // timer events.
        let _ = writeln!(
            out,
            "warning: {} samples were lost because the ring buffer was full; \
             raise --ring-buffer-size or {}",
            m.lost_samples,
            if m.events.in_bytes() {
                "--alloc-rate"
            } else {
                "lower --frequency"
            }
        );
    }
    if m.events.in_bytes() {
        memory_tops(profile, &mut out);
        return out;
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

/// The top functions of a memory profile by self bytes: allocated (`--event alloc`), then in use
/// at the end (`--event heap`), each list for its event; `no samples: …` when all are empty.
fn memory_tops(profile: &Profile, out: &mut String) {
    let events = profile.meta.events;
    type Bytes = fn(&Sample) -> u64;
    let lists: [(bool, &str, Bytes); 2] = [
        (events.alloc, "bytes allocated", |s| s.alloc.bytes),
        (events.heap, "bytes in use at the end", |s| s.inuse.bytes),
    ];
    let mut any = false;
    for (_, what, bytes) in lists.into_iter().filter(|&(on, _, _)| on) {
        let top = top_self_by(profile, 10, bytes);
        if top.is_empty() {
            continue;
        }
        any = true;
        let all = profile
            .samples
            .iter()
            .fold(0u64, |t, s| t.saturating_add(bytes(s)));
        let _ = writeln!(out, "top functions (self, {what}):");
        for (name, w) in top {
            let share = 100.0 * w as f64 / all as f64;
            let _ = writeln!(out, "  {share:>5.1}%  {:>10}  {name}", size(w));
        }
        let arenas = profile
            .samples
            .iter()
            .filter(|s| {
                s.frames.last().is_some_and(|&leaf| {
                    profile.frames[leaf as usize].display_name() == PYMALLOC_ARENA
                })
            })
            .fold(0u64, |t, s| t.saturating_add(bytes(s)));
        if arenas > 0 {
            let _ = writeln!(
                out,
                "  ({PYMALLOC_ARENA}: {} of CPython's small-object arenas, each under the code \
                 that needed a new one, not necessarily the code whose objects fill it; \
                 --python-allocators names that code)",
                size(arenas)
            );
        }
    }
    if !any {
        let _ = writeln!(out, "{}", no_samples_text(events));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fixture;

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

    /// The summary without `stats`' own `native stacks:` line.
    fn summary(profile: &Profile) -> Vec<String> {
        render(profile, &[0; ERROR_COUNT as usize])
            .lines()
            .filter(|l| !l.starts_with("native stacks: "))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn memory_summary_in_bytes() {
        let lost = "warning: 4 samples were lost because the ring buffer was full; raise \
                    --ring-buffer-size or --alloc-rate";
        let allocated = [
            "top functions (self, bytes allocated):",
            "   97.4%     1.2 GiB  compute",
            "    2.3%    28.6 MiB  do_syscall_64_[k]",
            "    0.3%     3.3 MiB  [unknown] (libfoo.so+0x1234)",
        ];
        let in_use = [
            "top functions (self, bytes in use at the end):",
            "   97.1%   762.9 MiB  compute",
            "    2.4%    19.1 MiB  do_syscall_64_[k]",
            "    0.4%     3.3 MiB  [unknown] (libfoo.so+0x1234)",
        ];
        let mut want = vec![
            "spanprof: 1.2 GiB allocated in 34,567 allocations, 785.4 MiB in use at the end in \
             1,037 (estimated), 4 lost, from 1 process in 2.5 s at 1 sample per 512 KiB: \
             pid 100 (app)",
            // Spans by bytes in use: span 0 800 MB, span 2 20 MB; OSProfiler: span 1 (nothing
            // in use), span 2.
            "spans: 782.0 MiB of 785.4 MiB in 2 OpenTelemetry spans (1 trace), 19.1 MiB in 1 \
             OSProfiler trace (2 trace points)",
            lost,
        ];
        want.extend(allocated);
        want.extend(in_use);
        assert_eq!(summary(&fixture::memory()), want);

        let mut want = vec![
            "spanprof: 1.2 GiB allocated in 34,567 allocations (estimated), 4 lost, from 1 \
             process in 2.5 s at 1 sample per 512 KiB: pid 100 (app)",
            "spans: 1.1 GiB of 1.2 GiB in 2 OpenTelemetry spans (1 trace), 76.3 MiB in 1 \
             OSProfiler trace (2 trace points)",
            lost,
        ];
        want.extend(allocated);
        assert_eq!(summary(&fixture::alloc_only()), want);

        let heap = summary(&fixture::heap_only());
        assert_eq!(
            heap[0],
            "spanprof: 785.4 MiB in use at the end in 1,037 allocations (estimated), 4 lost, \
             from 1 process in 2.5 s at 1 sample per 512 KiB: pid 100 (app)"
        );
        assert_eq!(heap[3..], in_use);

        // Every allocation recorded: not estimated.
        let mut every = fixture::alloc_only();
        every.meta.events.alloc_rate = 1;
        every.meta.lost_samples = 0;
        assert_eq!(
            summary(&every)[0],
            "spanprof: 1.2 GiB allocated in 34,567 allocations, 0 lost, from 1 process in 2.5 s \
             recording every allocation: pid 100 (app)"
        );

        let p = fixture::memory();
        assert_eq!(amount(&p, total_weight(&p)), "785.4 MiB");
        assert_eq!(unit_suffix(&p), "");
        assert_eq!(unit_suffix(&fixture::profile()), " samples");
        assert_eq!(unit_suffix(&fixture::off_cpu()), "");
        assert_eq!(off_cpu_line(&p), None);
        assert_eq!(
            top_self(&p, 2),
            [
                ("compute".to_string(), 800_000_000),
                ("do_syscall_64_[k]".to_string(), 20_000_000)
            ]
        );

        let mut idle = fixture::heap_only();
        idle.samples.clear();
        assert_eq!(
            summary(&idle).last().unwrap(),
            "no samples: no sampled allocation of the target was still in use at the end"
        );
        // Allocations, none in use: the allocated list alone.
        let mut freed = fixture::memory();
        for s in &mut freed.samples {
            s.inuse = Default::default();
        }
        assert_eq!(summary(&freed)[3..], allocated);
    }

    #[test]
    fn overhead_lines() {
        let o = Overhead {
            setup: Duration::from_millis(12),
            sampling: Duration::from_micros(1500),
            cpu_at_end_of_sampling: Duration::ZERO,
            kernel: None,
            records: 11,
            targets: None,
        };
        let after = Duration::from_millis(3);
        // 11 records read and 4 lost.
        assert_eq!(
            overhead_line(&fixture::profile(), &o, after),
            "spanprof own CPU: 12.0 ms setup, 100.0 µs per sample while sampling (1.5 ms), \
             3.0 ms symbolizing and writing"
        );
        assert_eq!(
            overhead_line(&fixture::memory(), &o, after),
            "spanprof own CPU: 12.0 ms setup, 1.5 ms while sampling, 3.0 ms symbolizing and \
             writing"
        );
    }

    #[test]
    fn cost_lines() {
        let mut o = Overhead {
            setup: Duration::from_millis(12),
            sampling: Duration::from_micros(1500),
            cpu_at_end_of_sampling: Duration::ZERO,
            kernel: Some(crate::bpf::KernelTime {
                total_ns: 300_000,
                total_runs: 40,
                sampling_ns: 200_000,
                sampling_runs: 20,
            }),
            records: 11,
            targets: None,
        };
        // /proc unreadable: 11 on-CPU samples and 4 lost ones, all on-CPU, at 100 Hz: 150 ms.
        let profile = fixture::profile();
        let cost = Cost::of(&profile, &o);
        assert_eq!((cost.samples, cost.lost), (15, 4));
        assert_eq!(cost.target_cpu_ns, Some(150_000_000));
        assert_eq!(cost.target_cpu_source, TargetCpuSource::Samples);
        // (0.3 + 1.5 ms) / 150 ms.
        assert_eq!(
            cost.line(&profile.meta.events),
            "spanprof overhead while sampling: 20.0 µs in the kernel and 100.0 µs of its own CPU \
             per sample (15 samples, 4 lost); 0.3 ms and 1.5 ms in all, 1.20% of the targets' \
             0.15 s of CPU (estimated from the on-CPU samples: /proc unreadable)"
        );
        // From /proc.
        o.targets = Some(crate::target_cpu::Measured {
            ns: 90_000_000,
            processes: 2,
            unreadable: 0,
        });
        assert_eq!(
            Cost::of(&profile, &o).line(&profile.meta.events),
            "spanprof overhead while sampling: 20.0 µs in the kernel and 100.0 µs of its own CPU \
             per sample (15 samples, 4 lost); 0.3 ms and 1.5 ms in all, 2.00% of the targets' \
             0.09 s of CPU (from /proc)"
        );
        o.kernel = None;
        o.targets.as_mut().unwrap().unreadable = 1;
        assert_eq!(
            Cost::of(&profile, &o).line(&profile.meta.events),
            "spanprof overhead while sampling: 100.0 µs of its own CPU per sample (15 samples, 4 \
             lost); 1.5 ms in all, 1.67% of the targets' 0.09 s of CPU (from /proc; 1 process \
             gone before it could be read) (in-kernel time not counted: the kernel counts it \
             for CAP_SYS_ADMIN, or with sysctl kernel.bpf_stats_enabled=1)"
        );
        // A memory profile has no CPU time of its targets to compare with.
        let memory = Cost::of(&fixture::memory(), &o);
        assert_eq!(memory.target_cpu_ns, None);
        assert_eq!(memory.share(), None);
    }

    /// Issue 18: with off-CPU events, lost records are no CPU time (the kernel counts the
    /// lost records of every kind together).
    #[test]
    fn lost_off_cpu_records_are_not_cpu_time() {
        let profile = fixture::off_cpu();
        assert_eq!(
            (profile.total_samples(), profile.meta.lost_samples),
            (11, 4)
        );
        let mut o = Overhead {
            sampling: Duration::from_micros(2100),
            kernel: Some(crate::bpf::KernelTime {
                total_ns: 900_000,
                ..Default::default()
            }),
            // 11 on-CPU samples and 5 off-CPU intervals read.
            records: 16,
            targets: None,
            ..Default::default()
        };
        let cost = Cost::of(&profile, &o);
        // Every record counts as a sample (a program run each), the lost ones too.
        assert_eq!(cost.samples, 20);
        assert_eq!(cost.kernel_per_sample(), Some(45_000.0));
        assert_eq!(cost.own_per_sample(), Some(105_000.0));
        // Without /proc: the 11 on-CPU samples kept, not the lost records.
        assert_eq!(cost.target_cpu_ns, Some(110_000_000));
        assert_eq!(cost.share(), Some(3_000_000.0 / 110_000_000.0));
        // With /proc: its figure, whatever was lost.
        o.targets = Some(crate::target_cpu::Measured {
            ns: 300_000_000,
            processes: 1,
            unreadable: 0,
        });
        let cost = Cost::of(&profile, &o);
        assert_eq!(cost.share(), Some(0.01));
        assert_eq!(
            cost.line(&profile.meta.events),
            "spanprof overhead while sampling: 45.0 µs in the kernel and 105.0 µs of its own CPU \
             per sample (20 on-CPU and off-CPU samples, 4 lost); 0.9 ms and 2.1 ms in all, \
             1.00% of the targets' 0.30 s of CPU (from /proc)"
        );
        // Off-CPU alone: a share of the targets' CPU from /proc, none without it.
        let mut only = profile.clone();
        only.meta.events.cpu = false;
        assert!(Cost::of(&only, &o)
            .line(&only.meta.events)
            .contains("(20 off-CPU samples, 4 lost)"));
        o.targets = None;
        for s in &mut only.samples {
            s.count = 0;
        }
        assert_eq!(Cost::of(&only, &o).share(), None);
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
