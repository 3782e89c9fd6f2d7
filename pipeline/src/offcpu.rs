//! Off-CPU time: why a thread was blocked, from the stack it blocked in.
//!
//! The BPF programs record blocked intervals of profiled threads (`--event offcpu` or `wall`):
//! the time from the switch out of a thread that blocked to its switch back in, sampled without
//! bias (an interval of `d` ns shorter than the period `P` is kept with probability `d / P` and
//! weighs `P`; a longer one weighs `d`), attributed to the kernel stack it blocked in and to the
//! user and Python stacks it returns to. [`classify`] names the reason of each.
//!
//! The lists it goes by (system calls, kernel, C library and interpreter functions) are in
//! `lists`.

mod lists;
#[cfg(test)]
mod tests;

use crate::profile::OffCpuReason;
use lists::{
    GIL_FUNCTIONS, GIL_PRIMITIVES, GIL_TAKERS, IO_SYSCALLS, KERNEL_IO, KERNEL_LOCK, KERNEL_SLEEP,
    LOCK_SYSCALLS, NATIVE_LOCK, NATIVE_SLEEP, SLEEP_IF_ARG0_ZERO,
};

/// Blocked intervals shorter than this are not counted (`--offcpu-min`, `sampling.offcpu_min`).
pub const DEFAULT_MIN: &str = "5us";

/// What the kernel recorded of one blocked interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BlockFacts {
    /// The x86_64 system call number the thread blocked in; None outside a system call (a page
    /// fault) or unknown.
    pub syscall: Option<u32>,
    /// The call's first argument was 0 (select/pselect6 with nfds 0: Python 3.8-3.10's
    /// time.sleep).
    pub arg0_zero: bool,
    /// The kernel had the thread marked as waiting for I/O (task->in_iowait).
    pub iowait: bool,
}

/// Why a thread was blocked, from what the kernel recorded and the stacks it blocked in.
///
/// `kernel` and `native` are function names, leaf (innermost) first; kernel names may carry
/// compiler suffixes (.constprop.0, .isra.0, .part.0, .cold) which are ignored; unknown frames
/// may be passed as `""` or `"[unknown] (...)"`.
///
/// Names are compared without compiler suffixes, without a trailing `_[k]`, without glibc's
/// `__GI_` prefix and without leading underscores, so `___pthread_cond_timedwait64` (glibc with
/// debug symbols) and `__GI___lll_lock_wait` match the names in the lists below. `native` is
/// read up to the innermost `_PyEval_EvalFrameDefault` or Python frame (`f (file.py:N)`): the
/// frames inside it are the ones the thread blocked in; the frames above are the Python code
/// that called them.
///
/// The first reason that applies, in this order:
/// 1. [`OffCpuReason::Gil`]: a frame of `GIL_FUNCTIONS`, or a condition wait or mutex lock of
///    glibc (`GIL_PRIMITIVES`) called by CPython itself: a `Py*`/`_Py*` function or an
///    unknown frame of a `python*`/`libpython*` module. CPython 3.8-3.13 on Linux calls
///    `pthread_cond_*wait` and `pthread_mutex_lock` only to take and hand over the GIL (its
///    locks are semaphores), so this names GIL waits in stripped interpreters (Debian's
///    `/usr/bin/python3.11` has no `take_gil` symbol).
/// 2. [`OffCpuReason::Sleep`]: nanosleep (35), clock_nanosleep (230), select (23), pselect6
///    (270), poll (7) or ppoll (271) with a first argument of 0 (no descriptors), a frame of
///    `KERNEL_SLEEP` or `NATIVE_SLEEP`.
/// 3. [`OffCpuReason::Lock`]: a system call of `LOCK_SYSCALLS` (futexes, file locks, System V
///    semaphores), a frame of `KERNEL_LOCK` or `NATIVE_LOCK`. `lock.acquire()`,
///    `queue.get()`, `threading.Event.wait()` and `Thread.join()` block here.
/// 4. [`OffCpuReason::Io`]: `iowait`, a system call of `IO_SYSCALLS` or a frame of
///    `KERNEL_IO`. `sock.recv()`, `selector.select()` and a page fault that reads the disk
///    block here.
/// 5. [`OffCpuReason::Other`]: anything else, among them waits for a child process (wait4 61,
///    waitid 247: `subprocess.run`, `os.waitpid`), for a signal (pause 34, rt_sigsuspend 130,
///    rt_sigtimedwait 128), for a vfork child, and page faults without I/O (the `mmap_lock`).
///    Kernel mutexes and rw-semaphores count as the system call they block in: they are
///    `.sched.text` functions, absent from the kernel stack of a switched-out task.
pub fn classify(facts: &BlockFacts, kernel: &[&str], native: &[&str]) -> OffCpuReason {
    let native = blocking_frames(native);
    if is_gil_wait(native) {
        return OffCpuReason::Gil;
    }
    let nr = facts.syscall;
    if nr.is_some_and(|nr| is_sleep_syscall(nr, facts.arg0_zero))
        || any_in(kernel, KERNEL_SLEEP)
        || any_in(native, NATIVE_SLEEP)
    {
        return OffCpuReason::Sleep;
    }
    if nr.is_some_and(|nr| LOCK_SYSCALLS.contains(&nr))
        || any_in(kernel, KERNEL_LOCK)
        || any_in(native, NATIVE_LOCK)
    {
        return OffCpuReason::Lock;
    }
    if facts.iowait || nr.is_some_and(|nr| IO_SYSCALLS.contains(&nr)) || any_in(kernel, KERNEL_IO) {
        return OffCpuReason::Io;
    }
    OffCpuReason::Other
}

