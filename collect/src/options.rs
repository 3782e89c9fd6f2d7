//! What a collection samples, and how: one type for `spanprof profile`'s flags, the daemon's
//! `[sampling]` table and `spanprof verify`, with its defaults written once ([`Options::default`])
//! and one validation ([`Options::validate`]). The events are parsed once ([`EventSet::parse`]);
//! each front end words the errors its own way (a flag, a TOML key).

use std::path::PathBuf;
use std::time::Duration;

use profiler_common::{MAX_PY_FRAMES, MAX_STACK_COPY, MAX_STACK_DEPTH, PY_FRAME_SIZE};

use crate::profile::{Events, DEFAULT_ALLOC_RATE};

/// Samples per second per CPU of a session (not 100, to avoid lockstep with timers).
pub const DEFAULT_FREQUENCY: u64 = 99;
/// Ring buffer size: a symbolization (up to about a second on a busy host) must not fill it.
pub const DEFAULT_RING_BUFFER_BYTES: u32 = 16 << 20;
/// Bytes of user stack copied per sample with `--unwind dwarf`.
pub const DEFAULT_STACK_COPY: u32 = 16384;

/// Bytes of a sample record besides its stack copy, at most (header, frames, Python frames,
/// span context).
pub const SAMPLE_RECORD_MAX: u32 = (std::mem::size_of::<profiler_common::SampleHeader>()
    + 2 * MAX_STACK_DEPTH * 8
    + MAX_PY_FRAMES * PY_FRAME_SIZE
    + std::mem::size_of::<profiler_common::SpanRecord>()) as u32;

/// Memory events: what a memory profile holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Sampled allocations (`alloc`).
    Alloc,
    /// Sampled allocations not freed at the end (`heap`).
    Heap,
    /// Both.
    AllocAndHeap,
}

/// What a collection samples: time or memory, never both (their weights are other units), and
/// never nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSet {
    /// On-CPU samples (`cpu`, the default).
    Cpu,
    /// Off-CPU intervals, with their reason (`offcpu`).
    OffCpu,
    /// Both, as two sample types (`cpu,offcpu`).
    CpuAndOffCpu,
    /// Both as one wall-clock profile, with the time waiting runnable (`wall`).
    Wall,
    /// A memory profile (`alloc`, `heap`).
    Memory(Memory),
}

/// Why a list of event names makes no [`EventSet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventError {
    /// A name that is none of cpu, offcpu (off-cpu), wall, alloc, heap.
    Unknown(String),
    /// Memory and time events together.
    Mixed,
    /// No name at all.
    Empty,
}

