//! Naming the code objects on the Python threads' stacks ahead of their samples, in off-CPU
//! sessions (see [`Python::set_read_ahead`]).

use std::time::{Duration, Instant};

use super::{function_of, intern, Proc, Python, Ready};

/// Frames walked per read-ahead period, over every process (a 1024-frame recursion in 16
/// threads), checked a thread at a time: a period of code objects already named costs about
/// 30 ms of spanprof's CPU (1.85 µs a frame measured with 50 threads 32 frames deep), more when
/// many are new (each is read and named), so the drains between are not held up long.
pub const READ_AHEAD_FRAMES: usize = 16 * 1024;

impl Python {
    /// Names the code objects on the stacks of every Python process's threads every `every`
    /// (`None`: never). For off-CPU sessions: a thread blocked until its process exits (a final
    /// `join` or sleep) sends its sample as the interpreter frees the code objects it names, so
    /// they are named while it waits. Costs a walk of each thread's frames (one read each, and
    /// three more for a code object not named yet) per process per period, at most
    /// [`READ_AHEAD_FRAMES`] frames a period. Done by [`Python::read_ahead_if_due`], which the
    /// caller calls between drains.
    pub fn set_read_ahead(&mut self, every: Option<Duration>) {
        self.read_ahead = every.map(|e| (e, Instant::now() + e));
    }

    /// When the next read-ahead is due, if any: the loop wakes for it (a quiet loop's tick is
    /// longer than 50 ms).
    pub fn next_read_ahead(&self) -> Option<Instant> {
        self.read_ahead.map(|(_, next)| next)
    }

    /// When due (see [`Python::set_read_ahead`]), names the code objects on the threads' stacks
    /// of every Python process found, [`READ_AHEAD_FRAMES`] frames at most in all; the
    /// processes are taken in turn, starting after the last one read the time before.
    pub fn read_ahead_if_due(&mut self) {
        let Some((every, next)) = self.read_ahead else {
            return;
        };
        let now = Instant::now();
        if now < next {
            return;
        }
        self.read_ahead = Some((every, now + every));
        let functions = &mut self.functions;
        let function_ids = &mut self.function_ids;
        let mut ready: Vec<(u32, &mut Box<Ready>)> = self
            .procs
            .iter_mut()
            .filter_map(|(&pid, p)| match p {
                Proc::Ready(r) => Some((pid, r)),
                _ => None,
            })
            .collect();
        ready.sort_unstable_by_key(|&(pid, _)| pid);
        let first = ready
            .iter()
            .position(|&(pid, _)| pid > self.read_ahead_last)
            .unwrap_or(0);
        ready.rotate_left(first);
        let mut frames = READ_AHEAD_FRAMES;
        for (pid, r) in ready {
            if frames == 0 {
                break;
            }
            let runtime = r.threads.runtime_addr;
            r.names.read_ahead(runtime, &mut frames, |info| {
                intern(functions, function_ids, function_of(info))
            });
            self.read_ahead_last = pid;
        }
    }
}
