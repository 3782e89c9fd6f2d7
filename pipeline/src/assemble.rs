//! The assemble stage: the counts of a [`Counter`] and the facts gathered for them become a
//! [`Profile`].
//!
//! Its inputs are data ([`Facts`]): the symbols of every address the counts hold (in the order
//! of [`Counter::addresses`]), what the Python side knew ([`PythonFacts`]), the offset of the
//! monotonic clock to Unix time, and the run's metadata. Each count key's Python stack is
//! merged into its native stack ([`merge`]), the off-CPU reason classified from the frames
//! ([`classify`]), and the samples sorted, so that the same inputs give the same profile.

use std::borrow::Cow;
use std::collections::BTreeMap;

use profiler_common::TASK_COMM_LEN;
use rustc_hash::{FxHashMap, FxHashSet};
use symbolizer::unwind::{FailedBy, UnwindStatus};
use symbolizer::Symbol;

use crate::count::{block_facts, Counter};
use crate::merge::{merge, Piece};
use crate::offcpu::{classify, is_asyncio_idle};
use crate::profile::{
    Frame, FrameKind, Memory, Meta, OffCpuReason, Process, Profile, PythonStats, Sample, Thread,
    Timed,
};
use crate::python::{
    split_token, MergeInfo, PyFunction, Python, Unread, TOKEN_ENTRY, TRUNCATED_FUNCTION,
};

/// Frame shown where C code called into Python but native unwinding could not show it.
pub const NATIVE_CODE: &str = "[native code]";
/// Frame at the root end of a Python stack that was cut.
pub const TRUNCATED: &str = "[truncated]";
/// Root frame of a native stack cut at a return address in no mapped code (its callers are
/// not known): `--unwind fp` through code without frame pointers.
pub const UNKNOWN_CALLERS: &str = "[unknown callers: the walk left mapped code]";
/// Leaf frame of the memory of CPython's small objects: an arena pymalloc mapped, charged to
/// no function (the code that needed a new arena is rarely the code whose objects fill it).
pub const PYMALLOC_ARENA: &str = "[pymalloc arena]";
/// The whole stack of a sample without Python frames, under `--python-only`.
pub const NO_PYTHON_FRAMES: &str = "[no python frames]";

/// How to merge the stacks of one Python process ([`MergeInfo`], owned).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeFacts {
    /// Run-time ranges of the interpreter loop.
    pub eval_ranges: Vec<(u64, u64)>,
    /// A boundary between two interpreter calls means C code called into Python (3.11+).
    pub markers: bool,
    /// The interpreter keeps frame pointers.
    pub native_trusted: bool,
    /// The module holding the interpreter, as the process's maps (and so its native frames)
    /// name it: its frames are [`Frame::interpreter`]. `None` in a recording older than
    /// version 4: then the module of an address in the loop ([`interpreter_modules`]).
    pub interpreter: Option<String>,
}

/// What the Python side knew at the end of a window: the input of assembly that
/// [`Python`] produces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PythonFacts<'a> {
    /// Functions by id (the function part of each token).
    pub functions: Cow<'a, [PyFunction]>,
    /// How to merge each Python process's stacks, by pid.
    pub merge: BTreeMap<u32, MergeFacts>,
    /// The CPython version of each Python process, by pid.
    pub versions: BTreeMap<u32, String>,
    /// Python processes found.
    pub found: u32,
    /// Why processes that looked like Python could not be profiled as such.
    pub notes: Vec<String>,
    /// Span contexts were looked for.
    pub spans_enabled: bool,
    /// Processes whose span contexts the kernel read.
    pub with_spans: u32,
}

