//! Off-CPU time: why a thread was blocked, from the stack it blocked in.
//!
//! The BPF programs record blocked intervals of profiled threads (`--event offcpu` or `wall`):
//! the time from the switch out of a thread that blocked to its switch back in, sampled without
//! bias (an interval of `d` ns shorter than the period `P` is kept with probability `d / P` and
//! weighs `P`; a longer one weighs `d`), attributed to the kernel stack it blocked in and to the
//! user and Python stacks it returns to. [`classify`] names the reason of each.

/// Why a thread was off CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OffCpuReason {
    /// Sleeping on purpose: `nanosleep`, `time.sleep`, a `select` without file descriptors.
    Sleep,
    /// Waiting for a lock, a semaphore, a condition or another futex.
    Lock,
    /// Waiting for I/O: network, disk, pipes, `poll`/`epoll`/`select` on descriptors.
    Io,
    /// Waiting for CPython's global interpreter lock.
    Gil,
    /// Anything else (page faults, signals, ptrace stops, unknown system calls).
    Other,
}

impl OffCpuReason {
    /// Every reason, in the order summaries list them.
    pub const ALL: [OffCpuReason; 5] = [
        OffCpuReason::Sleep,
        OffCpuReason::Lock,
        OffCpuReason::Io,
        OffCpuReason::Gil,
        OffCpuReason::Other,
    ];

    /// The label value: `sleep`, `lock`, `io`, `gil` or `other`.
    pub fn name(self) -> &'static str {
        match self {
            OffCpuReason::Sleep => "sleep",
            OffCpuReason::Lock => "lock",
            OffCpuReason::Io => "io",
            OffCpuReason::Gil => "gil",
            OffCpuReason::Other => "other",
        }
    }

    /// The inverse of [`OffCpuReason::name`].
    pub fn from_name(name: &str) -> Option<OffCpuReason> {
        OffCpuReason::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The pseudo-frame at the root of an off-CPU stack: `[off-cpu: lock]`.
    pub fn frame_name(self) -> String {
        format!("[off-cpu: {}]", self.name())
    }
}
