//! The writing side of a recording ([`Recorder`]); the format is in [`super`].

use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use profiler_common::{EVENT_ALLOC, EVENT_CPU, TASK_COMM_LEN};
use rustc_hash::FxHashMap;
use symbolizer::Symbol;

use super::codec::{Enc, StrTable};
use super::*;
use crate::assemble::{Facts, PythonFacts};
use crate::profile::{Meta, SpanContext};
use crate::resolve::{ProcessFacts, Resolved};
use crate::resource::ProcessInfo;

/// Writes a recording as the count stage is fed: samples, execs and process descriptions as
/// they come, the facts of assembly at the end ([`Recorder::finish`]).
pub struct Recorder {
    gz: GzEncoder<Vec<u8>>,
    enc: Enc,
    /// Uncompressed bytes written.
    written: u64,
    /// The recording passed [`MAX_UNCOMPRESSED`]: nothing more is written.
    overflow: bool,
    kernel: FxHashMap<Box<[u64]>, u32>,
    user: FxHashMap<Box<[u64]>, u32>,
    python: FxHashMap<Box<[u64]>, u32>,
    spans: FxHashMap<SpanContext, u32>,
    comms: FxHashMap<(u32, u32), [u8; TASK_COMM_LEN]>,
    thread_names: FxHashMap<(u32, u32), String>,
    last_time: u64,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("written", &self.written)
            .field("overflow", &self.overflow)
            .finish_non_exhaustive()
    }
}

/// Index of a stack in a table of the recorder, and whether it is new there.
fn intern(table: &mut FxHashMap<Box<[u64]>, u32>, stack: &[u64]) -> (u32, bool) {
    if let Some(&id) = table.get(stack) {
        return (id, false);
    }
    let id = table.len() as u32;
    table.insert(stack.into(), id);
    (id, true)
}

impl Recorder {
    /// A recording of a session whose count and assembly keep what `opts` says; its header
    /// is written now.
    pub fn new(opts: &Options) -> Recorder {
        let mut r = Recorder {
            gz: GzEncoder::new(Vec::new(), Compression::new(6)),
            enc: Enc::default(),
            written: 0,
            overflow: false,
            kernel: FxHashMap::default(),
            user: FxHashMap::default(),
            python: FxHashMap::default(),
            spans: FxHashMap::default(),
            comms: FxHashMap::default(),
            thread_names: FxHashMap::default(),
            last_time: 0,
        };
        // The empty stack is index 0 of every table, written nowhere.
        for table in [&mut r.kernel, &mut r.user, &mut r.python] {
            table.insert(Vec::new().into_boxed_slice(), 0);
        }
        let e = &mut r.enc;
        e.buf.extend_from_slice(MAGIC);
        e.var(u64::from(FORMAT_VERSION));
        e.str(env!("CARGO_PKG_VERSION"));
        e.u8(options_flags(opts));
        e.var(opts.alloc_rate);
        e.var(opts.max_keys as u64);
        e.var(opts.max_processes as u64);
        r.flush();
        r
    }

    /// Moves what was encoded into the compressed stream.
    fn flush(&mut self) {
        if self.overflow {
            self.enc.buf.clear();
            return;
        }
        self.written += self.enc.buf.len() as u64;
        // NB: writing into a Vec does not fail.
        if self.written > MAX_UNCOMPRESSED || self.gz.write_all(&self.enc.buf).is_err() {
            self.overflow = true;
        }
        self.enc.buf.clear();
    }