impl EventSet {
    /// The set that `names` (e.g. `["cpu", "offcpu"]`) ask for; `wall` takes in cpu and offcpu.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<EventSet, EventError> {
        let (mut cpu, mut off_cpu, mut wall, mut alloc, mut heap) =
            (false, false, false, false, false);
        for name in names {
            match name.trim() {
                "cpu" => cpu = true,
                "offcpu" | "off-cpu" => off_cpu = true,
                "wall" => wall = true,
                "alloc" => alloc = true,
                "heap" => heap = true,
                other => return Err(EventError::Unknown(other.to_string())),
            }
        }
        let memory = match (alloc, heap) {
            (true, true) => Some(Memory::AllocAndHeap),
            (true, false) => Some(Memory::Alloc),
            (false, true) => Some(Memory::Heap),
            (false, false) => None,
        };
        match (memory, wall, cpu, off_cpu) {
            (Some(_), true, _, _) | (Some(_), _, true, _) | (Some(_), _, _, true) => {
                Err(EventError::Mixed)
            }
            (Some(m), ..) => Ok(EventSet::Memory(m)),
            (None, true, _, _) => Ok(EventSet::Wall),
            (None, false, true, true) => Ok(EventSet::CpuAndOffCpu),
            (None, false, true, false) => Ok(EventSet::Cpu),
            (None, false, false, true) => Ok(EventSet::OffCpu),
            (None, false, false, false) => Err(EventError::Empty),
        }
    }

    /// On-CPU samples are taken.
    pub fn cpu(self) -> bool {
        matches!(
            self,
            EventSet::Cpu | EventSet::CpuAndOffCpu | EventSet::Wall
        )
    }

    /// Off-CPU intervals are recorded.
    pub fn off_cpu(self) -> bool {
        matches!(
            self,
            EventSet::OffCpu | EventSet::CpuAndOffCpu | EventSet::Wall
        )
    }

    /// One wall-clock profile (`wall`).
    pub fn wall(self) -> bool {
        self == EventSet::Wall
    }

    /// Sampled allocations are counted (`alloc`).
    pub fn alloc(self) -> bool {
        matches!(self, EventSet::Memory(Memory::Alloc | Memory::AllocAndHeap))
    }

    /// Sampled allocations are tracked to their free (`heap`).
    pub fn heap(self) -> bool {
        matches!(self, EventSet::Memory(Memory::Heap | Memory::AllocAndHeap))
    }

    /// A memory profile: weights are bytes.
    pub fn in_bytes(self) -> bool {
        matches!(self, EventSet::Memory(_))
    }

    /// The events as the profile's metadata states them.
    pub fn profile_events(self, alloc_rate: u64) -> Events {
        Events {
            cpu: self.cpu(),
            off_cpu: self.off_cpu(),
            wall: self.wall(),
            alloc: self.alloc(),
            heap: self.heap(),
            alloc_rate,
        }
    }

    /// The names that ask for this set, for logs: `cpu`, `cpu,offcpu`, `wall`, `alloc` …
    pub fn name(self) -> &'static str {
        match self {
            EventSet::Cpu => "cpu",
            EventSet::OffCpu => "offcpu",
            EventSet::CpuAndOffCpu => "cpu,offcpu",
            EventSet::Wall => "wall",
            EventSet::Memory(Memory::Alloc) => "alloc",
            EventSet::Memory(Memory::Heap) => "heap",
            EventSet::Memory(Memory::AllocAndHeap) => "alloc,heap",
        }
    }
}

/// How native user stacks are unwound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unwind {
    /// The kernel copies this many bytes of user stack per sample; spanprof unwinds them with
    /// the modules' unwind tables (`--unwind dwarf`, `--stack-copy`).
    Dwarf {
        /// Bytes copied (8 to [`MAX_STACK_COPY`]; rounded up to a multiple of 8 when loaded).
        stack_copy: u32,
    },
    /// The kernel follows frame pointers (`--unwind fp`).
    FramePointers,
}

impl Unwind {
    /// `dwarf` (with `stack_copy` bytes) or `fp`; `None` for another name.
    pub fn from_name(name: &str, stack_copy: u32) -> Option<Unwind> {
        match name {
            "dwarf" => Some(Unwind::Dwarf { stack_copy }),
            "fp" => Some(Unwind::FramePointers),
            _ => None,
        }
    }

    /// Bytes the kernel copies per sample, a multiple of 8; 0 for frame pointers.
    pub fn stack_copy_bytes(self) -> u32 {
        match self {
            Unwind::Dwarf { stack_copy } => stack_copy.next_multiple_of(8),
            Unwind::FramePointers => 0,
        }
    }
}

