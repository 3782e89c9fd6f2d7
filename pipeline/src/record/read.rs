//! The reading side of a recording ([`Reader`]); the format is in [`super`].
//!
//! Every length is checked against what the format allows before anything is allocated for
//! it, stacks refer only to stacks read before, and the tables a recording builds are bounded
//! as a whole, so that a damaged or hostile file is an error, never a panic or a huge
//! allocation.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use profiler_common::{MAX_PY_FRAMES, MAX_STACK_DEPTH, SPAN_NAME_MAX, TASK_COMM_LEN};
use rustc_hash::FxHashMap;
use symbolizer::build_id::ModuleIds;
use symbolizer::{Inlined, Symbol};

use super::codec::{bad, Dec, Error, Result, StrList};
use super::*;
use crate::assemble::{MergeFacts, PythonFacts};
use crate::profile::{Build, Events, Meta, OsProfilerIds, SpanContext, SpanName};
use crate::python::{PyFunction, TOKEN_ENTRY};
use crate::resolve::{ProcessFacts, Resolved, PY_FLAGS};
use crate::resource::{HostInfo, ProcessInfo};

/// Words (addresses, tokens) of the distinct stacks of a recording, at most (512 MiB).
const MAX_TABLE_WORDS: usize = 1 << 26;
/// Distinct span contexts of a recording, at most.
const MAX_SPANS: usize = 1 << 22;
/// Items of a list of the facts (symbols, functions, live allocations), at most.
const MAX_ITEMS: usize = 1 << 26;
/// Functions inlined at the addresses of a recording, at most (each becomes a frame of every
/// stack through its address: a bound on what a hostile file makes assembly build).
const MAX_INLINED_TOTAL: usize = 1 << 18;
/// Small lists (notes, labels, resource attributes, eval ranges, error counters), at most.
const MAX_SMALL: usize = 4096;

/// What a recording's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The version of spanprof that wrote it.
    pub spanprof: String,
    /// What its counting and assembly kept.
    pub options: Options,
}

/// One event of a recording.
#[derive(Debug)]
pub enum Event<'a> {
    /// A sample, for the count stage.
    Sample(Resolved<'a>),
    /// A process called execve at a time.
    Exec(u32, u64),
    /// What a process said about itself.
    Describe(u32, ProcessFacts),
    /// The sampled allocations in use at the end, as (id, size).
    Live(Vec<(u64, u64)>),
    /// The kernel's error counters at the end.
    Errors(Vec<u64>),
    /// The end of the events: [`Reader::facts`] follow.
    End,
}

/// The facts of assembly a recording ends with.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Symbols of the user addresses.
    pub user_symbols: Vec<Symbol>,
    /// Symbols of the kernel addresses.
    pub kernel_symbols: Vec<Symbol>,
    /// What the Python side knew.
    pub python: PythonFacts<'static>,
    /// What to add to a `CLOCK_MONOTONIC` time for the Unix time.
    pub unix_offset_ns: i64,
    /// The run's metadata.
    pub meta: Meta,
}

/// Reads a recording's events, then its facts.
#[derive(Debug)]
pub struct Reader<R> {
    dec: Dec<R>,
    /// The format version of the recording ([`OLDEST_VERSION`] to [`FORMAT_VERSION`]).
    version: u64,
    kernel: Vec<Box<[u64]>>,
    user: Vec<Box<[u64]>>,
    python: Vec<Box<[u64]>>,
    words: usize,
    spans: Vec<SpanContext>,
    comms: FxHashMap<(u32, u32), [u8; TASK_COMM_LEN]>,
    thread_name: String,
    last_time: u64,
    scratch: Vec<u64>,
    bytes: Vec<u8>,
}

/// Which table a stack goes to.
#[derive(Clone, Copy)]
enum Table {
    Kernel,
    User,
    Python,
}

