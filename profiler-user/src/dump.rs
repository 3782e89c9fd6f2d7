//! `spanprof dump`: every thread of a process at one moment — its stack (Python frames merged
//! into the native ones, then the kernel's), whether it runs or why it waits, and the span it
//! is in.
//!
//! # Overview
//! The collector is loaded as for a session (the timer sampler at [`DUMP_FREQUENCY`]), the
//! targets' interpreters and tracing libraries are looked for, and then, at once:
//! 1. the task iterator (`profiler-ebpf/src/dump.task.c`) sends an off-CPU record of every
//!    thread of a target that is off its CPU: its kernel stack, its user registers as it entered
//!    the kernel and a copy of its stack, its Python frames and span, read from the process's
//!    memory with `bpf_copy_from_user_task`. The pipeline names its wait (sleep, lock, io, gil…)
//!    as it names a session's off-CPU samples.
//! 2. a runnable thread (preempted) gets a timer sample's record from the iterator, read the same
//!    way; a thread on a CPU gets its stack from the timer sampler's next sample of it.
//!
//! Each thread's first record of a wait wins (the first pass's, unless it ran then; a timer or
//! runnable record in the interpreter's GIL functions is a wait for the GIL), else its first
//! timer sample. Right after the first pass the GIL of each Python process is read from its
//! memory ([`GilState`]): its holder is shown running (not waiting for the GIL it has), and
//! another thread whose record shows it running the interpreter's own code (which needs the
//! GIL) is shown waiting for the GIL. A thread neither sampled nor found blocked within [`DUMP_WAIT`] (one that
//! ran at each pass and was never sampled) is listed with its state unknown; the iterator runs
//! again every [`PASS_EVERY`] while one is missing.
//!
//! # Design constraints
//! Nothing stops the process: a blocked thread's stack and objects are read where it waits (a
//! thread that wakes during the reads has a record that mixes two moments, as a timer sample of
//! a running thread may), a running one's as a timer sample's are.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use serde_json::{json, Value};
use spanprof_collect::bpf::threads_of;
use spanprof_collect::options::{DEFAULT_RING_BUFFER_BYTES, DEFAULT_STACK_COPY};
use spanprof_collect::{self as collect, Collector, EventSet, Stopped};
use spanprof_pipeline::aggregate;
use spanprof_pipeline::python::GilState;
use spanprof_profile::profile::{
    hex, uuid, Frame, FrameKind, OffCpuReason, Profile, Sample, SpanContext,
};

use crate::preflight;

/// Timer samples per second on each CPU while the dump waits for its running threads: a thread
/// on a CPU is sampled within about 2 ms of its CPU time.
pub const DUMP_FREQUENCY: u64 = 499;
/// How long the dump waits for a sample of every thread at most.
pub const DUMP_WAIT: Duration = Duration::from_secs(1);
/// How often the task iterator runs again while a thread has no event.
pub const PASS_EVERY: Duration = Duration::from_millis(100);
/// Reads of a process's GIL after the first pass while it is free or changes hands as read.
const GIL_READS: usize = 5;
/// The pause between two of those reads.
const GIL_READ_PAUSE: Duration = Duration::from_micros(200);

/// What to dump.
#[derive(Debug, Clone)]
pub struct Options {
    /// The processes.
    pub pids: Vec<u32>,
    /// Their descendants too.
    pub children: bool,
    /// Read span contexts.
    pub spans: bool,
    /// The frames the stacks show.
    pub view: spanprof_profile::profile::View,
}

/// Where a thread was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// On a CPU, or runnable: its stack is a timer sample's (the iterator's, for a runnable one).
    Running,
    /// Blocked, for this reason.
    Blocked(OffCpuReason),
    /// Neither sampled nor found blocked within [`DUMP_WAIT`].
    Unknown,
}

impl State {
    /// `running`, the reason's name (`sleep`, `lock`, `io`, `gil`, `asyncio_idle`, `other`), or
    /// `unknown`.
    pub fn name(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Blocked(reason) => reason.name(),
            State::Unknown => "unknown",
        }
    }
}

