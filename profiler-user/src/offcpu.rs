//! Off-CPU time: why a thread was blocked, from the stack it blocked in.
//!
//! The BPF programs record blocked intervals of profiled threads (`--event offcpu` or `wall`):
//! the time from the switch out of a thread that blocked to its switch back in, sampled without
//! bias (an interval of `d` ns shorter than the period `P` is kept with probability `d / P` and
//! weighs `P`; a longer one weighs `d`), attributed to the kernel stack it blocked in and to the
//! user and Python stacks it returns to. [`classify`] names the reason of each.

/// Blocked intervals shorter than this are not counted (`--offcpu-min`, `sampling.offcpu_min`).
pub const DEFAULT_MIN: &str = "5us";

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

/// System calls that sleep when their first argument is 0: select (23) and pselect6 (270) with
/// nfds 0, poll (7) and ppoll (271) with a null descriptor array (glibc 2.36's `select` is
/// pselect6: Python 3.8-3.10's `time.sleep` blocks in pselect6(0, NULL, NULL, NULL, ...)).
const SLEEP_IF_ARG0_ZERO: &[u32] = &[7, 23, 270, 271];

fn is_sleep_syscall(nr: u32, arg0_zero: bool) -> bool {
    // nanosleep (35); clock_nanosleep (230): Python 3.11+'s time.sleep.
    nr == 35 || nr == 230 || (arg0_zero && SLEEP_IF_ARG0_ZERO.contains(&nr))
}

/// x86_64 system calls that wait for another thread or process to release something: futex
/// (202), futex_waitv (449), futex_wait (455, kernel `__x64_sys_futex_wait`), flock (73), fcntl
/// (72: only F_SETLKW/F_OFD_SETLKW block), semop (65), semtimedop (220).
const LOCK_SYSCALLS: &[u32] = &[202, 449, 455, 73, 72, 65, 220];

/// x86_64 system calls that wait for a descriptor, a file system or a device (numbers from
/// `asm/unistd_64.h`); select, pselect6, poll and ppoll without descriptors are sleeps.
const IO_SYSCALLS: &[u32] = &[
    0,   // read
    1,   // write
    2,   // open
    3,   // close (flushes network and FUSE files)
    4,   // stat
    5,   // fstat
    6,   // lstat
    7,   // poll
    17,  // pread64
    18,  // pwrite64
    19,  // readv
    20,  // writev
    23,  // select
    26,  // msync
    40,  // sendfile
    42,  // connect
    43,  // accept
    44,  // sendto
    45,  // recvfrom: socket.recv
    46,  // sendmsg
    47,  // recvmsg
    69,  // msgsnd
    70,  // msgrcv
    74,  // fsync
    75,  // fdatasync
    162, // sync
    208, // io_getevents
    217, // getdents64
    232, // epoll_wait: selectors.EpollSelector, asyncio
    242, // mq_timedsend
    243, // mq_timedreceive
    257, // openat (a FIFO waits for its other end)
    262, // newfstatat
    270, // pselect6: select.select with descriptors
    271, // ppoll
    275, // splice
    276, // tee
    277, // sync_file_range
    278, // vmsplice
    281, // epoll_pwait
    288, // accept4: socket.accept
    295, // preadv
    296, // pwritev
    299, // recvmmsg
    306, // syncfs
    307, // sendmmsg
    326, // copy_file_range
    327, // preadv2
    328, // pwritev2
    332, // statx
    333, // io_pgetevents
    426, // io_uring_enter
    437, // openat2
    441, // epoll_pwait2
];

/// CPython functions that take or hand over the GIL: the thread waits for the GIL below them.
/// `take_gil`, `drop_gil`: static, in the `.symtab` of pyenv's 3.8-3.13 (3.8 also has
/// `take_gil.constprop.0`), absent from Debian's stripped 3.11; `_PyEval_AcquireLock`: static,
/// 3.12-3.13; `_PyEval_ReleaseLock`: static, 3.9-3.13; `_PyThreadState_Attach`,
/// `_PyThreadState_Detach`: static, 3.13 (3.13's `PyEval_RestoreThread` tail-calls
/// `_PyThreadState_Attach`, so it is not on the stack); the others: `.dynsym` of 3.8-3.13 and
/// of Debian's 3.11 (`PyThreadState_Swap` and `_PyThreadState_Swap` take the GIL in 3.12-3.13).
/// None of them is on the stack while the thread runs other code.
const GIL_FUNCTIONS: &[&str] = &[
    "take_gil",
    "drop_gil",
    "_PyEval_AcquireLock",
    "_PyEval_ReleaseLock",
    "_PyThreadState_Attach",
    "_PyThreadState_Detach",
    "PyEval_RestoreThread",
    "PyEval_AcquireThread",
    "PyEval_AcquireLock",
    "PyEval_SaveThread",
    "PyEval_ReleaseThread",
    "PyEval_ReleaseLock",
    "PyGILState_Ensure",
    "PyThreadState_Swap",
    "_PyThreadState_Swap",
];

