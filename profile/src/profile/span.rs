//! Span contexts: the tracing ids and names a sample was taken in (OpenTelemetry, OSProfiler),
//! their text forms and labels, and the trace link an OSProfiler point's ids give.

/// The tracing context a sample was taken in, read from the thread while it was stopped.
///
/// Ids are kept as bytes in wire order (big-endian, as W3C trace context and OTLP carry them);
/// the `*_hex`/`uuid` helpers give the text forms the outputs use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanContext {
    /// OpenTelemetry trace id.
    pub trace_id: Option<[u8; 16]>,
    /// OpenTelemetry span id.
    pub span_id: Option<[u8; 8]>,
    /// The OSProfiler trace the thread was in.
    pub osprofiler: Option<OsProfilerIds>,
    /// The OpenTelemetry span's name (SDK spans only; not from a published thread context).
    pub span_name: Option<SpanName>,
    /// The name of the current OSProfiler trace point (what `profiler.start(name)` was given).
    pub osprofiler_name: Option<SpanName>,
}

/// Bytes of a [`SpanName`] at most: what the kernel reads of a name
/// ([`profiler_common::SPAN_NAME_MAX`]).
pub const SPAN_NAME_MAX: usize = profiler_common::SPAN_NAME_MAX;

/// A span or trace point name, inline: at most [`SPAN_NAME_MAX`] bytes of UTF-8, so that a
/// [`SpanContext`] stays `Copy` and interning one per sample allocates nothing.
///
/// A name from the kernel is ASCII; a longer one was cut to its first [`SPAN_NAME_MAX`] bytes
/// there, and one that was not ASCII was dropped. A name read back from a file is cut the same
/// way (at a character boundary), so a round trip keeps what spanprof wrote.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanName {
    /// The name, then zeros: equal names are equal arrays, so `Eq` and `Hash` can be derived.
    bytes: [u8; SPAN_NAME_MAX],
    len: u8,
}

impl SpanName {
    /// A name as the kernel read it: 1 to [`SPAN_NAME_MAX`] ASCII bytes, else none (a byte
    /// of 0x80 or more means the str changed under the read: garbage).
    pub fn from_ascii(bytes: &[u8]) -> Option<Self> {
        if bytes.is_empty() || bytes.len() > SPAN_NAME_MAX || !bytes.is_ascii() {
            return None;
        }
        Some(Self::from_valid(bytes))
    }

    /// A name from text, cut to at most [`SPAN_NAME_MAX`] bytes at a character boundary; none
    /// when empty.
    pub fn new(text: &str) -> Option<Self> {
        let mut end = text.len().min(SPAN_NAME_MAX);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        (end > 0).then(|| Self::from_valid(&text.as_bytes()[..end]))
    }

    /// `bytes`: valid UTF-8 of 1 to [`SPAN_NAME_MAX`] bytes.
    fn from_valid(bytes: &[u8]) -> Self {
        let mut name = Self {
            bytes: [0; SPAN_NAME_MAX],
            len: bytes.len() as u8,
        };
        name.bytes[..bytes.len()].copy_from_slice(bytes);
        name
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Only valid UTF-8 is ever stored.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::fmt::Debug for SpanName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for SpanName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialOrd for SpanName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// By text, as a `String` would sort.
impl Ord for SpanName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

/// OSProfiler's ids of a thread: `profiler.get_base_id()`, `get_id()` and `get_parent_id()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OsProfilerIds {
    /// The whole trace (the request): the first id of the trace stack.
    pub base_id: [u8; 16],
    /// The current trace point: the last id of the trace stack.
    pub trace_id: [u8; 16],
    /// The trace point the current one is nested in (the one before it), if any.
    pub parent_id: Option<[u8; 16]>,
}

impl OsProfilerIds {
    /// The OpenTelemetry ids OSProfiler's OTLP driver (`osprofiler.drivers.otlp`) exports the
    /// current trace point under: the base id's 128 bits as the trace id, the low 64 bits of
    /// the point's id as the span id (`_utils.uuid_to_int128`, `_utils.shorten_id`), both
    /// big-endian as OpenTelemetry writes ids, so the UUIDs' own bytes. Before the request's
    /// first point the current id is the parent the request came with (a point of the caller,
    /// exported by it), or with none the base id itself, which is no span: then None.
    pub fn otel_ids(&self) -> Option<([u8; 16], [u8; 8])> {
        if self.trace_id == self.base_id {
            return None;
        }
        let mut span_id = [0; 8];
        span_id.copy_from_slice(&self.trace_id[8..]);
        Some((self.base_id, span_id))
    }
}

/// The OpenTelemetry span a sample is linked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceLink {
    /// The trace, 16 bytes.
    pub trace_id: [u8; 16],
    /// The span, 8 bytes.
    pub span_id: [u8; 8],
    /// The ids are not an OpenTelemetry span's that was read but those OSProfiler's OTLP driver
    /// gives the OSProfiler point the sample ran in ([`OsProfilerIds::otel_ids`]).
    pub from_osprofiler: bool,
}

