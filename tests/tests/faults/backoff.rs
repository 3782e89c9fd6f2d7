//! The daemon's export backoff with its collector down and its queue full: the attempts that
//! reach the collector follow the doubling (1 s, 2 s, 4 s … up to `max_backoff`, each wait in
//! its upper half) however many windows the full queue drops meanwhile; sampling, windows and
//! the drop counters go on as before; once the collector is back, the kept windows arrive and
//! the backoff starts again from 1 s.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spanprof_tests::daemon::Daemon;
use spanprof_tests::{require_root, spanprof_bin, TempDir, Workload};

/// An OTLP/HTTP receiver that records when each request arrived, answering 503 while down and
/// 200 (an empty `ExportProfilesServiceResponse`) while up.
struct Receiver {
    port: u16,
    down: Arc<AtomicBool>,
    /// Arrival of each request, and whether it was refused.
    attempts: Arc<Mutex<Vec<(Instant, bool)>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = Arc::new(AtomicBool::new(true));
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let (d, a) = (down.clone(), attempts.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (d, a) = (d.clone(), a.clone());
                std::thread::spawn(move || serve(conn, &d, &a));
            }
        });
        Receiver {
            port,
            down,
            attempts,
        }
    }

    fn attempts(&self) -> Vec<(Instant, bool)> {
        self.attempts.lock().unwrap().clone()
    }
}

/// Answers the requests of one connection until it closes.
fn serve(conn: TcpStream, down: &AtomicBool, attempts: &Mutex<Vec<(Instant, bool)>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut conn = conn;
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        let mut first = true;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if first {
                first = false;
                assert!(line.starts_with("POST "), "{line}");
            }
            let l = line.to_ascii_lowercase();
            if let Some(v) = l.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let refused = down.load(Ordering::SeqCst);
        attempts.lock().unwrap().push((Instant::now(), refused));
        let reply: &[u8] = if refused {
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
        } else {
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
        };
        if conn.write_all(reply).is_err() {
            return;
        }
    }
}

/// The collector is down for two minutes while windows of one second fill a queue of two:
/// every wait between two attempts is within the doubling's bounds, whatever the drops.
#[test]
fn backoff_follows_the_doubling_while_the_queue_drops_windows() {
    require_root();
    spanprof_bin();
    const MAX_BACKOFF: f64 = 16.0;
    const DOWN: Duration = Duration::from_secs(120);
    let receiver = Receiver::start();
    let workload = Workload::start("cpu_split", 200.0);
    // Niced: it runs for minutes beside the suite's sampling tests.
    // SAFETY: setpriority on a pid we started.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, workload.pid(), 19) };
    let dir = TempDir::new("faults-backoff");
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[sampling]\nfrequency = 19\nwindow = \"1s\"\n[scope]\npids = [{}]\n\
             [export]\nprotocol = \"http/protobuf\"\nendpoint = \"http://127.0.0.1:{}\"\n\
             timeout = \"2s\"\nqueue = 2\nmax_backoff = \"{MAX_BACKOFF}s\"\n",
            workload.pid(),
            receiver.port
        ),
    );
    let start = Instant::now();
    while receiver.attempts().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no export attempt in 30 s: {}",
            daemon.process.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let first = receiver.attempts()[0].0;
    let before = daemon.metrics();
    let before_at = Instant::now();
    std::thread::sleep(DOWN.saturating_sub(first.elapsed()));
    let during = daemon.metrics();
    let between = before_at.elapsed().as_secs_f64();
    let attempts: Vec<Instant> = receiver
        .attempts()
        .iter()
        .map(|&(t, refused)| {
            assert!(refused);
            t
        })
        .filter(|&t| t.duration_since(first) <= DOWN)
        .collect();
    // The waits: the k-th (from 0) is drawn from [b/2, b), b = min(2^k s, max_backoff); the
    // client adds a little (the request, the 503) and the clock of this test some more.
    let gaps: Vec<f64> = attempts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    eprintln!(
        "{} attempts in {DOWN:?}, waits {:?}",
        attempts.len(),
        gaps.iter().map(|g| format!("{g:.2}")).collect::<Vec<_>>()
    );
    for (k, &gap) in gaps.iter().enumerate() {
        let b = 2f64.powi(k.min(20) as i32).min(MAX_BACKOFF);
        assert!(
            gap >= b / 2.0 - 0.05 && gap < b + 0.75,
            "wait {k} was {gap:.2} s, expected within [{:.1}, {b:.1}) s: {gaps:?}",
            b / 2.0
        );
    }
    // With every wait at its shortest or longest, the attempts in two minutes would be:
    let count_at = |scale: f64| {
        let (mut t, mut n, mut k) = (0.0, 1, 0);
        loop {
            t += 2f64.powi(k).min(MAX_BACKOFF) * scale;
            if t > DOWN.as_secs_f64() {
                return n;
            }
            n += 1;
            k += 1;
        }
    };
    let (fewest, most) = (count_at(1.0), count_at(0.5));
    assert!(
        (fewest - 1..=most + 1).contains(&attempts.len()),
        "{} attempts, expected {fewest} to {most}",
        attempts.len()
    );

    // Nothing else changed: sampling went on, a window a second, the full queue dropped them
    // and said so, every failure counted.
    let delta = |k: &str| during[k] - before[k];
    eprintln!(
        "while down: windows {}, dropped {}, failures {}, samples {}, queue {}",
        delta("spanprof_windows_total"),
        delta("spanprof_windows_dropped_total"),
        delta("spanprof_export_failures_total"),
        delta("spanprof_samples_total"),
        during["spanprof_export_queue_windows"],
    );
    let windows = delta("spanprof_windows_total");
    assert!(
        (windows - between).abs() <= 0.1 * between + 2.0,
        "{windows} windows in {between:.1} s"
    );
    assert!(delta("spanprof_windows_dropped_total") >= windows - 3.0);
    assert!(during["spanprof_export_queue_windows"] <= 2.0);
    // Sampling went on (the workload is niced: it gets less than a CPU on a busy machine).
    assert!(delta("spanprof_samples_total") >= 2.0 * between);
    let failures = during["spanprof_export_failures_total"];
    assert!(
        (failures - attempts.len() as f64).abs() <= 1.0,
        "{failures} failures counted, {} attempts received",
        attempts.len()
    );

    // Back: the next attempt succeeds, and from then on each window goes out as it closes.
    receiver.down.store(false, Ordering::SeqCst);
    let back = Instant::now();
    let up_wait = Duration::from_secs_f64(MAX_BACKOFF + 10.0);
    loop {
        let ok = receiver.attempts().iter().filter(|a| !a.1).count();
        if ok >= 6 {
            break;
        }
        assert!(
            back.elapsed() < up_wait,
            "{ok} windows accepted {up_wait:?} after the collector came back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let stderr = daemon.stop();
    assert!(stderr.contains("works again"), "{stderr}");
    drop(workload);
}