    /// One sample, as the count stage was given it.
    pub fn sample(&mut self, r: &Resolved<'_>) {
        // Past the limit nothing more is written: the tables stop growing too.
        if self.overflow {
            return;
        }
        let thread = (r.pid, r.tid);
        let mut flags = 0;
        let comm_changed = self.comms.get(&thread) != Some(&r.comm);
        if comm_changed {
            self.comms.insert(thread, r.comm);
            flags |= S_COMM;
        }
        let name = r
            .thread_name
            .filter(|name| self.thread_names.get(&thread).map(String::as_str) != Some(*name));
        if let Some(name) = name {
            self.thread_names.insert(thread, name.to_owned());
            flags |= S_THREAD_NAME;
        }
        let (kid, knew) = intern(&mut self.kernel, r.kernel);
        let (uid, unew) = intern(&mut self.user, r.user);
        let (pyid, pynew) = intern(&mut self.python, r.python);
        for (new, bit) in [
            (knew, S_KERNEL_NEW),
            (unew, S_USER_NEW),
            (pynew, S_PYTHON_NEW),
        ] {
            if new {
                flags |= bit;
            }
        }
        let span = (!r.span.is_empty()).then(|| {
            let next = self.spans.len() as u32;
            let id = *self.spans.entry(r.span).or_insert(next);
            (id, id == next)
        });
        if let Some((_, new)) = span {
            flags |= S_SPAN | if new { S_SPAN_NEW } else { 0 };
        }
        if r.event != EVENT_CPU {
            flags |= S_WEIGHT;
        }
        if r.event == EVENT_ALLOC {
            flags |= S_ALLOC_ID;
        }
        if r.off_cpu != 0 {
            flags |= S_OFF_CPU;
        }
        let e = &mut self.enc;
        e.u8(TAG_SAMPLE);
        e.var(flags);
        e.var(u64::from(r.pid));
        e.var(u64::from(r.tid));
        e.var(u64::from(r.event));
        e.signed(r.time_ns.wrapping_sub(self.last_time) as i64);
        self.last_time = r.time_ns;
        e.u8(r.python_flags);
        e.u8(unwind_code(r.unwind));
        if flags & S_COMM != 0 {
            e.bytes(profiler_common::comm_bytes(&r.comm));
        }
        if let Some(name) = name {
            e.str(name);
        }
        for (stack, id, new) in [(r.kernel, kid, knew), (r.user, uid, unew)] {
            if new {
                e.addrs(stack);
            } else {
                e.var(u64::from(id));
            }
        }
        if pynew {
            e.var(r.python.len() as u64);
            for &token in r.python {
                let (func, line, entry) = crate::python::split_token(token);
                e.var(u64::from(func));
                e.var(u64::from(line) << 1 | u64::from(entry));
            }
        } else {
            e.var(u64::from(pyid));
        }
        if let Some((id, new)) = span {
            if new {
                span_context(e, &r.span);
            } else {
                e.var(u64::from(id));
            }
        }
        if flags & S_WEIGHT != 0 {
            e.var(r.weight);
        }
        if flags & S_ALLOC_ID != 0 {
            e.var(r.alloc_id);
        }
        if flags & S_OFF_CPU != 0 {
            e.var(u64::from(r.off_cpu));
        }
        self.flush();
    }

    /// A process called execve.
    pub fn exec(&mut self, pid: u32, time_ns: u64) {
        self.enc.u8(TAG_EXEC);
        self.enc.var(u64::from(pid));
        self.enc.var(time_ns);
        self.flush();
    }

    /// What a process said about itself, as the count stage was given it.
    pub fn describe(&mut self, pid: u32, facts: &ProcessFacts) {
        let e = &mut self.enc;
        e.u8(TAG_DESCRIBE);
        e.var(u64::from(pid));
        e.opt_str(facts.name.as_deref());
        e.bool(facts.info.is_some());
        if let Some(info) = &facts.info {
            process_info(e, info);
        }
        self.flush();
    }

    /// The sampled allocations in use at the end, as (id, size).
    pub fn live(&mut self, live: &[(u64, u64)]) {
        self.enc.u8(TAG_LIVE);
        self.enc.var(live.len() as u64);
        for &(id, size) in live {
            self.enc.var(id);
            self.enc.var(size);
            if self.enc.buf.len() >= 1 << 16 {
                self.flush();
            }
        }
        self.flush();
    }

    /// The kernel's error counters at the end.
    pub fn errors(&mut self, errors: &[u64]) {
        self.enc.u8(TAG_ERRORS);
        self.enc.var(errors.len() as u64);
        for &n in errors {
            self.enc.var(n);
        }
        self.flush();
    }

    /// Writes the facts of assembly and ends the recording: its bytes (gzip), or why it
    /// could not be kept.
    pub fn finish(mut self, facts: &Facts<'_>) -> Result<Vec<u8>, String> {
        self.enc.u8(TAG_END);
        let mut strings = StrTable::default();
        for symbols in [&facts.user_symbols, &facts.kernel_symbols] {
            self.enc.var(symbols.len() as u64);
            for s in symbols.iter() {
                symbol(&mut self.enc, &mut strings, s);
                if self.enc.buf.len() >= 1 << 16 {
                    self.flush();
                }
            }
        }
        python_facts(&mut self.enc, &mut strings, &facts.python);
        self.enc.signed(facts.unix_offset_ns);
        meta(&mut self.enc, &facts.meta);
        self.enc.u8(TAG_TRAILER);
        self.flush();
        if self.overflow {
            return Err(format!(
                "the recording passed {} MiB (uncompressed), more than a replay reads: \
                 record a shorter session",
                MAX_UNCOMPRESSED >> 20
            ));
        }
        self.gz
            .finish()
            .map_err(|e| format!("cannot compress the recording: {e}"))
    }
}

