//! A running `spanprof daemon` for the integration tests: its configuration file, its metrics
//! endpoint (scraped as Prometheus text) and its stop by SIGTERM.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::{spanprof_command, Background, TempDir};

/// A free local TCP port (free when this returns; the daemon binds it a moment later).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `spanprof daemon` with its configuration file and metrics port.
#[derive(Debug)]
pub struct Daemon {
    pub process: Background,
    pub config: PathBuf,
    pub metrics_port: u16,
}

impl Daemon {
    /// Writes `config` (plus a `[metrics]` section on a free port) and starts the daemon.
    pub fn start(dir: &TempDir, config: &str) -> Daemon {
        let metrics_port = free_port();
        let path = dir.join("spanprof.toml");
        std::fs::write(
            &path,
            format!("{config}\n[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"),
        )
        .unwrap();
        let mut cmd = spanprof_command(["daemon", "--config"]);
        cmd.arg(&path);
        let mut process = Background::spawn(cmd);
        process.wait_for_stderr("spanprof daemon: profiling", Duration::from_secs(60));
        Daemon {
            process,
            config: path,
            metrics_port,
        }
    }

    /// `GET path` on the metrics port: (status line, body).
    pub fn get(&self, path: &str) -> (String, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics_port)).expect("metrics port");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        (
            head.lines().next().unwrap_or("").to_string(),
            body.to_string(),
        )
    }

    /// The metrics, by name.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let (status, body) = self.get("/metrics");
        assert!(status.contains("200"), "{status}");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    pub fn metric(&self, name: &str) -> f64 {
        *self
            .metrics()
            .get(name)
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    /// Waits until `metric` reaches `at_least`.
    pub fn wait_metric(&self, name: &str, at_least: f64, timeout: Duration) -> f64 {
        let end = Instant::now() + timeout;
        loop {
            let v = self.metric(name);
            if v >= at_least {
                return v;
            }
            assert!(
                Instant::now() < end,
                "{name} = {v} after {timeout:?}, expected {at_least}; stderr:\n{}",
                self.process.stderr_so_far()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGTERM, then waits for the exit; returns stderr.
    pub fn stop(self) -> String {
        self.process.signal(libc::SIGTERM);
        // NB: `finish` counts from the start; the daemon gets 60 s from now.
        let limit = self.process.elapsed() + Duration::from_secs(60);
        let out = self.process.finish(limit);
        assert!(out.status.success(), "daemon exit: {out}");
        out.stderr
    }
}
