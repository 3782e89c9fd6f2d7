//! One run of a gated target under each profiler: spanprof (its summary's sample, own-CPU and
//! `spans:` lines and its sampling program's in-kernel counters), `perf record` and
//! `py-spy record`.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::measure::{
    folded_stacks, wait_ready, wait_usage, BpfWindow, SamplingProg, Target, TargetRun, Usage, HZ,
};

/// The counts of the summary's `spans:` line.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SpanCounts {
    /// Samples with an OpenTelemetry span.
    pub(super) otel: u64,
    /// Samples in an OSProfiler trace.
    pub(super) osp: u64,
    /// Samples whose span context was read from the thread context the process publishes.
    pub(super) published: u64,
}

/// "spans: 1234 of 2000 samples in 12 OpenTelemetry spans (3 traces), 0 in OSProfiler traces"
/// (or "…, 5 in 1 OSProfiler trace (2 trace points)"), with
/// "; N read from the thread context the process publishes" at the end when N > 0.
fn parse_spans_line(line: &str) -> Option<SpanCounts> {
    const PUBLISHED: &str = " read from the thread context the process publishes";
    let line = line.strip_prefix("spans: ")?;
    let (line, published) = match line.strip_suffix(PUBLISHED) {
        Some(rest) => {
            let (rest, n) = rest.rsplit_once("; ")?;
            (rest, n.parse().ok()?)
        }
        None => (line, 0),
    };
    let (otel, rest) = line.split_once(" of ")?;
    let (_, osp) = rest.rsplit_once(", ")?;
    Some(SpanCounts {
        otel: otel.parse().ok()?,
        osp: osp.split_once(" in ")?.0.parse().ok()?,
        published,
    })
}

/// One run of the target under spanprof.
#[derive(Debug, Default)]
pub(super) struct SpanprofRun {
    pub(super) target: TargetRun,
    pub(super) own: Usage,
    pub(super) samples: u64,
    /// Samples lost (the ring buffer was full), from the summary.
    pub(super) lost: u64,
    /// spanprof's own figure: CPU per sample in its sampling loop (no setup, no symbolization).
    pub(super) loop_us: f64,
    /// spanprof's own figure: CPU before its first sample (loading, attaching), in ms.
    pub(super) setup_ms: f64,
    /// Instructions the verifier checked in the sampling program (`on_cpu_sample`).
    pub(super) verified_insns: Option<u64>,
    pub(super) bpf: Option<BpfWindow>,
    /// The summary's `spans:` line, which spanprof prints only when some sample has a span.
    pub(super) spans: Option<SpanCounts>,
}