impl<R: BufRead> Reader<R> {
    /// Reads the header of the decompressed recording `input`; refuses another format
    /// version, saying which one this build reads.
    pub fn new(input: R) -> Result<(Reader<R>, Header)> {
        let mut dec = Dec::new(input, MAX_UNCOMPRESSED);
        let mut magic = [0u8; MAGIC.len()];
        for b in &mut magic {
            *b = dec
                .u8()
                .map_err(|_| Error("not a spanprof recording (too short)".into()))?;
        }
        if &magic != MAGIC {
            return Err(Error("not a spanprof recording".into()));
        }
        let version = dec.var()?;
        // NB: the magic, the version and spanprof's version are read alike in every version.
        let spanprof = dec.str()?;
        if !(u64::from(OLDEST_VERSION)..=u64::from(FORMAT_VERSION)).contains(&version) {
            return Err(Error(format!(
                "a recording of format version {version} (written by spanprof {spanprof}); this \
                 spanprof ({}) reads versions {OLDEST_VERSION} to {FORMAT_VERSION}: replay it \
                 with the spanprof that recorded it",
                env!("CARGO_PKG_VERSION")
            )));
        }
        let f = dec.u8()?;
        if f & !(O_KERNEL | O_LINES | O_PYTHON_ONLY | O_HEAP | O_TIMESTAMPS) != 0 {
            return Err(bad(format!("options {f:#x}")));
        }
        let options = Options {
            kernel: f & O_KERNEL != 0,
            lines: f & O_LINES != 0,
            python_only: f & O_PYTHON_ONLY != 0,
            heap: f & O_HEAP != 0,
            timestamps: f & O_TIMESTAMPS != 0,
            alloc_rate: dec.var()?,
            max_keys: dec.var()? as usize,
            max_processes: dec.var()? as usize,
            record: false,
        };
        let empty = || vec![Box::<[u64]>::from([])];
        let reader = Reader {
            dec,
            version,
            kernel: empty(),
            user: empty(),
            python: empty(),
            words: 0,
            spans: Vec::new(),
            comms: FxHashMap::default(),
            thread_name: String::new(),
            last_time: 0,
            scratch: Vec::new(),
            bytes: Vec::new(),
        };
        Ok((reader, Header { spanprof, options }))
    }