impl<'a> PythonFacts<'a> {
    /// What `python` knows of the processes `pids`; its function table is borrowed.
    pub fn of(python: &'a Python, pids: impl IntoIterator<Item = u32>) -> PythonFacts<'a> {
        let mut merge = BTreeMap::new();
        let mut versions = BTreeMap::new();
        for pid in pids {
            if let Some(m) = python.merge_info(pid) {
                merge.insert(
                    pid,
                    MergeFacts {
                        eval_ranges: m.eval_ranges.to_vec(),
                        markers: m.markers,
                        native_trusted: m.native_trusted,
                        interpreter: python
                            .interpreter_module(pid)
                            .map(|p| p.display().to_string()),
                    },
                );
            }
            if let Some(v) = python.runtime_version(pid) {
                versions.insert(pid, v.to_string());
            }
        }
        PythonFacts {
            functions: Cow::Borrowed(python.functions()),
            merge,
            versions,
            found: python.found(),
            notes: python.notes(),
            spans_enabled: python.spans_enabled(),
            with_spans: python.with_spans(),
        }
    }

    fn merge_info(&self, pid: u32) -> Option<MergeInfo<'_>> {
        self.merge.get(&pid).map(|m| MergeInfo {
            eval_ranges: &m.eval_ranges,
            markers: m.markers,
            native_trusted: m.native_trusted,
        })
    }
}

/// The inputs of assembly besides the counts.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The run's metadata (its Python statistics are filled in here).
    pub meta: Meta,
    /// Symbols of the user addresses, in the order of [`Counter::addresses`].
    pub user_symbols: Vec<Symbol>,
    /// Symbols of the kernel addresses, in the order of [`Counter::addresses`].
    pub kernel_symbols: Vec<Symbol>,
    /// What the Python side knew.
    pub python: PythonFacts<'a>,
    /// What to add to a `CLOCK_MONOTONIC` time for the Unix time.
    pub unix_offset_ns: i64,
}

/// What to add to a `CLOCK_MONOTONIC` time (the clock of `bpf_ktime_get_ns`) for the Unix time.
pub fn unix_offset_ns() -> i64 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    unix - crate::monotonic_ns() as i64
}

