//! A debuginfod client: debug files fetched by GNU build id from the servers of
//! `DEBUGINFOD_URLS` (elfutils' protocol: `GET URL/buildid/BUILD_ID/debuginfo`), for modules
//! whose addresses this host's files cannot name (stripped distribution libraries).
//!
//! # Design constraints
//! - Asked only for a module with a GNU build id, no separate debug file on this host, and
//!   addresses its own symbols left unknown; once per module file per session, hit or miss.
//! - Bounded: each request has [`Debuginfod::request_timeout`], the session's requests
//!   together [`Debuginfod::budget`] (then it stops asking and says so); a file is at most
//!   [`MAX_DEBUGINFO`] bytes.
//! - A server's answer is untrusted: it is kept only if it is an ELF file with the very build id
//!   asked for (a wrong file would name addresses after another build's functions).
//! - Fetched files are cached under `$XDG_CACHE_HOME/spanprof/debuginfod/BUILD_ID/debuginfo`
//!   (`~/.cache/…` without it), written to a temporary name (mode 0600) and renamed, so a
//!   crash leaves no half file under the final name (the next download into that directory
//!   removes it); a cached file is used without asking.
//! - In the background ([`Debuginfod::in_background`], the daemon): downloads on a thread of
//!   their own, one at a time, so that a slow server never holds the collection up.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rustc_hash::FxHashSet;

/// The largest debug file fetched (libxul's is about 1 GiB; libpython's 20 MB).
pub const MAX_DEBUGINFO: u64 = 1 << 30;
/// The time one request may take, by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The time all requests of a session may take together, by default.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(30);

/// What the client did, for the session's summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DebuginfodStats {
    /// Debug files found in the cache.
    pub cached: u32,
    /// Debug files downloaded.
    pub fetched: u32,
    /// Build ids no server had (or whose answer was refused).
    pub missing: u32,
    /// Build ids not asked because the session's budget was spent.
    pub skipped: u32,
}

/// A debuginfod client (see the module's documentation).
#[derive(Debug)]
pub struct Debuginfod {
    servers: Servers,
    cache: PathBuf,
    /// The time one request may take.
    pub request_timeout: Duration,
    /// The time all requests may take together (in the foreground).
    pub budget: Duration,
    spent: Duration,
    asked: FxHashSet<String>,
    stats: DebuginfodStats,
    /// The last failure, for the summary.
    last_error: Option<String>,
    /// In the background: the downloads' thread, and what it did.
    worker: Option<Worker>,
}

/// The servers and the HTTP agent that asks them (cheap to clone: the agent is shared).
#[derive(Debug, Clone)]
struct Servers {
    urls: Vec<String>,
    agent: ureq::Agent,
}

/// The thread of a client in the background.
#[derive(Debug)]
struct Worker {
    queue: mpsc::Sender<String>,
    done: Arc<Mutex<(DebuginfodStats, Option<String>)>>,
    /// Set when the client is dropped (a daemon's new configuration): the thread asks no more.
    cancel: Arc<AtomicBool>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl Debuginfod {
    /// A client of `urls` (each a server's base URL) caching under `cache`; `None` without a
    /// URL.
    pub fn new(urls: Vec<String>, cache: PathBuf) -> Option<Debuginfod> {
        let urls: Vec<String> = urls
            .into_iter()
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return None;
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(DEFAULT_REQUEST_TIMEOUT))
            .http_status_as_error(false)
            .user_agent(concat!("spanprof/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Some(Debuginfod {
            servers: Servers { urls, agent },
            cache,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            budget: DEFAULT_BUDGET,
            spent: Duration::ZERO,
            asked: FxHashSet::default(),
            stats: DebuginfodStats::default(),
            last_error: None,
            worker: None,
        })
    }

    /// The client `DEBUGINFOD_URLS` asks for (URLs separated by spaces, as elfutils reads
    /// it), caching under [`default_cache`]; `None` when the variable is unset or empty, or
    /// there is no cache directory to use.
    pub fn from_env() -> Option<Debuginfod> {
        let urls = std::env::var("DEBUGINFOD_URLS").ok()?;
        Debuginfod::new(
            urls.split_whitespace().map(str::to_string).collect(),
            default_cache()?,
        )
    }

