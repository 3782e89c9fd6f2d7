//! Signals that end (and, in the daemon, reload) a collection. The handlers only store to
//! atomics; the loops read them once a tick.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The signal that asked the collection to stop, 0 while none did.
static STOP: AtomicI32 = AtomicI32::new(0);
/// SIGHUP came (the daemon reads its configuration again).
static RELOAD: AtomicBool = AtomicBool::new(false);

/// The signal (SIGINT, SIGTERM, and in a session SIGHUP) that asked to stop, if one did.
pub fn stop_signal() -> Option<i32> {
    match STOP.load(Ordering::Relaxed) {
        0 => None,
        sig => Some(sig),
    }
}

/// Whether SIGHUP came since the last call.
pub fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::Relaxed)
}

extern "C" fn on_session_signal(sig: libc::c_int) {
    if STOP.swap(sig, Ordering::Relaxed) != 0 {
        // The second one: leave now, without the outputs and without their temporary files.
        crate::write::remove_temp_files();
        // SAFETY: signal and raise are async-signal-safe; the default action ends the process.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

extern "C" fn on_daemon_stop(sig: libc::c_int) {
    STOP.store(sig, Ordering::Relaxed);
}

extern "C" fn on_hup(_: libc::c_int) {
    RELOAD.store(true, Ordering::Relaxed);
}

/// Installs `handler` for `sig`; with `keep_ignored`, a signal spanprof was started with
/// ignored stays ignored.
fn install(sig: libc::c_int, handler: extern "C" fn(libc::c_int), keep_ignored: bool) {
    // SAFETY: the handlers only store to atomics (and a second session signal ends the process
    // with async-signal-safe calls); `old` is a valid out-parameter.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler as *const () as usize;
        libc::sigemptyset(&mut act.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, &act, &mut old);
        if keep_ignored && old.sa_sigaction == libc::SIG_IGN {
            libc::sigaction(sig, &old, std::ptr::null_mut());
        }
    }
}

/// Makes SIGINT, SIGTERM and SIGHUP (the terminal closed) end a session (the outputs are still
/// written). Installed once, before anything is created that must be cleaned up; a second
/// one ends spanprof at once (removing its temporary files), so a user can always get out.
///
/// A signal spanprof was started with ignored (`nohup`, `&` in a script) stays ignored, for
/// spanprof and, through `exec`, for the command; caught ones are reset to the default by `exec`.
pub fn install_session_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        install(sig, on_session_signal, true);
    }
}

/// The daemon's: SIGINT and SIGTERM close the window and stop it (a second one changes
/// nothing: the queue is still flushed), SIGHUP reloads the configuration.
pub fn install_daemon_handlers() {
    install(libc::SIGINT, on_daemon_stop, false);
    install(libc::SIGTERM, on_daemon_stop, false);
    install(libc::SIGHUP, on_hup, false);
}
