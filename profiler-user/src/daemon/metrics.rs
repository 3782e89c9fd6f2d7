//! The daemon's own metrics, served as Prometheus text on `/metrics`, and `/healthz`.
//!
//! | Metric | Type | Meaning |
//! |---|---|---|
//! | `spanprof_samples_total` | counter | samples aggregated (on-CPU and off-CPU records) |
//! | `spanprof_samples_lost_total` | counter | samples the kernel could not hand over (ring buffer full) |
//! | `spanprof_samples_dropped_total` | counter | samples left out of a window by its limits (`max_stacks`, `max_processes`) |
//! | `spanprof_windows_total` | counter | windows closed (one profile each) |
//! | `spanprof_windows_exported_total` | counter | windows the collector accepted |
//! | `spanprof_windows_dropped_total` | counter | windows dropped: queue full while the collector was unreachable, or refused |
//! | `spanprof_export_failures_total` | counter | export attempts that failed (each retry counts) |
//! | `spanprof_profiles_rejected_total` | counter | profiles the collector rejected in partial successes |
//! | `spanprof_export_queue_windows` | gauge | windows waiting for export |
//! | `spanprof_processes` | gauge | processes with samples in the last window |
//! | `spanprof_targets` | gauge | processes in scope now |
//! | `spanprof_targets_failed_total` | counter | processes in scope that could not be profiled: the kernel's target map (16384) was full |
//! | `spanprof_cpu_seconds_total` | counter | CPU time of the daemon (user + system) |
//! | `spanprof_resident_memory_bytes` | gauge | the daemon's resident memory |
//! | `spanprof_last_export_timestamp_seconds` | gauge | Unix time of the last accepted export |
//! | `spanprof_symbol_cache_bytes` | gauge | parsed module symbols kept between windows (estimated), at most `limits.symbol_cache_bytes` |
//! | `spanprof_window_symbol_cache_peak_bytes` | gauge | in the last window: the most parsed module symbols held while its samples were symbolized (estimated; those of processes that exited are dropped at its end) |
//! | `spanprof_symbol_cache_limit_bytes` | gauge | `limits.symbol_cache_bytes` |
//! | `spanprof_modules` | gauge | module files open: mapped by a live process, or one whose samples are not symbolized yet |
//! | `spanprof_unwind_tables_bytes` | gauge | unwind tables read from the module files that live processes map |
//! | `spanprof_bpf_run_seconds_total` | counter | run time of spanprof's BPF programs in the kernel (from the kernel's BPF statistics; absent when they are not counted) |
//! | `spanprof_window_kernel_seconds_per_sample` | gauge | in the last window: in-kernel time per sample (a sample: a record the programs made, on-CPU or off-CPU, kept or lost; absent when not counted) |
//! | `spanprof_window_cpu_seconds_per_sample` | gauge | in the last window: spanprof's own CPU per sample |
//! | `spanprof_window_target_cpu_seconds` | gauge | in the last window: the CPU time of the profiled processes, from `/proc/PID/stat` ([`target_cpu`](spanprof_collect::target_cpu); on-CPU samples × period when none could be read; absent for `alloc`) |
//! | `spanprof_window_overhead_ratio` | gauge | in the last window: spanprof's CPU (in the kernel and its own) over `spanprof_window_target_cpu_seconds` |
//!
//! `/healthz` answers 200 `ok` while the sampling loop runs (it went round in the last 10
//! seconds), else 503.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Counters shared by the sampling loop, the exporter and the HTTP server.
#[derive(Debug)]
pub struct Metrics {
    pub samples: AtomicU64,
    pub samples_lost: AtomicU64,
    pub samples_dropped: AtomicU64,
    pub windows: AtomicU64,
    pub windows_exported: AtomicU64,
    pub windows_dropped: AtomicU64,
    pub export_failures: AtomicU64,
    pub profiles_rejected: AtomicU64,
    pub queue: AtomicU64,
    pub processes: AtomicU64,
    pub targets: AtomicU64,
    pub targets_failed: AtomicU64,
    pub last_export_unix: AtomicU64,
    pub symbol_cache_bytes: AtomicU64,
    pub symbol_cache_limit: AtomicU64,
    pub window_symbol_cache_peak: AtomicU64,
    pub modules: AtomicU64,
    pub unwind_tables_bytes: AtomicU64,
    /// Milliseconds since `start` when the sampling loop last went round.
    pub last_tick_ms: AtomicU64,
    /// Nanoseconds of BPF run time so far; `u64::MAX`: not counted.
    pub bpf_run_ns: AtomicU64,
    /// The last window's [`crate::summary::Cost`] figures as `f64` bits; NaN: none.
    pub window_kernel_per_sample: AtomicU64,
    pub window_cpu_per_sample: AtomicU64,
    pub window_overhead: AtomicU64,
    pub window_target_cpu: AtomicU64,
    start: Instant,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            samples: AtomicU64::new(0),
            samples_lost: AtomicU64::new(0),
            samples_dropped: AtomicU64::new(0),
            windows: AtomicU64::new(0),
            windows_exported: AtomicU64::new(0),
            windows_dropped: AtomicU64::new(0),
            export_failures: AtomicU64::new(0),
            profiles_rejected: AtomicU64::new(0),
            queue: AtomicU64::new(0),
            processes: AtomicU64::new(0),
            targets: AtomicU64::new(0),
            targets_failed: AtomicU64::new(0),
            last_export_unix: AtomicU64::new(0),
            symbol_cache_bytes: AtomicU64::new(0),
            symbol_cache_limit: AtomicU64::new(0),
            window_symbol_cache_peak: AtomicU64::new(0),
            modules: AtomicU64::new(0),
            unwind_tables_bytes: AtomicU64::new(0),
            last_tick_ms: AtomicU64::new(0),
            bpf_run_ns: AtomicU64::new(u64::MAX),
            window_kernel_per_sample: AtomicU64::new(f64::NAN.to_bits()),
            window_cpu_per_sample: AtomicU64::new(f64::NAN.to_bits()),
            window_overhead: AtomicU64::new(f64::NAN.to_bits()),
            window_target_cpu: AtomicU64::new(f64::NAN.to_bits()),
            start: Instant::now(),
        }
    }
}