    /// The same client with its downloads on a thread of its own (the daemon's: a download
    /// must not stop the collection): [`Debuginfod::fetch`] answers from the cache only and
    /// queues a build id it does not find there, once; a later call finds the file once it is
    /// downloaded. Each request has [`Debuginfod::request_timeout`]; there is no budget, since
    /// the requests are one at a time, one per build id for the client's life.
    pub fn in_background(mut self) -> Debuginfod {
        let (queue, asked) = mpsc::channel::<String>();
        let done = Arc::new(Mutex::new((DebuginfodStats::default(), None)));
        let (servers, cache, timeout) = (
            self.servers.clone(),
            self.cache.clone(),
            self.request_timeout,
        );
        let shared = Arc::clone(&done);
        let cancel = Arc::new(AtomicBool::new(false));
        let cancelled = Arc::clone(&cancel);
        let spawned = std::thread::Builder::new()
            .name("debuginfod".into())
            .spawn(move || {
                for build_id in asked {
                    if cancelled.load(Ordering::Relaxed) {
                        return;
                    }
                    let path = cache.join(&build_id).join("debuginfo");
                    let (got, _) = servers.download(&build_id, &path, timeout, Duration::MAX);
                    let mut done = shared.lock().unwrap_or_else(|e| e.into_inner());
                    match got {
                        Ok(_) => done.0.fetched += 1,
                        Err(err) => {
                            done.0.missing += 1;
                            done.1 = Some(err);
                        }
                    }
                }
            });
        match spawned {
            Ok(_) => {
                self.worker = Some(Worker {
                    queue,
                    done,
                    cancel,
                })
            }
            // NB: without a thread, downloads stay in the foreground, within the budget.
            Err(err) => self.last_error = Some(format!("no thread for downloads: {err}")),
        }
        self
    }

    /// The servers asked, in order.
    pub fn urls(&self) -> &[String] {
        &self.servers.urls
    }

    /// The directory of the cache.
    pub fn cache(&self) -> &Path {
        &self.cache
    }

    /// What it did so far (downloads in the background included once they end).
    pub fn stats(&self) -> DebuginfodStats {
        let mut stats = self.stats;
        if let Some(worker) = &self.worker {
            let done = worker.done.lock().unwrap_or_else(|e| e.into_inner());
            stats.fetched += done.0.fetched;
            stats.missing += done.0.missing;
        }
        stats
    }

    /// Why the last request failed, if one did.
    pub fn last_error(&self) -> Option<String> {
        if let Some(worker) = &self.worker {
            let done = worker.done.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(err) = &done.1 {
                return Some(err.clone());
            }
        }
        self.last_error.clone()
    }

    /// The debug file of `build_id` (lower-case hex), from the cache or a server: `None` when
    /// asked before in this session, when no server has it, or when the budget is spent (in
    /// the background: `None` until the download has ended).
    pub fn fetch(&mut self, build_id: &str) -> Option<File> {
        if !valid_build_id(build_id) {
            return None;
        }
        // The cache first, for every module file of this build (a container's copy too);
        // servers once per build id.
        let path = self.cache.join(build_id).join("debuginfo");
        if let Some(file) = crate::debug_file::open_regular(&path) {
            if crate::build_id::gnu_build_id(&file).map(|id| crate::build_id::hex(&id))
                == Some(build_id.to_string())
            {
                // Counted once per build id, and not when this client downloaded it.
                if self.asked.insert(build_id.to_string()) {
                    self.stats.cached += 1;
                }
                return Some(file);
            }
        }
        if !self.asked.insert(build_id.to_string()) {
            return None;
        }
        if let Some(worker) = &self.worker {
            // NB: a send fails only when the thread is gone (it panicked): a miss.
            if worker.queue.send(build_id.to_string()).is_err() {
                self.stats.missing += 1;
            }
            return None;
        }
        if self.spent >= self.budget {
            self.stats.skipped += 1;
            return None;
        }
        let left = self.budget.saturating_sub(self.spent);
        let (found, spent) = self
            .servers
            .download(build_id, &path, self.request_timeout, left);
        self.spent += spent;
        match found {
            Ok(file) => {
                self.stats.fetched += 1;
                Some(file)
            }
            Err(err) => {
                self.stats.missing += 1;
                self.last_error = Some(err);
                None
            }
        }
    }
}

/// The cache directory: `$CACHE_DIRECTORY/debuginfod` under systemd (`CacheDirectory=`), else
/// `$XDG_CACHE_HOME/spanprof/debuginfod` (`$HOME/.cache/…` without it); `None` when none is
/// set.
pub fn default_cache() -> Option<PathBuf> {
    default_cache_of(|name| std::env::var_os(name))
}

