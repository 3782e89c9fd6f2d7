//! The collector that `spanprof profile` (`session.rs` of the `spanprof` crate), `spanprof
//! daemon` (`daemon/`) and `spanprof verify` drive: load the programs ([`Collector::load`]),
//! add and discover targets ([`discover`]), tick ([`tick`]: drain, probe new processes,
//! normalize), take a window or stop ([`Collector::stop`]), and measure its own cost
//! ([`Collector::cost_since_mark`]). What it samples, and how, is one [`Options`].
//!
//! The front ends keep only what is theirs: a session its targets, progress and stop
//! conditions; the daemon its scope, windows, export and reloads.
//!
//! Beside the collector: [`bpf`] loads the C programs of `profiler-ebpf/` (compiled by
//! `build.rs`) and owns their maps and ring buffer; [`preflight`](mod@preflight) checks capabilities and the
//! kernel before anything is loaded; [`target_cpu`] measures the profiled processes' CPU time,
//! what the overhead is a share of.

// The modules of the crates below at this crate's root: the modules moved here from the one
// `spanprof` crate keep naming them `crate::python`, `crate::profile`… as before the split.
use spanprof_pipeline::{offcpu, python};
use spanprof_profile::{profile, resource, write};

// Prints that never panic (`profiler_common::stderr_lossy!`): a closed stderr or stdout must
// not end a session before it writes its outputs.
#[allow(unused_macros)]
macro_rules! eprintln { ($($a:tt)*) => { profiler_common::stderr_line_lossy!($($a)*) } }
#[allow(unused_macros)]
macro_rules! eprint { ($($a:tt)*) => { profiler_common::stderr_lossy!($($a)*) } }

pub mod bpf;
pub mod preflight;
pub mod probe_site;
pub mod target_cpu;

pub mod discover;
pub mod options;
pub mod signals;
pub mod tick;

use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use symbolizer::Symbolizer;

use crate::bpf::{KernelTime, Programs};
use crate::profile::Meta;
use crate::python::Python;
use crate::target_cpu::TargetCpu;
use discover::Probes;
pub use options::{EventError, EventSet, Invalid, Memory, Options, Unwind};
use spanprof_pipeline::aggregate::{self, Aggregator};
pub use tick::{Waiter, QUIET_TICK, TICK};

/// A loaded collection: the programs, what finds processes, the aggregate, the symbolizer.
#[derive(Debug)]
pub struct Collector {
    /// The loaded BPF programs and their maps.
    pub programs: Programs,
    /// The CPython processes found, and their frames' names.
    pub python: Python,
    probes: Probes,
    /// Reads the targets' modules at their first sample; symbolizes at the end of a window.
    pub symbolizer: Symbolizer,
    /// The samples counted so far (of this window).
    pub agg: Aggregator,
    /// Stack copy sizes: the default, and the processes given the largest.
    pub copy: StackCopySizes,
    /// The targets' CPU time, from `/proc`.
    pub target_cpu: TargetCpu,
    options: Options,
    /// CPU and kernel time at the last [`Collector::mark`].
    mark: (Duration, Option<KernelTime>),
    /// Until when the loop wakes every [`TICK`] rather than every [`tick::QUIET_TICK`].
    lively_until: Instant,
}

/// Checks that the programs can be loaded here: capabilities, pid namespace.
pub fn preflight() -> Result<()> {
    crate::preflight::check_capabilities()?;
    crate::preflight::check_pid_namespace()?;
    Ok(())
}

impl Collector {
    /// Loads and attaches the programs as `options` say; `aggregate` says what to keep of each
    /// sample (its allocation rate and heap tracking are taken from `options`).
    pub fn load(options: &Options, aggregate: aggregate::Options) -> Result<Collector> {
        let programs = Programs::load(&options.load_options())?;
        let agg = Aggregator::new(aggregate::Options {
            alloc_rate: options.alloc_rate,
            heap: options.events.heap(),
            ..aggregate
        });
        let mut collector = Collector {
            // Allocation probes: for every process that maps the module (the kernel keeps the
            // targets' calls only). A probe for one process would fire for its main thread
            // alone (measured on 6.18: two worker threads' 64 MiB were not seen).
            probes: Probes {
                enabled: options.events.in_bytes(),
                python: options.events.in_bytes() && options.python_allocators,
                unprobed: Default::default(),
            },
            python: Python::new(true, options.spans),
            symbolizer: Symbolizer::new(),
            agg,
            copy: StackCopySizes {
                default: options.unwind.stack_copy_bytes(),
                raised: Vec::new(),
            },
            target_cpu: TargetCpu::new(options.follow_children),
            options: options.clone(),
            mark: (Duration::ZERO, None),
            lively_until: Instant::now() + tick::QUIET_AFTER,
            programs,
        };
        collector.mark();
        Ok(collector)
    }