/// Builds the profile of `count` from `facts`; `user_addrs` and `kernel_addrs` are
/// [`Counter::addresses`], as long as the symbols of `facts` (the caller checks it).
pub fn assemble(
    mut count: Counter,
    user_addrs: &[(u32, u64)],
    kernel_addrs: &[u64],
    facts: Facts<'_>,
) -> Profile {
    let Facts {
        mut meta,
        user_symbols,
        kernel_symbols,
        python,
        unix_offset_ns: to_unix,
    } = facts;
    let opts = count.opts;
    meta.python = PythonStats {
        processes: python.found,
        notes: python.notes.clone(),
        spans_enabled: python.spans_enabled,
        span_processes: python.with_spans,
        ..count.python_stats.clone()
    };
    let mut frames = FrameTable::default();
    // Return addresses that are no code: a native stack is cut at its leafmost one.
    let outside: FxHashSet<(u32, u64)> = user_addrs
        .iter()
        .zip(&user_symbols)
        .filter(|(_, s)| s.unknown_reason.as_deref() == Some(symbolizer::OUTSIDE_MAPPINGS))
        .map(|(&k, _)| k)
        .collect();
    let interpreters = interpreter_modules(&python, user_addrs, &user_symbols);
    // The frames of each user address, root first: its function, then those inlined into it
    // (`chains[start..end]`).
    let mut chains: Vec<u32> = Vec::with_capacity(user_addrs.len());
    let user_frame: FxHashMap<(u32, u64), (u32, u32)> = user_addrs
        .iter()
        .zip(user_symbols)
        .map(|(&k, mut s)| {
            let inlined = std::mem::take(&mut s.inlined);
            let (module, address, ids) = (s.module.clone(), s.address, s.ids.clone());
            let interpreter = module
                .as_deref()
                .is_some_and(|m| interpreters.get(&k.0).is_some_and(|i| i == m));
            let start = chains.len() as u32;
            chains.push(frames.intern(s, FrameKind::Native, interpreter));
            for f in inlined {
                chains.push(frames.insert(Frame {
                    kind: FrameKind::Inlined,
                    function: f.function,
                    module: module.clone(),
                    address,
                    file: f.file,
                    // `--no-lines`: one frame per function, as for Python.
                    line: f.line.filter(|_| opts.lines),
                    unknown_reason: None,
                    ids: ids.clone(),
                    start_line: None,
                    interpreter,
                }));
            }
            (k, (start, chains.len() as u32))
        })
        .collect();
    let chain = |key: (u32, u64)| {
        let (start, end) = user_frame[&key];
        &chains[start as usize..end as usize]
    };
    let kernel_frame: FxHashMap<u64, u32> = kernel_addrs
        .iter()
        .zip(kernel_symbols)
        .map(|(&a, s)| (a, frames.intern(s, FrameKind::Kernel, false)))
        .collect();

    // A thread per (pid, tid, Python name): a renamed thread's samples keep the name they
    // had. A sample without one gets the thread's latest Python name if it has one (sampled
    // before the name was read), else its latest `comm`.
    let sample_thread = |pid: u32, tid: u32, name: u32| -> Thread {
        let name = match name.checked_sub(1) {
            Some(i) => count.thread_names[i as usize].to_string(),
            None => count
                .python_thread_names
                .get(&(pid, tid))
                .cloned()
                .unwrap_or_else(|| comm_string(&count.threads[&(pid, tid)])),
        };
        Thread { pid, tid, name }
    };
    let keys: FxHashSet<(u32, u32, u32)> = count
        .counts
        .keys()
        .map(|&(pid, tid, name, ..)| (pid, tid, name))
        .collect();
    let mut threads: Vec<Thread> = keys
        .iter()
        .map(|&(pid, tid, name)| sample_thread(pid, tid, name))
        .collect();
    threads.sort_unstable_by(|a, b| (a.pid, a.tid, &a.name).cmp(&(b.pid, b.tid, &b.name)));
    threads.dedup();
    // Each (pid, tid, name id) of the counts → its thread's index.
    let thread_index: FxHashMap<(u32, u32, u32), u32> = keys
        .into_iter()
        .map(|(pid, tid, name)| {
            let t = sample_thread(pid, tid, name);
            let i = threads
                .binary_search_by(|u| (u.pid, u.tid, &u.name).cmp(&(t.pid, t.tid, &t.name)))
                .expect("every key's thread is listed");
            ((pid, tid, name), i as u32)
        })
        .collect();

    let kernel_stacks = count.kernel.by_id();
    let python_stacks = count.python.by_id();
    let user_stacks: FxHashMap<u32, Vec<&[u64]>> = count
        .user
        .iter()
        .map(|(&pid, t)| (pid, t.by_id()))
        .collect();
    let mut python_frame: FxHashMap<u64, u32> = FxHashMap::default();
    let mut pieces = Vec::new();
    let mut samples: Vec<Sample> = Vec::with_capacity(count.counts.len());
    // Monotonic event times to wall-clock ones; none at all past MAX_TIMED.
    let keep_times = opts.timestamps && !count.timed_overflow;
    let timed = |times: &[(u64, u64)]| -> Vec<Timed> {
        if !keep_times {
            return Vec::new();
        }
        let mut v: Vec<Timed> = times
            .iter()
            .map(|&(t, value)| Timed {
                unix_ns: t.saturating_add_signed(to_unix),
                value,
            })
            .collect();
        v.sort_unstable();
        v
    };
    for (&(pid, tid, name, kid, uid, pyid, span, mut unwind, off), counts) in &count.counts {
        let mut ustack = user_stacks[&pid][uid as usize];
        // A walk by frame pointers through code that keeps none goes on with whatever the
        // register held: from the first address in no mapping on, the frames are garbage.
        // Only a walk the kernel did (`--unwind fp`): an unwinder that read the tables stops
        // at what they say, and its status stays as it found it.
        let cut = unwind == UnwindStatus::Unchecked && !outside.is_empty() && {
            match ustack.iter().position(|&a| outside.contains(&(pid, a))) {
                Some(i) => {
                    ustack = &ustack[..i];
                    unwind = UnwindStatus::Failed(FailedBy::LeftMappedCode);
                    true
                }
                None => false,
            }
        };
        let kstack = kernel_stacks[kid as usize];
        let pystack = python_stacks[pyid as usize];
        pieces.clear();
        // A stack unwound with the unwind tables holds every interpreter frame up to where it
        // stopped, frame pointers or not.
        let info = python.merge_info(pid).map(|mut info| {
            info.native_trusted |=
                matches!(unwind, UnwindStatus::Complete | UnwindStatus::Truncated(_));
            info
        });
        merge(ustack, pystack, info, &mut pieces);
        // Root first: outermost user frame … user leaf, then syscall entry … kernel leaf.
        let mut stack: Vec<u32> = Vec::with_capacity(pieces.len() + kstack.len() + 1);
        if cut && !opts.python_only {
            stack.push(frames.placeholder(UNKNOWN_CALLERS));
        }
        for piece in pieces.iter().rev() {
            let id = match *piece {
                Piece::Native(a) if !opts.python_only => {
                    stack.extend_from_slice(chain((pid, a)));
                    continue;
                }
                Piece::NativeCode if !opts.python_only => frames.placeholder(NATIVE_CODE),
                Piece::Native(_) | Piece::NativeCode => continue,
                Piece::Unread(unread) => {
                    if unread == Unread::NotFound {
                        meta.python.not_found += counts.samples;
                    }
                    frames.placeholder(unread.frame_name())
                }
                Piece::Python(token) => {
                    let (func, _, _) = split_token(token);
                    if func == TRUNCATED_FUNCTION {
                        frames.placeholder(TRUNCATED)
                    } else if let Some(unread) = Unread::of_function(func) {
                        // A marker among frames (a recording's): said where it is.
                        frames.placeholder(unread.frame_name())
                    } else {
                        let key = token & !TOKEN_ENTRY;
                        *python_frame.entry(key).or_insert_with(|| {
                            frames.insert(python_frame_of(&python.functions, key))
                        })
                    }
                }
            };
            stack.push(id);
        }
        if opts.kernel && !opts.python_only {
            stack.extend(kstack.iter().rev().map(|a| kernel_frame[a]));
        }
        // Off-CPU: the reason, from the kernel and native frames, as a root pseudo-frame.
        let reason = (off & 1 == 1).then(|| {
            let name = |id: u32| frames.frames[id as usize].function.as_deref().unwrap_or("");
            let kernel: Vec<&str> = kstack.iter().map(|a| name(kernel_frame[a])).collect();
            // Unknown native frames keep their module (`[unknown] (python3.11+0x…)`): the
            // classifier knows a stripped interpreter's GIL wait by its caller's module.
            let native: Vec<String> = ustack
                .iter()
                .map(|a| frames.frames[chain((pid, *a))[0] as usize].base_name())
                .collect();
            let native: Vec<&str> = native.iter().map(String::as_str).collect();
            let reason = classify(&block_facts(off), &kernel, &native);
            // The innermost two Python frames (the stack is root first): an event loop idle in
            // its selector is told apart from the I/O waits of the code it runs.
            let python: Vec<(&str, &str)> = stack
                .iter()
                .rev()
                .map(|&id| &frames.frames[id as usize])
                .filter(|f| f.kind == FrameKind::Python)
                .take(2)
                .map(|f| {
                    (
                        f.function.as_deref().unwrap_or(""),
                        f.file.as_deref().unwrap_or(""),
                    )
                })
                .collect();
            if is_asyncio_idle(reason, &python) {
                OffCpuReason::AsyncioIdle
            } else {
                reason
            }
        });
        if let Some(reason) = reason {
            stack.insert(0, frames.placeholder(&reason.frame_name()));
        }
        if off & 1 == 0 && off & crate::resolve::ALLOC_ARENA != 0 {
            stack.push(frames.placeholder(PYMALLOC_ARENA));
        }
        if stack.is_empty() {
            stack.push(frames.placeholder(if opts.python_only {
                NO_PYTHON_FRAMES
            } else {
                crate::wording::NO_STACK
            }));
        }
        samples.push(Sample {
            frames: stack,
            thread: thread_index[&(pid, tid, name)],
            count: counts.samples,
            off_cpu_ns: counts.off_cpu_ns,
            off_cpu: reason,
            alloc: Memory {
                objects: counts.alloc_objects.round() as u64,
                bytes: counts.alloc_bytes.round() as u64,
            },
            inuse: Memory {
                objects: counts.inuse_objects.round() as u64,
                bytes: counts.inuse_bytes.round() as u64,
            },
            span: span.checked_sub(1),
            unwind,
            times: timed(&counts.times),
            inuse_times: timed(&counts.inuse_times),
        });
    }
    samples.sort_by(|a, b| {
        (a.thread, &a.frames, a.span, a.unwind, a.off_cpu)
            .cmp(&(b.thread, &b.frames, b.span, b.unwind, b.off_cpu))
    });
    // Off-CPU keys that differ only in facts the reason did not depend on are one sample.
    samples.dedup_by(|b, a| {
        let same = (a.thread, &a.frames, a.span, a.unwind, a.off_cpu)
            == (b.thread, &b.frames, b.span, b.unwind, b.off_cpu);
        if same {
            a.absorb(b);
        }
        same
    });

    let processes = std::mem::take(&mut count.processes)
        .into_iter()
        .map(|(pid, name)| {
            let mut info = count.process_info.remove(&pid).unwrap_or_default();
            info.runtime = python
                .versions
                .get(&pid)
                .map(|v| ("cpython".to_string(), v.clone()));
            Process { pid, name, info }
        })
        .collect();
    Profile {
        meta,
        frames: frames.frames,
        threads,
        processes,
        samples,
        spans: std::mem::take(&mut count.spans),
    }
}

