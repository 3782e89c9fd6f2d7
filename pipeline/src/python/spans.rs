//! Span objects of a process for the BPF program (its `span_procs` entry): the tracing
//! libraries' objects a CPython process holds ([`Spans`]: OpenTelemetry's context variable,
//! OSProfiler's local, whether a thread's or a green thread's under eventlet or gevent, with
//! greenlet's thread state), and the OTEP 4947 thread context any process may publish itself
//! ([`Published`], watched in processes not read as Python by [`NativeCtx`]).

use std::time::{Duration, Instant};

use profiler_common::{
    SpanProc, ATTR_DICTOFFSET, ATTR_INLINE, ATTR_MANAGED, ATTR_TAGGED, DICT_LOG2, DICT_SIZE,
    GREEN_EVENTLET, GREEN_GEVENT, GREEN_NONE, LOCAL_LOCALDICTS, LOCAL_TSTATE_DICT, LONG_SIZE,
    LONG_TAG, NO_KEY, TLS_DTV, TLS_STATIC,
};

use symbolizer::greenlet::{GreenletCache, GreenletState};
use symbolizer::otel_ctx::{read_process_ctx, ModuleCache, ProcessCtx, ThreadCtxVar, TlsAccess};
use symbolizer::python::detect::PythonProcess;
use symbolizer::python::memory::LiveMemory;
use symbolizer::python::objects::{
    AttrLayout, DictLayout, LocalKind, ObjectOffsets, Objects, SpanFinder,
};
use symbolizer::python::offsets::PyOffsets;

/// How often a Python process is looked at for tracing libraries it imported since (at most one
/// look per drain, every 50 ms, 100 ms once the collection is quiet): the spans of a library imported mid-session are read from
/// about this long after the import. A look that finds no new module costs four small reads.
const SPAN_LOOK_EVERY: Duration = Duration::from_millis(50);

/// How often a Python process is looked at for tracing libraries in its first
/// [`QUICK_LOOKS_FOR`] of being read, until one is found: a service imports them at start and
/// begins spans at once (a 1-s `-- CMD` run on 3.8 lost its first 14 ms of spans to a 50 ms
/// look). A look that finds no new module costs four small reads.
const QUICK_LOOK_EVERY: Duration = Duration::from_millis(5);
const QUICK_LOOKS_FOR: Duration = Duration::from_secs(3);

/// The thread context record attributes spanprof reads, in `SpanProc::osp_keys` order:
/// OSProfiler's ids, and the Python context the OpenTelemetry ids were published in (written
/// by python/spanprof-context).
const OSP_ATTRIBUTES: [&str; 4] = [
    "osprofiler.base_id",
    "osprofiler.trace_id",
    "osprofiler.parent_id",
    "spanprof.python_context",
];

/// How often a process is looked at for a thread context it publishes (OTEP 4947: a module
/// exporting `otel_thread_ctx_v1`, loaded since) and for updates of its process context.
const CTX_LOOK_EVERY: Duration = Duration::from_secs(1);

/// How often, at most, a process that is not read as Python is looked at again for a thread
/// context it publishes: the looks start [`CTX_LOOK_EVERY`] apart and double up to this (a
/// tracer's library is mostly loaded at start; each look reads `/proc/PID/maps`).
const NATIVE_CTX_LOOK_MAX: Duration = Duration::from_secs(64);

/// The OTEP 4947 thread context (and OTEP 4719 process context) a process publishes itself,
/// whatever its language: a module exporting `otel_thread_ctx_v1`.
#[derive(Debug)]
pub(super) struct Published {
    /// The thread context the process publishes, once found.
    thread_ctx: Option<ThreadCtxVar>,
    /// Its process context (the attribute key map of the thread context records).
    process_ctx: Option<ProcessCtx>,
    pub(super) next: Instant,
    /// Between two looks while none is found.
    every: Duration,
    /// The files mapped at the last look, which found nothing (see
    /// `ModuleCache::find_thread_ctx`): unchanged, they are not opened again.
    unchanged_since: u64,
    /// Whether the wait doubles after each look that finds none (processes not read as
    /// Python: looking at every one host-wide each second would cost the daemon).
    backoff: bool,
}

