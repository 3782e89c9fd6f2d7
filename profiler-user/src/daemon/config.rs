//! The daemon's configuration file (TOML), with defaults for everything.
//!
//! ```toml
//! [sampling]
//! frequency = 19            # Hz per CPU
//! events = ["cpu"]          # cpu, offcpu, wall; or alloc (not with the others)
//! alloc_rate = 524288       # bytes between sampled allocations on average (alloc)
//! offcpu_min = "5us"
//! window = "60s"            # one export per window
//! unwind = "dwarf"          # or "fp"
//! spans = true              # read span contexts of Python processes
//!
//! [scope]                   # empty: every process on the host
//! pids = [1234]
//! executables = ["python3*", "nova-*"]   # globs on the executable's name (or comm)
//! cgroups = ["/system.slice/nova-*"]     # globs on the cgroup v2 path
//! containers = ["3f4e5d"]                # container id prefixes
//!
//! [export]                  # OTEL_EXPORTER_OTLP_[PROFILES_]* first, then these
//! endpoint = "http://localhost:4317"
//! protocol = "grpc"         # or "http/protobuf"
//! headers = { "x-api-key" = "…" }
//! timeout = "10s"
//! compression = "gzip"      # or "none"
//! queue = 10                # windows kept while the collector cannot be reached
//! max_backoff = "60s"
//!
//! [limits]                  # per window; what does not fit is counted as dropped
//! max_processes = 4096
//! max_stacks = 200000
//! symbol_cache_bytes = 268435456 # parsed symbols kept between windows (256 MiB, estimated)
//!
//! [metrics]
//! listen = "127.0.0.1:9464" # /metrics (Prometheus) and /healthz; "" turns it off
//!
//! [symbols]                 # off unless servers are listed (DEBUGINFOD_URLS is not read)
//! debuginfod_urls = ["https://debuginfod.debian.net"]
//! debuginfod_cache = "/var/cache/spanprof/debuginfod"  # default: $XDG_CACHE_HOME or
//!                           # ~/.cache, then spanprof/debuginfod
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::collect::options::DEFAULT_STACK_COPY;
use crate::collect::{EventError, EventSet, Invalid, Options, Unwind};
use crate::export::{ExporterConfig, Protocol};

/// The default `limits.symbol_cache_bytes`: 256 MiB as [`symbolizer::parse_cost`] estimates
/// it, three bytes per byte of a module's symbol and DWARF sections, far above what parsing
/// them holds. At the former 64 MiB, pyenv's CPython 3.12 libpython alone (23 MB of such
/// sections, estimated at 69 MB) was over the bound: it and libc's debug file were parsed
/// again for every window, about two fifths of the daemon's CPU beside busy Python processes (the daemon
/// block of BENCHMARKS.md is measured with this default).
pub const SYMBOL_CACHE_BYTES: u64 = 256 << 20;