    /// The next event; [`Event::End`] once the events are over.
    pub fn next_event(&mut self) -> Result<Event<'_>> {
        let tag = self.dec.u8()?;
        match tag {
            TAG_SAMPLE => self.sample().map(Event::Sample),
            TAG_EXEC => {
                let pid = self.dec.u32("a pid")?;
                Ok(Event::Exec(pid, self.dec.var()?))
            }
            TAG_DESCRIBE => {
                let pid = self.dec.u32("a pid")?;
                let name = self.dec.opt_str()?;
                let info = if self.dec.bool()? {
                    Some(self.process_info()?)
                } else {
                    None
                };
                Ok(Event::Describe(pid, ProcessFacts { name, info }))
            }
            TAG_LIVE => {
                let n = self.dec.len(MAX_ITEMS, "allocations in use")?;
                let mut live = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    live.push((self.dec.var()?, self.dec.var()?));
                }
                Ok(Event::Live(live))
            }
            TAG_ERRORS => {
                let n = self.dec.len(MAX_SMALL, "error counters")?;
                (0..n)
                    .map(|_| self.dec.var())
                    .collect::<Result<_>>()
                    .map(Event::Errors)
            }
            TAG_END => Ok(Event::End),
            t => Err(bad(format!(
                "a record of kind {t} at byte {}",
                self.dec.pos - 1
            ))),
        }
    }

    /// A stack: read and added to its table, or referred to; its index.
    fn stack(&mut self, table: Table, new: bool) -> Result<usize> {
        let t = match table {
            Table::Kernel => &mut self.kernel,
            Table::User => &mut self.user,
            Table::Python => &mut self.python,
        };
        if !new {
            let id = self.dec.var()?;
            return usize::try_from(id)
                .ok()
                .filter(|&i| i < t.len())
                .ok_or_else(|| bad(format!("stack {id} of {} referred to", t.len())));
        }
        match table {
            Table::Python => {
                let n = self
                    .dec
                    .len(MAX_PY_FRAMES + 2, "Python frames in a stack")?;
                self.scratch.clear();
                for _ in 0..n {
                    let func = self.dec.u32("a function")?;
                    let rest = self.dec.var()?;
                    let line = rest >> 1;
                    if line > 0x7fff_ffff {
                        return Err(bad(format!("line {line}")));
                    }
                    let entry = if rest & 1 != 0 { TOKEN_ENTRY } else { 0 };
                    self.scratch.push(u64::from(func) | line << 32 | entry);
                }
            }
            Table::Kernel | Table::User => {
                self.dec.addrs_into(MAX_STACK_DEPTH, &mut self.scratch)?;
            }
        }
        self.words += self.scratch.len() + 1;
        if self.words > MAX_TABLE_WORDS {
            return Err(bad("more distinct stacks than a recording holds"));
        }
        t.push(self.scratch.as_slice().into());
        Ok(t.len() - 1)
    }

    fn sample(&mut self) -> Result<Resolved<'_>> {
        let flags = self.dec.var()?;
        if flags & !S_ALL != 0 {
            return Err(bad(format!("sample flags {flags:#x}")));
        }
        let pid = self.dec.u32("a pid")?;
        let tid = self.dec.u32("a tid")?;
        let event = self.dec.u32("an event")?;
        let time_ns = self.last_time.wrapping_add(self.dec.signed()? as u64);
        self.last_time = time_ns;
        let python_flags = self.dec.u8()?;
        if python_flags & !PY_FLAGS != 0 {
            return Err(bad(format!("Python flags {python_flags:#x}")));
        }
        let unwind = self.dec.u8()?;
        let unwind = unwind_status(unwind).ok_or_else(|| bad(format!("unwinding {unwind}")))?;
        if flags & S_COMM != 0 {
            self.dec.bytes_into(TASK_COMM_LEN, &mut self.bytes)?;
            let mut comm = [0u8; TASK_COMM_LEN];
            comm[..self.bytes.len()].copy_from_slice(&self.bytes);
            self.comms.insert((pid, tid), comm);
        }
        let comm = *self
            .comms
            .get(&(pid, tid))
            .ok_or_else(|| bad(format!("thread {pid}/{tid} sampled before its name")))?;
        let has_name = flags & S_THREAD_NAME != 0;
        if has_name {
            self.thread_name = self.dec.str()?;
        }
        let kid = self.stack(Table::Kernel, flags & S_KERNEL_NEW != 0)?;
        let uid = self.stack(Table::User, flags & S_USER_NEW != 0)?;
        let pyid = self.stack(Table::Python, flags & S_PYTHON_NEW != 0)?;
        let span = if flags & S_SPAN == 0 {
            SpanContext::default()
        } else if flags & S_SPAN_NEW != 0 {
            if self.spans.len() >= MAX_SPANS {
                return Err(bad("more span contexts than a recording holds"));
            }
            let span = self.span_context()?;
            self.spans.push(span);
            span
        } else {
            let id = self.dec.var()?;
            *usize::try_from(id)
                .ok()
                .and_then(|i| self.spans.get(i))
                .ok_or_else(|| bad(format!("span {id} of {} referred to", self.spans.len())))?
        };
        let weight = if flags & S_WEIGHT != 0 {
            self.dec.var()?
        } else {
            0
        };
        let alloc_id = if flags & S_ALLOC_ID != 0 {
            self.dec.var()?
        } else {
            0
        };
        let off_cpu = if flags & S_OFF_CPU != 0 {
            self.dec.u32("off-CPU facts")?
        } else {
            0
        };
        Ok(Resolved {
            pid,
            tid,
            comm,
            event,
            time_ns,
            weight,
            alloc_id,
            off_cpu,
            kernel: &self.kernel[kid],
            user: &self.user[uid],
            unwind,
            python: &self.python[pyid],
            python_flags,
            span,
            thread_name: has_name.then_some(self.thread_name.as_str()),
        })
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        for b in &mut out {
            *b = self.dec.u8()?;
        }
        Ok(out)
    }

    fn span_name(&mut self) -> Result<SpanName> {
        self.dec.bytes_into(SPAN_NAME_MAX, &mut self.bytes)?;
        SpanName::from_ascii(&self.bytes).ok_or_else(|| bad("a span name that is not ASCII"))
    }

    fn span_context(&mut self) -> Result<SpanContext> {
        let f = self.dec.u8()?;
        if f & !63 != 0 || (f & 8 != 0 && f & 4 == 0) {
            return Err(bad(format!("span flags {f:#x}")));
        }
        let mut s = SpanContext::default();
        if f & 1 != 0 {
            s.trace_id = Some(self.fixed()?);
        }
        if f & 2 != 0 {
            s.span_id = Some(self.fixed()?);
        }
        if f & 4 != 0 {
            let base_id = self.fixed()?;
            let trace_id = self.fixed()?;
            let parent_id = if f & 8 != 0 {
                Some(self.fixed()?)
            } else {
                None
            };
            s.osprofiler = Some(OsProfilerIds {
                base_id,
                trace_id,
                parent_id,
            });
        }
        if f & 16 != 0 {
            s.span_name = Some(self.span_name()?);
        }
        if f & 32 != 0 {
            s.osprofiler_name = Some(self.span_name()?);
        }
        if s.is_empty() {
            return Err(bad("an empty span context"));
        }
        Ok(s)
    }

    fn process_info(&mut self) -> Result<ProcessInfo> {
        let d = &mut self.dec;
        let exe_path = d.opt_str()?;
        let command_line = d.opt_str()?;
        let service_name = d.opt_str()?;
        let n = d.len(MAX_SMALL, "resource attributes")?;
        let env_attributes = (0..n)
            .map(|_| Ok((d.str()?, d.str()?)))
            .collect::<Result<_>>()?;
        let container_id = d.opt_str()?;
        let runtime = if d.bool()? {
            Some((d.str()?, d.str()?))
        } else {
            None
        };
        Ok(ProcessInfo {
            exe_path,
            command_line,
            service_name,
            env_attributes,
            container_id,
            runtime,
        })
    }

    /// The facts of assembly, after [`Event::End`]; the input must end with them. `addresses`:
    /// how many user and kernel addresses the samples hold, one symbol each (checked before
    /// any symbol is read).
    pub fn facts(mut self, addresses: (usize, usize)) -> Result<Recorded> {
        let mut strings = StrList::default();
        let version = self.version;
        let mut inlined_total = 0usize;
        // One shared copy of each module's ids, as the symbolizer hands them out.
        let mut ids_seen: HashMap<(Option<String>, Option<String>), Arc<ModuleIds>> =
            HashMap::new();
        let mut symbols = |dec: &mut Dec<R>, what: &str, expected: usize| -> Result<Vec<Symbol>> {
            let n = dec.len(MAX_ITEMS, "symbols")?;
            if n != expected {
                return Err(bad(format!(
                    "{n} {what} symbols for {expected} {what} addresses"
                )));
            }
            let mut v = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                let function = strings.get(dec)?;
                let module = strings.get(dec)?;
                let address = dec.var()?;
                let file = strings.get(dec)?;
                let line = match dec.var()? {
                    0 => None,
                    l => Some(u32::try_from(l - 1).map_err(|_| bad(format!("line {}", l - 1)))?),
                };
                let unknown_reason = strings.get(dec)?;
                let mut inlined = Vec::new();
                if version >= 2 {
                    let n = dec.len(symbolizer::MAX_INLINED, "inlined functions")?;
                    inlined_total += n;
                    if inlined_total > MAX_INLINED_TOTAL {
                        return Err(bad(format!(
                            "more than {MAX_INLINED_TOTAL} inlined functions"
                        )));
                    }
                    for _ in 0..n {
                        let function = strings.get(dec)?;
                        let file = strings.get(dec)?;
                        let line = match dec.var()? {
                            0 => None,
                            l => Some(
                                u32::try_from(l - 1).map_err(|_| bad(format!("line {}", l - 1)))?,
                            ),
                        };
                        inlined.push(Inlined {
                            function,
                            file,
                            line,
                        });
                    }
                }
                let mut ids = None;
                if version >= 3 {
                    let gnu = strings.get(dec)?;
                    let htlhash = strings.get(dec)?;
                    if gnu.is_some() || htlhash.is_some() {
                        let key = (gnu, htlhash);
                        let shared = ids_seen.entry(key).or_insert_with_key(|(gnu, htl)| {
                            Arc::new(ModuleIds {
                                gnu: gnu.as_deref().map(Into::into),
                                htlhash: htl.as_deref().map(Into::into),
                            })
                        });
                        ids = Some(shared.clone());
                    }
                }
                v.push(Symbol {
                    function,
                    module,
                    address,
                    file,
                    line,
                    unknown_reason,
                    ids,
                    inlined,
                });
            }
            Ok(v)
        };
        let user_symbols = symbols(&mut self.dec, "user", addresses.0)?;
        let kernel_symbols = symbols(&mut self.dec, "kernel", addresses.1)?;
        let d = &mut self.dec;
        let n = d.len(MAX_ITEMS, "Python functions")?;
        let mut functions = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            let name = d.str()?;
            let file = strings.get(d)?;
            let start_line = match version {
                ..=2 => None,
                _ => match d.var()? {
                    0 => None,
                    l => Some(u32::try_from(l - 1).map_err(|_| bad(format!("line {}", l - 1)))?),
                },
            };
            functions.push(PyFunction {
                name,
                file,
                start_line,
            });
        }
        let mut merge = BTreeMap::new();
        for _ in 0..d.len(MAX_ITEMS, "Python processes")? {
            let pid = d.u32("a pid")?;
            let markers = d.bool()?;
            let native_trusted = d.bool()?;
            let n = d.len(MAX_SMALL, "interpreter ranges")?;
            let eval_ranges = (0..n)
                .map(|_| {
                    let start = d.var()?;
                    Ok((start, start.wrapping_add(d.var()?)))
                })
                .collect::<Result<_>>()?;
            let interpreter = if version >= 4 { d.opt_str()? } else { None };
            merge.insert(
                pid,
                MergeFacts {
                    eval_ranges,
                    markers,
                    native_trusted,
                    interpreter,
                },
            );
        }
        let mut versions = BTreeMap::new();
        for _ in 0..d.len(MAX_ITEMS, "Python versions")? {
            let pid = d.u32("a pid")?;
            versions.insert(pid, d.str()?);
        }
        let found = d.u32("a count of Python processes")?;
        let n = d.len(MAX_SMALL, "notes")?;
        let notes = (0..n).map(|_| d.str()).collect::<Result<_>>()?;
        let spans_enabled = d.bool()?;
        let with_spans = d.u32("a count of processes with spans")?;
        let python = PythonFacts {
            functions: Cow::Owned(functions),
            merge,
            versions,
            found,
            notes,
            spans_enabled,
            with_spans,
        };
        let unix_offset_ns = d.signed()?;
        let meta = meta(d)?;
        if d.u8()? != TAG_TRAILER || !d.at_end()? {
            return Err(bad("bytes after its end"));
        }
        Ok(Recorded {
            user_symbols,
            kernel_symbols,
            python,
            unix_offset_ns,
            meta,
        })
    }
}

