//! `spanprof daemon`: continuous profiling of a host (or of selected processes), one OTLP
//! profiles export per window.
//!
//! # How it runs
//!
//! - **Sampling** (the main thread): the BPF programs are loaded once, with children followed
//!   in the kernel. Every second a scan of `/proc` adds the processes that came into
//!   [scope](config::Scope) (the whole host by default); processes leave the target set in the
//!   kernel when they exit. The ring buffer is drained every 50 ms into the window's
//!   [`Aggregator`], bounded by `max_stacks` and `max_processes` (what does not fit is
//!   counted in `spanprof_samples_dropped_total`).
//! - **Windows**: at the end of each window the aggregate is symbolized into a
//!   [`Profile`](crate::profile::Profile), encoded as one `ExportProfilesServiceRequest`
//!   ([`crate::format::otlp`]) with a resource per process, and queued; sampling goes on into
//!   a fresh aggregate at once (the unwind tables and symbol caches are kept).
//! - **Memory**: what is kept per program is bounded, however many distinct programs come and
//!   go (a CI runner starts thousands an hour). A process's modules (its memory map, module
//!   files and unwind tables) are read while it lives, at its first sample, and dropped once it
//!   exited and its samples were symbolized ([`symbolizer::Symbolizer::forget_exited`],
//!   [`symbolizer::unwind::Unwinders::sweep`]); parsed symbols are kept between windows within
//!   `limits.symbol_cache_bytes`, least recently used dropped first.
//! - **Export** (a tokio task, [`queue`]): the queue never blocks sampling; it keeps at most
//!   `export.queue` windows, dropping the oldest, and retries with exponential backoff and
//!   jitter while the collector cannot be reached.
//! - **Signals**: SIGTERM or SIGINT closes the current window, and the daemon exits once the
//!   queue is sent or after `export.timeout` plus 5 s; SIGHUP reads the configuration again and
//!   applies its scope, export, window and limits (sampling settings need a restart).
//! - **Self-metrics** on `/metrics` and `/healthz` ([`metrics`]).

pub mod config;
pub mod metrics;
pub mod queue;
pub mod scope;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};

use crate::aggregate::{self, Aggregator};
use crate::bpf::{AllocOptions, LoadOptions, OffCpuOptions, Programs};
use crate::export::Exporter;
use crate::profile::Meta;
use crate::python::Python;
use crate::session::{Probes, StackCopySizes};
use crate::target_cpu::TargetCpu;
use config::DaemonConfig;
use metrics::Metrics;
use queue::{ExportState, Queue, Window};
use scope::Scanner;

/// How often the ring buffer is drained.
const TICK: Duration = Duration::from_millis(50);
/// How often `/proc` is scanned for processes that came into scope.
const SCAN_EVERY: Duration = Duration::from_secs(1);
/// Ring buffer size: a window's symbolization (up to about a second on a busy host) must not
/// fill it.
const RING_BUFFER_BYTES: u32 = 16 << 20;

static STOP: AtomicI32 = AtomicI32::new(0);
static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(sig: libc::c_int) {
    STOP.store(sig, Ordering::Relaxed);
}

