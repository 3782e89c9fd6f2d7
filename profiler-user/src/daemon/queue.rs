//! Windows waiting for export, and the task that sends them.
//!
//! The sampling loop pushes one request per window and never waits: the queue holds at most
//! `capacity` windows, and a push into a full queue drops the oldest (counted in
//! `spanprof_windows_dropped_total`). The exporter sends the oldest window; a failure that may
//! pass (collector unreachable, overloaded, timed out) is retried after an exponential backoff
//! (1 s, 2 s, 4 s … up to `max_backoff`, each wait drawn uniformly from its upper half, so
//! agents restarted together do not retry together); a refusal (malformed, unauthorized) drops
//! the window. The backoff belongs to the endpoint: a window dropped from a full queue while it
//! was being retried hands the current backoff on to the next window; only a successful export
//! or a new endpoint restarts it at 1 s.

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use tokio::sync::Notify;

use super::metrics::Metrics;
use crate::export::Exporter;

/// One closed window's request.
#[derive(Debug, Clone)]
pub struct Window {
    /// Counts windows from 1.
    pub id: u64,
    /// What is sent.
    pub request: Arc<ExportProfilesServiceRequest>,
    /// Its encoded size, for the queue's byte bound.
    pub bytes: usize,
}

/// Bytes (encoded) the queue holds at most, whatever its window count: the oldest windows go
/// first past it, so an outage does not hold the daemon's memory far above its goal.
pub const MAX_QUEUED_BYTES: usize = 64 << 20;

/// The windows waiting for export.
#[derive(Debug)]
pub struct Queue {
    windows: Mutex<VecDeque<Window>>,
    capacity: Mutex<usize>,
    notify: Notify,
    metrics: Arc<Metrics>,
}

impl Queue {
    /// An empty queue of at most `capacity` windows.
    pub fn new(capacity: usize, metrics: Arc<Metrics>) -> Queue {
        Queue {
            windows: Mutex::new(VecDeque::new()),
            capacity: Mutex::new(capacity.max(1)),
            notify: Notify::new(),
            metrics,
        }
    }

    /// A new bound (a reloaded configuration); windows beyond it are dropped, oldest first.
    pub fn set_capacity(&self, capacity: usize) {
        *self.capacity.lock().unwrap() = capacity.max(1);
        self.trim(0, 0);
    }

