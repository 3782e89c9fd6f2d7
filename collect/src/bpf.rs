//! Loading and attaching the eBPF programs of `profiler-ebpf/`, and the maps user space uses.
//!
//! The compiled object is embedded at build time (see `build.rs`). One `perf_event` program is
//! attached to a software `cpu-clock` event on every online CPU; it samples only processes in the
//! `target_pids` map, and walks the Python frames of those in the `py_procs` map. The
//! `raw_tp/sched_process_fork` program adds children of profiled processes to that map from
//! inside the kernel, so a child never runs unprofiled while user space catches up; the
//! `raw_tp/sched_process_exec` program tells user space when a target runs a new program.

use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};

use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::{BtfTracePoint, PerfEvent, ProgramType, RawTracePoint, UProbe};
use aya::{Btf, Ebpf, EbpfLoader};
use profiler_common::{
    AllocKey, ErrorCode, LiveAlloc, OffCpuTask, PyProc, SpanProc, Target, ALLOC_CALLOC, ALLOC_GAPS,
    ALLOC_MALLOC, ALLOC_MEMALIGN, ALLOC_MMAP, ALLOC_POSIX_MEMALIGN, ALLOC_PY_ARENA,
    ALLOC_PY_CALLOC, ALLOC_PY_FREE, ALLOC_PY_MALLOC, ALLOC_PY_REALLOC, ALLOC_REALLOC, ERROR_COUNT,
    SCRATCH_SLOTS, TARGET_EXPLICIT,
};

use spanprof_pipeline::monotonic_ns;
use spanprof_pipeline::python::KernelMaps;

use crate::profile::DEFAULT_ALLOC_RATE;

mod dump;

/// The compiled eBPF object.
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/spanprof.bpf.o"));

/// Where the kernel exposes its BTF; `SPANPROF_BTF_PATH` overrides it (for kernels that keep it
/// elsewhere, and for tests of the missing-BTF error).
pub const DEFAULT_BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

/// Errors of loading and attaching. Messages are lowercase, one line, and say what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The kernel BTF file is missing.
    #[error(
        "kernel BTF not found at {0}: spanprof needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
    )]
    NoBtf(PathBuf),
    /// The kernel BTF file could not be parsed.
    #[error("cannot parse kernel BTF at {path}: {source}")]
    BadBtf {
        /// BTF path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: aya::BtfError,
    },
    /// A program type the profiler needs is missing.
    #[error("this kernel does not support BPF program type {0}")]
    Unsupported(&'static str),
    /// The BPF syscall is missing or refused.
    #[error("the bpf() system call is not available: {0}")]
    NoBpf(String),
    /// Anything else from aya, with what was being done.
    #[error("failed to {what}: {detail}")]
    Aya {
        /// What was being done.
        what: &'static str,
        /// aya's error and its causes, flattened to one line.
        detail: String,
    },
}

fn aya_err<E: std::error::Error>(what: &'static str) -> impl FnOnce(E) -> LoadError {
    move |e| LoadError::Aya {
        what,
        detail: one_line(&e),
    }
}

/// What to load and how.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Samples per second per CPU.
    pub frequency: u64,
    /// Add children of profiled processes to the target set, in the kernel.
    pub follow_children: bool,
    /// Size of the sample ring buffer in bytes (a power of two, at least one page).
    pub ring_buffer_size: u32,
    /// Kernel BTF file.
    pub btf_path: PathBuf,
    /// Bytes of user stack copied per sample for unwinding in user space (`--unwind dwarf`), a
    /// multiple of 8 up to [`profiler_common::MAX_STACK_COPY`]; 0 for the kernel's
    /// frame-pointer walk (`--unwind fp`).
    pub stack_copy_bytes: u32,
    /// Sample on-CPU stacks from the cpu-clock event (`--event cpu`).
    pub cpu: bool,
    /// Record off-CPU intervals (`--event offcpu`).
    pub off_cpu: Option<OffCpuOptions>,
    /// Sample allocations (`--event alloc`, `heap`); the probes are attached per module with
    /// [`Programs::attach_allocator`].
    pub alloc: Option<AllocOptions>,
}

/// How allocations are sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocOptions {
    /// Bytes between two samples on average (exponentially distributed gaps); 1: every
    /// allocation.
    pub rate: u64,
    /// Track sampled allocations to their free, for the memory in use at the end.
    pub heap: bool,
    /// Probe CPython's object allocator too ([`Programs::attach_python_allocator`]).
    pub python: bool,
}