/// Lower-case hex of bytes, as trace and span ids are written.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A UUID in its canonical 8-4-4-4-12 form, as OSProfiler writes ids.
pub fn uuid(bytes: &[u8; 16]) -> String {
    let h = hex(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Label keys of span contexts in pprof (and the names of `spanprof report` filters).
pub mod labels {
    /// OpenTelemetry trace id, 32 hex digits.
    pub const TRACE_ID: &str = "trace_id";
    /// OpenTelemetry span id, 16 hex digits.
    pub const SPAN_ID: &str = "span_id";
    /// OSProfiler base id (the request's trace), a UUID.
    pub const OSP_BASE_ID: &str = "osprofiler.base_id";
    /// OSProfiler current trace point id, a UUID.
    pub const OSP_TRACE_ID: &str = "osprofiler.trace_id";
    /// OSProfiler parent trace point id, a UUID.
    pub const OSP_PARENT_ID: &str = "osprofiler.parent_id";
    /// OpenTelemetry span name (at most [`super::SPAN_NAME_MAX`] bytes).
    pub const SPAN_NAME: &str = "span.name";
    /// OSProfiler current trace point name (at most [`super::SPAN_NAME_MAX`] bytes).
    pub const OSP_NAME: &str = "osprofiler.name";
    /// `osprofiler` when [`TRACE_ID`] and [`SPAN_ID`] were not read from an OpenTelemetry
    /// span but derived from the OSProfiler point (see [`super::TraceLink`]).
    pub const IDS_FROM: &str = "span.ids_from";
    /// The value of [`IDS_FROM`].
    pub const IDS_FROM_OSPROFILER: &str = "osprofiler";
}

impl SpanContext {
    /// True when nothing is known: no id, no name.
    pub fn is_empty(&self) -> bool {
        self.trace_id.is_none()
            && self.span_id.is_none()
            && self.osprofiler.is_none()
            && self.span_name.is_none()
            && self.osprofiler_name.is_none()
    }

    /// The OpenTelemetry span to link the sample to: the one read, or with none read, the
    /// span OSProfiler's OTLP driver exports for the current OSProfiler point (OpenStack
    /// services export their trace points that way), so a tracing backend finds the profile
    /// of a request traced by either. None without both ids, or with an all-zero one.
    /// `derive = false` (`--drop-label` took an id or `span.ids_from`) gives none of the latter.
    pub fn trace_link(&self, derive: bool) -> Option<TraceLink> {
        let (trace_id, span_id, from_osprofiler) = match (self.trace_id, self.span_id) {
            (Some(t), Some(s)) => (t, s, false),
            (None, None) if derive => {
                let (t, s) = self.osprofiler?.otel_ids()?;
                (t, s, true)
            }
            _ => return None,
        };
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(TraceLink {
            trace_id,
            span_id,
            from_osprofiler,
        })
    }

    /// The (key, value) string labels of this context, in a fixed order (see [`labels`]): the
    /// OpenTelemetry ids, derived from OSProfiler's when none were read (then with
    /// [`labels::IDS_FROM`]; not with `derive = false`), the span name, the OSProfiler ids and
    /// point name.
    pub fn labels(&self, derive: bool) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(t) = &self.trace_id {
            out.push((labels::TRACE_ID, hex(t)));
        }
        if let Some(s) = &self.span_id {
            out.push((labels::SPAN_ID, hex(s)));
        }
        if let Some(link) = self.trace_link(derive).filter(|l| l.from_osprofiler) {
            out.push((labels::TRACE_ID, hex(&link.trace_id)));
            out.push((labels::SPAN_ID, hex(&link.span_id)));
            out.push((labels::IDS_FROM, labels::IDS_FROM_OSPROFILER.to_string()));
        }
        if let Some(n) = &self.span_name {
            out.push((labels::SPAN_NAME, n.as_str().to_string()));
        }
        if let Some(o) = &self.osprofiler {
            out.push((labels::OSP_BASE_ID, uuid(&o.base_id)));
            out.push((labels::OSP_TRACE_ID, uuid(&o.trace_id)));
            if let Some(p) = &o.parent_id {
                out.push((labels::OSP_PARENT_ID, uuid(p)));
            }
        }
        if let Some(n) = &self.osprofiler_name {
            out.push((labels::OSP_NAME, n.as_str().to_string()));
        }
        out
    }
}

/// Parses exactly `2 * N` hex digits (either case) into bytes.
pub fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Parses a UUID, `8-4-4-4-12` or 32 hex digits (either case).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let dashed = s.len() == 36
        && s.char_indices()
            .all(|(i, c)| matches!(i, 8 | 13 | 18 | 23) == (c == '-'));
    if dashed {
        parse_hex(&s.replace('-', ""))
    } else {
        parse_hex(s)
    }
}