/// glibc functions CPython calls to wait for the GIL: the only callers of `pthread_cond_*wait`
/// and `pthread_mutex_lock` in pyenv's 3.8-3.13 are `take_gil`, `drop_gil` and functions they
/// are inlined into (`PyEval_SaveThread`, `_Py_read` in Debian's 3.11); names as glibc 2.36's
/// `.dynsym` and, with libc6-dbg, its DWARF name them (`___pthread_cond_timedwait64`).
const GIL_PRIMITIVES: &[&str] = &[
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "___pthread_cond_timedwait64",
    "pthread_cond_clockwait",
    "___pthread_cond_clockwait64",
    "pthread_mutex_lock",
];

/// Kernel functions of a sleep, in the stacks of `bpf_get_task_stack` on Linux 6.18
/// (`/proc/kallsyms`): clock_nanosleep and nanosleep, POSIX timers' sleeps (CLOCK_*_ALARM,
/// CPU-time clocks), and the read of a timerfd (a timer wait). `do_nanosleep` and
/// `hrtimer_nanosleep_restart` are in `.sched.text`, absent from a switched-out task's stack,
/// present in one taken in its own context.
const KERNEL_SLEEP: &[&str] = &[
    "do_nanosleep",
    "hrtimer_nanosleep",
    "hrtimer_nanosleep_restart",
    "common_nsleep",
    "common_nsleep_timens",
    "alarm_timer_nsleep",
    "posix_cpu_nsleep",
    "__x64_sys_nanosleep",
    "__x64_sys_clock_nanosleep",
    "timerfd_read_iter",
];

/// Native functions of a sleep: CPython's `time_sleep` (static, pyenv's 3.8-3.13; `pysleep`,
/// its helper in the sources, is inlined there but kept for unoptimized builds) and glibc 2.36's
/// sleeps (`.dynsym`; `__GI___clock_nanosleep` with debug symbols).
const NATIVE_SLEEP: &[&str] = &[
    "time_sleep",
    "pysleep",
    "nanosleep",
    "clock_nanosleep",
    "usleep",
    "sleep",
    "thrd_sleep",
];

/// Kernel functions of a lock wait on Linux 6.18 (`/proc/kallsyms`; `futex_wait_queue` and
/// `futex_wait_queue_me` of older kernels are now `futex_do_wait`): futexes (a switched-out
/// task's stack reads `futex_do_wait`, `__futex_wait`, `futex_wait`, `do_futex`,
/// `__x64_sys_futex`), priority-inheritance futexes, flock and fcntl locks, System V semaphores.
const KERNEL_LOCK: &[&str] = &[
    "futex_do_wait",
    "__futex_wait",
    "futex_wait",
    "futex_wait_multiple",
    "futex_wait_requeue_pi",
    "futex_lock_pi",
    "rt_mutex_wait_proxy_lock",
    "do_futex",
    "__x64_sys_futex",
    "__x64_sys_futex_wait",
    "__x64_sys_futex_waitv",
    "locks_lock_inode_wait",
    "__do_sys_flock",
    "__x64_sys_flock",
    "fcntl_setlk",
    "do_semtimedop",
    "__x64_sys_semop",
    "__x64_sys_semtimedop",
];