impl Published {
    pub(super) fn new(backoff: bool) -> Self {
        Published {
            thread_ctx: None,
            process_ctx: None,
            next: Instant::now(),
            every: CTX_LOOK_EVERY,
            unchanged_since: 0,
            backoff,
        }
    }

    /// Looks again if it is time; true when something new was found.
    pub(super) fn look(
        &mut self,
        now: Instant,
        mem: &LiveMemory,
        modules: &mut ModuleCache,
    ) -> bool {
        if now < self.next {
            return false;
        }
        let mut changed = false;
        let pid = mem.pid();
        self.next = now + self.every;
        if self.thread_ctx.is_none() {
            if let Ok(Some(var)) = modules.find_thread_ctx(pid, mem, &mut self.unchanged_since) {
                self.thread_ctx = Some(var);
                self.every = CTX_LOOK_EVERY;
                changed = true;
            } else if self.backoff {
                self.every = (self.every * 2).min(NATIVE_CTX_LOOK_MAX);
            }
        }
        if self.thread_ctx.is_some() {
            let ctx = read_process_ctx(pid, mem);
            // Unreadable (mid-update) keeps what was read before.
            if ctx.is_some() && ctx != self.process_ctx {
                self.process_ctx = ctx;
                changed = true;
            }
        }
        changed
    }

    /// Puts where the thread context is, and the keys of its attributes, into `v`.
    pub(super) fn fill(&self, v: &mut SpanProc) {
        let Some(var) = &self.thread_ctx else {
            return;
        };
        match var.access {
            TlsAccess::Static { tp_offset } => {
                v.tls_kind = TLS_STATIC;
                v.tls_offset = tp_offset;
            }
            TlsAccess::Dynamic { module, offset } => {
                v.tls_kind = TLS_DTV;
                v.tls_module = module;
                v.tls_offset = offset as i64;
            }
        }
        let keys = self.process_ctx.as_ref().map(|c| c.key_map.as_slice());
        for (slot, name) in v.osp_keys.iter_mut().zip(OSP_ATTRIBUTES) {
            *slot = keys
                .and_then(|k| k.iter().position(|n| n == name))
                .and_then(|i| u8::try_from(i).ok())
                .filter(|&i| i != NO_KEY)
                .unwrap_or(NO_KEY);
        }
    }
}

/// A process not read as Python (native code, or a CPython spanprof cannot walk) watched for a
/// thread context it publishes.
#[derive(Debug)]
pub(super) struct NativeCtx {
    pub(super) mem: LiveMemory,
    pub(super) published: Published,
    /// A sample arrived since the last look: a process that sends none is not looked at (its
    /// samples would carry nothing anyway), so idle processes cost a host-wide daemon nothing.
    pub(super) seen: bool,
}

/// Finding a process's OpenTelemetry and OSProfiler objects for the BPF program.
#[derive(Debug)]
pub(super) struct Spans {
    finder: SpanFinder,
    published: Published,
    /// The `span_procs` value without the objects: the version's offsets.
    base: SpanProc,
    mem: LiveMemory,
    runtime_addr: u64,
    py: &'static PyOffsets,
    objects: &'static ObjectOffsets,
    next: Instant,
    /// Until when the looks come every [`QUICK_LOOK_EVERY`] while no library is found.
    quick_until: Instant,
    /// greenlet's thread state, once OSProfiler's local turned out green-thread local.
    green: Option<GreenletState>,
    greenlets: GreenletCache,
    /// When greenlet's state is looked for again after a look that did not find it.
    green_next: Instant,
    /// Looks for greenlet's state that failed in a row.
    green_failures: u32,
    /// Why greenlet's state is still not found after [`GREEN_WARN_AFTER`] looks, for the
    /// session's warnings (taken by [`Spans::take_note`]).
    note: Option<String>,
}

/// How long after a failed look for greenlet's thread state the next one comes (each reads
/// `/proc/PID/maps`).
const GREEN_LOOK_EVERY: Duration = Duration::from_secs(1);
/// Failed looks for greenlet's state before the session warns: a module still being loaded
/// (its TLS relocation not applied yet) is found at the next look.
const GREEN_WARN_AFTER: u32 = 3;