/// One thread of a dump.
#[derive(Debug, Clone)]
pub struct ThreadDump {
    /// Thread id.
    pub tid: u32,
    /// Its Python `threading` name where it has one, else its `comm`.
    pub name: String,
    /// Where it was.
    pub state: State,
    /// Its frames, innermost first: kernel, then native with the Python frames merged in.
    pub frames: Vec<Frame>,
    /// The span context it was in.
    pub span: Option<SpanContext>,
    /// It held its process's GIL when the GIL was read.
    pub holds_gil: bool,
}

/// One process of a dump.
#[derive(Debug, Clone)]
pub struct ProcessDump {
    /// Process id.
    pub pid: u32,
    /// Its name.
    pub name: String,
    /// Its threads, by thread id.
    pub threads: Vec<ThreadDump>,
    /// What its GIL was when read: `None` for a process not read as Python.
    pub gil: Option<Gil>,
}

/// A Python process's GIL as the dump read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gil {
    /// Held by this thread.
    HeldBy(u32),
    /// No thread held it.
    Free,
    /// It could not be read, or changed hands at each read.
    Unknown,
}

/// A dump: when, and every process's threads.
#[derive(Debug, Clone)]
pub struct Dump {
    /// When the threads were looked at.
    pub time: SystemTime,
    /// The processes, by pid.
    pub processes: Vec<ProcessDump>,
}