    /// Drops the oldest windows until `room` more windows of `bytes` in all fit.
    fn trim(&self, room: usize, bytes: usize) {
        let cap = *self.capacity.lock().unwrap();
        let mut q = self.windows.lock().unwrap();
        while q.len() + room > cap
            || (!q.is_empty()
                && q.iter().map(|w| w.bytes).sum::<usize>() + bytes > MAX_QUEUED_BYTES)
        {
            if q.pop_front().is_none() {
                break;
            }
            self.metrics.windows_dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics.queue.store(q.len() as u64, Ordering::Relaxed);
    }

    /// Queues a window, dropping the oldest if the queue is full; never waits.
    pub fn push(&self, window: Window) {
        self.trim(1, window.bytes);
        let mut q = self.windows.lock().unwrap();
        q.push_back(window);
        self.metrics.queue.store(q.len() as u64, Ordering::Relaxed);
        drop(q);
        self.notify.notify_one();
    }

    /// The oldest window.
    fn front(&self) -> Option<Window> {
        self.windows.lock().unwrap().front().cloned()
    }

    /// Removes window `id` if it is still queued; false when it was dropped meanwhile.
    fn remove(&self, id: u64) -> bool {
        let mut q = self.windows.lock().unwrap();
        let before = q.len();
        q.retain(|w| w.id != id);
        self.metrics.queue.store(q.len() as u64, Ordering::Relaxed);
        q.len() != before
    }

    /// Windows waiting.
    pub fn len(&self) -> usize {
        self.windows.lock().unwrap().len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every window left (at exit), counting them; returns how many.
    pub fn abandon(&self) -> usize {
        let mut q = self.windows.lock().unwrap();
        let n = q.len();
        q.clear();
        self.metrics
            .windows_dropped
            .fetch_add(n as u64, Ordering::Relaxed);
        self.metrics.queue.store(0, Ordering::Relaxed);
        n
    }
}

/// A random fraction in [0.5, 1).
fn jitter() -> f64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(0);
    0.5 + (h.finish() >> 11) as f64 / (1u64 << 53) as f64 / 2.0
}

/// The exporter's settings that a reload can change.
#[derive(Debug)]
pub struct ExportState {
    /// The client.
    pub exporter: Exporter,
    /// Longest wait between two attempts.
    pub max_backoff: Duration,
}

/// Sends queued windows, oldest first, until `stop` says so and the queue is empty (or its
/// deadline passed).
pub async fn run_exporter(
    queue: Arc<Queue>,
    state: Arc<Mutex<ExportState>>,
    metrics: Arc<Metrics>,
    deadline: Arc<Mutex<Option<Instant>>>,
) {
    let mut failing_since: Option<(Instant, u64)> = None;
    // NB: the backoff is the endpoint's, not a window's: it restarts only after an export
    // succeeds or the endpoint changes, never because the window being retried was dropped
    // from a full queue (which, during an outage, happens at every window).
    let mut backoff = Duration::from_secs(1);
    let mut endpoint_of_backoff = String::new();
    loop {
        let Some(window) = queue.front() else {
            if deadline.lock().unwrap().is_some() {
                return;
            }
            // Woken by a push, or by the shutdown (which pushes the last window first).
            let _ = tokio::time::timeout(Duration::from_millis(500), queue.notify.notified()).await;
            continue;
        };
        loop {
            let (exporter, max_backoff) = {
                let s = state.lock().unwrap();
                (s.exporter.clone(), s.max_backoff)
            };
            if exporter.config().endpoint != endpoint_of_backoff {
                endpoint_of_backoff.clone_from(&exporter.config().endpoint);
                backoff = Duration::from_secs(1);
            }
            backoff = backoff.min(max_backoff);
            match exporter.export(&window.request).await {
                Ok(accepted) => {
                    if !queue.remove(window.id) {
                        // Dropped (and counted) while it was being sent: it arrived after all.
                        metrics.windows_dropped.fetch_sub(1, Ordering::Relaxed);
                    }
                    metrics.windows_exported.fetch_add(1, Ordering::Relaxed);
                    let now = SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs());
                    metrics.last_export_unix.store(now, Ordering::Relaxed);
                    if accepted.rejected_profiles > 0 {
                        metrics
                            .profiles_rejected
                            .fetch_add(accepted.rejected_profiles as u64, Ordering::Relaxed);
                        eprintln!(
                            "spanprof daemon: {} rejected {} profiles of window {}: {}",
                            exporter.config().shown_endpoint(),
                            accepted.rejected_profiles,
                            window.id,
                            accepted.message
                        );
                    }
                    backoff = Duration::from_secs(1);
                    if let Some((since, failures)) = failing_since.take() {
                        eprintln!(
                            "spanprof daemon: export to {} works again after {failures} failed \
                             attempts in {:.0} s",
                            exporter.config().shown_endpoint(),
                            since.elapsed().as_secs_f64()
                        );
                    }
                    break;
                }
                Err(e) => {
                    metrics.export_failures.fetch_add(1, Ordering::Relaxed);
                    let first = failing_since.is_none();
                    let (_, failures) = failing_since.get_or_insert((Instant::now(), 0));
                    *failures += 1;
                    if !e.retryable {
                        if queue.remove(window.id) {
                            metrics.windows_dropped.fetch_add(1, Ordering::Relaxed);
                        }
                        eprintln!(
                            "spanprof daemon: {} refused window {} (dropped): {e}",
                            exporter.config().shown_endpoint(),
                            window.id
                        );
                        break;
                    }
                    let wait = backoff.mul_f64(jitter());
                    if first {
                        eprintln!(
                            "spanprof daemon: cannot export to {}: {e}; retrying with backoff \
                             (up to {} s), keeping at most the newest windows",
                            exporter.config().shown_endpoint(),
                            max_backoff.as_secs()
                        );
                    }
                    let limit = *deadline.lock().unwrap();
                    if let Some(limit) = limit {
                        // Shutting down: no wait past the deadline.
                        if Instant::now() + wait >= limit {
                            return;
                        }
                    }
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(max_backoff);
                    // Dropped from the queue meanwhile (full): on to the oldest left.
                    if queue.front().is_none_or(|w| w.id != window.id) {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(id: u64) -> Window {
        Window {
            id,
            request: Arc::new(ExportProfilesServiceRequest::default()),
            bytes: 1000,
        }
    }

    #[test]
    fn a_full_queue_drops_its_oldest_and_counts_them() {
        let metrics = Arc::new(Metrics::default());
        let q = Queue::new(3, metrics.clone());
        for id in 1..=5 {
            q.push(window(id));
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.front().unwrap().id, 3);
        assert_eq!(metrics.windows_dropped.load(Ordering::Relaxed), 2);
        assert_eq!(metrics.queue.load(Ordering::Relaxed), 3);
        assert!(q.remove(3));
        assert!(!q.remove(3));
        q.set_capacity(1);
        assert_eq!(q.front().unwrap().id, 5);
        assert_eq!(metrics.windows_dropped.load(Ordering::Relaxed), 3);
        assert_eq!(q.abandon(), 1);
        assert!(q.is_empty());
        // The byte bound: two windows of 40 MiB do not fit in 64 MiB, whatever the count.
        q.set_capacity(10);
        for id in 6..=7 {
            q.push(Window {
                bytes: 40 << 20,
                ..window(id)
            });
        }
        assert_eq!((q.len(), q.front().unwrap().id), (1, 7));
        assert_eq!(metrics.windows_dropped.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.5..1.0).contains(&j), "{j}");
        }
    }
}
