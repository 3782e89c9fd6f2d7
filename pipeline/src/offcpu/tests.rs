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

#[test]
fn an_event_loop_waiting_in_its_selector_is_asyncio_idle() {
    let selector = (
        "_PollLikeSelector.select",
        "/usr/lib/python3.11/selectors.py",
    );
    let run_once = (
        "BaseEventLoop._run_once",
        "/usr/lib/python3.11/asyncio/base_events.py",
    );
    // 3.8-3.10 name code objects without their class.
    let old = [
        ("select", "/opt/py/lib/python3.8/selectors.py"),
        ("_run_once", "/opt/py/lib/python3.8/asyncio/base_events.py"),
    ];
    for reason in [OffCpuReason::Io, OffCpuReason::Sleep] {
        assert!(is_asyncio_idle(reason, &[selector, run_once]));
        assert!(is_asyncio_idle(reason, &old));
    }
    // The loop waiting for the GIL or a lock is not idle.
    assert!(!is_asyncio_idle(OffCpuReason::Gil, &[selector, run_once]));
    assert!(!is_asyncio_idle(OffCpuReason::Lock, &[selector, run_once]));
    // A selector used outside asyncio, a task's own wait, a select of another module.
    assert!(!is_asyncio_idle(
        OffCpuReason::Io,
        &[selector, ("serve_forever", "/srv/socketserver.py")]
    ));
    assert!(!is_asyncio_idle(
        OffCpuReason::Io,
        &[("Handler.read", "/srv/app.py"), run_once]
    ));
    assert!(!is_asyncio_idle(
        OffCpuReason::Io,
        &[("select", "/srv/mine.py"), run_once]
    ));
    assert!(!is_asyncio_idle(OffCpuReason::Io, &[selector]));
    assert!(!is_asyncio_idle(OffCpuReason::Io, &[]));
    assert_eq!(
        OffCpuReason::AsyncioIdle.frame_name(),
        "[off-cpu: asyncio_idle]"
    );
    assert_eq!(
        OffCpuReason::from_name("asyncio_idle"),
        Some(OffCpuReason::AsyncioIdle)
    );
}

#[test]
fn a_thread_on_a_cpu_waits_for_the_gil_only_inside_a_taker_s_wait() {
    let py = "spin (app.py:3)";
    // Runnable in the condition wait of take_gil: waiting.
    assert!(waits_for_gil(&[
        "__futex_abstimed_wait_common",
        "___pthread_cond_timedwait64",
        "PyCOND_TIMEDWAIT (condvar.h:73, inlined)",
        "take_gil",
        py,
    ]));
    // Handing the GIL over, or leaving take_gil with it: not waiting.
    assert!(!waits_for_gil(&[
        "__GI___lll_lock_wake",
        "__GI___pthread_mutex_unlock_usercnt",
        "drop_gil",
        py,
    ]));
    assert!(!waits_for_gil(&["___pthread_mutex_unlock", "take_gil", py]));
    // Running Python code.
    assert!(!waits_for_gil(&["_PyLong_Add", py]));
}