/// Seconds of a time or duration at most: what fits in an `i64` of nanoseconds (year 2262), as
/// the formats write them.
const MAX_SECONDS: u64 = i64::MAX as u64 / 1_000_000_000 - 1;

fn duration<R: BufRead>(d: &mut Dec<R>) -> Result<Duration> {
    let secs = d.var()?;
    let nanos = d.u32("nanoseconds")?;
    if nanos >= 1_000_000_000 || secs > MAX_SECONDS {
        return Err(bad(format!("a time of {secs} s and {nanos} ns")));
    }
    Ok(Duration::new(secs, nanos))
}

fn meta<R: BufRead>(d: &mut Dec<R>) -> Result<Meta> {
    let target = d.str()?;
    // NB: a session starts after 1970 (the formats cannot write an earlier start).
    if d.bool()? {
        return Err(bad("a start time before 1970"));
    }
    let start = SystemTime::UNIX_EPOCH + duration(d)?;
    let duration = duration(d)?;
    let frequency = d.var()?;
    let f = d.u8()?;
    if f & !31 != 0 {
        return Err(bad(format!("events {f:#x}")));
    }
    let events = Events {
        cpu: f & 1 != 0,
        off_cpu: f & 2 != 0,
        wall: f & 4 != 0,
        alloc: f & 8 != 0,
        heap: f & 16 != 0,
        alloc_rate: d.var()?,
    };
    let lost_samples = d.var()?;
    let host = if d.bool()? {
        Some(HostInfo {
            name: d.str()?,
            id: d.opt_str()?,
        })
    } else {
        None
    };
    let build = Build {
        commit: d.opt_str()?,
        branch: d.opt_str()?,
    };
    let n = d.len(MAX_SMALL, "dropped labels")?;
    let dropped_labels = (0..n).map(|_| d.str()).collect::<Result<_>>()?;
    Ok(Meta {
        target,
        start,
        duration,
        frequency,
        events,
        lost_samples,
        python: Default::default(),
        host,
        build,
        dropped_labels,
    })
}