impl Spans {
    pub(super) fn new(
        base: SpanProc,
        mem: LiveMemory,
        runtime_addr: u64,
        hash_secret: Option<u64>,
        py: &'static PyOffsets,
        objects: &'static ObjectOffsets,
    ) -> Self {
        let now = Instant::now();
        Spans {
            finder: SpanFinder::new(hash_secret.unwrap_or(0)),
            published: Published::new(false),
            base,
            mem,
            runtime_addr,
            py,
            objects,
            next: now,
            quick_until: now + QUICK_LOOKS_FOR,
            green: None,
            greenlets: GreenletCache::default(),
            green_next: now,
            green_failures: 0,
            note: None,
        }
    }

    /// When the next look is due, while the looks are quick: the process was first read less
    /// than [`QUICK_LOOKS_FOR`] ago and neither OpenTelemetry nor OSProfiler is found yet.
    pub(super) fn quick_look(&self) -> Option<Instant> {
        let found = self.finder.otel.is_some() || self.finder.osp.is_some();
        (!found && self.next < self.quick_until).then_some(self.next)
    }

    /// A warning for the session's summary, once: why OSProfiler's green-thread local cannot
    /// be read.
    pub(super) fn take_note(&mut self) -> Option<String> {
        self.note.take()
    }

    /// Looks for the libraries again if it is time; the `span_procs` value when something new
    /// was found. `modules` caches what module files say of `otel_thread_ctx_v1`.
    pub(super) fn look(&mut self, now: Instant, modules: &mut ModuleCache) -> Option<SpanProc> {
        if now < self.next {
            return None;
        }
        self.next = now
            + if self.quick_look().is_some() {
                QUICK_LOOK_EVERY
            } else {
                SPAN_LOOK_EVERY
            };
        let objects = Objects {
            mem: &self.mem,
            py: self.py,
            obj: self.objects,
        };
        let mut changed = self.finder.look(&objects, self.runtime_addr);
        changed |= self.published.look(now, &self.mem, modules);
        changed |= self.look_green(now);
        if !changed {
            return None;
        }
        let mut v = self.base;
        self.published.fill(&mut v);
        if let Some(o) = self.finder.otel {
            v.otel_var = o.var;
            v.otel_var_hash = o.var_hash;
            v.otel_key = o.span_key.addr;
            v.otel_key_hash = o.span_key.hash;
            v.context_name = o.context_name.addr;
            v.context_name_hash = o.context_name.hash;
        }
        if let Some(o) = self.finder.osp {
            // A green-thread local is read only once the running greenlet can be.
            let green = match (o.kind, &self.green) {
                (LocalKind::Thread, _) => Some(GREEN_NONE),
                (LocalKind::Eventlet, Some(_)) => Some(GREEN_EVENTLET),
                (LocalKind::Gevent, Some(_)) => Some(GREEN_GEVENT),
                (_, None) => None,
            };
            // A published record is per OS thread: under greenlets its OSProfiler ids are those
            // of whichever greenlet published last, not the running one's.
            if o.kind != LocalKind::Thread {
                v.osp_keys[..3].fill(NO_KEY);
            }
            if let Some(kind) = green {
                v.osp_local = o.local.addr;
                v.osp_local_hash = o.local.hash;
                v.osp_profiler_name = o.profiler_name.addr;
                v.osp_profiler_name_hash = o.profiler_name.hash;
                v.osp_profiler_type = o.profiler_type;
                v.osp_stack_name = o.stack_name.addr;
                v.osp_stack_name_hash = o.stack_name.hash;
                v.green_kind = kind;
                v.dict_type = o.dict_type;
            }
            if let (Some(GREEN_EVENTLET | GREEN_GEVENT), Some(g)) = (green, &self.green) {
                v.green_type = g.greenlet_type;
                match g.access {
                    TlsAccess::Static { tp_offset } => {
                        v.green_tls_kind = TLS_STATIC;
                        v.green_tls_offset = tp_offset;
                    }
                    TlsAccess::Dynamic { module, offset } => {
                        v.green_tls_kind = TLS_DTV;
                        v.green_tls_module = module;
                        v.green_tls_offset = offset as i64;
                    }
                }
            }
        }
        if let Some(n) = self.finder.names {
            v.name_attr = n.attr.addr;
            v.name_attr_hash = n.attr.hash;
            v.str_type = n.str_type;
        }
        if let Some(active) = self.finder.threading_active {
            v.threading_active = active;
        }
        Some(v)
    }