/// Whether a wait classified `reason` is an asyncio event loop's idle wait: its innermost
/// Python frames (`python`: `(function, file)`, innermost first) are a selector's `select`
/// (`selectors.py`) called by asyncio's `BaseEventLoop._run_once` (`asyncio/base_events.py`),
/// and it waited for I/O or slept (a GIL or lock wait there is the loop's, not idleness).
pub fn is_asyncio_idle(reason: OffCpuReason, python: &[(&str, &str)]) -> bool {
    let method = |f: &str, name: &str| f == name || f.ends_with(&format!(".{name}"));
    matches!(reason, OffCpuReason::Io | OffCpuReason::Sleep)
        && matches!(python, [(select, sel_file), (run_once, loop_file), ..]
            if method(select, "select")
                && sel_file.ends_with("selectors.py")
                && method(run_once, "_run_once")
                && loop_file.ends_with("base_events.py"))
}

fn is_sleep_syscall(nr: u32, arg0_zero: bool) -> bool {
    // nanosleep (35); clock_nanosleep (230): Python 3.11+'s time.sleep.
    nr == 35 || nr == 230 || (arg0_zero && SLEEP_IF_ARG0_ZERO.contains(&nr))
}

/// The frames of `native` the thread blocked in: up to the innermost interpreter frame.
fn blocking_frames<'a, 'b>(native: &'a [&'b str]) -> &'a [&'b str] {
    let end = native
        .iter()
        .position(|f| base_name(f) == "PyEval_EvalFrameDefault" || is_python_frame(f))
        .unwrap_or(native.len());
    &native[..end]
}

/// A Python frame as the profile names it: `qualname (file.py:LINE)` or `qualname (file.py)`.
fn is_python_frame(frame: &str) -> bool {
    frame.ends_with(".py)") || (frame.ends_with(')') && frame.contains(".py:"))
}

/// Whether a thread caught on a CPU or runnable (`spanprof dump`) is waiting to take the GIL:
/// its native frames (innermost first, named as for [`classify`]) have a glibc wait
/// (`GIL_PRIMITIVES`) inside a function that takes it (`GIL_TAKERS`, the innermost of
/// `GIL_FUNCTIONS`). One handing the GIL over (`drop_gil`) or on its way out of `take_gil`
/// (unlocking, the GIL taken) is not: it holds the GIL, or is about to run.
pub fn waits_for_gil(native: &[&str]) -> bool {
    let native = blocking_frames(native);
    let Some(taker) = native
        .iter()
        .position(|f| in_list(base_name(f), GIL_FUNCTIONS))
    else {
        return false;
    };
    in_list(base_name(native[taker]), GIL_TAKERS)
        && native[..taker]
            .iter()
            .any(|f| in_list(base_name(f), GIL_PRIMITIVES))
}

/// Whether a thread caught on a CPU or runnable (`spanprof dump`) is in the interpreter's GIL
/// hand-over: a frame of `GIL_FUNCTIONS` (taking, waiting for, or dropping the GIL), or a glibc
/// wait or lock called by CPython, inside the innermost interpreter call (`native` as for
/// [`waits_for_gil`]). With another thread holding the GIL, such a thread waits to take it.
pub fn in_gil_hand_over(native: &[&str]) -> bool {
    is_gil_wait(blocking_frames(native))
}

fn is_gil_wait(native: &[&str]) -> bool {
    native.iter().enumerate().any(|(i, f)| {
        let name = base_name(f);
        in_list(name, GIL_FUNCTIONS)
            || (in_list(name, GIL_PRIMITIVES)
                && native.get(i + 1).is_some_and(|caller| is_cpython(caller)))
    })
}

/// A frame of CPython's own code (not one of its lock functions): a `Py*`/`_Py*` function or an
/// unknown frame of a `python*`/`libpython*` module (`[unknown] (python3.11+0xf94ed)`).
fn is_cpython(frame: &str) -> bool {
    if let Some(module) = frame.strip_prefix("[unknown] (") {
        return module.starts_with("python") || module.starts_with("libpython");
    }
    let name = base_name(frame);
    name.starts_with("Py") && !in_list(name, NATIVE_LOCK)
}

fn any_in(frames: &[&str], list: &[&str]) -> bool {
    frames.iter().any(|f| in_list(base_name(f), list))
}

/// Whether `name` (a [`base_name`]) is one of `list`, compared as base names.
fn in_list(name: &str, list: &[&str]) -> bool {
    !name.is_empty() && list.iter().any(|entry| base_name(entry) == name)
}

/// The name compared with the lists: without a trailing `_[k]`, compiler suffixes
/// (`.constprop.N`, `.isra.N`, `.part.N`, `.lto_priv.N`, `.llvm.N`, `.cold`, `.cold.N`,
/// `.localalias`), glibc's `__GI_` prefix and leading underscores.
fn base_name(name: &str) -> &str {
    let mut s = name.strip_suffix("_[k]").unwrap_or(name);
    loop {
        if let Some(rest) = s
            .strip_suffix(".cold")
            .or_else(|| s.strip_suffix(".localalias"))
        {
            s = rest;
            continue;
        }
        if let Some((head, number)) = s.rsplit_once('.') {
            if !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) {
                if let Some((rest, kind)) = head.rsplit_once('.') {
                    if matches!(
                        kind,
                        "constprop" | "isra" | "part" | "lto_priv" | "llvm" | "cold"
                    ) {
                        s = rest;
                        continue;
                    }
                }
            }
        }
        break;
    }
    let s = s.strip_prefix("__GI_").unwrap_or(s);
    s.trim_start_matches('_')
}