extern "C" fn on_hup(_: libc::c_int) {
    RELOAD.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() {
    let handlers: [(libc::c_int, extern "C" fn(libc::c_int)); 3] = [
        (libc::SIGINT, on_stop),
        (libc::SIGTERM, on_stop),
        (libc::SIGHUP, on_hup),
    ];
    for (sig, handler) in handlers {
        // SAFETY: the handlers only store to atomics (async-signal-safe).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as *const () as usize;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// Waits until the ring buffer has data or `timeout` passes.
fn wait_readable(fd: i32, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; EINTR (a signal) just ends the wait early.
    unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
}

fn aggregate_options(config: &DaemonConfig) -> aggregate::Options {
    aggregate::Options {
        timestamps: true,
        alloc_rate: config.events.alloc_rate,
        max_keys: config.max_stacks,
        max_processes: config.max_processes,
        ..aggregate::Options::default()
    }
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(config_path: Option<PathBuf>) -> Result<()> {
    let mut config = DaemonConfig::load(config_path.as_deref()).map_err(anyhow::Error::msg)?;
    crate::preflight::check_capabilities()?;
    crate::preflight::check_pid_namespace()?;
    install_signal_handlers();
    let me = std::process::id();
    let metrics = Arc::new(Metrics::default());
    metrics.tick();

    let mut programs = Programs::load(&LoadOptions {
        frequency: config.frequency,
        follow_children: true,
        ring_buffer_size: RING_BUFFER_BYTES,
        btf_path: std::env::var_os("SPANPROF_BTF_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(crate::bpf::DEFAULT_BTF_PATH)),
        stack_copy_bytes: config.stack_copy_bytes,
        cpu: config.events.cpu,
        off_cpu: config.events.off_cpu.then_some(OffCpuOptions {
            period_ns: 1_000_000_000 / config.frequency.max(1),
            min_ns: u64::try_from(config.offcpu_min.as_nanos()).unwrap_or(u64::MAX),
            runnable: config.events.wall,
        }),
        alloc: config.events.alloc.then_some(AllocOptions {
            rate: config.events.alloc_rate,
            heap: false,
        }),
    })?;
    // Allocation probes: on the C library of this process (the host's usual one) now, and on
    // any other one a process in scope maps when it is found.
    let mut probes = Probes {
        enabled: config.events.alloc,
    };
    probes.libc_of(&mut programs, me)?;
    // Loaded and attached: what only that needed goes, before any other thread starts.
    match crate::preflight::drop_capabilities(&crate::preflight::capabilities_after_loading(
        config.events.alloc,
    )) {
        Ok(kept) => eprintln!(
            "spanprof daemon: programs loaded; capabilities kept: {}",
            if kept.is_empty() {
                "none".to_string()
            } else {
                kept.join(", ")
            }
        ),
        Err(e) => eprintln!("spanprof daemon: warning: capabilities not dropped: {e}"),
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("spanprof-export")
        .enable_all()
        .build()
        .context("cannot start the export runtime")?;
    let queue = Arc::new(Queue::new(config.queue, metrics.clone()));
    let exporter = {
        let _guard = runtime.enter();
        Exporter::new(config.exporter.clone()).map_err(anyhow::Error::msg)?
    };
    let state = Arc::new(Mutex::new(ExportState {
        exporter,
        max_backoff: config.max_backoff,
    }));
    let deadline = Arc::new(Mutex::new(None));
    let exporter_task = runtime.spawn(queue::run_exporter(
        queue.clone(),
        state.clone(),
        metrics.clone(),
        deadline.clone(),
    ));
    let mut metrics_task = start_metrics(&runtime, config.metrics, &metrics)?;

    let mut scanner = Scanner::default();
    let mut python = Python::new(true, config.spans);
    let mut symbolizer = symbolizer::Symbolizer::new();
    symbolizer.set_cache_limit(config.symbol_cache_bytes);
    let mut copy = StackCopySizes {
        default: config.stack_copy_bytes,
        raised: Vec::new(),
    };
    let mut agg = Aggregator::new(aggregate_options(&config));
    // The targets' CPU time per window, from /proc (children are followed).
    let mut target_cpu = TargetCpu::new(true);
    add_in_scope(
        &mut scanner,
        &config,
        &mut programs,
        &mut probes,
        &mut python,
        &mut target_cpu,
        me,
    );
    eprintln!(
        "spanprof daemon: profiling {} at {} Hz ({}), a profile every {} s to {} ({}); \
         metrics on {}",
        config.scope.describe(),
        config.frequency,
        events_name(&config),
        config.window.as_secs_f64(),
        config.exporter.endpoint,
        config.exporter.protocol.name(),
        config
            .metrics
            .map_or("nothing (off)".to_string(), |a| format!(
                "http://{a}/metrics"
            ))
    );

    let mut cost_from = (crate::session::process_cpu_time(), programs.kernel_time());
    // The window being symbolized: its id, its profile to be, and the records it was made of.
    let mut closing: Option<(u64, aggregate::PendingProfile, u64)> = None;
    let mut window_start = Instant::now();
    let mut window_wall = SystemTime::now();
    let mut window_id = 0u64;
    let mut last_scan = Instant::now();
    let mut scans = 0u64;
    let mut lost_before = programs.lost_samples();
    let mut dropped_total = 0u64;
    let mut samples_total = 0u64;
    loop {
        // NB: no wait while a window is being symbolized: its next part comes at once.
        let wait = if closing.is_some() {
            Duration::ZERO
        } else {
            TICK
        };
        wait_readable(programs.samples.as_raw_fd(), wait);
        crate::session::drain(
            &mut programs,
            &mut agg,
            &mut python,
            &mut copy,
            &mut symbolizer,
        );
        probes.python(&mut programs, &mut python);
        agg.normalize_pending(&mut symbolizer);
        metrics.tick();
        metrics
            .samples
            .store(samples_total + agg.samples(), Ordering::Relaxed);
        metrics
            .samples_dropped
            .store(dropped_total + agg.dropped(), Ordering::Relaxed);

        if last_scan.elapsed() >= SCAN_EVERY {
            last_scan = Instant::now();
            add_in_scope(
                &mut scanner,
                &config,
                &mut programs,
                &mut probes,
                &mut python,
                &mut target_cpu,
                me,
            );
            // Listing walks the map (a syscall per entry): every 10 s is enough for a gauge,
            // and for the CPU time of the children the kernel added (those that exit sooner
            // are in their parents' figures).
            scans += 1;
            if scans % 10 == 1 {
                let pids = programs.target_pids();
                metrics.targets.store(pids.len() as u64, Ordering::Relaxed);
                target_cpu.refresh(&pids);
            }
            metrics
                .targets_failed
                .store(ADD_FAILED.load(Ordering::Relaxed), Ordering::Relaxed);
            metrics
                .samples_lost
                .store(programs.lost_samples(), Ordering::Relaxed);
            metrics.set_caches(&symbolizer.cache_stats(), agg.unwind_table_bytes());
        }
        // The last window's symbolization goes on a part at a time: processes that start and
        // exit meanwhile are drained (and their modules read) while they live.
        if let Some(mut part) = closing.take() {
            if part.1.step(&mut symbolizer, SYMBOLIZE_STEP) {
                let mut done = Done {
                    python: &python,
                    symbolizer: &mut symbolizer,
                    agg: &agg,
                    programs: &programs,
                    metrics: &metrics,
                    config: &config,
                    queue: &queue,
                    cost_from: &mut cost_from,
                    target_cpu: &mut target_cpu,
                };
                done.window(part);
            } else {
                // What the modules evicted meanwhile held goes back to the system now, not at
                // the window's end: the peak stays near the cache bound.
                release_freed_memory();
                closing = Some(part);
            }
        }
        let stop = STOP.load(Ordering::Relaxed) != 0;
        if stop || window_start.elapsed() >= config.window {
            window_id += 1;
            let lost = programs.lost_samples();
            let meta = Meta {
                target: config.scope.describe(),
                start: window_wall,
                duration: window_start.elapsed(),
                // A memory profile has no sampling frequency.
                frequency: if config.events.alloc {
                    0
                } else {
                    config.frequency
                },
                events: config.events,
                lost_samples: lost - lost_before,
                python: Default::default(),
                host: Some(crate::resource::HostInfo::current()),
                build: Default::default(),
                dropped_labels: Vec::new(),
            };
            lost_before = lost;
            window_start = Instant::now();
            window_wall = SystemTime::now();
            let window = agg.take_window();
            samples_total += window.samples();
            dropped_total += window.dropped();
            let records = window.samples() + window.dropped();
            let mut done = Done {
                python: &python,
                symbolizer: &mut symbolizer,
                agg: &agg,
                programs: &programs,
                metrics: &metrics,
                config: &config,
                queue: &queue,
                cost_from: &mut cost_from,
                target_cpu: &mut target_cpu,
            };
            // One window is symbolized at a time: a previous one still under way is finished
            // first (the sampling loop then waits, the ring buffer holding the samples).
            if let Some(mut previous) = closing.take() {
                while !previous.1.step(done.symbolizer, Duration::MAX) {}
                done.window(previous);
            }
            let next = (
                window_id,
                window.into_pending(done.symbolizer, meta),
                records,
            );
            if stop {
                let mut next = next;
                while !next.1.step(done.symbolizer, Duration::MAX) {}
                done.window(next);
            } else {
                closing = Some(next);
            }
        }
        if stop {
            break;
        }
        if RELOAD.swap(false, Ordering::Relaxed) {
            match DaemonConfig::load(config_path.as_deref()) {
                Err(e) => eprintln!("spanprof daemon: reload failed, configuration unchanged: {e}"),
                Ok(new) => {
                    let mut new = apply_reload(&config, new, &runtime, &state, &queue);
                    if new.metrics != config.metrics {
                        match start_metrics(&runtime, new.metrics, &metrics) {
                            Ok(task) => {
                                metrics_task.abort();
                                metrics_task = task;
                            }
                            Err(e) => {
                                eprintln!("spanprof daemon: metrics address not changed: {e:#}");
                                new.metrics = config.metrics;
                            }
                        }
                    }
                    if new.scope != config.scope {
                        programs.clear_targets();
                        target_cpu.untrack_all();
                        scanner.reset();
                    }
                    agg.set_limits(new.max_stacks, new.max_processes);
                    symbolizer.set_cache_limit(new.symbol_cache_bytes);
                    config = new;
                    add_in_scope(
                        &mut scanner,
                        &config,
                        &mut programs,
                        &mut probes,
                        &mut python,
                        &mut target_cpu,
                        me,
                    );
                    eprintln!(
                        "spanprof daemon: configuration reloaded: profiling {}",
                        config.scope.describe()
                    );
                }
            }
        }
    }

    // Flush: the last window is queued; give the exporter until the deadline.
    drop(programs);
    let limit = Instant::now() + config.exporter.timeout + Duration::from_secs(5);
    *deadline.lock().unwrap() = Some(limit);
    let sent = runtime.block_on(async {
        tokio::time::timeout_at(limit.into(), exporter_task)
            .await
            .is_ok()
    });
    let left = queue.abandon();
    if !sent || left > 0 {
        eprintln!("spanprof daemon: stopped with {left} windows not exported");
    } else {
        eprintln!("spanprof daemon: stopped; every window exported");
    }
    metrics_task.abort();
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// How long a part of a window's symbolization runs between two drains (at least one module).
const SYMBOLIZE_STEP: Duration = Duration::from_millis(20);

/// What finishing a window needs.
struct Done<'a> {
    python: &'a Python,
    symbolizer: &'a mut symbolizer::Symbolizer,
    agg: &'a Aggregator,
    programs: &'a Programs,
    metrics: &'a Metrics,
    config: &'a DaemonConfig,
    queue: &'a Queue,
    /// CPU time and kernel time when the last window was finished.
    cost_from: &'a mut (Duration, Option<crate::bpf::KernelTime>),
    /// The targets' CPU time since the last window was finished.
    target_cpu: &'a mut TargetCpu,
}

impl Done<'_> {
    /// Builds window `id`'s profile, once symbolized, and queues its export; forgets what was
    /// kept only for its samples.
    fn window(&mut self, (id, pending, records): (u64, aggregate::PendingProfile, u64)) {
        let mut profile = pending.finish(self.python);
        self.symbolizer.forget_exited();
        release_freed_memory();
        self.metrics.set_caches(
            &self.symbolizer.cache_stats(),
            self.agg.unwind_table_bytes(),
        );
        // The window's cost, as a session's summary gives it, symbolizing included: from the
        // last window's end to this one's, as the targets' CPU time.
        let kernel_now = self.programs.kernel_time();
        let cpu_now = crate::session::process_cpu_time();
        let targets = self.target_cpu.take(&self.programs.target_pids());
        let (cpu_then, kernel_then) = std::mem::replace(self.cost_from, (cpu_now, kernel_now));
        let overhead = crate::session::Overhead {
            setup: Duration::ZERO,
            sampling: cpu_now.saturating_sub(cpu_then),
            cpu_at_end_of_sampling: cpu_now,
            kernel: kernel_now
                .zip(kernel_then)
                .map(|(now, then)| now.since(&then)),
            records,
            targets,
        };
        self.metrics.set_cost(
            &crate::summary::Cost::of(&profile, &overhead),
            kernel_now.map(|k| k.total_ns),
        );
        self.config.privacy.apply(&mut profile);
        self.metrics
            .processes
            .store(profile.processes.len() as u64, Ordering::Relaxed);
        self.metrics.windows.fetch_add(1, Ordering::Relaxed);
        let request = crate::format::otlp::request(&profile);
        self.queue.push(Window {
            id,
            bytes: prost::Message::encoded_len(&request),
            request: Arc::new(request),
        });
    }
}

/// Gives the memory freed since (the tables of programs that exited) back to the system:
/// glibc keeps freed memory for reuse in the middle of its heaps, where a daemon that saw a
/// burst of distinct programs would keep their peak for ever.
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn events_name(config: &DaemonConfig) -> &'static str {
    if config.events.alloc {
        return "alloc";
    }
    match (config.events.wall, config.events.cpu, config.events.off_cpu) {
        (true, _, _) => "wall",
        (false, true, true) => "cpu,offcpu",
        (false, false, true) => "offcpu",
        _ => "cpu",
    }
}

/// Adds the processes that came into scope to the kernel's target set, looks for their
/// interpreter at once (so their first samples have Python frames), and probes their C library
/// for allocations (once per library file).
fn add_in_scope(
    scanner: &mut Scanner,
    config: &DaemonConfig,
    programs: &mut Programs,
    probes: &mut Probes,
    python: &mut Python,
    target_cpu: &mut TargetCpu,
    me: u32,
) {
    for pid in scanner.scan(&config.scope, me) {
        if programs.is_target(pid) {
            continue;
        }
        if programs.add_target(pid).is_err() {
            // The map is full (or the process is gone): counted, and said once in a while.
            ADD_FAILED.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        target_cpu.add(pid);
        python.detect_now(pid);
        if let Err(e) = probes.libc_of(programs, pid) {
            eprintln!("spanprof daemon: pid {pid}: {e:#}");
        }
    }
    python.flush(programs);
}

/// Processes in scope that could not be added to the kernel's target set.
static ADD_FAILED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Serves the metrics on `addr`, if any.
fn start_metrics(
    runtime: &tokio::runtime::Runtime,
    addr: Option<std::net::SocketAddr>,
    metrics: &Arc<Metrics>,
) -> Result<tokio::task::JoinHandle<()>> {
    let Some(addr) = addr else {
        return Ok(runtime.spawn(async {}));
    };
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    Ok(runtime.spawn(metrics::serve(listener, metrics.clone())))
}

/// Applies what a reload can change without reloading the BPF programs; returns the new
/// configuration with the sampling settings that did not change (they need a restart).
fn apply_reload(
    old: &DaemonConfig,
    mut new: DaemonConfig,
    runtime: &tokio::runtime::Runtime,
    state: &Arc<Mutex<ExportState>>,
    queue: &Arc<Queue>,
) -> DaemonConfig {
    let needs_restart = old.frequency != new.frequency
        || old.events != new.events
        || old.offcpu_min != new.offcpu_min
        || old.stack_copy_bytes != new.stack_copy_bytes
        || old.spans != new.spans;
    if needs_restart {
        eprintln!(
            "spanprof daemon: sampling settings changed (frequency, events, alloc_rate, \
             offcpu_min, unwind, spans): they apply after a restart, the running ones are kept"
        );
        new.frequency = old.frequency;
        new.events = old.events;
        new.offcpu_min = old.offcpu_min;
        new.stack_copy_bytes = old.stack_copy_bytes;
        new.spans = old.spans;
    }
    if old.exporter != new.exporter || old.max_backoff != new.max_backoff {
        let _guard = runtime.enter();
        match Exporter::new(new.exporter.clone()) {
            Ok(exporter) => {
                *state.lock().unwrap() = ExportState {
                    exporter,
                    max_backoff: new.max_backoff,
                }
            }
            Err(e) => eprintln!("spanprof daemon: export settings not applied: {e}"),
        }
    }
    queue.set_capacity(new.queue);
    new
}