/// How long the sampling loop may be silent before `/healthz` says so.
const HEALTHY_WITHIN: Duration = Duration::from_secs(10);

/// The daemon's resident memory in bytes (`/proc/self/statm`).
pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

impl Metrics {
    /// Records the cost of a window that closed, and the BPF run time so far.
    pub fn set_cost(&self, cost: &crate::summary::Cost, bpf_run_ns: Option<u64>) {
        let store = |a: &AtomicU64, v: Option<f64>| {
            a.store(v.unwrap_or(f64::NAN).to_bits(), Ordering::Relaxed)
        };
        store(&self.window_kernel_per_sample, cost.kernel_per_sample());
        store(&self.window_cpu_per_sample, cost.own_per_sample());
        store(&self.window_overhead, cost.share());
        store(
            &self.window_target_cpu,
            cost.target_cpu_ns.map(|ns| ns as f64 / 1e9),
        );
        self.bpf_run_ns
            .store(bpf_run_ns.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Records what the symbolizer and the unwinders hold now.
    pub fn set_caches(&self, symbols: &symbolizer::CacheStats, unwind_tables_bytes: u64) {
        self.symbol_cache_bytes
            .store(symbols.parsed_bytes, Ordering::Relaxed);
        self.symbol_cache_limit
            .store(symbols.limit, Ordering::Relaxed);
        self.modules
            .store(symbols.modules as u64, Ordering::Relaxed);
        self.unwind_tables_bytes
            .store(unwind_tables_bytes, Ordering::Relaxed);
    }

    /// The sampling loop went round now.
    pub fn tick(&self) {
        self.last_tick_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Whether the sampling loop went round recently.
    pub fn healthy(&self) -> bool {
        let last = Duration::from_millis(self.last_tick_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last) < HEALTHY_WITHIN
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let cpu = crate::session::process_cpu_time().as_secs_f64();
        let rows: [(&str, &str, &str, String); 20] = [
            (
                "spanprof_samples_total",
                "counter",
                "Samples aggregated.",
                get(&self.samples).to_string(),
            ),
            (
                "spanprof_samples_lost_total",
                "counter",
                "Samples lost in the kernel: ring buffer full.",
                get(&self.samples_lost).to_string(),
            ),
            (
                "spanprof_samples_dropped_total",
                "counter",
                "Samples left out of a window by its limits.",
                get(&self.samples_dropped).to_string(),
            ),
            (
                "spanprof_windows_total",
                "counter",
                "Windows closed.",
                get(&self.windows).to_string(),
            ),
            (
                "spanprof_windows_exported_total",
                "counter",
                "Windows the collector accepted.",
                get(&self.windows_exported).to_string(),
            ),
            (
                "spanprof_windows_dropped_total",
                "counter",
                "Windows dropped before the collector accepted them.",
                get(&self.windows_dropped).to_string(),
            ),
            (
                "spanprof_export_failures_total",
                "counter",
                "Export attempts that failed.",
                get(&self.export_failures).to_string(),
            ),
            (
                "spanprof_profiles_rejected_total",
                "counter",
                "Profiles the collector rejected.",
                get(&self.profiles_rejected).to_string(),
            ),
            (
                "spanprof_export_queue_windows",
                "gauge",
                "Windows waiting for export.",
                get(&self.queue).to_string(),
            ),
            (
                "spanprof_processes",
                "gauge",
                "Processes with samples in the last window.",
                get(&self.processes).to_string(),
            ),
            (
                "spanprof_targets",
                "gauge",
                "Processes in scope.",
                get(&self.targets).to_string(),
            ),
            (
                "spanprof_targets_failed_total",
                "counter",
                "Processes in scope that could not be added to the kernel's target map.",
                get(&self.targets_failed).to_string(),
            ),
            (
                "spanprof_cpu_seconds_total",
                "counter",
                "CPU time of spanprof itself.",
                format!("{cpu:.6}"),
            ),
            (
                "spanprof_resident_memory_bytes",
                "gauge",
                "Resident memory of spanprof itself.",
                resident_bytes().to_string(),
            ),
            (
                "spanprof_last_export_timestamp_seconds",
                "gauge",
                "Unix time of the last accepted export.",
                get(&self.last_export_unix).to_string(),
            ),
            (
                "spanprof_symbol_cache_bytes",
                "gauge",
                "Parsed module symbols kept between windows (estimated).",
                get(&self.symbol_cache_bytes).to_string(),
            ),
            (
                "spanprof_window_symbol_cache_peak_bytes",
                "gauge",
                "In the last window: the most parsed module symbols held while symbolizing.",
                get(&self.window_symbol_cache_peak).to_string(),
            ),
            (
                "spanprof_symbol_cache_limit_bytes",
                "gauge",
                "Bound of the parsed module symbols kept (limits.symbol_cache_bytes).",
                get(&self.symbol_cache_limit).to_string(),
            ),
            (
                "spanprof_modules",
                "gauge",
                "Module files open: mapped by a live process or with samples to symbolize.",
                get(&self.modules).to_string(),
            ),
            (
                "spanprof_unwind_tables_bytes",
                "gauge",
                "Unwind tables of the module files live processes map.",
                get(&self.unwind_tables_bytes).to_string(),
            ),
        ];
        let float = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed));
        let bpf = get(&self.bpf_run_ns);
        let optional = [
            (
                "spanprof_bpf_run_seconds_total",
                "counter",
                "Run time of spanprof's BPF programs in the kernel.",
                (bpf != u64::MAX).then(|| bpf as f64 / 1e9),
            ),
            (
                "spanprof_window_kernel_seconds_per_sample",
                "gauge",
                "In-kernel time per sample in the last window.",
                Some(float(&self.window_kernel_per_sample) / 1e9),
            ),
            (
                "spanprof_window_cpu_seconds_per_sample",
                "gauge",
                "spanprof's own CPU per sample in the last window.",
                Some(float(&self.window_cpu_per_sample) / 1e9),
            ),
            (
                "spanprof_window_target_cpu_seconds",
                "gauge",
                "CPU time of the profiled processes in the last window (from /proc).",
                Some(float(&self.window_target_cpu)),
            ),
            (
                "spanprof_window_overhead_ratio",
                "gauge",
                "spanprof's CPU over the profiled processes' CPU time, last window.",
                Some(float(&self.window_overhead)),
            ),
        ];
        let optional = optional.into_iter().filter_map(|(n, k, h, v)| {
            v.filter(|v| v.is_finite())
                .map(|v| (n, k, h, format!("{v:.9}")))
        });
        let mut out = String::new();
        for (name, kind, help, value) in rows.into_iter().chain(optional) {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        }
        out
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            // Out of descriptors, say: do not spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            // Only the request line matters; a request is small, and a slow client is cut off.
            let mut buf = vec![0u8; 4096];
            let mut len = 0;
            let read = async {
                while len < buf.len() {
                    match stream.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => len += n,
                    }
                    if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            };
            if tokio::time::timeout(Duration::from_secs(5), read)
                .await
                .is_err()
            {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..len]);
            let mut parts = head.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let (status, kind, body) = match (method, path) {
                ("GET", "/metrics") => (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    metrics.render(),
                ),
                ("GET", "/healthz") if metrics.healthy() => ("200 OK", "text/plain", "ok\n".into()),
                ("GET", "/healthz") => (
                    "503 Service Unavailable",
                    "text/plain",
                    "sampling loop stalled\n".into(),
                ),
                ("GET", _) => (
                    "404 Not Found",
                    "text/plain",
                    "try /metrics or /healthz\n".into(),
                ),
                _ => ("405 Method Not Allowed", "text/plain", "GET only\n".into()),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}