/// Native functions of a lock wait. CPython (`.dynsym` of 3.8-3.13 unless noted):
/// `PyThread_acquire_lock_timed` and its callers `acquire_timed`, `lock_PyThread_acquire_lock`,
/// `rlock_acquire` (static, 3.8-3.12; 3.13 `PyThread_acquire_lock_timed_with_retries`); 3.13's
/// mutexes and parking lot (`PyMutex_Lock`, `_PyMutex_LockTimed`, `_PyParkingLot_Park`,
/// `_PySemaphore_Wait`, `PyEvent_WaitTimed`: `Thread.join()`). glibc 2.36: the `.dynsym` names,
/// and with libc6-dbg the internal ones (`__new_sem_wait_slow64`, `do_futex_wait`,
/// `__futex_abstimed_wait_common`, `__pthread_mutex_cond_lock`, `__lll_lock_wait`).
const NATIVE_LOCK: &[&str] = &[
    "PyThread_acquire_lock_timed",
    "PyThread_acquire_lock",
    "PyThread_acquire_lock_timed_with_retries",
    "acquire_timed",
    "lock_PyThread_acquire_lock",
    "rlock_acquire",
    "PyMutex_Lock",
    "PyMutex_LockFlags",
    "_PyMutex_LockTimed",
    "_PyRawMutex_LockSlow",
    "_PyRecursiveMutex_Lock",
    "_PyRWMutex_Lock",
    "_PyRWMutex_RLock",
    "_PyCriticalSection_BeginSlow",
    "_PyCriticalSection2_BeginSlow",
    "_PyParkingLot_Park",
    "_PySemaphore_Wait",
    "PyEvent_Wait",
    "PyEvent_WaitTimed",
    "sem_wait",
    "sem_timedwait",
    "sem_clockwait",
    "__new_sem_wait",
    "__new_sem_wait_slow64",
    "do_futex_wait",
    "__futex_abstimed_wait_common",
    "__futex_abstimed_wait_common64",
    "__futex_abstimed_wait_cancelable64",
    "__futex_abstimed_wait64",
    "__futex_lock_pi64",
    "pthread_mutex_lock",
    "pthread_mutex_timedlock",
    "pthread_mutex_clocklock",
    "__pthread_mutex_lock_full",
    "__pthread_mutex_cond_lock",
    "__pthread_mutex_clocklock_common",
    "__lll_lock_wait",
    "__lll_lock_wait_private",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "___pthread_cond_timedwait64",
    "pthread_cond_clockwait",
    "___pthread_cond_clockwait64",
    "pthread_rwlock_rdlock",
    "pthread_rwlock_wrlock",
    "pthread_rwlock_timedrdlock",
    "pthread_rwlock_timedwrlock",
    "pthread_rwlock_clockrdlock",
    "pthread_rwlock_clockwrlock",
    "pthread_barrier_wait",
    "pthread_join",
    "pthread_timedjoin_np",
    "pthread_clockjoin_np",
    "__pthread_clockjoin_ex",
];

/// Kernel functions of an I/O wait on Linux 6.18 (`/proc/kallsyms`, and the stacks of blocked
/// Python threads in `/proc/PID/task/TID/stack`: `ep_poll`, `unix_stream_data_wait` and
/// `inet_csk_wait_for_connect` are inlined, `pipe_read` is now `anon_pipe_read`,
/// `wait_on_page_bit` is now `folio_wait_bit_common`): poll/select/epoll, sockets, pipes and
/// FIFOs, terminals, FUSE, io_uring and AIO, the page cache, block devices and journal commits.
/// `io_schedule`, `io_schedule_timeout` and `wait_for_completion_io` are in `.sched.text`.
const KERNEL_IO: &[&str] = &[
    "do_epoll_wait",
    "do_epoll_pwait",
    "__x64_sys_epoll_wait",
    "__x64_sys_epoll_pwait",
    "__x64_sys_epoll_pwait2",
    "do_sys_poll",
    "__x64_sys_poll",
    "__x64_sys_ppoll",
    "do_select",
    "core_sys_select",
    "do_pselect",
    "__x64_sys_select",
    "__x64_sys_pselect6",
    "poll_schedule_timeout",
    "sk_wait_data",
    "wait_woken",
    "sk_stream_wait_memory",
    "sk_stream_wait_connect",
    "sock_alloc_send_pskb",
    "tcp_recvmsg",
    "tcp_recvmsg_locked",
    "udp_recvmsg",
    "__skb_wait_for_more_packets",
    "__skb_recv_datagram",
    "__skb_recv_udp",
    "unix_stream_read_generic",
    "unix_stream_recvmsg",
    "unix_dgram_recvmsg",
    "__unix_dgram_recvmsg",
    "unix_wait_for_peer",
    "inet_csk_accept",
    "inet_accept",
    "do_accept",
    "__inet_stream_connect",
    "sock_recvmsg",
    "__sys_recvfrom",
    "__sys_recvmsg",
    "anon_pipe_read",
    "anon_pipe_write",
    "fifo_pipe_read",
    "fifo_pipe_write",
    "pipe_wait_readable",
    "pipe_wait_writable",
    "wait_for_partner",
    "fifo_open",
    "n_tty_read",
    "eventfd_read",
    "inotify_read",
    "fuse_dev_do_read",
    "request_wait_answer",
    "io_cqring_wait",
    "__do_sys_io_uring_enter",
    "read_events",
    "do_io_getevents",
    "io_schedule",
    "io_schedule_timeout",
    "wait_for_completion_io",
    "folio_wait_bit_common",
    "folio_wait_bit",
    "folio_wait_bit_killable",
    "__folio_lock",
    "__folio_lock_killable",
    "__folio_lock_or_retry",
    "folio_wait_writeback",
    "wait_on_page_writeback",
    "__filemap_fdatawait_range",
    "filemap_fdatawait_range",
    "filemap_fdatawait_range_keep_errors",
    "__wait_on_buffer",
    "submit_bio_wait",
    "blkdev_issue_flush",
    "blk_mq_get_tag",
    "jbd2_log_wait_commit",
];

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

