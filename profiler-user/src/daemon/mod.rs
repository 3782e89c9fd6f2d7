//! `spanprof daemon`: continuous profiling of a host (or of selected processes), one OTLP
//! profiles export per window.
//!
//! # How it runs
//!
//! - **Sampling** (the main thread, on the [collector](crate::collect) a session uses too): the
//!   BPF programs are loaded once, with children followed in the kernel. Every second a scan of
//!   `/proc` adds the processes that came into [scope](config::Scope) (the whole host by
//!   default); processes leave the target set in the kernel when they exit. The ring buffer is
//!   drained every 50 ms (100 ms once quiet: `collect::QUIET_TICK`) into the window's [`Aggregator`](crate::aggregate::Aggregator), bounded
//!   by `max_stacks` and `max_processes` (what does not fit is counted in
//!   `spanprof_samples_dropped_total`).
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

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};

use crate::aggregate;
use crate::collect::{self, signals, Collector};
use crate::export::Exporter;
use config::DaemonConfig;
use metrics::Metrics;
use queue::{ExportState, Queue, Window};
use scope::Scanner;

/// How often `/proc` is scanned for processes that came into scope.
const SCAN_EVERY: Duration = Duration::from_secs(1);

fn aggregate_options(config: &DaemonConfig) -> aggregate::Options {
    aggregate::Options {
        timestamps: true,
        max_keys: config.max_stacks,
        max_processes: config.max_processes,
        ..aggregate::Options::default()
    }
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(config_path: Option<PathBuf>) -> Result<()> {
    let mut config = DaemonConfig::load(config_path.as_deref()).map_err(anyhow::Error::msg)?;
    collect::preflight()?;
    signals::install_daemon_handlers();
    let me = std::process::id();
    let metrics = Arc::new(Metrics::default());
    metrics.tick();

    let mut c = Collector::load(&config.sampling, aggregate_options(&config))?;
    // The pass that counts, at each window's end, the threads blocked then (see below).
    let off_cpu = config.sampling.events.off_cpu()
        && match c.programs.load_task_iterator() {
            Ok(()) => true,
            Err(e) => {
                eprintln!(
                    "spanprof daemon: warning: threads blocked at a window's end are counted \
                     only when they wake: {e}"
                );
                false
            }
        };
    // Allocation probes: on the C library of this process (the host's usual one) now, and on
    // any other one a process in scope maps when it is found.
    c.probe_own_libc()?;
    // Loaded and attached: what only that needed goes, before any other thread starts.
    match crate::preflight::drop_capabilities(&crate::preflight::capabilities_after_loading(
        config.sampling.events.alloc(),
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
    c.symbolizer.set_cache_limit(config.symbol_cache_bytes);
    c.symbolizer.set_debuginfod(debuginfod_client(&config));
    let mut debuginfod_said = Default::default();
    // Refused module files said so far.
    let mut refused_said = 0u64;
    add_in_scope(&mut scanner, &config, &mut c, me);
    eprintln!(
        "spanprof daemon: profiling {} at {} Hz ({}), a profile every {} s to {} ({}); \
         metrics on {}",
        config.scope.describe(),
        config.sampling.frequency,
        config.sampling.events.name(),
        config.window.as_secs_f64(),
        config.exporter.shown_endpoint(),
        config.exporter.protocol.name(),
        config
            .metrics
            .map_or("nothing (off)".to_string(), |a| format!(
                "http://{a}/metrics"
            ))
    );

    // The window's cost is measured from here to its finish.
    c.mark();
    // The window being symbolized: its id, its profile to be, and the records it was made of.
    let mut closing: Option<(u64, aggregate::PendingProfile, u64)> = None;
    let mut window_start = Instant::now();
    let mut window_wall = SystemTime::now();
    let mut window_id = 0u64;
    let mut last_scan = Instant::now();
    let mut scans = 0u64;
    let mut lost_before = c.programs.lost_samples();
    let mut dropped_total = 0u64;
    let mut samples_total = 0u64;
    let mut waiter = c.waiter(&[]);
    loop {
        // NB: no wait while a window is being symbolized: its next part comes at once.
        let wait = if closing.is_some() {
            Duration::ZERO
        } else {
            c.max_wait()
        };
        waiter.wait(wait);
        c.tick();
        metrics.tick();
        metrics
            .samples
            .store(samples_total + c.agg.samples(), Ordering::Relaxed);
        metrics
            .samples_dropped
            .store(dropped_total + c.agg.dropped(), Ordering::Relaxed);

        if last_scan.elapsed() >= SCAN_EVERY {
            last_scan = Instant::now();
            add_in_scope(&mut scanner, &config, &mut c, me);
            // Listing walks the map (a syscall per entry): every 10 s is enough for a gauge,
            // and for the CPU time of the children the kernel added (those that exit sooner
            // are in their parents' figures).
            scans += 1;
            if scans % 10 == 1 {
                let pids = c.programs.target_pids();
                metrics.targets.store(pids.len() as u64, Ordering::Relaxed);
                c.target_cpu.refresh(&pids);
            }
            metrics
                .targets_failed
                .store(ADD_FAILED.load(Ordering::Relaxed), Ordering::Relaxed);
            metrics
                .samples_lost
                .store(c.programs.lost_samples(), Ordering::Relaxed);
            metrics.set_caches(&c.symbolizer.cache_stats(), c.agg.unwind_table_bytes());
            say_debuginfod(&c.symbolizer, &mut debuginfod_said);
            if let Some(line) = crate::session::refused_files_line(&c.symbolizer, refused_said) {
                eprintln!("spanprof daemon: {line}");
                refused_said = c.symbolizer.refused_files().1;
            }
        }
        // The last window's symbolization goes on a part at a time: processes that start and
        // exit meanwhile are drained (and their modules read) while they live.
        if let Some(mut part) = closing.take() {
            if part.1.step(&mut c.symbolizer, SYMBOLIZE_STEP) {
                let mut done = Done {
                    c: &mut c,
                    metrics: &metrics,
                    config: &config,
                    queue: &queue,
                };
                done.window(part);
            } else {
                // What the modules evicted meanwhile held goes back to the system now, not at
                // the window's end: the peak stays near the cache bound.
                release_freed_memory();
                closing = Some(part);
            }
        }
        let stop = signals::stop_signal().is_some();
        if stop || window_start.elapsed() >= config.window {
            window_id += 1;
            let (cut, cut_wall) = (Instant::now(), SystemTime::now());
            // A thread blocked now has its time so far in this window, the rest in the next:
            // one stuck for hours is in every window, not in none.
            if off_cpu {
                if let Err(e) = c.programs.count_open_intervals() {
                    eprintln!("spanprof daemon: threads blocked now not counted: {e}");
                }
                c.drain();
            }
            let lost = c.programs.lost_samples();
            let meta = c.meta(
                config.scope.describe(),
                window_wall,
                cut.duration_since(window_start),
                lost - lost_before,
            );
            lost_before = lost;
            window_start = cut;
            window_wall = cut_wall;
            let window = c.agg.take_window();
            samples_total += window.samples();
            dropped_total += window.dropped();
            let records = window.samples() + window.dropped();
            let mut done = Done {
                c: &mut c,
                metrics: &metrics,
                config: &config,
                queue: &queue,
            };
            // One window is symbolized at a time: a previous one still under way is finished
            // first (the sampling loop then waits, the ring buffer holding the samples).
            if let Some(mut previous) = closing.take() {
                while !previous.1.step(&mut done.c.symbolizer, Duration::MAX) {}
                done.window(previous);
            }
            let next = (
                window_id,
                window.into_pending(&mut done.c.symbolizer, meta),
                records,
            );
            if stop {
                let mut next = next;
                while !next.1.step(&mut done.c.symbolizer, Duration::MAX) {}
                done.window(next);
            } else {
                closing = Some(next);
            }
        }
        if stop {
            break;
        }
        if signals::take_reload() {
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
                        c.programs.clear_targets();
                        c.target_cpu.untrack_all();
                        scanner.reset();
                    }
                    c.agg.set_limits(new.max_stacks, new.max_processes);
                    c.symbolizer.set_cache_limit(new.symbol_cache_bytes);
                    if new.debuginfod != config.debuginfod {
                        c.symbolizer.set_debuginfod(debuginfod_client(&new));
                        debuginfod_said = Default::default();
                    }
                    config = new;
                    add_in_scope(&mut scanner, &config, &mut c, me);
                    eprintln!(
                        "spanprof daemon: configuration reloaded: profiling {}",
                        config.scope.describe()
                    );
                }
            }
        }
    }

    // Flush: the last window is queued; give the exporter until the deadline.
    drop(c);
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
    /// The collection: its symbolizer, and the cost since the last window was finished.
    c: &'a mut Collector,
    metrics: &'a Metrics,
    config: &'a DaemonConfig,
    queue: &'a Queue,
}