/// `pids` and, with `children`, every process descended from them.
fn targets(pids: &[u32], children: bool) -> Vec<u32> {
    if children {
        collect::target_cpu::with_descendants(pids)
    } else {
        let mut all = pids.to_vec();
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// The ring buffer of a dump of `threads` threads: room for a record of each, so that one pass
/// of the iterator (which user space cannot drain meanwhile) loses none; at least the default,
/// at most 1 GiB (about 34,000 threads of 31 KiB records).
fn ring_buffer_size(threads: usize) -> u32 {
    let record = u64::from(collect::options::SAMPLE_RECORD_MAX + DEFAULT_STACK_COPY);
    let want = (threads as u64 + 16)
        .saturating_mul(record)
        .next_power_of_two();
    want.clamp(u64::from(DEFAULT_RING_BUFFER_BYTES), 1 << 30) as u32
}

/// Takes the dump.
pub fn run(opts: &Options) -> Result<Dump> {
    collect::preflight()?;
    for &pid in &opts.pids {
        preflight::check_pid(pid)?;
    }
    let pids = targets(&opts.pids, opts.children);
    let listed: usize = pids.iter().map(|&p| threads_of(p).len()).sum();
    let sampling = collect::Options {
        frequency: DUMP_FREQUENCY,
        events: EventSet::parse(["cpu"]).expect("cpu is an event"),
        spans: opts.spans,
        follow_children: false,
        ring_buffer_size: ring_buffer_size(listed),
        ..collect::Options::default()
    };
    let mut c = Collector::load(
        &sampling,
        aggregate::Options {
            timestamps: true,
            ..aggregate::Options::default()
        },
    )?;
    for &pid in &pids {
        // Its interpreter and tracing libraries first, so its first records have their frames.
        c.discover(pid)?;
    }
    c.flush_discovered();
    for &pid in &pids {
        c.add_target(pid)?;
    }
    let time = SystemTime::now();
    let mut threads: BTreeSet<(u32, u32)> = pids
        .iter()
        .flat_map(|&pid| threads_of(pid).into_iter().map(move |tid| (pid, tid)))
        .collect();
    // Loaded first (~40 ms): the pass's time is when it runs.
    c.programs.load_task_iterator()?;
    let pass = SystemTime::now();
    c.programs.dump_blocked_threads()?;
    let gils = read_gils(&c.python, &pids);
    let start = Instant::now();
    let mut last_pass = start;
    let mut waiter = c.waiter(&pids);
    loop {
        c.tick();
        let seen: BTreeSet<(u32, u32)> = c.agg.threads_seen().collect();
        // A thread that exited meanwhile is not waited for.
        threads.retain(|&(pid, tid)| {
            seen.contains(&(pid, tid))
                || std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
        });
        if threads.iter().all(|t| seen.contains(t)) || start.elapsed() >= DUMP_WAIT {
            break;
        }
        if last_pass.elapsed() >= PASS_EVERY {
            last_pass = Instant::now();
            c.programs.dump_blocked_threads()?;
        }
        waiter.wait(Duration::from_millis(10));
    }
    let lost = c.programs.lost_samples();
    if lost > 0 {
        eprintln!(
            "spanprof: warning: {lost} records were lost (the ring buffer was full): a thread \
             without one is shown at a later pass, or as unknown"
        );
    }
    let mut meta = c.meta(
        pids.iter()
            .map(|p| format!("pid {p}"))
            .collect::<Vec<_>>()
            .join(", "),
        time,
        start.elapsed(),
        lost,
    );
    meta.events.off_cpu = true;
    let Stopped {
        agg,
        mut symbolizer,
        python,
        ..
    } = c.stop();
    let profile = agg.into_profile(&mut symbolizer, &python, meta);
    let pass_ns = pass
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Ok(dump_of(profile, pass_ns, &threads, &gils, opts.view, time))
}

/// The GIL of each Python process of `pids`, read up to [`GIL_READS`] times while it is free
/// or changes hands as read (two threads sharing it hand it over every 5 ms).
fn read_gils(python: &spanprof_pipeline::python::Python, pids: &[u32]) -> BTreeMap<u32, Gil> {
    let mut gils = BTreeMap::new();
    for &pid in pids {
        let mut gil = None;
        for attempt in 0..GIL_READS {
            if attempt > 0 {
                std::thread::sleep(GIL_READ_PAUSE);
            }
            gil = match python.gil_state(pid) {
                None => break,
                Some(Ok(GilState::HeldBy(tid))) => Some(Gil::HeldBy(tid)),
                Some(Ok(GilState::Free)) => Some(Gil::Free),
                Some(Err(_)) => Some(Gil::Unknown),
            };
            if let Some(Gil::HeldBy(_)) = gil {
                break;
            }
        }
        if let Some(gil) = gil {
            gils.insert(pid, gil);
        }
    }
    gils
}

/// The dump of a profile of every record taken, the first pass of the iterator at `pass_ns`,
/// the processes' GILs read right after it: each thread's record is chosen on the whole stacks
/// (a GIL wait is in the interpreter's own frames), then shown in `view`.
fn dump_of(
    mut profile: Profile,
    pass_ns: u64,
    listed: &BTreeSet<(u32, u32)>,
    gils: &BTreeMap<u32, Gil>,
    view: spanprof_profile::profile::View,
    time: SystemTime,
) -> Dump {
    let chosen = choose(&profile, pass_ns);
    let mut index = 0;
    profile.retain_samples(|_, _| {
        index += 1;
        chosen.contains_key(&(index - 1))
    });
    // A thread running the interpreter's code while another holds the GIL has let it go since
    // its record: it waits to take it back.
    let gil: BTreeSet<(u32, u32)> = chosen
        .values()
        .filter(|c| {
            let (pid, tid) = c.key;
            c.gil_wait
                || (c.in_interpreter
                    && matches!(gils.get(&pid), Some(&Gil::HeldBy(holder)) if holder != tid))
        })
        .map(|c| c.key)
        .collect();
    assemble(&profile.into_view(view), listed, &gil, gils, time)
}

/// The record a thread is shown with.
#[derive(Debug, Clone, Copy)]
struct Chosen {
    /// (pid, tid).
    key: (u32, u32),
    /// On a CPU or runnable in the interpreter's GIL functions.
    gil_wait: bool,
    /// On a CPU or runnable in the interpreter's own code (or Python code), which needs the GIL,
    /// or in the GIL's hand-over.
    in_interpreter: bool,
}

/// The record each thread is shown with, by index in `profile.samples`, with what it shows
/// ([`Chosen`]): its record of a wait nearest the
/// first pass of the task iterator (at `pass_ns`, Unix time), the pass's own for a thread
/// blocked then, else the timer sample nearest the pass. The threads are then shown at about
/// one moment: two threads sharing the GIL swap every 5 ms, and their first samples (taken
/// before the pass, as the sampler starts) showed both running in 4 of 10 dumps.
fn choose(profile: &Profile, pass_ns: u64) -> BTreeMap<usize, Chosen> {
    // (pid, tid) → (rank, index, what it shows); a rank is whether it runs (a wait comes
    // first), then its distance from the pass.
    type Best = ((bool, u64), usize, Chosen);
    let mut first: BTreeMap<(u32, u32), Best> = BTreeMap::new();
    for (i, s) in profile.samples.iter().enumerate() {
        let Some(t) = profile.threads.get(s.thread as usize) else {
            continue;
        };
        // Its native frames, innermost first, as the off-CPU reasons read them.
        let native: Vec<String> = s
            .frames
            .iter()
            .rev()
            .filter_map(|&f| profile.frames.get(f as usize))
            .filter(|f| f.kind != FrameKind::Kernel)
            .map(Frame::display_name)
            .collect();
        let native: Vec<&str> = native.iter().map(String::as_str).collect();
        let on_cpu = s.off_cpu.is_none();
        let gil = on_cpu && spanprof_pipeline::offcpu::waits_for_gil(&native);
        // Running Python (its innermost frame the interpreter's or a Python one), or in the
        // GIL's hand-over: either needs the GIL next.
        let in_interpreter = on_cpu
            && s.frames.iter().any(|&f| {
                profile
                    .frames
                    .get(f as usize)
                    .is_some_and(|f| f.kind == FrameKind::Python)
            })
            && (s
                .frames
                .iter()
                .rev()
                .filter_map(|&f| profile.frames.get(f as usize))
                .find(|f| f.kind != FrameKind::Kernel)
                .is_some_and(|f| f.interpreter || f.kind == FrameKind::Python)
                || spanprof_pipeline::offcpu::in_gil_hand_over(&native));
        let when = s
            .times
            .iter()
            .map(|t| t.unix_ns.abs_diff(pass_ns))
            .min()
            .unwrap_or(u64::MAX);
        let rank = (s.off_cpu.is_none() && !gil, when);
        let key = (t.pid, t.tid);
        if first.get(&key).is_none_or(|&(r, ..)| rank < r) {
            let chosen = Chosen {
                key,
                gil_wait: gil,
                in_interpreter,
            };
            first.insert(key, (rank, i, chosen));
        }
    }
    first.into_values().map(|(_, i, c)| (i, c)).collect()
}

/// The dump of `profile`, which holds one sample per thread ([`choose`]), and the threads of
/// `listed` without one; those of `gil` wait for the GIL on a CPU, the holders of `gils` run.
fn assemble(
    profile: &Profile,
    listed: &BTreeSet<(u32, u32)>,
    gil: &BTreeSet<(u32, u32)>,
    gils: &BTreeMap<u32, Gil>,
    time: SystemTime,
) -> Dump {
    let mut first: BTreeMap<(u32, u32), &Sample> = BTreeMap::new();
    for s in &profile.samples {
        if let Some(t) = profile.threads.get(s.thread as usize) {
            first.entry((t.pid, t.tid)).or_insert(s);
        }
    }
    let mut processes: BTreeMap<u32, ProcessDump> = BTreeMap::new();
    let keys: BTreeSet<(u32, u32)> = first.keys().chain(listed.iter()).copied().collect();
    for (pid, tid) in keys {
        let entry = processes.entry(pid).or_insert_with(|| ProcessDump {
            pid,
            name: profile
                .processes
                .iter()
                .find(|p| p.pid == pid)
                .map(|p| p.name.clone())
                .or_else(|| preflight::check_pid(pid).ok().map(|s| s.comm))
                .unwrap_or_default(),
            threads: Vec::new(),
            gil: gils.get(&pid).copied(),
        });
        let holds_gil = gils.get(&pid) == Some(&Gil::HeldBy(tid));
        let thread = match first.get(&(pid, tid)) {
            Some(&s) => {
                let mut t = thread_of(profile, s, tid);
                if holds_gil {
                    // It took the GIL since its record of a wait for it.
                    t.holds_gil = true;
                    if t.state == State::Blocked(OffCpuReason::Gil) {
                        t.state = State::Running;
                    }
                } else if gil.contains(&(pid, tid)) {
                    t.state = State::Blocked(OffCpuReason::Gil);
                }
                t
            }
            None => ThreadDump {
                tid,
                name: std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                    .map(|n| n.trim_end().to_string())
                    .unwrap_or_default(),
                state: State::Unknown,
                frames: Vec::new(),
                span: None,
                holds_gil,
            },
        };
        entry.threads.push(thread);
    }
    Dump {
        time,
        processes: processes.into_values().collect(),
    }
}

/// A thread's dump from its sample.
fn thread_of(profile: &Profile, s: &Sample, tid: u32) -> ThreadDump {
    let name = profile
        .threads
        .get(s.thread as usize)
        .map(|t| t.name.clone())
        .unwrap_or_default();
    // An off-CPU sample's root frame is its reason's pseudo-frame: the state says it.
    let skip = usize::from(s.off_cpu.is_some()).min(s.frames.len());
    let frames = s.frames[skip..]
        .iter()
        .rev()
        .filter_map(|&i| profile.frames.get(i as usize))
        .cloned()
        .collect();
    ThreadDump {
        tid,
        name,
        state: s.off_cpu.map_or(State::Running, State::Blocked),
        frames,
        span: profile.span_of(s).copied(),
        holds_gil: false,
    }
}

/// The span lines of a thread: OpenTelemetry's span, OSProfiler's trace point.
fn span_lines(span: &SpanContext) -> Vec<String> {
    let mut lines = Vec::new();
    if let (Some(trace), Some(id)) = (span.trace_id, span.span_id) {
        let name = span
            .span_name
            .map(|n| format!(" \"{}\"", n.as_str()))
            .unwrap_or_default();
        lines.push(format!(
            "span{name}: trace {} span {}",
            hex(&trace),
            hex(&id)
        ));
    }
    if let Some(osp) = &span.osprofiler {
        let name = span
            .osprofiler_name
            .map(|n| format!(" \"{}\"", n.as_str()))
            .unwrap_or_default();
        lines.push(format!(
            "osprofiler point{name}: base {} point {}",
            uuid(&osp.base_id),
            uuid(&osp.trace_id)
        ));
    }
    lines
}

/// The dump as text: per thread a heading, its span, then its frames innermost first.
pub fn render_text(dump: &Dump) -> String {
    let mut out = String::new();
    let when = humantime::format_rfc3339_millis(dump.time);
    for p in &dump.processes {
        let gil = match p.gil {
            Some(Gil::HeldBy(tid)) => format!(", the GIL held by thread {tid}"),
            Some(Gil::Free) => ", the GIL free".to_string(),
            Some(Gil::Unknown) => ", the GIL's holder unknown".to_string(),
            None => String::new(),
        };
        out.push_str(&format!(
            "Process {} ({}): {} threads at {when}{gil}\n",
            p.pid,
            p.name,
            p.threads.len()
        ));
        for t in &p.threads {
            let state = match t.state {
                State::Running => "running".to_string(),
                State::Blocked(reason) => format!("blocked: {}", reason.name()),
                State::Unknown => format!(
                    "state unknown: neither sampled nor found blocked within {}",
                    humantime::format_duration(DUMP_WAIT)
                ),
            };
            let holds = if t.holds_gil { ", holds the GIL" } else { "" };
            out.push_str(&format!(
                "\nThread {} \"{}\" {state}{holds}\n",
                t.tid, t.name
            ));
            for line in t.span.iter().flat_map(span_lines) {
                out.push_str(&format!("    {line}\n"));
            }
            for f in &t.frames {
                out.push_str(&format!("    {}\n", f.display_name()));
            }
        }
        out.push('\n');
    }
    out
}

fn kind_name(kind: FrameKind) -> &'static str {
    match kind {
        FrameKind::Native => "native",
        FrameKind::Kernel => "kernel",
        FrameKind::Python => "python",
        FrameKind::Inlined => "inlined",
    }
}

/// The dump as JSON (docs/dump.md describes it).
pub fn render_json(dump: &Dump) -> Value {
    let processes: Vec<Value> = dump
        .processes
        .iter()
        .map(|p| {
            let threads: Vec<Value> = p
                .threads
                .iter()
                .map(|t| {
                    let otel = t.span.and_then(|s| {
                        Some(json!({
                            "trace_id": hex(&s.trace_id?),
                            "span_id": hex(&s.span_id?),
                            "name": s.span_name.map(|n| n.as_str().to_string()),
                        }))
                    });
                    let osp = t.span.and_then(|s| {
                        let o = s.osprofiler?;
                        Some(json!({
                            "base_id": uuid(&o.base_id),
                            "trace_id": uuid(&o.trace_id),
                            "parent_id": o.parent_id.as_ref().map(uuid),
                            "name": s.osprofiler_name.map(|n| n.as_str().to_string()),
                        }))
                    });
                    let frames: Vec<Value> = t
                        .frames
                        .iter()
                        .map(|f| {
                            json!({
                                "kind": kind_name(f.kind),
                                "function": f.function,
                                "name": f.display_name(),
                                "file": f.file,
                                "line": f.line,
                                "module": f.module,
                                "address": f.address,
                            })
                        })
                        .collect();
                    json!({
                        "tid": t.tid,
                        "name": t.name,
                        "state": t.state.name(),
                        "holds_gil": t.holds_gil,
                        "span": otel,
                        "osprofiler": osp,
                        "frames": frames,
                    })
                })
                .collect();
            let gil = match p.gil {
                Some(Gil::HeldBy(tid)) => json!({"state": "held", "holder": tid}),
                Some(Gil::Free) => json!({"state": "free", "holder": null}),
                Some(Gil::Unknown) => json!({"state": "unknown", "holder": null}),
                None => Value::Null,
            };
            json!({"pid": p.pid, "name": p.name, "gil": gil, "threads": threads})
        })
        .collect();
    json!({
        "time": humantime::format_rfc3339_millis(dump.time).to_string(),
        "processes": processes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use spanprof_profile::format::fixture;
    use spanprof_profile::profile::Timed;

    /// A sample of `thread` (an index of the fixture's threads: 0 is tid 100, 1 tid 101) at
    /// `unix_ns`, blocked for `reason` or on-CPU, with the fixture's `main;compute` stack
    /// (under the reason's pseudo-frame, `pseudo`, when blocked).
    fn sample(
        base: &Sample,
        thread: u32,
        unix_ns: u64,
        reason: Option<OffCpuReason>,
        pseudo: u32,
    ) -> Sample {
        let mut s = base.clone();
        s.thread = thread;
        s.off_cpu = reason;
        s.frames = match reason {
            Some(_) => vec![pseudo, 0, 1],
            None => vec![0, 1],
        };
        s.times = vec![Timed { unix_ns, value: 1 }];
        s.span = None;
        s
    }

    #[test]
    fn the_ring_buffer_holds_a_record_of_every_thread_within_bounds() {
        let record = (collect::options::SAMPLE_RECORD_MAX + DEFAULT_STACK_COPY) as usize;
        assert_eq!(ring_buffer_size(1), DEFAULT_RING_BUFFER_BYTES);
        for threads in [1_000, 5_000, 30_000] {
            let size = ring_buffer_size(threads) as usize;
            assert!(
                size.is_power_of_two() && size >= threads * record,
                "{threads}: {size}"
            );
        }
        assert_eq!(ring_buffer_size(10_000_000), 1 << 30);
    }

    #[test]
    fn each_thread_is_shown_waiting_if_found_so_and_a_listed_one_without_any_as_unknown() {
        let mut p = fixture::profile();
        let mut pseudo = p.frames[0].clone();
        pseudo.function = Some(OffCpuReason::Lock.frame_name());
        p.frames.push(pseudo);
        let pseudo = p.frames.len() as u32 - 1;
        let base = p.samples[0].clone();
        p.samples = vec![
            // tid 100: blocked at the first pass (at 100), sampled running later.
            sample(&base, 0, 200, None, pseudo),
            sample(&base, 0, 100, Some(OffCpuReason::Lock), pseudo),
            // tid 101: sampled running before the pass, found blocked by a later pass.
            sample(&base, 1, 50, None, pseudo),
            sample(&base, 1, 300, Some(OffCpuReason::Sleep), pseudo),
        ];
        // tid 4242 was listed (a thread of pid 100 then) and never seen.
        let listed: BTreeSet<(u32, u32)> = [(100, 100), (100, 101), (100, 4242)].into();
        let dump = dump_of(
            p,
            100,
            &listed,
            &BTreeMap::new(),
            spanprof_profile::profile::View::Full,
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(dump.processes.len(), 1);
        let threads = &dump.processes[0].threads;
        let shown: Vec<(u32, State, Vec<String>)> = threads
            .iter()
            .map(|t| {
                let names = t.frames.iter().map(Frame::display_name).collect();
                (t.tid, t.state, names)
            })
            .collect();
        let stack = vec!["compute".to_string(), "main".to_string()];
        assert_eq!(
            shown,
            vec![
                (100, State::Blocked(OffCpuReason::Lock), stack.clone()),
                (101, State::Blocked(OffCpuReason::Sleep), stack),
                (4242, State::Unknown, Vec::new()),
            ]
        );
        assert_eq!(threads[0].name, "app");
        let text = render_text(&dump);
        assert!(
            text.contains("Thread 100 \"app\" blocked: lock\n    compute\n    main\n"),
            "{text}"
        );
        assert!(text.contains("Thread 4242 \"\" state unknown"), "{text}");
        let json = render_json(&dump);
        let t = &json["processes"][0]["threads"];
        assert_eq!(t[0]["state"], "lock");
        assert_eq!(t[1]["state"], "sleep");
        assert_eq!(t[2]["state"], "unknown");
        assert_eq!(t[0]["frames"][0]["function"], "compute");
        assert_eq!(t[0]["frames"][0]["kind"], "native");
    }

    /// With the GIL read held by tid 101: 101, whose record is a wait for the GIL, is shown
    /// running and holding it; 100, whose record runs the interpreter's code under a Python
    /// frame, waits for the GIL; so does neither when the GIL's holder is not known.
    #[test]
    fn the_gil_s_holder_runs_and_a_thread_in_the_interpreter_waits_for_it() {
        let mut p = fixture::profile();
        let mut pseudo = p.frames[0].clone();
        pseudo.function = Some(OffCpuReason::Gil.frame_name());
        p.frames.push(pseudo);
        let pseudo = p.frames.len() as u32 - 1;
        // `compute` is the interpreter's; a Python frame `work` calls it.
        p.frames[1].interpreter = true;
        let mut work = p.frames[0].clone();
        work.kind = FrameKind::Python;
        work.function = Some("work".to_string());
        p.frames.push(work);
        let work = p.frames.len() as u32 - 1;
        let base = p.samples[0].clone();
        let mut running = sample(&base, 0, 90, None, pseudo);
        running.frames = vec![0, work, 1];
        p.samples = vec![
            running,
            sample(&base, 1, 95, Some(OffCpuReason::Gil), pseudo),
        ];
        let listed: BTreeSet<(u32, u32)> = [(100, 100), (100, 101)].into();
        let show = |gils: &BTreeMap<u32, Gil>| {
            let dump = dump_of(
                p.clone(),
                100,
                &listed,
                gils,
                spanprof_profile::profile::View::Full,
                SystemTime::UNIX_EPOCH,
            );
            let states: Vec<(u32, State, bool)> = dump.processes[0]
                .threads
                .iter()
                .map(|t| (t.tid, t.state, t.holds_gil))
                .collect();
            (dump, states)
        };
        let (dump, states) = show(&[(100, Gil::HeldBy(101))].into());
        assert_eq!(
            states,
            vec![
                (100, State::Blocked(OffCpuReason::Gil), false),
                (101, State::Running, true),
            ]
        );
        let text = render_text(&dump);
        assert!(text.contains("the GIL held by thread 101\n"), "{text}");
        assert!(
            text.contains("Thread 101 \"worker\" running, holds the GIL\n"),
            "{text}"
        );
        let json = render_json(&dump);
        assert_eq!(json["processes"][0]["gil"]["holder"], 101);
        assert_eq!(json["processes"][0]["threads"][1]["holds_gil"], true);
        for gils in [[(100, Gil::Unknown)].into(), BTreeMap::new()] {
            let (_, states) = show(&gils);
            assert_eq!(
                states,
                vec![
                    (100, State::Running, false),
                    (101, State::Blocked(OffCpuReason::Gil), false),
                ],
                "{gils:?}"
            );
        }
    }
}