/// The file as written (every field optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    sampling: SamplingFile,
    #[serde(default)]
    scope: ScopeFile,
    #[serde(default)]
    export: ExportFile,
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    metrics: MetricsFile,
    #[serde(default)]
    privacy: PrivacyFile,
    #[serde(default)]
    symbols: SymbolsFile,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SymbolsFile {
    #[serde(default)]
    debuginfod_urls: Vec<String>,
    debuginfod_cache: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrivacyFile {
    redact_paths: Option<String>,
    #[serde(default)]
    drop_labels: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SamplingFile {
    frequency: Option<u64>,
    events: Option<Vec<String>>,
    offcpu_min: Option<String>,
    alloc_rate: Option<u64>,
    window: Option<String>,
    unwind: Option<String>,
    spans: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScopeFile {
    #[serde(default)]
    pids: Vec<u32>,
    #[serde(default)]
    executables: Vec<String>,
    #[serde(default)]
    cgroups: Vec<String>,
    #[serde(default)]
    containers: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportFile {
    endpoint: Option<String>,
    protocol: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    timeout: Option<String>,
    compression: Option<String>,
    queue: Option<usize>,
    max_backoff: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    max_processes: Option<usize>,
    max_stacks: Option<usize>,
    symbol_cache_bytes: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsFile {
    listen: Option<String>,
}

/// Which processes the daemon profiles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// These processes (and their children).
    pub pids: Vec<u32>,
    /// Processes whose executable name (or `comm`) matches one of these globs.
    pub executables: Vec<String>,
    /// Processes whose cgroup v2 path matches one of these globs.
    pub cgroups: Vec<String>,
    /// Processes in a container whose id starts with one of these.
    pub containers: Vec<String>,
}

impl Scope {
    /// No selector: every process on the host.
    pub fn is_host(&self) -> bool {
        self.pids.is_empty()
            && self.executables.is_empty()
            && self.cgroups.is_empty()
            && self.containers.is_empty()
    }

    /// A one-line description, for logs.
    pub fn describe(&self) -> String {
        if self.is_host() {
            return "every process on the host".to_string();
        }
        let mut parts = Vec::new();
        if !self.pids.is_empty() {
            let pids: Vec<String> = self.pids.iter().map(u32::to_string).collect();
            parts.push(format!("pids {}", pids.join(",")));
        }
        if !self.executables.is_empty() {
            parts.push(format!("executables {}", self.executables.join(",")));
        }
        if !self.cgroups.is_empty() {
            parts.push(format!("cgroups {}", self.cgroups.join(",")));
        }
        if !self.containers.is_empty() {
            parts.push(format!("containers {}", self.containers.join(",")));
        }
        parts.join("; ")
    }
}

/// The daemon's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DaemonConfig {
    /// `[sampling]` but the window: frequency, events (cpu, offcpu or wall; or alloc),
    /// alloc_rate, offcpu_min, unwind, spans. Children of the targets are followed; the ring
    /// buffer and stack copy have the collector's defaults.
    pub sampling: crate::collect::Options,
    /// One profile is exported per window.
    pub window: Duration,
    /// Which processes.
    pub scope: Scope,
    /// Where profiles go.
    pub exporter: ExporterConfig,
    /// Windows waiting for export at most; older ones are dropped (and counted).
    pub queue: usize,
    /// Longest wait between two attempts of an export.
    pub max_backoff: Duration,
    /// Processes per window at most.
    pub max_processes: usize,
    /// Distinct stacks (per thread, span and event) per window at most.
    pub max_stacks: usize,
    /// Bytes of parsed module symbols kept between windows at most (as
    /// [`symbolizer::parse_cost`] estimates them).
    pub symbol_cache_bytes: u64,
    /// Where `/metrics` and `/healthz` are served, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// `[privacy]`: what the exported profiles may not show (as `--redact-paths` and
    /// `--drop-label`).
    pub privacy: crate::privacy::Privacy,
    /// debuginfod's servers and cache directory (`[symbols]`); `None`: not asked (the
    /// default).
    pub debuginfod: Option<(Vec<String>, PathBuf)>,
}

/// Samples per second per CPU of the daemon, lower than a session's
/// ([`crate::collect::options::DEFAULT_FREQUENCY`]): it runs always.
pub const DEFAULT_FREQUENCY: u64 = 19;

fn duration(field: &str, value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .map_err(|_| format!("{field}: invalid duration {value:?} (e.g. 60s, 500ms)"))
}

impl DaemonConfig {
    /// Reads a configuration file; `None` is the defaults. The exporter's settings start from
    /// the environment's `OTEL_EXPORTER_OTLP_*` and the file's `[export]` overrides them.
    pub fn load(path: Option<&Path>) -> Result<DaemonConfig, String> {
        let text = match path {
            Some(p) => std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?,
            None => String::new(),
        };
        let exporter = ExporterConfig::from_env()?;
        Self::parse(&text, exporter).map_err(|e| match path {
            Some(p) => format!("{}: {e}", p.display()),
            None => e,
        })
    }

    /// Parses the text of a configuration file over the exporter settings `exporter`.
    pub fn parse(text: &str, mut exporter: ExporterConfig) -> Result<DaemonConfig, String> {
        // NB: the parser's error quotes the line, which may be an endpoint with a password.
        let file: File = toml::from_str(text)
            .map_err(|e| symbolizer::debuginfod::without_credentials(&e.to_string()))?;
        let s = file.sampling;
        let defaults = Options::default();
        let events = s.events.unwrap_or_else(|| vec!["cpu".to_string()]);
        // NB: before parsing, so that heap with another event is named as heap; trimmed as the
        // parser trims (" heap" is heap).
        if events.iter().any(|e| e.trim() == "heap") {
            return Err(
                "sampling.events: \"heap\" is not available in the daemon yet \
                 (`spanprof profile --event heap` has it): use cpu, offcpu, wall or alloc"
                    .to_string(),
            );
        }
        let events = EventSet::parse(events.iter().map(String::as_str)).map_err(|e| match e {
            EventError::Unknown(other) => {
                format!("sampling.events: unknown event {other:?}: use cpu, offcpu, wall or alloc")
            }
            EventError::Mixed => "sampling.events: alloc makes a memory profile and does not \
                                  combine with cpu, offcpu or wall (run two daemons)"
                .to_string(),
            EventError::Empty => {
                "sampling.events: give at least one of cpu, offcpu, wall, alloc".to_string()
            }
        })?;
        let offcpu_min = match &s.offcpu_min {
            Some(d) => duration("sampling.offcpu_min", d)?,
            None => defaults.offcpu_min,
        };
        let unwind = match s.unwind.as_deref() {
            None => defaults.unwind,
            Some(name) => Unwind::from_name(name, DEFAULT_STACK_COPY)
                .ok_or_else(|| format!("sampling.unwind: {name:?}: use dwarf or fp"))?,
        };
        let sampling = Options {
            frequency: s.frequency.unwrap_or(DEFAULT_FREQUENCY),
            events,
            alloc_rate: s.alloc_rate.unwrap_or(defaults.alloc_rate),
            offcpu_min,
            unwind,
            spans: s.spans.unwrap_or(defaults.spans),
            follow_children: true,
            ..defaults
        };
        sampling.validate(1000).map_err(|e| match e {
            Invalid::Frequency => format!(
                "sampling.frequency: {} Hz is out of 1 to 1000",
                sampling.frequency
            ),
            Invalid::AllocRate => {
                "sampling.alloc_rate: 1 (every allocation) or more bytes".to_string()
            }
            // NB: the file sets neither the ring buffer nor the stack copy.
            other => format!("sampling: {other:?}"),
        })?;
        let window = duration("sampling.window", s.window.as_deref().unwrap_or("60s"))?;
        if window < Duration::from_secs(1) {
            return Err("sampling.window: at least 1s".to_string());
        }

        let scope = Scope {
            pids: file.scope.pids,
            executables: file.scope.executables,
            cgroups: file.scope.cgroups,
            containers: file
                .scope
                .containers
                .into_iter()
                .map(|c| c.to_ascii_lowercase())
                .collect(),
        };
        if let Some(bad) = scope
            .containers
            .iter()
            .find(|c| c.is_empty() || c.len() > 64 || !c.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(format!(
                "scope.containers: {bad:?} is not a container id (or prefix) in hex"
            ));
        }

        let x = file.export;
        if let Some(p) = &x.protocol {
            exporter
                .set_protocol(Protocol::from_name(p).map_err(|e| format!("export.protocol: {e}"))?);
        }
        if let Some(e) = &x.endpoint {
            exporter
                .set_endpoint(e)
                .map_err(|e| format!("export.endpoint: {e}"))?;
        }
        for (k, v) in x.headers {
            exporter.headers.retain(|(key, _)| *key != k);
            exporter.headers.push((k, v));
        }
        if let Some(t) = &x.timeout {
            exporter.timeout = duration("export.timeout", t)?;
            if exporter.timeout < Duration::from_millis(100)
                || exporter.timeout > Duration::from_secs(3600)
            {
                return Err("export.timeout: from 100ms to 1h".to_string());
            }
        }
        match x.compression.as_deref() {
            None => {}
            Some("gzip") => exporter.gzip = true,
            Some("none") => exporter.gzip = false,
            Some(other) => return Err(format!("export.compression: {other:?}: use gzip or none")),
        }
        let queue = x.queue.unwrap_or(10);
        if queue == 0 {
            return Err("export.queue: at least 1 window".to_string());
        }
        let max_backoff = duration(
            "export.max_backoff",
            x.max_backoff.as_deref().unwrap_or("60s"),
        )?;
        if max_backoff < Duration::from_secs(1) || max_backoff > Duration::from_secs(86400) {
            return Err("export.max_backoff: from 1s (the first wait) to 24h".to_string());
        }

        let metrics = match file.metrics.listen.as_deref() {
            None => Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            Some("") => None,
            Some(a) => Some(
                a.parse()
                    .map_err(|_| format!("metrics.listen: {a:?} is not an address:port"))?,
            ),
        };
        let privacy = crate::privacy::Privacy {
            redact_paths: match file.privacy.redact_paths.as_deref() {
                None | Some("none") => None,
                Some(m) => Some(crate::privacy::PathMode::from_name(m).ok_or_else(|| {
                    format!("privacy.redact_paths: {m:?}: use basename, hash or none")
                })?),
            },
            drop_labels: file
                .privacy
                .drop_labels
                .iter()
                .map(|k| {
                    crate::privacy::Privacy::parse_label(k)
                        .map_err(|e| format!("privacy.drop_labels: {e}"))
                })
                .collect::<Result<_, _>>()?,
        };
        let debuginfod = debuginfod_config(file.symbols)?;
        Ok(DaemonConfig {
            sampling,
            window,
            scope,
            exporter,
            queue,
            max_backoff,
            max_processes: file.limits.max_processes.unwrap_or(4096).max(1),
            max_stacks: file.limits.max_stacks.unwrap_or(200_000).max(1),
            symbol_cache_bytes: file.limits.symbol_cache_bytes.unwrap_or(SYMBOL_CACHE_BYTES),
            metrics,
            privacy,
            debuginfod,
        })
    }
}

/// `[symbols]`: the servers (http or https URLs) and the cache (an absolute path), when
/// servers are listed.
fn debuginfod_config(file: SymbolsFile) -> Result<Option<(Vec<String>, PathBuf)>, String> {
    let urls: Vec<String> = file
        .debuginfod_urls
        .iter()
        .map(|u| u.trim().to_string())
        .collect();
    if let Some(bad) = urls
        .iter()
        .find(|u| !u.starts_with("http://") && !u.starts_with("https://"))
    {
        return Err(format!(
            "symbols.debuginfod_urls: {:?} is not an http:// or https:// URL",
            symbolizer::debuginfod::without_credentials(bad)
        ));
    }
    let cache = match file.debuginfod_cache {
        Some(path) if Path::new(&path).is_absolute() => Some(PathBuf::from(path)),
        Some(path) => {
            return Err(format!(
                "symbols.debuginfod_cache: {path:?} is not an absolute path"
            ))
        }
        None => None,
    };
    if urls.is_empty() {
        return Ok(None);
    }
    let cache = cache
        .or_else(symbolizer::debuginfod::default_cache)
        .ok_or("symbols.debuginfod_cache: needed (neither XDG_CACHE_HOME nor HOME is set)")?;
    Ok(Some((urls, cache)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> ExporterConfig {
        ExporterConfig::from_vars(&|_| None).unwrap()
    }

    #[test]
    fn a_syntax_error_does_not_show_the_endpoint_s_password() {
        let err = DaemonConfig::parse(
            "[export]\nendpoint = \"http://me:s3cret@collector:4317\" oops\n",
            base(),
        )
        .unwrap_err();
        assert!(err.contains("http://***@collector:4317"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn defaults() {
        let c = DaemonConfig::parse("", base()).unwrap();
        assert_eq!(c.sampling.frequency, 19);
        assert_eq!(c.sampling.events, EventSet::Cpu);
        assert_eq!(c.sampling.unwind.stack_copy_bytes(), 16384);
        assert!(c.sampling.follow_children);
        assert_eq!(c.window, Duration::from_secs(60));
        assert!(c.scope.is_host());
        assert_eq!(c.exporter.endpoint, "http://localhost:4317");
        assert_eq!(c.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(c.symbol_cache_bytes, 256 << 20);
        assert_eq!(c.queue, 10);
    }

    #[test]
    fn a_full_file() {
        let c = DaemonConfig::parse(
            r#"
            [sampling]
            frequency = 49
            events = ["cpu", "offcpu"]
            window = "5s"
            unwind = "fp"
            [scope]
            pids = [1, 2]
            executables = ["python3*"]
            containers = ["ABCdef"]
            [export]
            protocol = "http/protobuf"
            endpoint = "http://c:4318"
            headers = { "x-api-key" = "k" }
            timeout = "3s"
            compression = "none"
            queue = 3
            [limits]
            max_processes = 10
            max_stacks = 100
            symbol_cache_bytes = 1000
            [metrics]
            listen = ""
            "#,
            base(),
        )
        .unwrap();
        assert_eq!(c.sampling.frequency, 49);
        assert_eq!(c.sampling.events, EventSet::CpuAndOffCpu);
        assert_eq!(c.window, Duration::from_secs(5));
        assert_eq!(c.sampling.unwind, Unwind::FramePointers);
        assert_eq!(c.scope.pids, [1, 2]);
        assert_eq!(c.scope.containers, ["abcdef"]);
        assert_eq!(c.exporter.endpoint, "http://c:4318/v1development/profiles");
        assert_eq!(
            c.exporter.headers,
            [("x-api-key".to_string(), "k".to_string())]
        );
        assert!(!c.exporter.gzip);
        assert_eq!((c.queue, c.max_processes, c.max_stacks), (3, 10, 100));
        assert_eq!(c.symbol_cache_bytes, 1000);
        assert_eq!(c.metrics, None);
        assert_eq!(c.debuginfod, None);
        let c = DaemonConfig::parse(
            "[symbols]\ndebuginfod_urls = [\" http://d:8002 \"]\ndebuginfod_cache = \"/c\"\n",
            base(),
        )
        .unwrap();
        assert_eq!(
            c.debuginfod,
            Some((vec!["http://d:8002".to_string()], PathBuf::from("/c")))
        );
    }

    /// The rows of the first table after `marker` in `doc`: (first cell, second cell).
    fn doc_table<'a>(doc: &'a str, marker: &str) -> Vec<(&'a str, &'a str)> {
        let at = doc
            .find(marker)
            .unwrap_or_else(|| panic!("docs/daemon.md has no `{marker}` marker"));
        doc[at..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with('|'))
            .skip(2) // the header and the |---| line
            .map(|l| {
                let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
                (cells[0], cells.get(1).copied().unwrap_or(""))
            })
            .collect()
    }

    /// The TOML value a default cell of docs/daemon.md states: the cell, or what follows its
    /// last `, else ` (`…TIMEOUT`, else `"10s"`), without backticks, when that is a literal.
    fn toml_literal(cell: &str) -> Option<String> {
        let value = cell.rsplit(", else ").next().unwrap_or(cell).trim();
        let value = value.trim_matches('`').trim();
        let literal = value.parse::<f64>().is_ok()
            || matches!(value, "true" | "false")
            || value.starts_with(['"', '[', '{']);
        literal.then(|| value.to_string())
    }

    /// Keys whose documented default is not a literal (it comes from the environment): the
    /// value the default stands for when no `OTEL_EXPORTER_OTLP_*` variable is set.
    const NON_LITERAL: &[(&str, &str)] = &[
        ("export.endpoint", "\"http://localhost:4317\""),
        ("export.headers", "{}"),
        (
            "symbols.debuginfod_cache",
            "\"/var/cache/spanprof/debuginfod\"",
        ),
    ];

    /// docs/daemon.md's key table says what the code does: every key it names is accepted, and
    /// setting each to the default the table gives leaves the configuration the defaults make.
    /// dist/spanprof.toml ("every key with its default") must give the defaults too, and every key
    /// it lists must be in the table.
    #[test]
    fn documented_defaults_are_the_code_s() {
        let doc = include_str!("../../../docs/daemon.md");
        let dist = include_str!("../../../dist/spanprof.toml");
        let defaults = DaemonConfig::parse("", base()).unwrap();
        let mut documented = Vec::new();
        let mut wrong = Vec::new();
        for (keys, default) in doc_table(doc, "<!-- config: spanprof daemon") {
            for key in keys.split(',').map(|k| k.trim().trim_matches('`')) {
                documented.push(key.to_string());
                let (section, name) = key
                    .split_once('.')
                    .unwrap_or_else(|| panic!("docs/daemon.md: key {key:?} has no section"));
                let value = toml_literal(default)
                    .or_else(|| {
                        NON_LITERAL
                            .iter()
                            .find(|(k, _)| *k == key)
                            .map(|(_, v)| v.to_string())
                    })
                    .unwrap_or_else(|| {
                        panic!("docs/daemon.md: {key}: no literal default in {default:?}")
                    });
                match DaemonConfig::parse(&format!("[{section}]\n{name} = {value}\n"), base()) {
                    Ok(c) if c == defaults => {}
                    Ok(_) => wrong.push(format!("{key}: documented {value}, not the default")),
                    Err(e) => wrong.push(format!("{key} = {value}: {e}")),
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "docs/daemon.md's defaults differ from the code's:\n  {}",
            wrong.join("\n  ")
        );
        assert_eq!(
            DaemonConfig::parse(dist, base()).unwrap(),
            defaults,
            "dist/spanprof.toml does not hold the defaults"
        );
        let mut section = "";
        for line in dist.lines() {
            let line = line.trim_start_matches(['#', ' ']);
            if let Some(s) = line.strip_prefix('[').and_then(|l| l.split_once(']')) {
                section = s.0;
            } else if let Some((name, _)) = line.split_once(" = ") {
                if !name.contains(' ') && !section.is_empty() {
                    let key = format!("{section}.{name}");
                    assert!(
                        documented.contains(&key),
                        "dist/spanprof.toml has {key}, docs/daemon.md's table does not"
                    );
                }
            }
        }
    }

    #[test]
    fn mistakes_are_named() {
        for (text, needle) in [
            ("[sampling]\nfrequency = 0", "sampling.frequency"),
            (
                "[sampling]\nevents = [\"heap\"]",
                "not available in the daemon",
            ),
            (
                "[sampling]\nevents = [\"cpu\", \" heap \"]",
                "not available in the daemon",
            ),
            (
                "[sampling]\nevents = [\"alloc\", \"cpu\"]",
                "does not combine",
            ),
            ("[sampling]\nalloc_rate = 0", "sampling.alloc_rate"),
            ("[sampling]\nwindow = \"soon\"", "sampling.window"),
            ("[sampling]\nwindw = \"5s\"", "unknown field"),
            ("[scope]\ncontainers = [\"xyz\"]", "scope.containers"),
            ("[export]\nendpoint = \"c:4317\"", "export.endpoint"),
            ("[export]\nqueue = 0", "export.queue"),
            ("[export]\nmax_backoff = \"0s\"", "export.max_backoff"),
            ("[export]\ntimeout = \"0s\"", "export.timeout"),
            ("[metrics]\nlisten = \"nowhere\"", "metrics.listen"),
            (
                "[symbols]\ndebuginfod_urls = [\"ftp://u:secret@x\"]",
                "\"ftp://***@x\" is not an http",
            ),
            (
                "[symbols]\ndebuginfod_urls = [\"http://x\"]\ndebuginfod_cache = \"c\"",
                "symbols.debuginfod_cache",
            ),
            ("not toml", "expected"),
        ] {
            let err = DaemonConfig::parse(text, base()).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
