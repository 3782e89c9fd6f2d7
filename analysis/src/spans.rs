//! The sampled time of each span name: the time its spans' own samples stand for.

use std::collections::HashMap;

use crate::profile::Profile;

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

/// Sampling periods a span must take on average for its mean to be a time: a span gets whole
/// samples (or none, and is then not counted), so spans a period or two long read as a period
/// or two whatever they take (spans of 3.5 ms at 99 Hz read 11-12 ms).
pub const MIN_PERIODS_PER_SPAN: u64 = 5;

impl SpanTime {
    /// Mean nanoseconds per span.
    pub fn mean_ns(&self) -> u64 {
        self.total_ns / self.spans.max(1)
    }

    /// Whether the mean is a time at this sampling period ([`MIN_PERIODS_PER_SPAN`]); a period
    /// of 0 ([`count_period`] of a profile whose weights are nanoseconds) times every mean.
    pub fn timed(&self, period_ns: u64) -> bool {
        self.mean_ns() >= MIN_PERIODS_PER_SPAN.saturating_mul(period_ns)
    }

    /// The mean in samples per span, at this period.
    pub fn periods(&self, period_ns: u64) -> f64 {
        self.mean_ns() as f64 / period_ns.max(1) as f64
    }
}

/// The period a span's samples are counted in, for [`SpanTime::timed`]: an on-CPU profile's
/// (a sample counts whole periods); 0 when the weights are nanoseconds (`offcpu`, `wall`: a
/// blocked interval weighs its own length, or is sampled without bias).
pub fn count_period(profile: &Profile) -> u64 {
    if profile.meta.events.in_nanoseconds() {
        0
    } else {
        profile.meta.period_ns()
    }
}

/// The highest rate `spanprof profile -F` takes.
const MAX_RATE: u64 = 10_000;

/// The sampling rate that times spans of `ns` nanoseconds ([`MIN_PERIODS_PER_SPAN`] samples a
/// span), in Hz, rounded up to a round figure; at most 10,000 (spans shorter than 0.5 ms
/// cannot be timed at any rate spanprof samples at).
pub fn rate_for(ns: u64) -> u64 {
    let hz = (MIN_PERIODS_PER_SPAN as f64 * 1e9 / ns.max(1) as f64).ceil() as u64;
    if hz >= MAX_RATE {
        return MAX_RATE;
    }
    // 1, 2 or 5 times a power of ten, as a user would type it.
    let mut step = 1u64;
    loop {
        for m in [1, 2, 5] {
            if m * step >= hz {
                return m * step;
            }
        }
        step = step.saturating_mul(10);
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
