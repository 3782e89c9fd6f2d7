//! What [`classify`](super::classify) knows of x86_64 Linux and CPython: the system calls that
//! sleep, wait for a lock or for I/O, and the kernel, C library and interpreter functions a
//! thread blocks in for each reason.

/// System calls that sleep when their first argument is 0: select (23) and pselect6 (270) with
/// nfds 0, poll (7) and ppoll (271) with a null descriptor array (glibc 2.36's `select` is
/// pselect6: Python 3.8-3.10's `time.sleep` blocks in pselect6(0, NULL, NULL, NULL, ...)).
pub(super) const SLEEP_IF_ARG0_ZERO: &[u32] = &[7, 23, 270, 271];

/// x86_64 system calls that wait for another thread or process to release something: futex
/// (202), futex_waitv (449), futex_wait (455, kernel `__x64_sys_futex_wait`), flock (73), fcntl
/// (72: only F_SETLKW/F_OFD_SETLKW block), semop (65), semtimedop (220).
pub(super) const LOCK_SYSCALLS: &[u32] = &[202, 449, 455, 73, 72, 65, 220];

/// x86_64 system calls that wait for a descriptor, a file system or a device (numbers from
/// `asm/unistd_64.h`); select, pselect6, poll and ppoll without descriptors are sleeps.
pub(super) const IO_SYSCALLS: &[u32] = &[
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
pub(super) const GIL_FUNCTIONS: &[&str] = &[
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

/// The functions of [`GIL_FUNCTIONS`] that take the GIL (the others hand it over).
pub(super) const GIL_TAKERS: &[&str] = &[
    "take_gil",
    "_PyEval_AcquireLock",
    "_PyThreadState_Attach",
    "PyEval_RestoreThread",
    "PyEval_AcquireThread",
    "PyEval_AcquireLock",
    "PyGILState_Ensure",
    "PyThreadState_Swap",
    "_PyThreadState_Swap",
];

/// glibc functions CPython calls to wait for the GIL: the only callers of `pthread_cond_*wait`
/// and `pthread_mutex_lock` in pyenv's 3.8-3.13 are `take_gil`, `drop_gil` and functions they
/// are inlined into (`PyEval_SaveThread`, `_Py_read` in Debian's 3.11); names as glibc 2.36's
/// `.dynsym` and, with libc6-dbg, its DWARF name them (`___pthread_cond_timedwait64`).
pub(super) const GIL_PRIMITIVES: &[&str] = &[
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
pub(super) const KERNEL_SLEEP: &[&str] = &[
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
pub(super) const NATIVE_SLEEP: &[&str] = &[
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
pub(super) const KERNEL_LOCK: &[&str] = &[
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
pub(super) const NATIVE_LOCK: &[&str] = &[
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
pub(super) const KERNEL_IO: &[&str] = &[
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
