//! `--span`, `--trace-id`, `--span-id`, `--osprofiler-id`, `--event` and `--thread` of
//! `report`, `diff` and `check`: [`Filter`] keeps the samples of one trace or span (by id or
//! span name glob), one measure ([`EventFilter`]) or some threads
//! ([`Profile::retain_samples`]), of a profile read back by [`spanprof_profile::format`].

use std::fmt;

use crate::profile::{hex, uuid, Profile, SpanContext, Thread};

/// `--event` of `report`, `diff` and `check`: which of a profile's measures to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFilter {
    /// On-CPU samples only (of a `cpu,offcpu` or `wall` profile: then weighed in samples).
    Cpu,
    /// Off-CPU samples only.
    OffCpu,
    /// The allocations of an `alloc,heap` profile (weighed in bytes allocated).
    Alloc,
    /// The memory in use at the end of an `alloc,heap` profile.
    Heap,
}

impl EventFilter {
    /// Parses `cpu`, `offcpu`, `alloc` or `heap`.
    pub fn from_name(name: &str) -> Option<EventFilter> {
        Some(match name {
            "cpu" => EventFilter::Cpu,
            "offcpu" | "off-cpu" => EventFilter::OffCpu,
            "alloc" => EventFilter::Alloc,
            "heap" => EventFilter::Heap,
            _ => return None,
        })
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            EventFilter::Cpu => "cpu",
            EventFilter::OffCpu => "offcpu",
            EventFilter::Alloc => "alloc",
            EventFilter::Heap => "heap",
        }
    }

    /// Keeps that measure of `profile`; an error when the profile does not have it.
    fn apply(self, profile: &mut Profile) -> Result<(), String> {
        let e = &mut profile.meta.events;
        let has = match self {
            EventFilter::Cpu => e.cpu,
            EventFilter::OffCpu => e.off_cpu,
            EventFilter::Alloc => e.alloc,
            EventFilter::Heap => e.heap,
        };
        if !has {
            return Err(format!(
                "--event {}: the profile has no such samples (it was profiled with --event {})",
                self.name(),
                crate::event_names(profile).join(",")
            ));
        }
        match self {
            EventFilter::Cpu => {
                (e.off_cpu, e.wall) = (false, false);
                profile.retain_samples(|_, s| s.off_cpu.is_none());
            }
            EventFilter::OffCpu => {
                (e.cpu, e.wall) = (false, false);
                profile.retain_samples(|_, s| s.off_cpu.is_some());
            }
            EventFilter::Alloc => {
                e.heap = false;
                profile.retain_samples(|_, s| !s.alloc.is_empty());
            }
            EventFilter::Heap => {
                e.alloc = false;
                profile.retain_samples(|_, s| !s.inuse.is_empty());
            }
        }
        Ok(())
    }
}

/// Which samples `spanprof report` keeps: those of the threads and measure asked for, whose
/// span context has every id given and a name matching one of the `--span` globs (if any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// `--event`: one measure of the profile.
    pub event: Option<EventFilter>,
    /// `--thread`: thread names or ids; a sample of any of them is kept.
    pub threads: Vec<String>,
    /// `--trace-id`: the OpenTelemetry trace id.
    pub trace_id: Option<[u8; 16]>,
    /// `--span-id`: the OpenTelemetry span id.
    pub span_id: Option<[u8; 8]>,
    /// `--base-id`: the OSProfiler base id (the whole request).
    pub base_id: Option<[u8; 16]>,
    /// `--osprofiler-id`: the OSProfiler trace point the thread was in (not its parents).
    pub osprofiler_id: Option<[u8; 16]>,
    /// `--span`: globs of span names (OpenTelemetry) or trace point names (OSProfiler); a
    /// sample in a span of any of them is kept.
    pub span_names: Vec<crate::Pattern>,
}

impl Filter {
    /// True when no id is asked for: every sample is kept.
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    /// Whether the filter keeps every sample whatever its span (no id asked for).
    fn no_ids(&self) -> bool {
        self.span_names.is_empty()
            && self.trace_id.is_none()
            && self.span_id.is_none()
            && self.base_id.is_none()
            && self.osprofiler_id.is_none()
    }

    /// Whether a sample of `thread` passes `--thread`.
    pub fn matches_thread(&self, thread: &Thread) -> bool {
        self.threads.is_empty()
            || self
                .threads
                .iter()
                .any(|t| *t == thread.name || t.parse() == Ok(thread.tid))
    }

