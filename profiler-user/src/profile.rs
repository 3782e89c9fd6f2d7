//! The symbolized, aggregated profile that every output sink reads.
//!
//! One [`Profile`] is built at the end of a session (or from a replayed file later) and handed to
//! each sink in [`crate::output`]. Frames and threads are interned tables; a [`Sample`] points into
//! them by index, so a sink walks small integers instead of strings.

use std::time::{Duration, SystemTime};

/// What kind of code a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A user-space native frame (ELF executable or shared library).
    Native,
    /// A kernel frame.
    Kernel,
    /// A Python frame: `function` is the qualified name, `file` and `line` where it runs.
    Python,
}

/// One symbolized frame, shared by every stack that contains it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Native or kernel.
    pub kind: FrameKind,
    /// Demangled function name, or `None` when the address could not be symbolized.
    pub function: Option<String>,
    /// Path of the module (executable, shared object, `[kernel]`) the address belongs to, if known.
    pub module: Option<String>,
    /// Address normalized to the module: the file offset for ELF files, the absolute address for
    /// the kernel and for addresses that could not be normalized.
    pub address: u64,
    /// Source file of the function, when debug information has it.
    pub file: Option<String>,
    /// Source line of the address, when debug information has it.
    pub line: Option<u32>,
    /// Why the frame has no function name (e.g. "no symbol", "process exited"), when it has none.
    pub unknown_reason: Option<String>,
}

impl Frame {
    /// The name shown in folded stacks and flamegraphs.
    ///
    /// Known functions show their demangled name; unknown ones `[unknown] (libfoo.so+0x1234)` with
    /// the module's base name and the normalized address. Kernel frames end in `_[k]`, the
    /// convention of perf and inferno. Python frames read `qualname (file.py:LINE)`, with the
    /// file's base name, or `qualname (file.py)` without a line (`--no-lines`).
    pub fn display_name(&self) -> String {
        match self.kind {
            FrameKind::Kernel => format!("{}_[k]", self.base_name()),
            FrameKind::Native => self.base_name(),
            FrameKind::Python => {
                let name = self.base_name();
                let Some(file) = self.file.as_deref() else {
                    return name;
                };
                let file = file.rsplit('/').next().unwrap_or(file);
                match self.line {
                    Some(line) => format!("{name} ({file}:{line})"),
                    None => format!("{name} ({file})"),
                }
            }
        }
    }

    /// The name without the kernel suffix: the function, or `[unknown] (module+0x…)`.
    pub fn base_name(&self) -> String {
        match &self.function {
            Some(f) => f.clone(),
            None => {
                let module = self
                    .module
                    .as_deref()
                    .map(|m| m.rsplit('/').next().unwrap_or(m))
                    .unwrap_or("?");
                format!("[unknown] ({module}+{:#x})", self.address)
            }
        }
    }
}

/// A thread that samples were taken on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Thread {
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name (`comm`) as the kernel reported it in the sample.
    pub name: String,
}

/// One aggregated sample: a distinct (stack, thread) with its count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Indexes into [`Profile::frames`], root (outermost caller) first, leaf last.
    pub frames: Vec<u32>,
    /// Index into [`Profile::threads`].
    pub thread: u32,
    /// Number of perf events that hit this stack on this thread.
    pub count: u64,
}

/// A process that was profiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Process id.
    pub pid: u32,
    /// Executable name: `/proc/PID/comm` when first sampled, else the sampled thread's `comm`.
    pub name: String,
}

/// Facts about the session that produced the profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    /// What was profiled, for titles: e.g. `pid 1234 (python3)` or `./bench --fast`.
    pub target: String,
    /// Wall-clock start of the session.
    pub start: SystemTime,
    /// How long sampling ran.
    pub duration: Duration,
    /// Sampling frequency in Hz; the period of one sample is `1e9 / frequency` nanoseconds.
    pub frequency: u64,
    /// Samples the kernel could not hand over (ring buffer full), never silently dropped.
    pub lost_samples: u64,
    /// What the CPython walker found.
    pub python: PythonStats,
}

/// What the CPython walker found over a session, for the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PythonStats {
    /// CPython processes found.
    pub processes: u32,
    /// Samples of those processes with Python frames (a walk that failed midway included).
    pub with_frames: u64,
    /// Samples of threads without a Python thread state (C threads, no interpreter yet).
    pub no_thread: u64,
    /// Samples whose walk stopped at a failed read (with or without frames before it).
    pub read_failed: u64,
    /// Samples whose Python stack was cut (too deep, a cycle, or a failed read).
    pub truncated: u64,
    /// Processes that looked like Python but could not be profiled as such, one line each.
    pub notes: Vec<String>,
}

impl Meta {
    /// Nanoseconds of CPU time one sample stands for.
    pub fn period_ns(&self) -> u64 {
        1_000_000_000 / self.frequency.max(1)
    }
}

/// A complete on-CPU profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Session facts.
    pub meta: Meta,
    /// Interned frames.
    pub frames: Vec<Frame>,
    /// Interned threads.
    pub threads: Vec<Thread>,
    /// Processes seen (the targets and their children).
    pub processes: Vec<Process>,
    /// Aggregated samples, in a deterministic order.
    pub samples: Vec<Sample>,
}

impl Profile {
    /// Total number of samples.
    pub fn total_samples(&self) -> u64 {
        self.samples.iter().map(|s| s.count).sum()
    }
}