    /// The options it was loaded with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Marks the start of what [`Collector::cost_since_mark`] measures; returns spanprof's CPU
    /// time so far.
    pub fn mark(&mut self) -> Duration {
        self.mark = (process_cpu_time(), self.programs.kernel_time());
        self.mark.0
    }

    /// Sampling starts now (a session's targets are set up): the cost is measured from here,
    /// and the targets' CPU time (`pids`, and with `follow_children` the children they start)
    /// too. Returns spanprof's CPU time so far.
    pub fn start_sampling(&mut self, pids: &[u32]) -> Duration {
        let cpu = self.mark();
        self.target_cpu = TargetCpu::new(self.options.follow_children);
        for &pid in pids {
            self.target_cpu.add(pid);
        }
        cpu
    }

    /// spanprof's cost since the last mark (which this call moves to now): its CPU time, the
    /// programs' time in the kernel, and the targets' CPU time meanwhile. `setup` and
    /// `records` are the caller's.
    pub fn cost_since_mark(&mut self) -> Overhead {
        let kernel_now = self.programs.kernel_time();
        let cpu_now = process_cpu_time();
        let targets = self.target_cpu.take(&self.programs.target_pids());
        let (cpu_then, kernel_then) = std::mem::replace(&mut self.mark, (cpu_now, kernel_now));
        Overhead {
            setup: Duration::ZERO,
            sampling: cpu_now.saturating_sub(cpu_then),
            cpu_at_end_of_sampling: cpu_now,
            kernel: kernel_now
                .zip(kernel_then)
                .map(|(now, then)| now.since(&then)),
            records: 0,
            targets,
        }
    }

    /// The programs' time in the kernel at the last mark (`None` when the kernel does not
    /// count it).
    pub fn marked_kernel_time(&self) -> Option<KernelTime> {
        self.mark.1
    }

    /// The metadata of a profile of this collection: `target` described, from `start` for
    /// `duration`, with `lost_samples` lost.
    pub fn meta(
        &self,
        target: String,
        start: SystemTime,
        duration: Duration,
        lost_samples: u64,
    ) -> Meta {
        Meta {
            target,
            start,
            duration,
            // A memory profile has no sampling frequency (and its files do not keep one).
            frequency: self.options.profile_frequency(),
            events: self.options.profile_events(),
            lost_samples,
            python: Default::default(),
            host: Some(crate::resource::HostInfo::current()),
            build: Default::default(),
            dropped_labels: Vec::new(),
        }
    }

    /// Stops sampling (the programs are detached) and keeps what symbolization needs.
    pub fn stop(self) -> Stopped {
        drop(self.programs);
        Stopped {
            agg: self.agg,
            symbolizer: self.symbolizer,
            python: self.python,
            copy: self.copy,
        }
    }
}

/// What a stopped collection leaves for symbolization.
#[derive(Debug)]
pub struct Stopped {
    /// The samples counted.
    pub agg: Aggregator,
    /// The modules read while the processes lived.
    pub symbolizer: Symbolizer,
    /// The CPython processes found.
    pub python: Python,
    /// Stack copy sizes.
    pub copy: StackCopySizes,
}

/// The stack copy sizes of a collection: `--stack-copy`, and the processes given the largest.
#[derive(Debug, Clone, Default)]
pub struct StackCopySizes {
    /// Bytes copied per sample by default (0: frame pointers).
    pub default: u32,
    /// Processes raised to [`profiler_common::MAX_STACK_COPY`] because the default truncated
    /// their stacks.
    pub raised: Vec<u32>,
}

/// spanprof's own CPU time (user + system, all its threads), by phase of a session (or over a
/// daemon's window).
#[derive(Debug, Clone, Copy, Default)]
pub struct Overhead {
    /// Checking, loading and attaching the programs, starting the command.
    pub setup: Duration,
    /// The sampling loop: draining, aggregating, normalizing addresses, progress.
    pub sampling: Duration,
    /// The process's CPU time when sampling ended; later phases are measured from here.
    pub cpu_at_end_of_sampling: Duration,
    /// The programs' run time in the kernel while sampling; `None` when the kernel did not
    /// count it (see [`crate::bpf::KernelTime`]).
    pub kernel: Option<KernelTime>,
    /// Records read from the programs while sampling: on-CPU samples, off-CPU intervals,
    /// allocations (the lost ones are in [`Meta::lost_samples`]).
    pub records: u64,
    /// The targets' CPU time while sampling, read from `/proc` ([`crate::target_cpu`]);
    /// `None` when no target could be read.
    pub targets: Option<crate::target_cpu::Measured>,
}

/// This process's CPU time so far (user + system).
pub fn process_cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