impl Done<'_> {
    /// Builds window `id`'s profile, once symbolized, and queues its export; forgets what was
    /// kept only for its samples.
    fn window(&mut self, (id, pending, records): (u64, aggregate::PendingProfile, u64)) {
        let mut profile = pending.finish(&self.c.python);
        // Before the modules of the processes gone are dropped: the most this window held.
        self.metrics.window_symbol_cache_peak.store(
            self.c.symbolizer.cache_stats().parsed_peak,
            Ordering::Relaxed,
        );
        self.c.symbolizer.forget_exited();
        release_freed_memory();
        self.metrics.set_caches(
            &self.c.symbolizer.cache_stats(),
            self.c.agg.unwind_table_bytes(),
        );
        // The window's cost, as a session's summary gives it, symbolizing included: from the
        // last window's end to this one's, as the targets' CPU time.
        let overhead = collect::Overhead {
            records,
            ..self.c.cost_since_mark()
        };
        self.metrics.set_cost(
            &crate::summary::Cost::of(&profile, &overhead),
            self.c.marked_kernel_time().map(|k| k.total_ns),
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

/// The debuginfod client `[symbols]` asks for, its downloads in the background (a download must
/// not hold the collection up).
fn debuginfod_client(config: &DaemonConfig) -> Option<symbolizer::debuginfod::Debuginfod> {
    let (urls, cache) = config.debuginfod.as_ref()?;
    Some(symbolizer::debuginfod::Debuginfod::new(urls.clone(), cache.clone())?.in_background())
}

/// A line on stderr when the debuginfod client's figures changed since `said`.
fn say_debuginfod(
    symbolizer: &symbolizer::Symbolizer,
    said: &mut symbolizer::debuginfod::DebuginfodStats,
) {
    let Some(client) = symbolizer.debuginfod() else {
        return;
    };
    let now = client.stats();
    if (now.fetched, now.missing) == (said.fetched, said.missing) {
        return;
    }
    *said = now;
    let mut line = format!(
        "spanprof daemon: debuginfod: {} debug files fetched into {}, {} not found",
        now.fetched,
        client.cache().display(),
        now.missing
    );
    if let Some(err) = client.last_error().filter(|_| now.missing > 0) {
        line.push_str(&format!(" (last: {err})"));
    }
    eprintln!("{line}");
}

/// Adds the processes that came into scope to the kernel's target set, after looking for their
/// interpreter (so their first samples have Python frames) and probing their C library for
/// allocations (once per library file).
fn add_in_scope(scanner: &mut Scanner, config: &DaemonConfig, c: &mut Collector, me: u32) {
    let new: Vec<u32> = scanner
        .scan(&config.scope, me)
        .into_iter()
        .filter(|&pid| !c.programs.is_target(pid))
        .collect();
    for &pid in &new {
        if let Err(e) = c.discover(pid) {
            eprintln!("spanprof daemon: pid {pid}: {e:#}");
        }
    }
    c.flush_discovered();
    for pid in new {
        if c.add_target(pid).is_err() {
            // The map is full (or the process is gone): counted, and said once in a while.
            ADD_FAILED.fetch_add(1, Ordering::Relaxed);
        } else if config.sampling.events.off_cpu() {
            // Threads asleep now are counted from here.
            c.programs.start_blocked_threads(pid);
        }
    }
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
    if old.sampling != new.sampling {
        eprintln!(
            "spanprof daemon: sampling settings changed (frequency, events, alloc_rate, \
             offcpu_min, unwind, spans): they apply after a restart, the running ones are kept"
        );
        new.sampling = old.sampling.clone();
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