    /// Looks for greenlet's thread state when OSProfiler's local is a green thread's and the
    /// state is not known yet; true when it was found now.
    fn look_green(&mut self, now: Instant) -> bool {
        let Some(osp) = self.finder.osp else {
            return false;
        };
        if osp.kind == LocalKind::Thread || self.green.is_some() || now < self.green_next {
            return false;
        }
        self.green_next = now + GREEN_LOOK_EVERY;
        let who = match osp.kind {
            LocalKind::Eventlet => "eventlet",
            _ => "gevent",
        };
        let why = match self.greenlets.find(self.mem.pid(), &self.mem) {
            Ok(Some(state)) => {
                self.green = Some(state);
                self.green_failures = 0;
                return true;
            }
            Ok(None) => "greenlet's module (greenlet 2.0 or later) is not loaded".to_string(),
            Err(e) => format!("the running greenlet cannot be found: {e}"),
        };
        self.green_failures += 1;
        if self.green_failures == GREEN_WARN_AFTER {
            self.note = Some(format!(
                "OSProfiler's trace points are not read: its local is {who}'s, and {why}"
            ));
        }
        false
    }
}

/// The `span_procs` value of a process before its tracing libraries are found: the offsets of
/// its version and the HAMT node types (0 when the symbol table does not have them: the BPF
/// program then tells nodes apart by their type's name).
pub(super) fn span_proc(
    process: &PythonProcess,
    py: &PyOffsets,
    o: &ObjectOffsets,
) -> Result<SpanProc, String> {
    let u = |v: u64, what: &str| -> Result<u32, String> {
        u32::try_from(v).map_err(|_| format!("offset of {what} out of range"))
    };
    let [bitmap, array, collision] = process.hamt_types.map(|t| t.unwrap_or(0));
    let (tstate_local, local_kind) = match o.tstate_local_key {
        Some(at) => (at, LOCAL_LOCALDICTS),
        None => (o.tstate_dict, LOCAL_TSTATE_DICT),
    };
    Ok(SpanProc {
        hamt_bitmap_type: bitmap,
        hamt_array_type: array,
        hamt_collision_type: collision,
        tstate_context: u(o.tstate_context, "PyThreadState.context")?,
        context_vars: u(o.context_vars, "PyContext.ctx_vars")?,
        hamt_root: u(o.hamt_root, "PyHamtObject.h_root")?,
        tstate_local: u(tstate_local, "PyThreadState.dict")?,
        local_kind,
        dict_kind: match o.dict_layout {
            DictLayout::Size => DICT_SIZE,
            DictLayout::Log2 => DICT_LOG2,
        },
        dict_values: u(o.dict_values, "PyDictValues.values")?,
        attr_kind: match o.attr_layout {
            AttrLayout::DictOffset => ATTR_DICTOFFSET,
            AttrLayout::Managed => ATTR_MANAGED,
            AttrLayout::Tagged => ATTR_TAGGED,
            AttrLayout::Inline => ATTR_INLINE,
        },
        type_flags: u(o.type_flags, "tp_flags")?,
        type_dictoffset: u(o.type_dictoffset, "tp_dictoffset")?,
        type_basicsize: u(o.type_basicsize, "tp_basicsize")?,
        type_cached_keys: u(o.type_cached_keys, "ht_cached_keys")?,
        long_kind: if o.long_tag { LONG_TAG } else { LONG_SIZE },
        str_data: u(py.unicode_ascii_size, "PyASCIIObject data")?,
        tuple_items: u(o.tuple_items, "PyTupleObject.ob_item")?,
        osp_keys: [NO_KEY; 4],
        ..SpanProc::default()
    })
}