#[cfg(test)]
mod tests {
    use super::*;

    // Stacks below were read on Linux 6.18 with glibc 2.36 and libc6-dbg: kernel frames from
    // /proc/PID/task/TID/stack (the walk bpf_get_task_stack does), native frames symbolized by
    // blazesym from blocked threads of pyenv's CPython 3.8-3.13 and Debian's python3.11.

    const FUTEX_KERNEL: &[&str] = &[
        "futex_do_wait",
        "__futex_wait",
        "futex_wait",
        "do_futex",
        "__x64_sys_futex",
        "do_syscall_64",
        "entry_SYSCALL_64_after_hwframe",
    ];
    const PSELECT_KERNEL: &[&str] = &[
        "poll_schedule_timeout.constprop.0",
        "do_select",
        "core_sys_select",
        "do_pselect.constprop.0",
        "__x64_sys_pselect6",
        "do_syscall_64",
        "entry_SYSCALL_64_after_hwframe",
    ];
    const NANOSLEEP_KERNEL: &[&str] = &[
        "hrtimer_nanosleep",
        "common_nsleep_timens",
        "__x64_sys_clock_nanosleep",
        "do_syscall_64",
        "entry_SYSCALL_64_after_hwframe",
    ];

    fn syscall(nr: u32) -> BlockFacts {
        BlockFacts {
            syscall: Some(nr),
            ..BlockFacts::default()
        }
    }

    fn syscall_arg0_zero(nr: u32) -> BlockFacts {
        BlockFacts {
            syscall: Some(nr),
            arg0_zero: true,
            iowait: false,
        }
    }

    #[test]
    fn gil_after_blocking_call() {
        // 3.9: time.sleep returned, the thread waits to take the GIL back.
        let native = [
            "__futex_abstimed_wait_common",
            "__GI___futex_abstimed_wait_cancelable64",
            "___pthread_cond_timedwait64",
            "take_gil",
            "PyEval_RestoreThread",
            "time_sleep",
            "cfunction_vectorcall_O",
            "_PyEval_EvalFrameDefault",
        ];
        let r = classify(&syscall(202), FUTEX_KERNEL, &native);
        assert_eq!(r, OffCpuReason::Gil);
    }

    #[test]
    fn gil_in_the_eval_loop() {
        // 3.8: a forced switch; take_gil is called by the eval loop itself.
        let native = [
            "__futex_abstimed_wait_common",
            "__GI___futex_abstimed_wait_cancelable64",
            "___pthread_cond_timedwait64",
            "take_gil.constprop.0",
            "_PyEval_EvalFrameDefault",
            "function_code_fastcall",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Gil
        );
        // 3.12: through _Py_HandlePending; waiting for the GIL mutex, not the condition.
        let native = [
            "__GI___lll_lock_wait",
            "___pthread_mutex_lock",
            "take_gil",
            "_Py_HandlePending",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Gil
        );
        // 3.12: drop_gil waits until another thread took the GIL.
        let native = [
            "__futex_abstimed_wait_common",
            "___pthread_cond_wait",
            "drop_gil",
            "_Py_HandlePending",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Gil
        );
    }

    #[test]
    fn gil_in_python_3_13() {
        let native = [
            "__futex_abstimed_wait_common",
            "__GI___futex_abstimed_wait_cancelable64",
            "___pthread_cond_timedwait64",
            "take_gil",
            "_PyEval_AcquireLock",
            "_PyThreadState_Attach",
            "_Py_HandlePending",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Gil
        );
        // Without take_gil's symbol, the static attach function still names it.
        let native = [
            "pthread_cond_timedwait",
            "[unknown] (libpython3.13.so.1.0+0x2a1f3)",
            "_PyThreadState_Attach",
            "time_sleep",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Gil
        );
    }