/// The profile frame of a Python token (without its entry flag).
fn python_frame_of(functions: &[PyFunction], token: u64) -> Frame {
    let (func, line, _) = split_token(token);
    // NB: the replay checks every token against its function table first.
    let f = &functions[func as usize];
    Frame {
        kind: FrameKind::Python,
        function: Some(f.name.clone()),
        module: None,
        address: 0,
        file: f.file.clone(),
        line: (line != 0).then_some(line),
        unknown_reason: None,
        ids: None,
        start_line: f.start_line,
        interpreter: false,
    }
}

/// The module of each Python process's interpreter, as its native frames name it: the one the
/// Python side found, else (a recording older than version 4) the module of an address of the
/// process in the interpreter loop.
fn interpreter_modules(
    python: &PythonFacts<'_>,
    user_addrs: &[(u32, u64)],
    user_symbols: &[Symbol],
) -> FxHashMap<u32, String> {
    let mut modules: FxHashMap<u32, String> = python
        .merge
        .iter()
        .filter_map(|(&pid, m)| Some((pid, m.interpreter.clone()?)))
        .collect();
    for (&(pid, addr), sym) in user_addrs.iter().zip(user_symbols) {
        if modules.contains_key(&pid) {
            continue;
        }
        let in_loop = python.merge_info(pid).is_some_and(|m| m.is_eval(addr));
        if let (true, Some(module)) = (in_loop, &sym.module) {
            modules.insert(pid, module.clone());
        }
    }
    modules
}