/// What a collection samples, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Samples per second per CPU; off-CPU intervals are sampled at the same rate of time.
    /// Default [`DEFAULT_FREQUENCY`] (`spanprof daemon` has its own, 19).
    pub frequency: u64,
    /// What to sample. Default [`EventSet::Cpu`].
    pub events: EventSet,
    /// Bytes between two sampled allocations on average (1: every allocation), with memory
    /// events. Default [`DEFAULT_ALLOC_RATE`].
    pub alloc_rate: u64,
    /// With memory events, also probe CPython's object allocator (pymalloc) in the Python
    /// processes whose symbol table has it, so small objects are charged to the code that
    /// allocates them rather than seen through their arenas. Default off.
    pub python_allocators: bool,
    /// Off-CPU intervals shorter than this are not counted. Default
    /// [`crate::offcpu::DEFAULT_MIN`] (5 µs).
    pub offcpu_min: Duration,
    /// Ring buffer size in bytes, a power of two of at least 4096. Default
    /// [`DEFAULT_RING_BUFFER_BYTES`] (16 MiB).
    pub ring_buffer_size: u32,
    /// How user stacks are unwound. Default `dwarf` with [`DEFAULT_STACK_COPY`] bytes.
    pub unwind: Unwind,
    /// Read the span context (OpenTelemetry, OSProfiler) of Python threads. Default on.
    pub spans: bool,
    /// Children of the targets become targets, in the kernel. Default off (on for a command
    /// and for the daemon).
    pub follow_children: bool,
    /// Kernel BTF file. Default `$SPANPROF_BTF_PATH`, else `/sys/kernel/btf/vmlinux`.
    pub btf_path: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            frequency: DEFAULT_FREQUENCY,
            events: EventSet::Cpu,
            alloc_rate: DEFAULT_ALLOC_RATE,
            python_allocators: false,
            offcpu_min: humantime::parse_duration(crate::offcpu::DEFAULT_MIN)
                .expect("a valid default"),
            ring_buffer_size: DEFAULT_RING_BUFFER_BYTES,
            unwind: Unwind::Dwarf {
                stack_copy: DEFAULT_STACK_COPY,
            },
            spans: true,
            follow_children: false,
            btf_path: default_btf_path(),
        }
    }
}

/// `$SPANPROF_BTF_PATH`, else [`crate::bpf::DEFAULT_BTF_PATH`]. Not taken from the environment
/// of a process given privileges its user lacks (AT_SECURE: the binary's file capabilities):
/// the programs' field offsets come from this file.
pub fn default_btf_path() -> PathBuf {
    // SAFETY: getauxval reads the auxiliary vector; it has no preconditions.
    let secure = unsafe { libc::getauxval(libc::AT_SECURE) != 0 };
    std::env::var_os("SPANPROF_BTF_PATH")
        .filter(|_| !secure)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(crate::bpf::DEFAULT_BTF_PATH))
}

/// A value of [`Options`] out of its range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// The frequency is out of 1 to the front end's maximum.
    Frequency,
    /// The ring buffer size is no power of two of at least 4096.
    RingBufferSize,
    /// The stack copy is out of 8 to [`MAX_STACK_COPY`].
    StackCopy,
    /// The ring buffer cannot hold 8 records of the largest size; it needs this many bytes.
    RingTooSmallForCopy { record: u32, needed: u32 },
    /// `alloc_rate` is 0.
    AllocRate,
}

impl Options {
    /// Checks every value against its range and reports the first out of range (the front
    /// ends parse names, `--unwind` and the events, before); `max_frequency` is the front
    /// end's (10000 Hz for a session, 1000 for the daemon).
    pub fn validate(&self, max_frequency: u64) -> Result<(), Invalid> {
        if !(1..=max_frequency).contains(&self.frequency) {
            return Err(Invalid::Frequency);
        }
        if self.ring_buffer_size < 4096 || !self.ring_buffer_size.is_power_of_two() {
            return Err(Invalid::RingBufferSize);
        }
        if let Unwind::Dwarf { stack_copy } = self.unwind {
            if !(8..=MAX_STACK_COPY as u32).contains(&stack_copy) {
                return Err(Invalid::StackCopy);
            }
            // A ring that cannot hold a few records of the largest size loses every sample (a
            // process whose stacks the copy cuts short gets the largest copy).
            let record = SAMPLE_RECORD_MAX + MAX_STACK_COPY as u32;
            if self.ring_buffer_size < 8 * record {
                return Err(Invalid::RingTooSmallForCopy {
                    record,
                    needed: (8 * record).next_power_of_two(),
                });
            }
        }
        if self.alloc_rate == 0 {
            return Err(Invalid::AllocRate);
        }
        Ok(())
    }

    /// The events as the profile's metadata states them.
    pub fn profile_events(&self) -> Events {
        self.events.profile_events(self.alloc_rate)
    }