    #[test]
    fn gil_in_a_stripped_interpreter() {
        // Debian's /usr/bin/python3.11: take_gil is an unknown frame of the executable.
        let after_sleep = [
            "__futex_abstimed_wait_common",
            "__GI___futex_abstimed_wait_cancelable64",
            "___pthread_cond_timedwait64",
            "[unknown] (python3.11+0xf94ed)",
            "PyEval_RestoreThread",
            "[unknown] (python3.11+0x1d64bd)",
            "PyObject_Vectorcall",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &after_sleep),
            OffCpuReason::Gil
        );
        // Forced switch: the caller of the unknown frame is the eval loop.
        let switch = [
            "__futex_abstimed_wait_common",
            "__GI___futex_abstimed_wait_cancelable64",
            "___pthread_cond_timedwait64",
            "[unknown] (python3.11+0xf94ed)",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &switch),
            OffCpuReason::Gil
        );
        // drop_gil inlined into _Py_read; take_gil's mutex; glibc without debug symbols.
        for native in [
            &[
                "___pthread_cond_wait",
                "_Py_read",
                "[unknown] (python3.11+0x1e25b3)",
            ][..],
            &[
                "__GI___lll_lock_wait",
                "___pthread_mutex_lock",
                "[unknown] (python3.11+0xf9316)",
            ][..],
            &[
                "[unknown] (libc.so.6+0x85f16)",
                "[unknown] (libc.so.6+0x85f7b)",
                "pthread_cond_timedwait",
                "[unknown] (libpython3.11.so.1.0+0x1f94ed)",
            ][..],
        ] {
            assert_eq!(
                classify(&syscall(202), FUTEX_KERNEL, native),
                OffCpuReason::Gil,
                "{native:?}"
            );
        }
    }

    #[test]
    fn condition_wait_outside_cpython_is_a_lock() {
        for native in [
            &[
                "___pthread_cond_wait",
                "[unknown] (libfoo.so+0x1234)",
                "worker",
            ][..],
            &["pthread_cond_wait", "", "start_thread"][..],
            &["pthread_cond_wait", "std::sync::condvar::Condvar::wait"][..],
        ] {
            assert_eq!(
                classify(&syscall(202), FUTEX_KERNEL, native),
                OffCpuReason::Lock,
                "{native:?}"
            );
        }
    }

    #[test]
    fn gil_beats_lock() {
        // lock.acquire() got the lock; the thread now waits for the GIL.
        let native = [
            "__futex_abstimed_wait_common",
            "___pthread_cond_timedwait64",
            "take_gil",
            "PyEval_RestoreThread",
            "acquire_timed",
            "lock_PyThread_acquire_lock",
            "method_vectorcall_VARARGS_KEYWORDS",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Gil
        );
        // The same without take_gil and the lock functions' frames of a stripped build.
        let native = ["pthread_cond_timedwait", "PyEval_RestoreThread"];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Gil
        );
    }

    #[test]
    fn lock_acquire() {
        // threading.Lock().acquire() on 3.8 (lock, Queue.get, Event.wait and join look alike).
        let native = [
            "__futex_abstimed_wait_common",
            "__GI___futex_abstimed_wait_cancelable64",
            "do_futex_wait",
            "__new_sem_wait_slow64",
            "__new_sem_wait",
            "PyThread_acquire_lock_timed",
            "acquire_timed",
            "lock_PyThread_acquire_lock",
            "method_vectorcall_VARARGS_KEYWORDS",
            "call_function",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Lock
        );
        // Debian's 3.11: PyThread_acquire_lock_timed is exported, its callers are not.
        let native = [
            "__futex_abstimed_wait_common",
            "__GI___futex_abstimed_wait_cancelable64",
            "do_futex_wait",
            "__new_sem_wait_slow64",
            "PyThread_acquire_lock_timed",
            "[unknown] (python3.11+0x1899ae)",
            "[unknown] (python3.11+0x150c6d)",
            "PyObject_Vectorcall",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Lock
        );
        // 3.13's Thread.join() parks on a PyEvent.
        let native = [
            "__futex_abstimed_wait_common",
            "do_futex_wait",
            "__new_sem_wait_slow64",
            "__new_sem_wait",
            "_PySemaphore_Wait",
            "_PyParkingLot_Park",
            "PyEvent_WaitTimed",
            "ThreadHandle_join",
            "PyThreadHandleObject_join",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Lock
        );
    }

    #[test]
    fn lock_from_the_kernel_alone() {
        assert_eq!(classify(&syscall(202), &[], &[]), OffCpuReason::Lock);
        assert_eq!(classify(&syscall(449), &[], &[]), OffCpuReason::Lock);
        let futex_wait2 = [
            "futex_do_wait",
            "__futex_wait",
            "__x64_sys_futex_wait",
            "do_syscall_64",
        ];
        assert_eq!(
            classify(&syscall(455), &futex_wait2, &[]),
            OffCpuReason::Lock
        );
        assert_eq!(
            classify(&BlockFacts::default(), FUTEX_KERNEL, &[]),
            OffCpuReason::Lock
        );
        // fcntl.flock and fcntl.lockf on a locked file.
        let flock = [
            "locks_lock_inode_wait",
            "__do_sys_flock",
            "do_syscall_64",
            "entry_SYSCALL_64_after_hwframe",
        ];
        assert_eq!(classify(&syscall(73), &flock, &[]), OffCpuReason::Lock);
        let lockf = [
            "fcntl_setlk",
            "do_fcntl",
            "__x64_sys_fcntl",
            "do_syscall_64",
        ];
        assert_eq!(classify(&syscall(72), &lockf, &[]), OffCpuReason::Lock);
    }

    #[test]
    fn lock_in_a_signal_handler_called_from_sleep() {
        // Only the frames inside the innermost eval loop count: time_sleep is its caller.
        let native = [
            "__futex_abstimed_wait_common",
            "do_futex_wait",
            "__new_sem_wait_slow64",
            "PyThread_acquire_lock_timed",
            "acquire_timed",
            "lock_PyThread_acquire_lock",
            "_PyEval_EvalFrameDefault",
            "_PyFunction_Vectorcall",
            "PyErr_CheckSignals",
            "time_sleep",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Lock
        );
        // The same with Python frames in place of the eval loop's.
        let native = [
            "PyThread_acquire_lock_timed",
            "lock_PyThread_acquire_lock",
            "handler (app.py:12)",
            "time_sleep",
        ];
        assert_eq!(
            classify(&syscall(202), FUTEX_KERNEL, &native),
            OffCpuReason::Lock
        );
    }

    #[test]
    fn sleep_as_select_without_descriptors() {
        // 3.9's time.sleep: glibc 2.36's select is pselect6(0, NULL, NULL, NULL, ...).
        let native = [
            "__GI___select",
            "time_sleep",
            "cfunction_vectorcall_O",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall_arg0_zero(270), PSELECT_KERNEL, &native),
            OffCpuReason::Sleep
        );
        // Stripped interpreter, older glibc calling select (23).
        let native = ["__select", "[unknown] (python3.9+0x1234)"];
        assert_eq!(
            classify(&syscall_arg0_zero(23), &[], &native),
            OffCpuReason::Sleep
        );
        // select.select([], [], [], t) from its own module is a sleep too.
        let native = [
            "__GI___select",
            "select_select_impl",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall_arg0_zero(270), PSELECT_KERNEL, &native),
            OffCpuReason::Sleep
        );
        // poll(NULL, 0, timeout).
        assert_eq!(
            classify(&syscall_arg0_zero(7), &[], &[]),
            OffCpuReason::Sleep
        );
    }

    #[test]
    fn sleep_as_clock_nanosleep() {
        // 3.12's time.sleep.
        let native = [
            "__GI___clock_nanosleep",
            "time_sleep",
            "cfunction_vectorcall_O",
            "PyObject_Vectorcall",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(230), NANOSLEEP_KERNEL, &native),
            OffCpuReason::Sleep
        );
        // Debian's 3.11: time_sleep is an unknown frame.
        let native = [
            "__GI___clock_nanosleep",
            "[unknown] (python3.11+0x1d64b3)",
            "[unknown] (python3.11+0x145962)",
            "PyObject_Vectorcall",
        ];
        assert_eq!(
            classify(&syscall(230), NANOSLEEP_KERNEL, &native),
            OffCpuReason::Sleep
        );
        // Only the kernel stack (blocked, back in user mode elsewhere).
        assert_eq!(
            classify(&BlockFacts::default(), NANOSLEEP_KERNEL, &[]),
            OffCpuReason::Sleep
        );
        assert_eq!(classify(&syscall(35), &[], &[]), OffCpuReason::Sleep);
    }

    #[test]
    fn io_as_epoll_wait() {
        // selectors.EpollSelector.select() (asyncio's loop waits the same way).
        let kernel = [
            "do_epoll_wait",
            "__x64_sys_epoll_wait",
            "do_syscall_64",
            "entry_SYSCALL_64_after_hwframe",
        ];
        let native = [
            "epoll_wait",
            "select_epoll_poll",
            "method_vectorcall_FASTCALL_KEYWORDS",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(classify(&syscall(232), &kernel, &native), OffCpuReason::Io);
        assert_eq!(classify(&syscall(232), &[], &[]), OffCpuReason::Io);
        assert_eq!(
            classify(&BlockFacts::default(), &kernel, &[]),
            OffCpuReason::Io
        );
    }

    #[test]
    fn io_as_recvfrom() {
        // sock.recv() on a TCP connection.
        let kernel = [
            "wait_woken",
            "sk_wait_data",
            "tcp_recvmsg_locked",
            "tcp_recvmsg",
            "sock_recvmsg",
            "__sys_recvfrom",
            "__x64_sys_recvfrom",
            "do_syscall_64",
            "entry_SYSCALL_64_after_hwframe",
        ];
        let native = [
            "__libc_recv",
            "sock_recv",
            "method_vectorcall_VARARGS",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(classify(&syscall(45), &kernel, &native), OffCpuReason::Io);
        assert_eq!(
            classify(&BlockFacts::default(), &kernel[..3], &[]),
            OffCpuReason::Io
        );
        // A Unix socket and a pipe (os.read).
        let unix = [
            "unix_stream_read_generic",
            "unix_stream_recvmsg",
            "sock_recvmsg",
        ];
        assert_eq!(
            classify(&BlockFacts::default(), &unix, &[]),
            OffCpuReason::Io
        );
        let pipe = ["anon_pipe_read", "vfs_read", "ksys_read", "do_syscall_64"];
        assert_eq!(
            classify(&syscall(0), &pipe, &["__GI___libc_read", "_Py_read"]),
            OffCpuReason::Io
        );
    }

    #[test]
    fn select_with_descriptors_is_io() {
        // select.select([sock], [], [], t): the same kernel stack as a sleep, nfds > 0.
        let native = [
            "__GI___select",
            "select_select_impl",
            "_PyEval_EvalFrameDefault",
        ];
        assert_eq!(
            classify(&syscall(270), PSELECT_KERNEL, &native),
            OffCpuReason::Io
        );
        assert_eq!(classify(&syscall(23), &[], &[]), OffCpuReason::Io);
    }

    #[test]
    fn arg0_zero_matters_only_for_select_and_poll() {
        // read(0, ...): standard input.
        let facts = syscall_arg0_zero(0);
        assert_eq!(
            classify(&facts, &["n_tty_read", "tty_read", "vfs_read"], &[]),
            OffCpuReason::Io
        );
        assert_eq!(
            classify(&syscall_arg0_zero(202), &[], &[]),
            OffCpuReason::Lock
        );
    }

    #[test]
    fn page_faults() {
        // A fault that reads a file mapping from disk (io_schedule sets in_iowait).
        let read_fault = [
            "folio_wait_bit_common",
            "filemap_read_folio",
            "filemap_fault",
            "__do_fault",
            "do_fault",
            "__handle_mm_fault",
            "handle_mm_fault",
            "exc_page_fault",
            "asm_exc_page_fault",
        ];
        let iowait = BlockFacts {
            syscall: None,
            arg0_zero: false,
            iowait: true,
        };
        assert_eq!(classify(&iowait, &read_fault, &[]), OffCpuReason::Io);
        // A fault waiting for the mmap_lock.
        let mmap_lock = [
            "lock_mm_and_find_vma",
            "exc_page_fault",
            "asm_exc_page_fault",
        ];
        assert_eq!(
            classify(&BlockFacts::default(), &mmap_lock, &[]),
            OffCpuReason::Other
        );
        assert_eq!(classify(&iowait, &mmap_lock, &[]), OffCpuReason::Io);
        assert_eq!(classify(&iowait, &[], &[]), OffCpuReason::Io);
        // pread64 of the same file.
        let pread = [
            "folio_wait_bit_common",
            "filemap_get_pages",
            "filemap_read",
            "vfs_read",
            "__x64_sys_pread64",
        ];
        assert_eq!(classify(&syscall(17), &pread, &[]), OffCpuReason::Io);
    }

    #[test]
    fn other() {
        // subprocess.Popen.wait(): os.waitpid blocks in wait4.
        let kernel = [
            "do_wait",
            "kernel_wait4",
            "do_syscall_64",
            "entry_SYSCALL_64_after_hwframe",
        ];
        let native = ["__GI___wait4", "__GI___waitpid", "os_waitpid"];
        assert_eq!(
            classify(&syscall(61), &kernel, &native),
            OffCpuReason::Other
        );
        assert_eq!(classify(&syscall(247), &[], &[]), OffCpuReason::Other);
        // signal.pause(), signal.sigwait(), a vfork child, a preemption on the way out.
        let pause = ["__do_sys_pause", "do_syscall_64"];
        assert_eq!(classify(&syscall(34), &pause, &[]), OffCpuReason::Other);
        let sigwait = ["do_sigtimedwait.isra.0", "__x64_sys_rt_sigtimedwait"];
        assert_eq!(classify(&syscall(128), &sigwait, &[]), OffCpuReason::Other);
        let vfork = ["kernel_clone", "__do_sys_vfork", "do_syscall_64"];
        assert_eq!(
            classify(&syscall(58), &vfork, &["__libc_vfork"]),
            OffCpuReason::Other
        );
        let exit = ["exit_to_user_mode_loop", "do_syscall_64"];
        assert_eq!(
            classify(&BlockFacts::default(), &exit, &[]),
            OffCpuReason::Other
        );
    }

    #[test]
    fn empty_and_unknown_inputs() {
        let none = BlockFacts::default();
        assert_eq!(classify(&none, &[], &[]), OffCpuReason::Other);
        assert_eq!(classify(&none, &[""], &[""]), OffCpuReason::Other);
        assert_eq!(
            classify(
                &none,
                &["[unknown] (kernel+0x1)"],
                &["[unknown] (a.out+0x10)", ""]
            ),
            OffCpuReason::Other
        );
        assert_eq!(classify(&syscall(9999), &[], &[]), OffCpuReason::Other);
    }

    #[test]
    fn suffixes_and_prefixes_are_ignored() {
        assert_eq!(base_name("core_sys_select.cold"), "core_sys_select");
        assert_eq!(base_name("do_epoll_pwait.part.0"), "do_epoll_pwait");
        assert_eq!(base_name("sigsuspend.isra.0"), "sigsuspend");
        assert_eq!(base_name("take_gil.constprop.0"), "take_gil");
        assert_eq!(
            base_name("PyMutex_LockFlags.part.0.constprop.0"),
            "PyMutex_LockFlags"
        );
        assert_eq!(base_name("foo.lto_priv.0"), "foo");
        assert_eq!(base_name("foo.llvm.1234567"), "foo");
        assert_eq!(base_name("foo.cold.3"), "foo");
        assert_eq!(base_name("futex_do_wait_[k]"), "futex_do_wait");
        assert_eq!(base_name("__GI___lll_lock_wait"), "lll_lock_wait");
        assert_eq!(
            base_name("___pthread_cond_timedwait64"),
            "pthread_cond_timedwait64"
        );
        assert_eq!(
            base_name("_PyEval_EvalFrameDefault"),
            "PyEval_EvalFrameDefault"
        );
        assert_eq!(base_name("foo.bar"), "foo.bar");
        assert_eq!(base_name("foo.1"), "foo.1");
        assert_eq!(base_name(""), "");
        assert_eq!(
            base_name("[unknown] (libc.so.6+0x85f7b)"),
            "[unknown] (libc.so.6+0x85f7b)"
        );

        let kernel = ["do_epoll_pwait.part.0_[k]", "__x64_sys_epoll_pwait_[k]"];
        assert_eq!(
            classify(&BlockFacts::default(), &kernel, &[]),
            OffCpuReason::Io
        );
        let kernel = ["core_sys_select.cold"];
        assert_eq!(
            classify(&BlockFacts::default(), &kernel, &[]),
            OffCpuReason::Io
        );
        let native = ["pthread_cond_timedwait", "take_gil.constprop.0"];
        assert_eq!(
            classify(&BlockFacts::default(), &[], &native),
            OffCpuReason::Gil
        );
        let native = ["PyMutex_LockFlags.part.0.constprop.0", "PyMutex_Lock"];
        assert_eq!(
            classify(&BlockFacts::default(), &[], &native),
            OffCpuReason::Lock
        );
    }

    #[test]
    fn lists_do_not_overlap() {
        fn overlap(a: &[&str], b: &[&str]) -> Vec<String> {
            a.iter()
                .filter(|x| in_list(base_name(x), b))
                .map(|x| x.to_string())
                .collect()
        }
        let kernel = [KERNEL_SLEEP, KERNEL_LOCK, KERNEL_IO];
        let native = [GIL_FUNCTIONS, NATIVE_SLEEP, NATIVE_LOCK];
        for (i, a) in kernel.iter().enumerate() {
            for b in &kernel[i + 1..] {
                assert_eq!(overlap(a, b), Vec::<String>::new());
            }
        }
        for (i, a) in native.iter().enumerate() {
            for b in &native[i + 1..] {
                assert_eq!(overlap(a, b), Vec::<String>::new());
            }
        }
        // Every GIL primitive is a lock function when CPython does not call it.
        assert_eq!(
            overlap(GIL_PRIMITIVES, NATIVE_LOCK).len(),
            GIL_PRIMITIVES.len()
        );
        for nr in LOCK_SYSCALLS {
            assert!(!IO_SYSCALLS.contains(nr), "{nr}");
        }
        for nr in [35, 230] {
            assert!(!IO_SYSCALLS.contains(&nr) && !LOCK_SYSCALLS.contains(&nr));
        }
        for list in kernel.into_iter().chain(native).chain([GIL_PRIMITIVES]) {
            for name in list {
                assert!(!base_name(name).is_empty(), "{name}");
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for r in OffCpuReason::ALL {
            assert_eq!(OffCpuReason::from_name(r.name()), Some(r));
            assert_eq!(r.frame_name(), format!("[off-cpu: {}]", r.name()));
        }
        assert_eq!(OffCpuReason::from_name("idle"), None);
        assert_eq!(OffCpuReason::from_name("Lock"), None);
        assert_eq!(OffCpuReason::Gil.frame_name(), "[off-cpu: gil]");
    }
}