    /// Whether a sample in `span` (`None`: in no span) passes every id given.
    pub fn matches(&self, span: Option<&SpanContext>) -> bool {
        if self.no_ids() {
            return true;
        }
        let Some(span) = span else {
            return false;
        };
        let osp = span.osprofiler.as_ref();
        let named = self.span_names.is_empty()
            || [span.span_name, span.osprofiler_name]
                .iter()
                .flatten()
                .any(|n| self.span_names.iter().any(|p| p.matches(n.as_str())));
        // The ids a tracing backend shows: with no OpenTelemetry ids, those OSProfiler's OTLP
        // driver exports the point under (SpanContext::trace_link).
        let derived = osp
            .filter(|_| span.trace_id.is_none() && span.span_id.is_none())
            .and_then(|o| o.otel_ids());
        let trace_id = span.trace_id.or(derived.map(|d| d.0));
        let span_id = span.span_id.or(derived.map(|d| d.1));
        named
            && self.trace_id.is_none_or(|t| trace_id == Some(t))
            && self.span_id.is_none_or(|s| span_id == Some(s))
            && self
                .base_id
                .is_none_or(|b| osp.is_some_and(|o| o.base_id == b))
            && self
                .osprofiler_id
                .is_none_or(|t| osp.is_some_and(|o| o.trace_id == t))
    }

    /// Keeps the samples of `profile` that match, and the tables they use; an error when
    /// `--event` asks for a measure the profile does not have.
    pub fn apply(&self, profile: &mut Profile) -> Result<(), String> {
        if let Some(event) = self.event {
            event.apply(profile)?;
        }
        profile.retain_samples(|p, s| {
            self.matches(p.span_of(s)) && self.matches_thread(&p.threads[s.thread as usize])
        });
        Ok(())
    }
}