fn comm_string(comm: &[u8; TASK_COMM_LEN]) -> String {
    String::from_utf8_lossy(profiler_common::comm_bytes(comm)).into_owned()
}

#[derive(Debug, Default)]
struct FrameTable {
    ids: FxHashMap<Frame, u32>,
    frames: Vec<Frame>,
}

impl FrameTable {
    fn intern(&mut self, sym: Symbol, kind: FrameKind, interpreter: bool) -> u32 {
        let frame = Frame {
            kind,
            function: sym.function,
            module: sym.module,
            address: sym.address,
            file: sym.file,
            line: sym.line,
            unknown_reason: sym.unknown_reason,
            // NB: kernel symbols have none.
            ids: sym.ids,
            start_line: None,
            interpreter,
        };
        self.insert(frame)
    }

    fn insert(&mut self, frame: Frame) -> u32 {
        if let Some(&id) = self.ids.get(&frame) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.ids.insert(frame.clone(), id);
        self.frames.push(frame);
        id
    }

    fn placeholder(&mut self, name: &str) -> u32 {
        self.insert(Frame {
            kind: FrameKind::Native,
            function: Some(name.to_string()),
            module: None,
            address: 0,
            file: None,
            line: None,
            unknown_reason: None,
            ids: None,
            start_line: None,
            interpreter: false,
        })
    }
}