fn span_context(e: &mut Enc, s: &SpanContext) {
    let mut f = 0u8;
    for (on, bit) in [
        (s.trace_id.is_some(), 1),
        (s.span_id.is_some(), 2),
        (s.osprofiler.is_some(), 4),
        (s.osprofiler.is_some_and(|o| o.parent_id.is_some()), 8),
        (s.span_name.is_some(), 16),
        (s.osprofiler_name.is_some(), 32),
    ] {
        if on {
            f |= bit;
        }
    }
    e.u8(f);
    if let Some(t) = &s.trace_id {
        e.buf.extend_from_slice(t);
    }
    if let Some(t) = &s.span_id {
        e.buf.extend_from_slice(t);
    }
    if let Some(o) = &s.osprofiler {
        e.buf.extend_from_slice(&o.base_id);
        e.buf.extend_from_slice(&o.trace_id);
        if let Some(p) = &o.parent_id {
            e.buf.extend_from_slice(p);
        }
    }
    for name in [&s.span_name, &s.osprofiler_name].into_iter().flatten() {
        e.str(name.as_str());
    }
}

fn process_info(e: &mut Enc, info: &ProcessInfo) {
    e.opt_str(info.exe_path.as_deref());
    e.opt_str(info.command_line.as_deref());
    e.opt_str(info.service_name.as_deref());
    e.var(info.env_attributes.len() as u64);
    for (k, v) in &info.env_attributes {
        e.str(k);
        e.str(v);
    }
    e.opt_str(info.container_id.as_deref());
    e.bool(info.runtime.is_some());
    if let Some((name, version)) = &info.runtime {
        e.str(name);
        e.str(version);
    }
}

fn symbol(e: &mut Enc, strings: &mut StrTable, s: &Symbol) {
    strings.put(e, s.function.as_deref());
    strings.put(e, s.module.as_deref());
    e.var(s.address);
    strings.put(e, s.file.as_deref());
    e.var(s.line.map_or(0, |l| u64::from(l) + 1));
    strings.put(e, s.unknown_reason.as_deref());
    // Since version 2.
    let inlined = &s.inlined[..s.inlined.len().min(symbolizer::MAX_INLINED)];
    e.var(inlined.len() as u64);
    for f in inlined {
        strings.put(e, f.function.as_deref());
        strings.put(e, f.file.as_deref());
        e.var(f.line.map_or(0, |l| u64::from(l) + 1));
    }
    // Since version 3: the module file's ids.
    let ids = s.ids.as_deref();
    strings.put(e, ids.and_then(|i| i.gnu.as_deref()));
    strings.put(e, ids.and_then(|i| i.htlhash.as_deref()));
}

fn python_facts(e: &mut Enc, strings: &mut StrTable, p: &PythonFacts<'_>) {
    e.var(p.functions.len() as u64);
    for f in p.functions.iter() {
        e.str(&f.name);
        strings.put(e, f.file.as_deref());
        // Since version 3.
        e.var(f.start_line.map_or(0, |l| u64::from(l) + 1));
    }
    e.var(p.merge.len() as u64);
    for (&pid, m) in &p.merge {
        e.var(u64::from(pid));
        e.bool(m.markers);
        e.bool(m.native_trusted);
        e.var(m.eval_ranges.len() as u64);
        for &(start, end) in &m.eval_ranges {
            e.var(start);
            e.var(end.wrapping_sub(start));
        }
        // Since version 4.
        e.opt_str(m.interpreter.as_deref());
    }
    e.var(p.versions.len() as u64);
    for (&pid, v) in &p.versions {
        e.var(u64::from(pid));
        e.str(v);
    }
    e.var(u64::from(p.found));
    e.var(p.notes.len() as u64);
    for n in &p.notes {
        e.str(n);
    }
    e.bool(p.spans_enabled);
    e.var(u64::from(p.with_spans));
}

fn meta(e: &mut Enc, m: &Meta) {
    e.str(&m.target);
    match m.start.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => {
            e.u8(0);
            e.var(d.as_secs());
            e.var(u64::from(d.subsec_nanos()));
        }
        Err(before) => {
            let d = before.duration();
            e.u8(1);
            e.var(d.as_secs());
            e.var(u64::from(d.subsec_nanos()));
        }
    }
    e.var(m.duration.as_secs());
    e.var(u64::from(m.duration.subsec_nanos()));
    e.var(m.frequency);
    let ev = &m.events;
    let mut f = 0u8;
    for (on, bit) in [
        (ev.cpu, 1),
        (ev.off_cpu, 2),
        (ev.wall, 4),
        (ev.alloc, 8),
        (ev.heap, 16),
    ] {
        if on {
            f |= bit;
        }
    }
    e.u8(f);
    e.var(ev.alloc_rate);
    e.var(m.lost_samples);
    e.bool(m.host.is_some());
    if let Some(h) = &m.host {
        e.str(&h.name);
        e.opt_str(h.id.as_deref());
    }
    e.opt_str(m.build.commit.as_deref());
    e.opt_str(m.build.branch.as_deref());
    e.var(m.dropped_labels.len() as u64);
    for l in &m.dropped_labels {
        e.str(l);
    }
}