/// (program, symbol, function kind for the `on_alloc` cookie) of the C library's probes.
const LIBC_PROBES: &[(&str, &str, u64)] = &[
    ("on_alloc", "malloc", ALLOC_MALLOC),
    ("on_alloc", "calloc", ALLOC_CALLOC),
    ("on_alloc", "realloc", ALLOC_REALLOC),
    ("on_alloc", "aligned_alloc", ALLOC_MEMALIGN),
    ("on_alloc", "memalign", ALLOC_MEMALIGN),
    ("on_alloc", "posix_memalign", ALLOC_POSIX_MEMALIGN),
    ("on_alloc", "mmap", ALLOC_MMAP),
];

/// The probes only the heap profile needs: frees and returns.
const LIBC_HEAP_PROBES: &[(&str, &str, u64)] = &[
    ("on_free", "free", 0),
    ("on_munmap", "munmap", 0),
    ("on_alloc_return", "malloc", 0),
    ("on_alloc_return", "calloc", 0),
    ("on_alloc_return", "realloc", 0),
    ("on_alloc_return", "aligned_alloc", 0),
    ("on_alloc_return", "memalign", 0),
    ("on_alloc_return", "posix_memalign", 0),
    ("on_alloc_return", "mmap", 0),
];

/// The allocation programs, loaded when allocations are sampled.
const ALLOC_PROGRAMS: [&str; 4] = ["on_alloc", "on_free", "on_munmap", "on_alloc_return"];

/// What the kernel keeps of a thread's off-CPU state.
#[derive(Debug, Clone)]
pub enum ThreadState {
    /// Its state (it blocked, or was preempted with `--event wall`, during the session).
    Known(Box<OffCpuTask>),
    /// None: it never left a CPU blocked during the session, or it is gone.
    Nothing,
    /// Not readable: a kernel without `PIDFD_THREAD` (before 6.9).
    Unreadable,
}

/// The thread ids of process `pid` (empty when it is gone).
pub fn threads_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a thread is asleep now (`S` or `D` in `/proc/PID/task/TID/stat`).
pub fn thread_sleeping(pid: u32, tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
        .ok()
        .and_then(|s| {
            let state = s.rsplit_once(") ")?.1.chars().next()?;
            Some(matches!(state, 'S' | 'D'))
        })
        .unwrap_or(false)
}

/// The task storage value of thread `tid` in the map `map_fd`, or with `write`, stores that one
/// if the thread has none yet (`BPF_MAP_LOOKUP_ELEM` / `BPF_MAP_UPDATE_ELEM` with `BPF_NOEXIST`,
/// a pidfd for the key; aya has no task storage type).
fn task_storage(map_fd: std::os::fd::RawFd, tid: u32, write: Option<&OffCpuTask>) -> ThreadState {
    /// `PIDFD_THREAD` (Linux 6.9): a pidfd of one thread rather than of a thread group.
    const PIDFD_THREAD: libc::c_long = libc::O_EXCL as libc::c_long;
    const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    const BPF_NOEXIST: u64 = 1;
    /// The part of `union bpf_attr` that lookups use.
    #[repr(C)]
    struct LookupAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::c_long, PIDFD_THREAD) };
    let Some(pidfd) = i32::try_from(pidfd).ok().filter(|&fd| fd >= 0) else {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINVAL) => ThreadState::Unreadable,
            _ => ThreadState::Nothing,
        };
    };
    // SAFETY: pidfd_open returned a new fd, owned here.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd) };
    let key: i32 = owned.as_raw_fd();
    // SAFETY: OffCpuTask is integers only: all zeroes is a valid value.
    let mut value: OffCpuTask = unsafe { std::mem::zeroed() };
    if let Some(w) = write {
        value = *w;
    }
    let attr = LookupAttr {
        map_fd: map_fd as u32,
        _pad: 0,
        key: &key as *const i32 as u64,
        value: &mut value as *mut OffCpuTask as u64,
        flags: if write.is_some() { BPF_NOEXIST } else { 0 },
    };
    let cmd = if write.is_some() {
        BPF_MAP_UPDATE_ELEM
    } else {
        BPF_MAP_LOOKUP_ELEM
    };
    // SAFETY: attr points at a live key and a value buffer of the map's value size
    // (OffCpuTask mirrors struct spanprof_offcpu_task, checked by profiler-common's tests).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            &attr as *const LookupAttr,
            std::mem::size_of::<LookupAttr>(),
        )
    };
    if r == 0 {
        ThreadState::Known(Box::new(value))
    } else {
        ThreadState::Nothing
    }
}

/// Exponentially distributed gaps with mean `rate`, at the midpoints of `n` equal-probability
/// slices: the countdown the BPF program draws from after each sampled allocation.
pub fn alloc_gaps(rate: u64, n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let u = (i as f64 + 0.5) / n as f64;
            ((-u.ln()) * rate as f64).round().max(1.0) as u64
        })
        .collect()
}