/// The filter as options, e.g. `--trace-id 4bf9… --span-id 00f0…`.
impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(e) = self.event {
            parts.push(format!("--event {}", e.name()));
        }
        for t in &self.threads {
            parts.push(format!("--thread {t}"));
        }
        for n in &self.span_names {
            parts.push(format!("--span '{n}'"));
        }
        if let Some(t) = &self.trace_id {
            parts.push(format!("--trace-id {}", hex(t)));
        }
        if let Some(s) = &self.span_id {
            parts.push(format!("--span-id {}", hex(s)));
        }
        if let Some(b) = &self.base_id {
            parts.push(format!("--base-id {}", uuid(b)));
        }
        if let Some(o) = &self.osprofiler_id {
            parts.push(format!("--osprofiler-id {}", uuid(o)));
        }
        f.write_str(&parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::pprof::read_pprof;
    use crate::format::{self, fixture, Format};
    use crate::profile::{parse_hex, parse_uuid, Memory};

    fn folded(profile: &Profile) -> String {
        String::from_utf8(format::render(profile, Format::Folded).unwrap()).unwrap()
    }

    fn round_trip(profile: &Profile) -> Profile {
        read_pprof(&format::render(profile, Format::Pprof).unwrap()).unwrap()
    }

    #[test]
    fn filters_keep_memory_samples() {
        let span = Filter {
            span_id: parse_hex("00f067aa0ba902b7"),
            ..Filter::default()
        };
        let mut kept = round_trip(&fixture::memory());
        span.apply(&mut kept).unwrap();
        assert_eq!(folded(&kept), "main;compute 800000000\n");
        assert_eq!(
            kept.samples[0].alloc,
            Memory {
                objects: 34_000,
                bytes: 1_200_000_000
            }
        );
        // OSProfiler base: span 1 (nothing in use, not in the file) and span 2.
        let base = Filter {
            base_id: Some(fixture::BASE),
            ..Filter::default()
        };
        let mut heap = round_trip(&fixture::heap_only());
        base.apply(&mut heap).unwrap();
        assert_eq!(folded(&heap), "main;compute;do_syscall_64_[k] 20000000\n");
        let mut alloc = round_trip(&fixture::alloc_only());
        base.apply(&mut alloc).unwrap();
        assert_eq!(
            folded(&alloc),
            "main;compute 50000000\nmain;compute;do_syscall_64_[k] 30000000\n"
        );
    }

    #[test]
    fn filters_keep_off_cpu_samples() {
        let back = round_trip(&fixture::off_cpu());
        let span = Filter {
            span_id: parse_hex("00f067aa0ba902b7"),
            ..Filter::default()
        };
        let mut kept = back.clone();
        span.apply(&mut kept).unwrap();
        // Span 0: 5 samples on CPU, 30 ms on a lock.
        assert_eq!(
            folded(&kept),
            "[off-cpu: lock];main;compute;do_syscall_64_[k] 30000000\nmain;compute 50000000\n"
        );
        let mut only = round_trip(&fixture::off_cpu_only());
        let base = Filter {
            base_id: Some(fixture::BASE),
            ..Filter::default()
        };
        base.apply(&mut only).unwrap();
        assert_eq!(folded(&only), "[off-cpu: lock];main;compute 15500000\n");
        assert_eq!(only.total_samples(), 0);
    }

    #[test]
    fn event_and_thread_filters() {
        let both = fixture::off_cpu();
        let only = |event, threads: &[&str]| {
            let mut p = both.clone();
            Filter {
                event,
                threads: threads.iter().map(|t| t.to_string()).collect(),
                ..Filter::default()
            }
            .apply(&mut p)
            .map(|()| p)
        };
        let cpu = only(Some(EventFilter::Cpu), &[]).unwrap();
        assert!(!cpu.meta.events.off_cpu && cpu.meta.events.cpu);
        assert_eq!(
            crate::wording::total_weight(&cpu),
            11,
            "weighed in samples again"
        );
        assert!(cpu.samples.iter().all(|s| s.off_cpu.is_none()));
        let off = only(Some(EventFilter::OffCpu), &[]).unwrap();
        assert!(!off.meta.events.cpu && off.samples.iter().all(|s| s.off_cpu.is_some()));
        assert_eq!(off.total_off_cpu_ns(), both.total_off_cpu_ns());
        let err = only(Some(EventFilter::Heap), &[]).unwrap_err();
        assert!(
            err.contains("no such samples (it was profiled with --event cpu,offcpu)"),
            "{err}"
        );
        // Threads by name or id.
        let names: Vec<String> = both.threads.iter().map(|t| t.name.clone()).collect();
        let one = only(None, &[&names[0]]).unwrap();
        assert_eq!(one.threads, [both.threads[0].clone()]);
        let by_tid = only(None, &[&both.threads[1].tid.to_string()]).unwrap();
        assert_eq!(by_tid.threads, [both.threads[1].clone()]);
        assert!(only(None, &["no-such-thread"]).unwrap().samples.is_empty());
        let f = Filter {
            event: Some(EventFilter::Cpu),
            threads: vec!["worker".to_string()],
            ..Filter::default()
        };
        assert_eq!(f.to_string(), "--event cpu --thread worker");
        // Memory: one of the two measures.
        let mut mem = fixture::memory();
        Filter {
            event: Some(EventFilter::Alloc),
            ..Filter::default()
        }
        .apply(&mut mem)
        .unwrap();
        assert!(mem.meta.events.alloc && !mem.meta.events.heap);
    }

    #[test]
    fn filters() {
        let profile = fixture::with_spans();
        let kept = |f: &Filter| {
            let mut p = profile.clone();
            f.apply(&mut p).unwrap();
            (p.total_samples(), p.spans.len(), p.threads.len())
        };
        assert_eq!(kept(&Filter::default()), (11, 3, 2));
        // By name: one span each; a glob over both kinds of name.
        let by_name = |globs: &[&str]| Filter {
            span_names: globs.iter().map(|g| crate::Pattern::new(g)).collect(),
            ..Filter::default()
        };
        assert_eq!(kept(&by_name(&[fixture::SPAN_NAME])).1, 1);
        assert_eq!(kept(&by_name(&["wsgi", "db.*"])).1, 2);
        assert_eq!(kept(&by_name(&["*"])).1, 3);
        assert_eq!(kept(&by_name(&["nothing"])).0, 0);
        assert_eq!(by_name(&["GET *"]).to_string(), "--span 'GET *'");
        let trace = Filter {
            trace_id: Some(fixture::TRACE),
            ..Filter::default()
        };
        assert_eq!(kept(&trace), (7, 2, 1));
        let span = Filter {
            span_id: parse_hex("00F067AA0BA902B8"),
            ..trace.clone()
        };
        assert_eq!(kept(&span), (2, 1, 1));
        let base = Filter {
            base_id: Some(fixture::BASE),
            ..Filter::default()
        };
        assert_eq!(kept(&base), (5, 2, 2));
        let point = Filter {
            osprofiler_id: parse_uuid("22222222-2222-2222-2222-222222222222"),
            ..base.clone()
        };
        assert_eq!(kept(&point), (3, 1, 1));
        let none = Filter {
            span_id: parse_hex("00f067aa0ba902b7"),
            ..point.clone()
        };
        assert_eq!(kept(&none), (0, 0, 0));
        assert_eq!(
            none.to_string(),
            "--span-id 00f067aa0ba902b7 --base-id 11111111-1111-1111-1111-111111111111 \
             --osprofiler-id 22222222-2222-2222-2222-222222222222"
        );
    }

    #[test]
    fn parses_ids() {
        assert_eq!(parse_hex::<2>("aB09"), Some([0xab, 0x09]));
        assert_eq!(parse_hex::<2>("ab0"), None);
        assert_eq!(parse_hex::<2>("+b09"), None);
        assert_eq!(parse_hex::<2>("ab09x"), None);
        let u = [0x12; 16];
        assert_eq!(parse_uuid("12121212-1212-1212-1212-121212121212"), Some(u));
        assert_eq!(parse_uuid("12121212121212121212121212121212"), Some(u));
        assert_eq!(parse_uuid("1212121-21212-1212-1212-121212121212"), None);
        assert_eq!(parse_uuid("12121212-1212-1212-1212-12121212121"), None);
    }
}