    /// The sampling frequency a profile states: none (0) for a memory profile.
    pub fn profile_frequency(&self) -> u64 {
        if self.events.in_bytes() {
            0
        } else {
            self.frequency
        }
    }

    /// `offcpu_min` in nanoseconds.
    pub fn offcpu_min_ns(&self) -> u64 {
        u64::try_from(self.offcpu_min.as_nanos()).unwrap_or(u64::MAX)
    }

    /// The options the BPF programs are loaded with.
    pub(crate) fn load_options(&self) -> crate::bpf::LoadOptions {
        crate::bpf::LoadOptions {
            frequency: self.frequency,
            follow_children: self.follow_children,
            ring_buffer_size: self.ring_buffer_size,
            btf_path: self.btf_path.clone(),
            stack_copy_bytes: self.unwind.stack_copy_bytes(),
            cpu: self.events.cpu(),
            off_cpu: self.events.off_cpu().then_some(crate::bpf::OffCpuOptions {
                period_ns: 1_000_000_000 / self.frequency.max(1),
                min_ns: self.offcpu_min_ns(),
                runnable: self.events.wall(),
            }),
            alloc: self.events.in_bytes().then_some(crate::bpf::AllocOptions {
                rate: self.alloc_rate,
                heap: self.events.heap(),
                python: self.python_allocators,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_to_valid_sets_only() {
        let p = |names: &[&str]| EventSet::parse(names.iter().copied());
        assert_eq!(p(&["cpu"]), Ok(EventSet::Cpu));
        assert_eq!(p(&["off-cpu"]), Ok(EventSet::OffCpu));
        assert_eq!(p(&["offcpu", "cpu"]), Ok(EventSet::CpuAndOffCpu));
        assert_eq!(p(&["wall", "cpu"]), Ok(EventSet::Wall));
        assert_eq!(
            p(&["heap", "alloc"]),
            Ok(EventSet::Memory(Memory::AllocAndHeap))
        );
        assert_eq!(p(&["alloc", "wall"]), Err(EventError::Mixed));
        assert_eq!(p(&[]), Err(EventError::Empty));
        assert_eq!(p(&["gpu"]), Err(EventError::Unknown("gpu".into())));
        let wall = EventSet::Wall.profile_events(7);
        assert!(wall.cpu && wall.off_cpu && wall.wall && !wall.alloc && wall.alloc_rate == 7);
        assert!(EventSet::Memory(Memory::Heap).heap() && !EventSet::Memory(Memory::Heap).alloc());
    }

    #[test]
    fn defaults_are_valid_and_ranges_checked() {
        let d = Options::default();
        assert_eq!(d.validate(10_000), Ok(()));
        assert_eq!(d.ring_buffer_size, 16 << 20);
        assert_eq!(d.unwind.stack_copy_bytes(), 16384);
        assert_eq!(d.offcpu_min, Duration::from_micros(5));
        let with = |f: fn(&mut Options)| {
            let mut o = Options::default();
            f(&mut o);
            o.validate(1000)
        };
        assert_eq!(with(|o| o.frequency = 1001), Err(Invalid::Frequency));
        assert_eq!(
            with(|o| o.ring_buffer_size = 5000),
            Err(Invalid::RingBufferSize)
        );
        assert_eq!(
            with(|o| o.unwind = Unwind::Dwarf { stack_copy: 4 }),
            Err(Invalid::StackCopy)
        );
        assert!(matches!(
            with(|o| o.ring_buffer_size = 4096),
            Err(Invalid::RingTooSmallForCopy { .. })
        ));
        assert_eq!(
            with(|o| {
                o.ring_buffer_size = 4096;
                o.unwind = Unwind::FramePointers
            }),
            Ok(())
        );
        assert_eq!(with(|o| o.alloc_rate = 0), Err(Invalid::AllocRate));
        assert_eq!(Unwind::Dwarf { stack_copy: 9 }.stack_copy_bytes(), 16);
    }
}