/// How blocked intervals are sampled ([`crate::offcpu`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuOptions {
    /// Intervals at least this long weigh what they last; shorter ones are kept with probability
    /// `length / period` and weigh `period` (the on-CPU sampling period, `1e9 / frequency`).
    pub period_ns: u64,
    /// Shorter intervals are not counted.
    pub min_ns: u64,
    /// Sum each thread's time runnable, waiting for a CPU (`--event wall`), for the summary.
    pub runnable: bool,
}

/// Loaded, attached programs and the maps user space reads and writes.
pub struct Programs {
    // Dropping `Ebpf` detaches every program; it must outlive the maps taken from it.
    ebpf: Ebpf,
    /// Ring buffer of sample records ([`profiler_common::Sample`]).
    pub samples: RingBuf<MapData>,
    targets: HashMap<MapData, u32, Target>,
    py_procs: HashMap<MapData, u32, PyProc>,
    span_procs: HashMap<MapData, u32, SpanProc>,
    stack_copy_sizes: HashMap<MapData, u32, u32>,
    errors: PerCpuArray<MapData, u64>,
    alloc: Option<AllocOptions>,
    /// Allocator modules probed: (device, inode).
    probed: std::collections::HashSet<(u64, u64)>,
    alloc_live: Option<HashMap<MapData, AllocKey, LiveAlloc>>,
    /// Keeps the kernel's run time statistics of BPF programs on while it is open (`None`:
    /// `BPF_ENABLE_STATS` was refused, it needs CAP_SYS_ADMIN).
    stats: Option<std::os::fd::OwnedFd>,
    /// The kernel BTF the programs were loaded with (the task iterator is loaded against it).
    btf_path: PathBuf,
}

/// What spanprof's programs cost in the kernel so far: the `run_time_ns` and `run_cnt` counters
/// the kernel keeps per program while statistics are enabled (`bpftool prog show` prints them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelTime {
    /// Time in every program (sampling, fork/exec/exit tracking, off-CPU, allocation probes).
    pub total_ns: u64,
    /// Runs of every program.
    pub total_runs: u64,
    /// Time in the timer sampling program, `on_cpu_sample`.
    pub sampling_ns: u64,
    /// Its runs: one per cpu-clock tick on a CPU, profiled process or not.
    pub sampling_runs: u64,
}

impl KernelTime {
    /// The change since `earlier`.
    pub fn since(&self, earlier: &KernelTime) -> KernelTime {
        KernelTime {
            total_ns: self.total_ns.saturating_sub(earlier.total_ns),
            total_runs: self.total_runs.saturating_sub(earlier.total_runs),
            sampling_ns: self.sampling_ns.saturating_sub(earlier.sampling_ns),
            sampling_runs: self.sampling_runs.saturating_sub(earlier.sampling_runs),
        }
    }
}

/// Whether the kernel already keeps BPF run time statistics for everyone
/// (`sysctl kernel.bpf_stats_enabled=1`).
fn stats_enabled_by_sysctl() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|v| v.trim() == "1")
}

impl std::fmt::Debug for Programs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Programs").finish_non_exhaustive()
    }
}

/// Checks that the kernel has what the programs need, before anything is loaded.
pub fn probe_kernel(btf_path: &Path) -> Result<(), LoadError> {
    if !btf_path.exists() {
        return Err(LoadError::NoBtf(btf_path.to_path_buf()));
    }
    // NB: the raw tracepoint programs are not probed: a load failure names them instead.
    for (ty, name) in [(ProgramType::PerfEvent, "perf_event")] {
        match aya::sys::is_program_supported(ty) {
            Ok(true) => {}
            Ok(false) => return Err(LoadError::Unsupported(name)),
            Err(e) => return Err(LoadError::NoBpf(one_line(&e))),
        }
    }
    Ok(())
}

fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// The maps only the allocation programs use.
const ALLOC_ONLY_MAPS: [&str; 4] = ["alloc_live", "alloc_calls", "arena_calls", "py_reallocs"];