pub(super) fn run_spanprof(
    spanprof: &Path,
    target: &Target,
    amount: u64,
    hz: u32,
    extra: &[&str],
    out: &Path,
) -> Result<SpanprofRun> {
    let mut t = target.start(amount)?;
    let mut prof = Command::new(spanprof)
        .args([
            "profile",
            "--frequency",
            &hz.to_string(),
            "--pid",
            &t.pid.to_string(),
        ])
        .args(extra)
        .arg("-o")
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start spanprof")?;
    let mut err = wait_ready(prof.stderr.take().expect("piped"), "spanprof: profiling")?;
    // The in-kernel counters: an interval without target samples, then the target's run.
    let prog = SamplingProg::of(prof.id());
    let stats = || prog.as_ref().and_then(SamplingProg::stats);
    let verified_insns = prog.as_ref().and_then(SamplingProg::verified_insns);
    let idle_start = stats();
    std::thread::sleep(Duration::from_secs(1));
    let window_start = stats();
    let released = t.release()?;
    let target = t.wait(released);
    let window_end = stats();
    let mut rest = String::new();
    err.read_to_string(&mut rest)?;
    let (status, own) = wait_usage(&mut prof)?;
    let target = target?;
    if status != 0 {
        bail!("spanprof failed (status {status}):\n{rest}");
    }
    // "spanprof: 520 samples, 0 lost, from 1 process in 5.3 s at 99 Hz: pid …"
    let (samples, lost) = rest
        .lines()
        .find_map(|l| {
            let (n, tail) = l.strip_prefix("spanprof: ")?.split_once(" samples, ")?;
            let lost = tail.split_once(" lost")?.0;
            Some((n.parse::<u64>().ok()?, lost.parse::<u64>().ok()?))
        })
        .with_context(|| format!("spanprof printed no sample count:\n{rest}"))?;
    // "spanprof own CPU: 48.5 ms setup, 16.6 µs per sample while sampling (8.1 ms), …"
    let loop_us = rest
        .lines()
        .find_map(|l| {
            l.strip_prefix("spanprof own CPU: ")?
                .split(" setup, ")
                .nth(1)?
                .split(" µs per sample")
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| format!("spanprof printed no own-CPU line:\n{rest}"))?;
    let setup_ms = rest
        .lines()
        .find_map(|l| {
            l.strip_prefix("spanprof own CPU: ")?
                .split(" ms setup")
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| format!("spanprof printed no setup figure:\n{rest}"))?;
    let spans = rest.lines().find_map(parse_spans_line);
    let bpf = match (idle_start, window_start, window_end) {
        (Some(a), Some(b), Some(c)) => Some(BpfWindow {
            idle_ns: b.0 - a.0,
            idle_runs: b.1 - a.1,
            ns: c.0 - b.0,
            runs: c.1 - b.1,
            target_samples: samples + lost,
        }),
        _ => None,
    };
    Ok(SpanprofRun {
        target,
        own,
        samples,
        lost,
        loop_us,
        setup_ms,
        verified_insns,
        bpf,
        spans,
    })
}

/// One run of the target under perf record or py-spy record.
#[derive(Debug, Default)]
pub(super) struct OtherRun {
    pub(super) target: TargetRun,
    pub(super) own: Usage,
    pub(super) samples: u64,
}

/// `perf record CALL_GRAPH -F HZ -e cpu-clock -p PID -o OUT`; `call_graph` is `-g` (frame
/// pointers) or `--call-graph dwarf`.
pub(super) fn run_perf(
    target: &Target,
    amount: u64,
    hz: u32,
    call_graph: &[&str],
    out: &Path,
) -> Result<OtherRun> {
    let mut t = target.start(amount)?;
    let mut perf = Command::new("perf")
        .arg("record")
        .args(call_graph)
        .args([
            "-F",
            &hz.to_string(),
            "-e",
            "cpu-clock",
            "-p",
            &t.pid.to_string(),
            "-o",
        ])
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start perf (Debian package linux-perf)")?;
    // perf prints nothing when it is attached; give it time, as a user would.
    std::thread::sleep(Duration::from_millis(500));
    let released = t.release()?;
    let target = t.wait(released)?;
    let mut text = String::new();
    perf.stderr
        .take()
        .expect("piped")
        .read_to_string(&mut text)?;
    let (_, own) = wait_usage(&mut perf)?;
    // "[ perf record: Captured and wrote 0.052 MB perf.data (198 samples) ]"
    let samples = text
        .rsplit_once(" samples)")
        .and_then(|(head, _)| head.rsplit_once('(')?.1.trim().parse().ok())
        .with_context(|| format!("perf printed no sample count:\n{text}"))?;
    Ok(OtherRun {
        target,
        own,
        samples,
    })
}

/// py-spy in its default mode: it pauses the target for each sample, so the stack it reads is
/// consistent (spanprof reads the stack while the thread is stopped in the kernel).
pub(super) fn run_pyspy(
    py_spy: &Path,
    target: &Target,
    amount: u64,
    out: &Path,
) -> Result<OtherRun> {
    let mut t = target.start(amount)?;
    let mut prof = Command::new(py_spy)
        .args([
            "record",
            "--pid",
            &t.pid.to_string(),
            "--rate",
            &HZ.to_string(),
            "--format",
            "raw",
            "-o",
        ])
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {}", py_spy.display()))?;
    // "py-spy> Sampling process 99 times a second. Press Control-C to exit."
    let ready = wait_ready(prof.stdout.take().expect("piped"), "py-spy> Sampling");
    let mut stdout = match ready {
        Ok(r) => r,
        Err(e) => {
            let mut text = String::new();
            let _ = prof.stderr.take().expect("piped").read_to_string(&mut text);
            let _ = wait_usage(&mut prof);
            let _ = t.child.kill();
            let _ = t.child.wait();
            return Err(e).context(format!("py-spy did not attach:\n{text}"));
        }
    };
    let released = t.release()?;
    let target = t.wait(released);
    let mut text = String::new();
    stdout.read_to_string(&mut text)?;
    prof.stderr
        .take()
        .expect("piped")
        .read_to_string(&mut text)?;
    let (status, own) = wait_usage(&mut prof)?;
    let target = target?;
    if status != 0 {
        bail!("py-spy failed (status {status}):\n{text}");
    }
    let folded = std::fs::read_to_string(out)
        .with_context(|| format!("py-spy wrote no {}:\n{text}", out.display()))?;
    let samples = folded_stacks(&folded).map(|(_, n)| n).sum();
    Ok(OtherRun {
        target,
        own,
        samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_line_counts() {
        let c = parse_spans_line(
            "spans: 131 of 153 samples in 1 OpenTelemetry span (1 trace), 0 in OSProfiler traces",
        )
        .unwrap();
        assert_eq!((c.otel, c.osp), (131, 0));
        let c = parse_spans_line(
            "spans: 0 of 176 samples in 0 OpenTelemetry spans (0 traces), 131 in 1 OSProfiler \
             trace (1 trace point)",
        )
        .unwrap();
        assert_eq!((c.otel, c.osp, c.published), (0, 131, 0));
        let c = parse_spans_line(
            "spans: 700 of 705 samples in 1 OpenTelemetry span (1 trace), 700 in 1 OSProfiler \
             trace (1 trace point); 695 read from the thread context the process publishes",
        )
        .unwrap();
        assert_eq!((c.otel, c.osp, c.published), (700, 700, 695));
        assert!(parse_spans_line("spanprof: 176 samples, 0 lost").is_none());
    }
}
