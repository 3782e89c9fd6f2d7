//! The `threading.Thread` names of a Python process as user space reads them, and as the kernel
//! read them with samples.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use symbolizer::python::memory::LiveMemory;
use symbolizer::python::objects::{ObjectOffsets, Objects};
use symbolizer::python::offsets::PyOffsets;
use symbolizer::python::walk;

/// `threading.Thread` names of one process, read from `threading._active` in user space: when a
/// thread not named yet is sampled (at most every [`THREAD_NAMES_EVERY`]; a thread still not
/// found is not a reason to read again for [`THREAD_MISS_BACKOFF`]: a C thread, or one started
/// by `_thread` directly), and every [`THREAD_NAMES_REFRESH`] when any thread is sampled (a
/// renamed thread, a thread id reused).
#[derive(Debug)]
pub(super) struct ThreadNames {
    mem: LiveMemory,
    py: &'static PyOffsets,
    objects: Option<&'static ObjectOffsets>,
    pub(super) runtime_addr: u64,
    /// Native thread id → its Python name (the last read).
    names: FxHashMap<u32, String>,
    /// Native thread id → the name the kernel read with a sample, and when it came.
    from_kernel: FxHashMap<u32, (String, Instant)>,
    /// Threads sampled but not found by the last read, and when.
    misses: FxHashMap<u32, Instant>,
    /// When `threading._active` may be read again for a new thread.
    next: Instant,
    /// When it is read again whatever is sampled.
    refresh: Instant,
}

/// The shortest time between two reads of a process's thread names for a thread sampled
/// unnamed: `threading` names a thread before its `run()` starts.
const THREAD_NAMES_EVERY: Duration = Duration::from_millis(250);
/// How long a thread that a read did not find does not cause another.
const THREAD_MISS_BACKOFF: Duration = Duration::from_secs(5);
/// How often the names are read again while the process is sampled.
const THREAD_NAMES_REFRESH: Duration = Duration::from_secs(5);
/// Threads remembered as not found, at most (then forgotten all at once).
const MAX_THREAD_MISSES: usize = 4096;

impl ThreadNames {
    /// Who holds the process's GIL now ([`walk::gil_state`]).
    pub(super) fn gil_state(&self) -> Result<walk::GilState, walk::WalkError> {
        walk::gil_state(&self.mem, self.py, self.runtime_addr)
    }

    pub(super) fn new(
        mem: LiveMemory,
        py: &'static PyOffsets,
        objects: Option<&'static ObjectOffsets>,
        runtime_addr: u64,
    ) -> Self {
        let now = Instant::now();
        ThreadNames {
            mem,
            py,
            objects,
            runtime_addr,
            names: FxHashMap::default(),
            from_kernel: FxHashMap::default(),
            misses: FxHashMap::default(),
            next: now,
            refresh: now + THREAD_NAMES_REFRESH,
        }
    }

    /// Sets the name of thread `tid` (read by the kernel with a sample). It is kept apart from
    /// the names read from user space, which a read of `threading._active` replaces: a thread
    /// that ended is no longer there, but its samples may still be coming.
    pub(super) fn set(&mut self, tid: u32, name: &str) {
        let now = Instant::now();
        match self.from_kernel.get_mut(&tid) {
            Some((n, at)) if n == name => *at = now,
            _ => {
                if self.from_kernel.len() >= MAX_THREAD_MISSES {
                    self.from_kernel
                        .retain(|_, (_, at)| now.duration_since(*at) < THREAD_NAMES_REFRESH);
                    if self.from_kernel.len() >= MAX_THREAD_MISSES {
                        self.from_kernel.clear();
                    }
                }
                self.from_kernel.insert(tid, (name.to_string(), now));
            }
        }
        self.misses.remove(&tid);
    }

    /// The Python name of thread `tid`, reading the names again when it is due (see the type).
    /// Allocation-free when nothing is read.
    pub(super) fn get(&mut self, tid: u32) -> Option<&str> {
        let now = Instant::now();
        // The kernel's read is the newest: it is made at the thread's first samples and again
        // at most every 50 ms while it runs.
        if self.from_kernel.contains_key(&tid) {
            return self.from_kernel.get(&tid).map(|(n, _)| n.as_str());
        }
        let unnamed = !self.names.contains_key(&tid)
            && self
                .misses
                .get(&tid)
                .is_none_or(|&at| now.duration_since(at) >= THREAD_MISS_BACKOFF);
        if (unnamed && now >= self.next) || now >= self.refresh {
            self.next = now + THREAD_NAMES_EVERY;
            self.refresh = now + THREAD_NAMES_REFRESH;
            if let Some(obj) = self.objects {
                let o = Objects {
                    mem: &self.mem,
                    py: self.py,
                    obj,
                };
                if let Ok(found) = o.thread_names(self.runtime_addr) {
                    self.names = found
                        .into_iter()
                        .filter_map(|(id, name)| Some((u32::try_from(id).ok()?, name)))
                        .collect();
                }
            }
            if !self.names.contains_key(&tid) {
                if self.misses.len() >= MAX_THREAD_MISSES {
                    self.misses.clear();
                }
                self.misses.insert(tid, now);
            }
        }
        self.names.get(&tid).map(String::as_str)
    }
}