impl Programs {
    /// Loads the programs and attaches them on every online CPU.
    pub fn load(opts: &LoadOptions) -> Result<Programs, LoadError> {
        probe_kernel(&opts.btf_path)?;
        // NB: `EbpfLoader::new()` always parses the default BTF itself (~5 MB, ~15 ms); parse
        // again only for another path. (That is also why the fork and exit programs are raw
        // tracepoints, which need no `&Btf` of ours, rather than tp_btf.)
        let custom_btf = if opts.btf_path == Path::new(DEFAULT_BTF_PATH) {
            None
        } else {
            Some(
                Btf::parse_file(&opts.btf_path, aya::Endianness::default()).map_err(|source| {
                    LoadError::BadBtf {
                        path: opts.btf_path.clone(),
                        source,
                    }
                })?,
            )
        };
        let follow: u32 = opts.follow_children.into();
        let (guard_exec, guard_uid, guard_gid, guard_caps) = crate::preflight::exec_guard();
        let wakeup_bytes = u64::from(opts.ring_buffer_size / 2);
        let stack_copy_bytes = opts
            .stack_copy_bytes
            .min(profiler_common::MAX_STACK_COPY as u32)
            & !7;
        // The scratch map is indexed by CPU number (bpf_get_smp_processor_id).
        let cpus = aya::util::nr_cpus()
            .map_err(|(what, e)| LoadError::Aya {
                what: "count the possible CPUs",
                detail: format!("{what}: {e}"),
            })?
            .max(1) as u32;
        // The kernel counts the programs' run time only while someone holds statistics on; the
        // counters cost two clock reads per run. Refused without CAP_SYS_ADMIN: then the
        // summary has no in-kernel figure (unless the sysctl has them on anyway).
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        let mut loader = EbpfLoader::new();
        if let Some(btf) = &custom_btf {
            loader.btf(Some(btf));
        }
        let (offcpu_period_ns, offcpu_min_ns) = opts.off_cpu.map_or((1_000_000_000, 0), |o| {
            (o.period_ns.clamp(1, 1_000_000_000), o.min_ns)
        });
        let offcpu_runnable = u32::from(opts.off_cpu.is_some_and(|o| o.runnable));
        let offcpu_enabled = u32::from(opts.off_cpu.is_some());
        let alloc_rate = opts.alloc.map_or(DEFAULT_ALLOC_RATE, |a| a.rate.max(1));
        let alloc_heap = u32::from(opts.alloc.is_some_and(|a| a.heap));
        if opts.alloc.is_none() {
            // aya makes every map of the object: without an allocation event no program uses
            // these, made with one entry each rather than preallocated (about 7 MB zeroed).
            for name in ALLOC_ONLY_MAPS {
                loader.map_max_entries(name, 1);
            }
        }
        let mut ebpf = loader
            // The off-CPU state is task storage, which aya creates but has no wrapper for; only
            // the BPF programs use it.
            .allow_unsupported_maps()
            .override_global("follow_children", &follow, true)
            .override_global("guard_exec", &guard_exec, true)
            .override_global("guard_uid", &guard_uid, true)
            .override_global("guard_gid", &guard_gid, true)
            .override_global("guard_caps", &guard_caps, true)
            .override_global("wakeup_bytes", &wakeup_bytes, true)
            .override_global("stack_copy_bytes", &stack_copy_bytes, true)
            .override_global("offcpu_period_ns", &offcpu_period_ns, true)
            .override_global("offcpu_min_ns", &offcpu_min_ns, true)
            .override_global("offcpu_runnable", &offcpu_runnable, true)
            .override_global("offcpu_enabled", &offcpu_enabled, true)
            .override_global("alloc_rate", &alloc_rate, true)
            .override_global("alloc_heap", &alloc_heap, true)
            .map_max_entries("samples", opts.ring_buffer_size)
            // Three scratches per CPU: the timer sample's, the off-CPU and the allocation ones;
            // then one of the task iterator's.
            .map_max_entries("scratch", SCRATCH_SLOTS * cpus + 1)
            // The task iterator's (`spanprof dump`), after the CPUs'.
            .override_global("dump_scratch_key", &(SCRATCH_SLOTS * cpus), true)
            .load(EBPF_OBJECT)
            .map_err(aya_err("load the eBPF programs"))?;

        let sampler: &mut PerfEvent = ebpf
            .program_mut("on_cpu_sample")
            .expect("on_cpu_sample is in the object")
            .try_into()
            .map_err(aya_err("find the sampling program"))?;
        sampler
            .load()
            .map_err(aya_err("load the sampling program"))?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| LoadError::Aya {
            what: "list online CPUs",
            detail: format!("{what}: {e}"),
        })?;
        let period_ns = 1_000_000_000 / opts.frequency.max(1);
        for cpu in cpus.into_iter().filter(|_| opts.cpu) {
            sampler
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Period(period_ns),
                    false,
                )
                .map_err(aya_err("attach the sampler to a CPU's cpu-clock event"))?;
        }

        let fork: &mut RawTracePoint = ebpf
            .program_mut("on_fork")
            .expect("on_fork is in the object")
            .try_into()
            .map_err(aya_err("find the fork program"))?;
        fork.load()
            .map_err(aya_err("load the fork-following program"))?;
        if opts.follow_children {
            fork.attach("sched_process_fork")
                .map_err(aya_err("attach to sched_process_fork"))?;
        }
        let exit: &mut RawTracePoint = ebpf
            .program_mut("on_process_exit")
            .expect("on_process_exit is in the object")
            .try_into()
            .map_err(aya_err("find the exit program"))?;
        exit.load().map_err(aya_err("load the exit program"))?;
        exit.attach("sched_process_exit")
            .map_err(aya_err("attach to sched_process_exit"))?;
        let exec: &mut RawTracePoint = ebpf
            .program_mut("on_exec")
            .expect("on_exec is in the object")
            .try_into()
            .map_err(aya_err("find the exec program"))?;
        exec.load().map_err(aya_err("load the exec program"))?;
        exec.attach("sched_process_exec")
            .map_err(aya_err("attach to sched_process_exec"))?;

        if opts.off_cpu.is_some() {
            // tp_btf programs need the kernel's BTF for their attach point.
            let btf = match custom_btf {
                Some(btf) => btf,
                None => Btf::from_sys_fs().map_err(|source| LoadError::BadBtf {
                    path: PathBuf::from(DEFAULT_BTF_PATH),
                    source,
                })?,
            };
            for (name, tracepoint, what) in [
                ("on_switch", "sched_switch", "the off-CPU switch program"),
                (
                    "on_sys_exit",
                    "sys_exit",
                    "the off-CPU system call exit program",
                ),
            ] {
                let program: &mut BtfTracePoint = ebpf
                    .program_mut(name)
                    .expect("off-CPU programs are in the object")
                    .try_into()
                    .map_err(aya_err("find an off-CPU program"))?;
                program.load(tracepoint, &btf).map_err(aya_err(what))?;
                program.attach().map_err(aya_err(what))?;
            }
        }

        let mut alloc_live = None;
        if opts.alloc.is_some() {
            let mut gaps: Array<&mut MapData, u64> =
                Array::try_from(ebpf.map_mut("alloc_gaps").expect("alloc_gaps map"))
                    .map_err(aya_err("open the allocation gap table"))?;
            for (i, gap) in alloc_gaps(alloc_rate, ALLOC_GAPS).into_iter().enumerate() {
                gaps.set(i as u32, gap, 0)
                    .map_err(aya_err("fill the allocation gap table"))?;
            }
            for name in ALLOC_PROGRAMS {
                let program: &mut UProbe = ebpf
                    .program_mut(name)
                    .expect("allocation programs are in the object")
                    .try_into()
                    .map_err(aya_err("find an allocation program"))?;
                program
                    .load()
                    .map_err(aya_err("load an allocation program"))?;
            }
            alloc_live = Some(
                HashMap::try_from(ebpf.take_map("alloc_live").expect("alloc_live map"))
                    .map_err(aya_err("open the live allocation table"))?,
            );
        }

        let samples = RingBuf::try_from(ebpf.take_map("samples").expect("samples map"))
            .map_err(aya_err("open the sample ring buffer"))?;
        let targets = HashMap::try_from(ebpf.take_map("target_pids").expect("target_pids map"))
            .map_err(aya_err("open the target map"))?;
        let py_procs = HashMap::try_from(ebpf.take_map("py_procs").expect("py_procs map"))
            .map_err(aya_err("open the python process map"))?;
        let span_procs = HashMap::try_from(ebpf.take_map("span_procs").expect("span_procs map"))
            .map_err(aya_err("open the span context map"))?;
        let stack_copy_sizes = HashMap::try_from(
            ebpf.take_map("stack_copy_sizes")
                .expect("stack_copy_sizes map"),
        )
        .map_err(aya_err("open the stack copy size map"))?;
        let errors = PerCpuArray::try_from(ebpf.take_map("errors").expect("errors map"))
            .map_err(aya_err("open the error counters"))?;
        Ok(Programs {
            ebpf,
            alloc: opts.alloc,
            probed: Default::default(),
            alloc_live,
            samples,
            targets,
            py_procs,
            span_procs,
            stack_copy_sizes,
            errors,
            stats,
            btf_path: opts.btf_path.clone(),
        })
    }

    /// The in-kernel run time of the loaded programs so far; `None` when the kernel does not
    /// count it (statistics could not be enabled).
    pub fn kernel_time(&self) -> Option<KernelTime> {
        if self.stats.is_none() && !stats_enabled_by_sysctl() {
            return None;
        }
        let mut t = KernelTime::default();
        for (name, program) in self.ebpf.programs() {
            // NB: a program of the object that was not loaded (an event not asked for) has no
            // info.
            let Ok(info) = program.info() else { continue };
            let ns = u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
            t.total_ns = t.total_ns.saturating_add(ns);
            t.total_runs = t.total_runs.saturating_add(info.run_count());
            if name == "on_cpu_sample" {
                t.sampling_ns = ns;
                t.sampling_runs = info.run_count();
            }
        }
        Some(t)
    }

    /// Adds a process the user named to the profiled set.
    pub fn add_target(&mut self, pid: u32) -> Result<(), LoadError> {
        let value = Target {
            flags: TARGET_EXPLICIT,
            parent_tgid: 0,
        };
        self.targets
            .insert(pid, value, 0)
            .map_err(aya_err("add a process to the target map"))
    }

    /// Removes a process (that exited) from the profiled set; absent pids are fine.
    pub fn remove_target(&mut self, pid: u32) {
        // NB: ENOENT when the process was never there or was removed already.
        let _ = self.targets.remove(&pid);
    }

    /// Tells the BPF walker where a CPython process keeps its interpreter.
    pub fn set_python(&mut self, pid: u32, value: &PyProc) -> Result<(), LoadError> {
        self.py_procs
            .insert(pid, *value, 0)
            .map_err(aya_err("add a process to the python map"))
    }

    /// Tells the BPF program where a process keeps its threads' span contexts (a CPython's
    /// objects, or a thread context the process publishes).
    pub fn set_spans(&mut self, pid: u32, value: &SpanProc) -> Result<(), LoadError> {
        self.span_procs
            .insert(pid, *value, 0)
            .map_err(aya_err("add a process to the span context map"))
    }

    /// Whether a process is in the profiled set (a target, or a child the kernel added).
    pub fn is_target(&self, pid: u32) -> bool {
        self.targets.get(&pid, 0).is_ok()
    }

    /// Sets how many bytes of user stack the kernel copies for a process (`--unwind dwarf`).
    pub fn set_stack_copy(&mut self, pid: u32, bytes: u32) -> Result<(), LoadError> {
        self.stack_copy_sizes
            .insert(pid, bytes, 0)
            .map_err(aya_err("set a process's stack copy size"))
    }

    /// Whether any process is still in the profiled set (targets and the children the kernel
    /// added; the kernel removes each when it exits).
    pub fn has_targets(&self) -> bool {
        self.targets.keys().next().is_some()
    }

    /// How many processes are in the target set (explicit ones and their children).
    pub fn target_count(&self) -> usize {
        self.targets.keys().count()
    }

    /// Empties the target set (the daemon's scope changed).
    pub fn clear_targets(&mut self) {
        let pids: Vec<u32> = self.targets.keys().filter_map(Result::ok).collect();
        for pid in pids {
            let _ = self.targets.remove(&pid);
        }
    }

    /// The processes in the profiled set now.
    pub fn target_pids(&self) -> Vec<u32> {
        self.targets.keys().filter_map(Result::ok).collect()
    }

    /// Puts the allocation probes on the C library at `module` (a path the calling process can
    /// open, e.g. through `/proc/PID/root`) for every process that maps it: the BPF programs
    /// skip processes that are not targets. (A probe scoped to one process fires for its main
    /// thread only.) A module already probed is skipped.
    /// `name` is the library as the process maps it, for messages (`module` may be a
    /// `/proc/self/fd/N` path to the open file).
    pub fn attach_allocator(&mut self, module: &Path, name: &str) -> Result<(), LoadError> {
        let Some(alloc) = self.alloc else {
            return Ok(());
        };
        if !self.first_probe_of(module, name)? {
            return Ok(());
        }
        let heap: &[(&str, &str, u64)] = if alloc.heap { LIBC_HEAP_PROBES } else { &[] };
        let probes: Vec<(&str, &str, u64)> = LIBC_PROBES.iter().chain(heap).copied().collect();
        let symbols: Vec<&str> = probes.iter().map(|&(_, symbol, _)| symbol).collect();
        let (heads, text_end) = symbolizer::symbol_addresses(module, &symbols)
            .unwrap_or_else(|| (vec![None; symbols.len()], 0));
        let mut placed = std::collections::HashSet::new();
        for (&(program, symbol, kind), head) in probes.iter().zip(&heads) {
            let offset = head
                .as_ref()
                .map_or(0, |head| crate::probe_site::probe_offset(&head.code));
            let site = head.as_ref().map(|head| head.address + offset);
            let cookie = match (kind, site) {
                (0, _) => None,
                // mmap's probe tells the library's own calls (malloc's chunks, thread stacks)
                // from the program's by the library's code range; without it, it would count
                // malloc's large chunks twice: no mmap probe then.
                (ALLOC_MMAP, Some(at)) if at < 1 << 30 && text_end < 1 << 30 && text_end > 0 => {
                    Some(kind << 60 | at << 30 | text_end)
                }
                (ALLOC_MMAP, _) => {
                    eprintln!(
                        "spanprof: warning: {name}: mmap or the code's end not found: anonymous \
                         mappings (CPython's small-object arenas) are not counted"
                    );
                    continue;
                }
                _ => Some(kind << 60),
            };
            self.attach_probe(
                (module, name),
                (program, symbol),
                head.as_ref(),
                cookie,
                &mut placed,
            )?;
        }
        Ok(())
    }

    /// Puts the probes of CPython's object allocator (`--python-allocators`) on the interpreter
    /// module `module` (libpython or the executable), as [`Programs::attach_allocator`] does on
    /// the C library. Returns whether the allocator is probed: `false` when `--python-allocators`
    /// was not asked for, or when the module's symbol table lacks pymalloc's functions (a
    /// stripped build), whose small objects are then seen through their arenas only.
    /// `minor` is the interpreter's 3.x version: 3.8 inlines `realloc(NULL, n)`, and the arena
    /// size is 256 KiB up to 3.9, 1 MiB from 3.10 (3.11+ map their frame stacks with the same
    /// function, which stay allocations).
    pub fn attach_python_allocator(
        &mut self,
        module: &Path,
        name: &str,
        minor: u8,
    ) -> Result<bool, LoadError> {
        let Some(alloc) = self.alloc.filter(|a| a.python) else {
            return Ok(false);
        };
        let symbols = [
            "_PyObject_Malloc",
            "_PyObject_Calloc",
            "_PyObject_Realloc",
            "_PyObject_Free",
            "_PyObject_ArenaMmap",
            "_PyMem_ArenaAlloc",
        ];
        let Some((heads, _)) = symbolizer::symbol_addresses(module, &symbols) else {
            return Ok(false);
        };
        let [Some(malloc), Some(calloc), Some(realloc), Some(free), ..] = &heads[..] else {
            return Ok(false);
        };
        // Its arenas must not count besides their objects: 3.8-3.11 and 3.12+ name it apart.
        let Some((arena_symbol, arena)) = symbols[4..]
            .iter()
            .zip(&heads[4..])
            .find_map(|(s, h)| Some((*s, h.as_ref()?)))
        else {
            return Ok(false);
        };
        if !self.first_probe_of(module, name)? {
            return Ok(true);
        }
        // A call from inside _PyObject_Realloc (3.13 moves a block with a call, 3.11 inlines
        // it) is the block realloc moves, which its own probe counts.
        let site = malloc.address + crate::probe_site::probe_offset(&malloc.code);
        let delta = realloc.address.wrapping_sub(site) as i64;
        let inside = if i32::try_from(delta).is_ok() && realloc.size < 1 << 16 {
            realloc.size << 32 | (delta as u64 & 0xffff_ffff)
        } else {
            0
        };
        let mut probes = vec![
            (
                "on_alloc",
                "_PyObject_Malloc",
                malloc,
                ALLOC_PY_MALLOC << 60 | inside,
            ),
            (
                "on_alloc",
                "_PyObject_Calloc",
                calloc,
                ALLOC_PY_CALLOC << 60,
            ),
            (
                "on_alloc",
                "_PyObject_Realloc",
                realloc,
                ALLOC_PY_REALLOC << 60 | u64::from(minor <= 8),
            ),
            // After the object probes: its failure leaves every arena counted besides them.
            (
                "on_alloc",
                arena_symbol,
                arena,
                ALLOC_PY_ARENA << 60 | if minor <= 9 { 256 << 10 } else { 1 << 20 },
            ),
        ];
        if alloc.heap {
            probes.extend([
                ("on_free", "_PyObject_Free", free, ALLOC_PY_FREE << 60),
                ("on_alloc_return", "_PyObject_Malloc", malloc, 0),
                ("on_alloc_return", "_PyObject_Calloc", calloc, 0),
                ("on_alloc_return", "_PyObject_Realloc", realloc, 0),
            ]);
        }
        let mut placed = std::collections::HashSet::new();
        for (program, symbol, head, cookie) in probes {
            let cookie = (cookie != 0).then_some(cookie);
            self.attach_probe(
                (module, name),
                (program, symbol),
                Some(head),
                cookie,
                &mut placed,
            )?;
        }
        Ok(true)
    }

    /// Whether `module` is not probed yet (and is from now on).
    fn first_probe_of(&mut self, module: &Path, name: &str) -> Result<bool, LoadError> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(module).map_err(|e| LoadError::Aya {
            what: "open a module to probe",
            detail: format!("{name}: {e}"),
        })?;
        Ok(self.probed.insert((meta.dev(), meta.ino())))
    }

    /// Attaches allocation program `program` to `symbol` of `module` (`head`: where it is,
    /// when known), with `cookie`. One probe per program and address: glibc's memalign and
    /// aligned_alloc are one function, whose two probes would both fire on each call.
    fn attach_probe(
        &mut self,
        (module, name): (&Path, &str),
        (program, symbol): (&str, &str),
        head: Option<&symbolizer::FunctionHead>,
        cookie: Option<u64>,
        placed: &mut std::collections::HashSet<(String, u64)>,
    ) -> Result<(), LoadError> {
        if let Some(head) = head {
            if !placed.insert((program.to_owned(), head.address)) {
                return Ok(());
            }
        }
        // Past a first instruction the kernel would single-step (glibc's `free`). A return
        // probe goes at the same place as the entry's: the return address is still at the
        // stack pointer there, and one breakpoint serves both (the entry program reads `[sp]`
        // before the kernel replaces it with the return trampoline).
        let offset = head.map_or(0, |head| crate::probe_site::probe_offset(&head.code));
        let uprobe: &mut UProbe = self
            .ebpf
            .program_mut(program)
            .expect("allocation programs are in the object")
            .try_into()
            .map_err(aya_err("find an allocation program"))?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::SymbolOffset(symbol, offset),
            cookie,
        };
        uprobe
            .attach(point, module, UProbeScope::AllProcesses)
            .map_err(|e| {
                let detail = one_line(&e);
                // Measured on 6.18: a uprobe's perf_event_open wants CAP_SYS_ADMIN, where
                // CAP_PERFMON is enough for the other events.
                let hint =
                    if detail.contains("Permission denied") && !crate::preflight::has_sys_admin() {
                        " (missing capability CAP_SYS_ADMIN: this kernel attaches uprobes, which \
                     --event alloc and heap need, only with it)"
                    } else {
                        ""
                    };
                LoadError::Aya {
                    what: "attach the allocation probes",
                    detail: format!("{name} ({symbol}): {detail}{hint}"),
                }
            })?;
        Ok(())
    }

    /// The off-CPU state the kernel keeps of each thread of process `pid` (threads that blocked,
    /// or were preempted with `--event wall`, during the session), read by pidfd; `None` for a
    /// thread without one. Empty when off-CPU time is not recorded or the process is gone.
    pub fn offcpu_threads(&self, pid: u32) -> Vec<(u32, ThreadState)> {
        let Some(map_fd) = self.offcpu_map_fd() else {
            return Vec::new();
        };
        threads_of(pid)
            .into_iter()
            .map(|tid| (tid, task_storage(map_fd, tid, None)))
            .collect()
    }

    /// Starts an off-CPU interval now for every thread of `pid` that is asleep (`S` or `D`):
    /// blocked since before the session, its time from here to its wake-up is then sampled like
    /// any other (with the user registers unknown: the system call it returns from is taken as
    /// the one it blocked in). Returns the threads started.
    pub fn start_blocked_threads(&self, pid: u32) -> u32 {
        let Some(map_fd) = self.offcpu_map_fd() else {
            return 0;
        };
        let now = monotonic_ns();
        let mut started = 0;
        for tid in threads_of(pid) {
            if !thread_sleeping(pid, tid) {
                continue;
            }
            // One that blocked since the programs were attached has its interval already.
            if matches!(task_storage(map_fd, tid, None), ThreadState::Known(t) if t.off_ts != 0) {
                continue;
            }
            // SAFETY: OffCpuTask is integers only: all zeroes is a valid value.
            let mut value: OffCpuTask = unsafe { std::mem::zeroed() };
            value.off_ts = now;
            if matches!(
                task_storage(map_fd, tid, Some(&value)),
                ThreadState::Known(_)
            ) {
                started += 1;
            }
        }
        started
    }

    fn offcpu_map_fd(&self) -> Option<std::os::fd::RawFd> {
        match self.ebpf.map("offcpu_tasks") {
            Some(aya::maps::Map::Unsupported(map)) => Some(map.fd().as_fd().as_raw_fd()),
            _ => None,
        }
    }

    /// The sampled allocations not freed so far (`--event heap`), by address.
    pub fn live_allocations(&self) -> Vec<(AllocKey, LiveAlloc)> {
        self.alloc_live
            .as_ref()
            .map(|m| m.iter().filter_map(Result::ok).collect())
            .unwrap_or_default()
    }

    /// Samples lost so far because the ring buffer was full, summed over CPUs.
    pub fn lost_samples(&self) -> u64 {
        self.error_count(ErrorCode::RingbufFull)
    }

    fn error_count(&self, code: ErrorCode) -> u64 {
        self.errors
            .get(&(code as u32), 0)
            .map(|v| v.iter().sum())
            .unwrap_or(0)
    }

    /// The kernel-side counters (errors, and [`ErrorCode::RunnableNs`]), summed over CPUs.
    pub fn error_counts(&self) -> [u64; ERROR_COUNT as usize] {
        let mut out = [0u64; ERROR_COUNT as usize];
        for code in ErrorCode::ALL.into_iter().chain([ErrorCode::RunnableNs]) {
            out[code as usize] = self.error_count(code);
        }
        out
    }
}

/// The Python stage hands the offsets of the processes it finds to the maps through this.
impl KernelMaps for Programs {
    type Error = LoadError;

    fn set_python(&mut self, pid: u32, value: &PyProc) -> Result<(), LoadError> {
        Programs::set_python(self, pid, value)
    }

    fn set_spans(&mut self, pid: u32, value: &SpanProc) -> Result<(), LoadError> {
        Programs::set_spans(self, pid, value)
    }
}