/// [`default_cache`] with the environment `var`: systemd's `CACHE_DIRECTORY` (a service's
/// `CacheDirectory=`; the first of several) first.
fn default_cache_of(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    if let Some(dir) = var("CACHE_DIRECTORY")
        .and_then(|v| {
            v.to_str()
                .and_then(|v| v.split(':').next())
                .map(PathBuf::from)
        })
        .filter(|p| p.is_absolute())
    {
        return Some(dir.join("debuginfod"));
    }
    // NB: a relative XDG_CACHE_HOME is ignored, as the XDG specification says.
    let base = var("XDG_CACHE_HOME")
        .filter(|v| Path::new(v).is_absolute())
        .map(PathBuf::from)
        .or_else(|| {
            var("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("spanprof").join("debuginfod"))
}

impl Servers {
    /// Asks each server in turn, each request within `timeout` and all of them within `left`;
    /// the first good answer is cached at `path` and returned, with the time spent.
    fn download(
        &self,
        build_id: &str,
        path: &Path,
        timeout: Duration,
        left: Duration,
    ) -> (Result<File, String>, Duration) {
        let mut last = String::from("no server");
        let mut spent = Duration::ZERO;
        for url in &self.urls {
            let timeout = timeout.min(left.saturating_sub(spent));
            if timeout.is_zero() {
                break;
            }
            let url = format!("{url}/buildid/{build_id}/debuginfo");
            let began = Instant::now();
            let got = self.get(&url, timeout, build_id, path);
            spent += began.elapsed();
            match got {
                Ok(file) => return (Ok(file), spent),
                Err(err) => last = without_credentials(&format!("{url}: {err}")),
            }
        }
        (Err(last), spent)
    }

    fn get(
        &self,
        url: &str,
        timeout: Duration,
        build_id: &str,
        path: &Path,
    ) -> Result<File, String> {
        let mut response = self
            .agent
            .get(url)
            .config()
            .timeout_global(Some(timeout))
            .build()
            .call()
            .map_err(|e| e.to_string())?;
        let status = response.status();
        if status != 200 {
            return Err(format!("HTTP {}", status.as_u16()));
        }
        let dir = path.parent().expect("a cache path has a parent");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        // A name of this download's own: two clients of one process (a daemon's reload) may
        // fetch one build id at once.
        static DOWNLOADS: AtomicU64 = AtomicU64::new(0);
        let partial = dir.join(format!(
            ".debuginfo.{}.{}.part",
            std::process::id(),
            DOWNLOADS.fetch_add(1, Ordering::Relaxed)
        ));
        remove_abandoned_parts(dir);
        let result = (|| {
            // NB: a file (or a link) left at that name by a killed process of the same pid is
            // replaced, never followed.
            let _ = std::fs::remove_file(&partial);
            let mut out = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&partial)
                .map_err(|e| format!("{}: {e}", partial.display()))?;
            let mut body = response
                .body_mut()
                .with_config()
                .limit(MAX_DEBUGINFO + 1)
                .reader();
            let mut limited = (&mut body).take(MAX_DEBUGINFO + 1);
            let n = std::io::copy(&mut limited, &mut out).map_err(|e| e.to_string())?;
            if n > MAX_DEBUGINFO {
                return Err(format!("more than {MAX_DEBUGINFO} bytes"));
            }
            out.flush().map_err(|e| e.to_string())?;
            // NB: checked on the descriptor written, not on a file opened again by its name.
            let file = out;
            let got = crate::build_id::gnu_build_id(&file).map(|id| crate::build_id::hex(&id));
            if got.as_deref() != Some(build_id) {
                return Err(format!(
                    "the answer is not the debug file of {build_id} (its build id: {})",
                    got.as_deref().unwrap_or("none")
                ));
            }
            std::fs::rename(&partial, path).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(file)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        result
    }
}

/// Removes the temporary files of downloads into `dir` whose process is gone (a session killed
/// while it downloaded): `.debuginfo.PID.N.part` with no process PID.
fn remove_abandoned_parts(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(".debuginfo.")?.strip_suffix(".part"))
            .and_then(|p| p.split('.').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// `text` for messages: the user name and password of every URL in it
/// (`http://user:secret@host/`) become `***` (`DEBUGINFOD_URLS` and an OTLP endpoint may hold
/// them, and the HTTP clients' errors repeat the URL they were given; a summary or a log is no
/// place for them). A URL's user info is what follows `scheme://` up to the last `@` before the
/// authority's end: `/`, `?`, `#`, a space, or a character a URL's user info cannot hold
/// unencoded (`"`, `<`, `>`, `[`); `'`, `(` and `)` can be in a password, so they do not end
/// it (a `)` after a URL without a path stays after the host).
pub fn without_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| {
                matches!(c, '/' | '?' | '#' | '"' | '<' | '>' | '[') || c.is_whitespace()
            })
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(i) => {
                out.push_str("***");
                out.push_str(&authority[i..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// A build id as a path component: 2 to 128 lower-case hex digits.
fn valid_build_id(id: &str) -> bool {
    (2..=128).contains(&id.len()) && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_trimmed_and_build_ids_checked() {
        assert!(Debuginfod::new(vec![" ".into()], PathBuf::from("/tmp")).is_none());
        let d = Debuginfod::new(vec!["http://a:1/".into(), "".into()], "/x".into()).unwrap();
        assert_eq!(d.urls(), ["http://a:1"]);
        assert_eq!(
            without_credentials("https://u:p@a.example:8002/x@y"),
            "https://***@a.example:8002/x@y"
        );
        assert_eq!(without_credentials("http://a:1"), "http://a:1");
        assert_eq!(without_credentials("no scheme@x"), "no scheme@x");
        assert!(valid_build_id("0123abcdef"));
        for bad in ["", "A0", "../x", "ab/cd", "0"] {
            assert!(!valid_build_id(bad), "{bad}");
        }
    }

    /// Serves `body` with status 200 to one request on a new port; returns the URL.
    fn serve_once(body: Vec<u8>) -> String {
        use std::io::{BufRead, BufReader};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let mut stream = stream;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        });
        url
    }

    #[test]
    fn the_cache_directory_follows_the_environment() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        type Vars = &'static [(&'static str, &'static str)];
        let cases: [(Vars, Option<&str>); 4] = [
            (
                &[
                    ("CACHE_DIRECTORY", "/var/cache/spanprof:/x"),
                    ("HOME", "/root"),
                ],
                Some("/var/cache/spanprof/debuginfod"),
            ),
            (
                &[("XDG_CACHE_HOME", "/c"), ("HOME", "/root")],
                Some("/c/spanprof/debuginfod"),
            ),
            (
                &[("XDG_CACHE_HOME", "rel"), ("HOME", "/root")],
                Some("/root/.cache/spanprof/debuginfod"),
            ),
            (&[("CACHE_DIRECTORY", "rel")], None),
        ];
        for (vars, want) in cases {
            assert_eq!(
                default_cache_of(env(vars)),
                want.map(PathBuf::from),
                "{vars:?}"
            );
        }
    }

    #[test]
    fn parts_of_processes_gone_are_removed() {
        let dir = std::env::temp_dir().join(format!("spanprof-dbgd-parts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Above any pid_max: no such process.
        let gone = dir.join(".debuginfo.999999999.0.part");
        let mine = dir.join(format!(".debuginfo.{}.7.part", std::process::id()));
        let other = dir.join("debuginfo");
        for f in [&gone, &mine, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        remove_abandoned_parts(&dir);
        assert!(!gone.exists() && mine.exists() && other.exists());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_answer_of_another_build_is_refused_and_not_cached() {
        // This test binary: an ELF file, of another build id than the one asked.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let cache =
            std::env::temp_dir().join(format!("spanprof-dbgd-wrong-{}", std::process::id()));
        let mut d = Debuginfod::new(vec![serve_once(exe)], cache.clone()).unwrap();
        let asked = "00112233445566778899aabbccddeeff00112233";
        assert!(d.fetch(asked).is_none());
        assert_eq!(d.stats().missing, 1);
        let err = d.last_error().unwrap();
        assert!(err.contains("is not the debug file of"), "{err}");
        let dir = cache.join(asked);
        let left: Vec<_> = std::fs::read_dir(&dir).map_or(Vec::new(), |d| d.collect());
        assert!(left.is_empty(), "left in the cache: {left:?}");
        let _ = std::fs::remove_dir_all(cache);
    }

    #[test]
    fn a_server_that_is_not_there_is_a_miss_asked_once() {
        // A port nothing listens on: refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let cache = std::env::temp_dir().join(format!("spanprof-dbgd-{}", std::process::id()));
        let mut d =
            Debuginfod::new(vec![format!("http://127.0.0.1:{port}")], cache.clone()).unwrap();
        assert!(d.fetch("00112233445566778899").is_none());
        assert!(d.fetch("00112233445566778899").is_none());
        assert_eq!(d.stats().missing, 1);
        assert!(d.last_error().is_some());
        let _ = std::fs::remove_dir_all(cache);
    }
}
