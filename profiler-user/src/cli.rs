//! The command line: the subcommands' flags (clap), what they parse into (the collector's
//! options, filters, exporter settings), and the errors and exit statuses of bad input.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use spanprof::command::CannotRun;
use spanprof::export::{ExporterConfig, Protocol};
use spanprof_analysis::filter::{self, Filter};
use spanprof_collect::{self as collect, EventError, EventSet, Invalid, Unwind};
use spanprof_profile::format::Format;
use spanprof_profile::profile::{GroupBy, View};

/// Exit status for bad command-line input.
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit status for a failed session.
pub(crate) const EXIT_FAILURE: u8 = 1;
/// Exit status of `check` and `diff` when a budget is exceeded or a function regressed.
pub(crate) const EXIT_BUDGET: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "spanprof",
    version,
    about = "Low-overhead eBPF sampling profiler with trace correlation"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Cmd {
    /// Profile running processes, or a command and its children, for a while.
    Profile(ProfileArgs),
    /// Top functions of a pprof file spanprof wrote (text or JSON), or the file filtered and
    /// rendered again (by event, thread, trace or span).
    Report(ReportArgs),
    /// Compare two profiles: the functions whose share grew or shrank most, a differential
    /// flame graph, and a non-zero exit on regression.
    Diff(DiffArgs),
    /// Check a profile against budgets: exit 3 when a function's share is over its budget.
    Check(CheckArgs),
    /// Write the outputs of a session again from its recording (`profile --record`), without
    /// root or BPF.
    Replay(ReplayArgs),
    /// Every thread of running processes now: its stack (Python, native, kernel), whether it
    /// runs or why it waits (sleep, lock, io, gil), and its span.
    Dump(DumpArgs),
    /// A live view of running processes, refreshed every second: functions by self and total
    /// share over a sliding window, and the span names; q quits.
    Top(TopArgs),
    /// Profile the host (or selected processes) continuously, exporting OTLP profiles.
    Daemon(DaemonArgs),
    /// Check that profiling works here: calibrated workloads (or a target) profiled and
    /// compared with their truth, with every figure; exit 1 when a check fails.
    Verify(VerifyArgs),
    /// Shell completions: a script for bash, zsh or fish (or elvish, powershell) on stdout.
    #[command(after_help = "Examples:\n  \
        spanprof completions bash > /etc/bash_completion.d/spanprof\n  \
        spanprof completions zsh > /usr/local/share/zsh/site-functions/_spanprof\n  \
        spanprof completions fish > ~/.config/fish/completions/spanprof.fish")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// The manual pages: spanprof(1) on stdout, or every page (spanprof.1 and one per
    /// subcommand, spanprof-profile.1 …) written into a directory.
    #[command(after_help = "Examples:\n  \
        spanprof man | man -l -\n  \
        spanprof man --dir /usr/local/share/man/man1")]
    Man {
        /// Write every page into this directory (made if missing) instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// A calibrated native workload of `spanprof verify` (not for direct use).
    #[command(name = "__verify-workload", hide = true)]
    VerifyWorkload {
        kind: String,
        out: PathBuf,
        seconds: f64,
    },
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  spanprof verify\n  \
                  spanprof verify --pid 1234 --otlp-endpoint http://localhost:4317\n  \
                  spanprof verify -- python3 app.py\n\n\
                  Without a target it profiles built-in workloads whose truth is known: native \
                  functions sharing the CPU 3:1, a known allocation volume, and with python3 two \
                  Python functions sharing it 2:1 and requests traced with OpenTelemetry and \
                  OSProfiler (skipped when the libraries cannot be imported). \
                  Exit status: 1 when a check fails; 2 for bad arguments.")]
pub(crate) struct VerifyArgs {
    /// Check these running processes instead of the built-in workloads.
    #[arg(short, long, value_name = "PID[,PID…]", conflicts_with = "command")]
    pub(crate) pid: Option<String>,
    /// How long a --pid target is profiled.
    #[arg(short, long, value_name = "DURATION", default_value = "10s")]
    pub(crate) duration: String,
    /// Samples per second on each CPU.
    #[arg(short = 'F', long, default_value_t = 499)]
    pub(crate) frequency: u64,
    /// The Python of the Python workloads (default: python3 on PATH).
    #[arg(long, value_name = "PATH")]
    pub(crate) python: Option<PathBuf>,
    /// Also send the profile to this OTLP collector and check its answer.
    #[arg(long, value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (default from OTEL_EXPORTER_OTLP_PROTOCOL, else grpc).
    #[arg(long, value_name = "PROTOCOL")]
    pub(crate) otlp_protocol: Option<String>,
    /// Command to run and check, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  spanprof daemon --config /etc/spanprof/spanprof.toml\n  \
                  OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317 spanprof daemon\n\n\
                  Signals: SIGTERM flushes the current window and exits; SIGHUP reloads the \
                  configuration. Metrics on http://127.0.0.1:9464/metrics by default."
)]
pub(crate) struct DaemonArgs {
    /// Configuration file (TOML); without one: every process, cpu at 19 Hz, 60 s windows,
    /// exported as the OTEL_EXPORTER_OTLP_* variables say.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  spanprof profile --pid 1234 --duration 30s -o flame.svg\n  \
                  spanprof profile -o run.pb.gz -o run.svg -- ./bench --fast\n\n\
                  Formats (from the extension, or --format for every output): .svg flame graph, \
                  .folded stacks, .pb.gz pprof, .speedscope.json, .otlp OTLP profiles.\n\
                  Exit status: the command's in `-- CMD` mode; 2 for bad arguments; 1 for other errors."
)]
pub(crate) struct ProfileArgs {
    /// Processes to profile, comma-separated.
    #[arg(short, long, value_name = "PID[,PID…]", conflicts_with = "command")]
    pub(crate) pid: Option<String>,
    /// How long to profile (e.g. 30s, 500ms, 2m). Default: until the targets exit or Ctrl-C.
    #[arg(short, long, value_name = "DURATION")]
    pub(crate) duration: Option<String>,
    /// What to sample, comma-separated or repeated: `cpu` (on-CPU stacks), `offcpu` (time
    /// blocked, with its reason: sleep, lock, io, gil, asyncio_idle, other), `wall` (both, as wall-clock time);
    /// or memory: `alloc` (sampled allocations), `heap` (those not freed at the end).
    #[arg(short, long, value_name = "EVENT[,EVENT…]", default_value = "cpu")]
    pub(crate) event: Vec<String>,
    // NB: these two defaults are applied in code (giving the flag without alloc, heap, offcpu
    // or wall is an error), so the help text states them the way clap states its own; the
    // documentation check (`cargo xtask docs`) reads `[default: …]` from this help.
    #[arg(long, value_name = "BYTES", help = format!(
        "With alloc or heap: bytes allocated between two samples on average (1: every \
         allocation) [default: {}]",
        spanprof_profile::profile::DEFAULT_ALLOC_RATE
    ))]
    pub(crate) alloc_rate: Option<u64>,
    /// With alloc or heap: also probe CPython's small-object allocator (pymalloc), so objects
    /// of 512 bytes or less are charged to the code that allocates them, not seen through the
    /// arenas they fill; needs the interpreter's symbol table; slows Python code much more
    #[arg(long)]
    pub(crate) python_allocators: bool,
    #[arg(long, value_name = "DURATION", help = format!(
        "With offcpu or wall: blocked intervals shorter than this are not counted \
         [default: {}]",
        spanprof_pipeline::offcpu::DEFAULT_MIN
    ))]
    pub(crate) offcpu_min: Option<String>,
    /// Samples per second on each CPU; off-CPU intervals are sampled at the same rate of time
    /// (an interval of 1/HZ or more is always kept).
    #[arg(short = 'F', long, default_value_t = collect::options::DEFAULT_FREQUENCY, value_name = "HZ")]
    pub(crate) frequency: u64,
    /// Output file; repeat for several formats of the same profile.
    #[arg(short, long = "output", value_name = "FILE")]
    pub(crate) output: Vec<PathBuf>,
    /// Format of every output (svg, folded, pprof, speedscope, otlp), instead of the extension.
    #[arg(long, value_name = "FORMAT")]
    pub(crate) format: Option<String>,
    /// Drop kernel frames.
    #[arg(long)]
    pub(crate) no_kernel: bool,
    /// One frame per Python (or inlined native) function instead of one per line: `f (app.py)`.
    #[arg(long)]
    pub(crate) no_lines: bool,
    /// Keep only Python frames (native and kernel frames are dropped).
    #[arg(long)]
    pub(crate) python_only: bool,
    #[command(flatten)]
    pub(crate) view: ViewArgs,
    /// Do not fetch debug files from the servers of DEBUGINFOD_URLS (fetched by default when it
    /// is set, for stripped modules whose addresses have no name here).
    #[arg(long)]
    pub(crate) no_debuginfod: bool,
    /// Do not read span contexts (OpenTelemetry, OSProfiler) of Python threads.
    #[arg(long)]
    pub(crate) no_spans: bool,
    /// With --pid, also profile the processes the targets started before (a pre-fork server's
    /// workers) and start during the session (always on for a command).
    #[arg(long)]
    pub(crate) children: bool,
    /// Size of the kernel-to-user sample ring buffer in bytes (a power of two, ≥ 4096).
    #[arg(long, default_value_t = collect::options::DEFAULT_RING_BUFFER_BYTES, value_name = "BYTES")]
    pub(crate) ring_buffer_size: u32,
    /// How native user stacks are unwound: `dwarf` (the kernel copies the stack, spanprof
    /// unwinds it with the modules' .eh_frame, frame pointers where a module has none) or `fp`
    /// (the kernel follows frame pointers: cheaper, but cut short in code built without them).
    #[arg(long, default_value = "dwarf", value_name = "MODE")]
    pub(crate) unwind: String,
    /// With --unwind dwarf: bytes of user stack copied per sample (8 to 32768).
    #[arg(long, default_value_t = collect::options::DEFAULT_STACK_COPY, value_name = "BYTES")]
    pub(crate) stack_copy: u32,
    /// Write per-process statistics (how many stacks were complete, truncated or failed, and
    /// why) as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) stats: Option<PathBuf>,
    /// Also record the session to FILE (gzip), from which `spanprof replay` writes its outputs
    /// again without root; it holds what an OTLP output of the session would hold (see docs/replay.md).
    #[arg(long, value_name = "FILE")]
    pub(crate) record: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) privacy: PrivacyArgs,
    /// Put every sample under a root frame named after its span (`span`: one root per span,
    /// `[span NAME (ID trace ID)]`), its span's name (`span-name`: one root per endpoint,
    /// `[span NAME]`), its thread (`thread`: `[thread NAME]`, the Python thread name where
    /// there is one) or its process (`process`: `[process PID (NAME)]`).
    #[arg(long, value_name = "GROUP")]
    pub(crate) group_by: Option<String>,
    /// speedscope outputs: one profile per thread, rather than one per thread name without
    /// its number (`Thread-12 (handle)` and `Thread-13 (handle)` are one `handle` profile).
    #[arg(long)]
    pub(crate) speedscope_per_thread: bool,
    /// No progress bar or progress lines.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Send the profile to this OTLP collector at the end of the session (e.g.
    /// http://localhost:4317); the OTEL_EXPORTER_OTLP_[PROFILES_]* variables give the rest.
    #[arg(long, value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
    /// OTLP protocol: grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_[PROFILES_]PROTOCOL,
    /// else grpc).
    #[arg(long, value_name = "PROTOCOL")]
    pub(crate) otlp_protocol: Option<String>,
    /// An extra OTLP request header, KEY=VALUE (repeatable; added to
    /// OTEL_EXPORTER_OTLP_[PROFILES_]HEADERS).
    #[arg(long = "otlp-header", value_name = "KEY=VALUE")]
    pub(crate) otlp_headers: Vec<String>,
    /// Command to run and profile, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  spanprof top --pid 1234\n  \
                  spanprof top --pid 1234 --window 1m --plain\n  \
                  spanprof top -- python3 app.py\n\n\
                  Keys: q (or Esc, Ctrl-C) quits, p pauses, s sorts by self or total share, n \
                  shows every function or the Python ones. Not on a terminal (or with \
                  --plain): the top 10 lines every second.")]
pub(crate) struct TopArgs {
    /// Processes to watch, comma-separated.
    #[arg(
        short,
        long,
        value_name = "PID[,PID…]",
        conflicts_with = "command",
        required_unless_present = "command"
    )]
    pub(crate) pid: Option<String>,
    /// Samples per second on each CPU.
    #[arg(short = 'F', long, default_value_t = collect::options::DEFAULT_FREQUENCY, value_name = "HZ")]
    pub(crate) frequency: u64,
    /// The sliding window the shares are of, in whole seconds (e.g. 10s, 1m).
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub(crate) window: String,
    /// Plain lines every second, even on a terminal.
    #[arg(long)]
    pub(crate) plain: bool,
    #[command(flatten)]
    pub(crate) view: ViewArgs,
    /// Do not read span contexts (OpenTelemetry, OSProfiler) of Python threads.
    #[arg(long)]
    pub(crate) no_spans: bool,
    /// Command to run and watch, with its children, after `--`; in the terminal view its
    /// output is discarded (--plain keeps it); it is stopped (SIGTERM) when the view quits.
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  spanprof dump --pid 1234\n  \
                  spanprof dump --pid 1234 --children --json\n\n\
                  Nothing is stopped: a blocked thread is read where it waits, a running one \
                  at its next timer sample (within a second). Needs what `profile` needs, and \
                  Linux 6.8 or later.")]
pub(crate) struct DumpArgs {
    /// Processes to dump, comma-separated.
    #[arg(short, long, value_name = "PID[,PID…]", required = true)]
    pub(crate) pid: String,
    /// Also dump the processes they started, and theirs.
    #[arg(long)]
    pub(crate) children: bool,
    /// Print JSON (described in docs/dump.md) instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) view: ViewArgs,
    /// Do not read span contexts (OpenTelemetry, OSProfiler) of Python threads.
    #[arg(long)]
    pub(crate) no_spans: bool,
}

/// The sample filters `report`, `diff` and `check` share; a sample must match them all.
#[derive(Debug, clap::Args)]
pub(crate) struct FilterArgs {
    /// Keep one measure: `cpu` or `offcpu` (of a `cpu,offcpu` or `wall` profile), `alloc` or
    /// `heap` (of an `alloc,heap` profile).
    #[arg(long, value_name = "EVENT")]
    pub(crate) event: Option<String>,
    /// Keep samples of this thread (its name or id); repeat for several.
    #[arg(long, value_name = "NAME|TID")]
    pub(crate) thread: Vec<String>,
    /// Keep samples of this OpenTelemetry trace (32 hex digits); also matches OSProfiler
    /// points by the trace id their OTLP driver exports (the base id's digits).
    #[arg(long, value_name = "HEX")]
    pub(crate) trace_id: Option<String>,
    /// Keep samples of this OpenTelemetry span (16 hex digits; of an OSProfiler point, the
    /// last 16 digits of its id).
    #[arg(long, value_name = "HEX")]
    pub(crate) span_id: Option<String>,
    /// Keep samples of this OSProfiler trace (its base id, a UUID).
    #[arg(long, value_name = "UUID")]
    pub(crate) base_id: Option<String>,
    /// Keep samples taken in this OSProfiler trace point (its own id, not a parent's).
    #[arg(long, value_name = "UUID")]
    pub(crate) osprofiler_id: Option<String>,
    /// Keep samples in spans (OpenTelemetry) or trace points (OSProfiler) of this name, a glob
    /// (`GET /servers*`, `job_[xy]`: `*`, `?`, `[...]`, `[!...]`); repeat for several.
    #[arg(long = "span", value_name = "NAME")]
    pub(crate) span: Vec<String>,
}

/// What the outputs may not show (see docs/privacy.md).
#[derive(Debug, clap::Args)]
pub(crate) struct PrivacyArgs {
    /// Reduce every file path in the outputs (modules, source files, the executable, the
    /// target's command line) to its base name: `--redact-paths` or `--redact-paths=basename`;
    /// `--redact-paths=hash` keeps the base name behind a hash of the directory
    /// (`<3f2a9c1b>/libc.so.6`).
    #[arg(long, value_name = "MODE", num_args = 0..=1, require_equals = true,
          default_missing_value = "basename")]
    pub(crate) redact_paths: Option<String>,
    /// Leave a sample label or resource attribute out of the pprof and OTLP outputs, e.g.
    /// thread.name, span.name, process.command_line, host.name; repeat for several.
    #[arg(long = "drop-label", value_name = "KEY")]
    pub(crate) drop_label: Vec<String>,
}

impl PrivacyArgs {
    pub(crate) fn parse(&self) -> Result<spanprof_profile::privacy::Privacy, Failure> {
        use spanprof_profile::privacy::{PathMode, Privacy};
        let redact_paths = self
            .redact_paths
            .as_deref()
            .map(|m| {
                PathMode::from_name(m).ok_or_else(|| {
                    usage(format!(
                        "invalid --redact-paths={m}: expected basename or hash"
                    ))
                })
            })
            .transpose()?;
        let drop_labels = self
            .drop_label
            .iter()
            .map(|k| Privacy::parse_label(k).map_err(usage))
            .collect::<Result<_, _>>()?;
        Ok(Privacy {
            redact_paths,
            drop_labels,
        })
    }
}

/// Which frames stacks show (`profile`, `replay`, `report`, `diff`, `check`, `top`, `dump`).
#[derive(Debug, clap::Args)]
pub(crate) struct ViewArgs {
    /// Which frames stacks show: `python` (in a stack with Python frames, the interpreter's own
    /// C functions are left out and their time is the self time of the function that called
    /// them; C extensions, other libraries and the kernel stay) or `full` (every frame). pprof
    /// and OTLP files keep every frame either way.
    #[arg(long, value_enum, default_value = "python", value_name = "VIEW")]
    pub(crate) view: ViewName,
    /// Every frame, the interpreter's own included: the same as --view full.
    #[arg(long, conflicts_with = "view")]
    pub(crate) native: bool,
}

/// The values of `--view` (no doc comments on the values: clap would then print every flag's
/// help in its long layout, which the documentation check reads defaults from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ViewName {
    Python,
    Full,
}

impl ViewArgs {
    /// The view asked for.
    pub(crate) fn view(&self) -> View {
        match (self.native, self.view) {
            (true, _) | (false, ViewName::Full) => View::Full,
            (false, ViewName::Python) => View::Python,
        }
    }
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
                  spanprof report run.pb.gz\n  \
                  spanprof report run.pb.gz --format json --top 0 > functions.json\n  \
                  spanprof report run.pb.gz --event offcpu --thread worker-1 -o blocked.svg\n  \
                  spanprof report run.pb.gz --span 'GET /servers*' -o servers.svg\n  \
                  spanprof report run.pb.gz --trace-id 4bf92f3577b34da6a3ce929d0e0e4736 -o trace.svg\n\n\
                  Without -o the report goes to standard output: a table of the top functions \
                  (self and total shares) by default. \
                  Exit status: 2 for bad arguments; 1 for other errors, and when no sample matches.")]
pub(crate) struct ReportArgs {
    /// A pprof file written by `spanprof profile` (`.pb.gz`, or not compressed), folded
    /// stacks (`.folded`) or an OTLP profiles request (`.otlp`).
    #[arg(value_name = "PROFILE")]
    pub(crate) profile: PathBuf,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
    /// Put every sample under a root frame named after its span (`span`: one root per span,
    /// `[span NAME (ID trace ID)]`), its span's name (`span-name`: one root per endpoint,
    /// `[span NAME]`), its thread (`thread`: `[thread NAME]`, the Python thread name where
    /// there is one) or its process (`process`: `[process PID (NAME)]`).
    #[arg(long, value_name = "GROUP")]
    pub(crate) group_by: Option<String>,
    /// speedscope outputs: one profile per thread, rather than one per thread name without
    /// its number (`Thread-12 (handle)` and `Thread-13 (handle)` are one `handle` profile).
    #[arg(long)]
    pub(crate) speedscope_per_thread: bool,
    /// Output file; repeat for several formats. `.txt` and `.json` get the table of
    /// functions, the other extensions the profile (see `spanprof profile --help`).
    #[arg(short, long = "output", value_name = "FILE")]
    pub(crate) output: Vec<PathBuf>,
    /// Format of every output, or of standard output: text (the default), json, svg,
    /// folded, pprof, speedscope or otlp.
    #[arg(long, value_name = "FORMAT")]
    pub(crate) format: Option<String>,
    /// Functions in the table (0: all of them).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub(crate) top: usize,
    #[command(flatten)]
    pub(crate) view: ViewArgs,
    #[command(flatten)]
    pub(crate) privacy: PrivacyArgs,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
                  spanprof diff main.pb.gz pr.pb.gz -o diff.svg --fail-on-regression 5%\n  \
                  spanprof diff main.pb.gz pr.pb.gz --format json\n\n\
                  Shares are of each run's total, so runs of different lengths compare. A \
                  regression is a function whose self or total share grew by more than the \
                  threshold and by more than 3 standard errors of the sampling (a run too short \
                  to tell says so and passes). \
                  Exit status: 3 on regression; 2 for bad arguments; 1 for other errors.")]
pub(crate) struct DiffArgs {
    /// The baseline profile (a pprof file written by `spanprof profile`).
    #[arg(value_name = "BASE")]
    pub(crate) base: PathBuf,
    /// The profile to compare with it.
    #[arg(value_name = "NEW")]
    pub(crate) new: PathBuf,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
    /// Output file: `.svg` a differential flame graph (red: grew, blue: shrank), `.txt` or
    /// `.json` the comparison; repeat for several.
    #[arg(short, long = "output", value_name = "FILE")]
    pub(crate) output: Vec<PathBuf>,
    /// Format of the comparison on standard output: text (the default) or json.
    #[arg(long, value_name = "FORMAT")]
    pub(crate) format: Option<String>,
    /// Functions listed as grown and as shrunk (0: all of them).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub(crate) top: usize,
    /// Exit 3 when a function's share grew by more than this many points of the total
    /// (e.g. 5%).
    #[arg(long, value_name = "PERCENT")]
    pub(crate) fail_on_regression: Option<String>,
    #[command(flatten)]
    pub(crate) view: ViewArgs,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
                  spanprof check run.pb.gz --max 'json_*=20%' --max-self 'memcpy*=5%'\n  \
                  spanprof check run.pb.gz --span-max 'GET /servers*=30ms'\n\n\
                  Patterns are globs (*, ?, [abc], [a-z], [!abc], \\ before a character to \
                  match it as is; a name given whole, such as `[unknown] (libz.so.1)`, matches \
                  itself) matched against whole function names, or the \
                  name before its ` (` (a Python function: `handle` matches `handle (app.py)`). \
                  Exit status: 3 when a budget is exceeded; 2 for bad arguments; 1 for other \
                  errors.")]
pub(crate) struct CheckArgs {
    /// A pprof file written by `spanprof profile`, folded stacks (`.folded`) or an OTLP
    /// profiles request (`.otlp`).
    #[arg(value_name = "PROFILE")]
    pub(crate) profile: PathBuf,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
    /// PATTERN=PERCENT%: the samples with a matching function anywhere in the stack may be at
    /// most this share of the total; repeat for several.
    #[arg(long = "max", value_name = "PATTERN=PERCENT%")]
    pub(crate) max: Vec<String>,
    /// PATTERN=PERCENT%: the samples whose innermost function matches (self time) may be at
    /// most this share.
    #[arg(long = "max-self", value_name = "PATTERN=PERCENT%")]
    pub(crate) max_self: Vec<String>,
    /// NAME=DURATION: spans of this name (a glob; OpenTelemetry span or OSProfiler trace point)
    /// may take at most this long on average, as their samples show (e.g. 'GET /servers=30ms').
    #[arg(long = "span-max", value_name = "NAME=DURATION")]
    pub(crate) span_max: Vec<String>,
    #[command(flatten)]
    pub(crate) view: ViewArgs,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
                  sudo spanprof profile --record run.rec.gz -o run.svg -- ./bench\n  \
                  spanprof replay run.rec.gz -o run.svg -o run.pb.gz\n  \
                  spanprof replay run.rec.gz --group-by span -o by-span.svg\n\n\
                  The outputs are the ones the recorded session wrote (or would have written) \
                  in each format. Without -o it prints the session's summary only. \
                  Exit status: 2 for bad arguments; 1 for other errors.")]
pub(crate) struct ReplayArgs {
    /// A recording written by `spanprof profile --record`.
    #[arg(value_name = "RECORDING")]
    pub(crate) recording: PathBuf,
    /// Output file; repeat for several formats (see `spanprof profile --help`).
    #[arg(short, long = "output", value_name = "FILE")]
    pub(crate) output: Vec<PathBuf>,
    /// Format of every output (svg, folded, pprof, speedscope, otlp), instead of the extension.
    #[arg(long, value_name = "FORMAT")]
    pub(crate) format: Option<String>,
    /// Put every sample under a root frame named after its span (`span`: one root per span,
    /// `[span NAME (ID trace ID)]`), its span's name (`span-name`: one root per endpoint,
    /// `[span NAME]`), its thread (`thread`: `[thread NAME]`, the Python thread name where
    /// there is one) or its process (`process`: `[process PID (NAME)]`).
    #[arg(long, value_name = "GROUP")]
    pub(crate) group_by: Option<String>,
    /// speedscope outputs: one profile per thread, rather than one per thread name without
    /// its number (`Thread-12 (handle)` and `Thread-13 (handle)` are one `handle` profile).
    #[arg(long)]
    pub(crate) speedscope_per_thread: bool,
    #[command(flatten)]
    pub(crate) view: ViewArgs,
    #[command(flatten)]
    pub(crate) privacy: PrivacyArgs,
}

/// A one-line error and the exit status it gets.
pub(crate) struct Failure(pub(crate) u8, pub(crate) String);

pub(crate) fn usage(msg: impl Into<String>) -> Failure {
    Failure(EXIT_USAGE, msg.into())
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, Failure> {
    match humantime::parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(usage(format!(
            "invalid duration '{s}' for --duration: must be more than zero"
        ))),
        Err(_) => Err(usage(format!(
            "invalid duration '{s}' for --duration: expected e.g. 30s, 500ms, 2m"
        ))),
    }
}

/// `--event` values: `cpu`, `offcpu`, `wall`, `alloc`, `heap`, comma-separated or repeated.
fn parse_events(values: &[String]) -> Result<EventSet, Failure> {
    EventSet::parse(values.iter().flat_map(|v| v.split(','))).map_err(|e| match e {
        EventError::Unknown(other) => usage(format!(
            "invalid --event {other:?}: expected cpu, offcpu, wall, alloc or heap"
        )),
        EventError::Mixed => usage(
            "--event alloc and heap make a memory profile: they do not combine with cpu, offcpu \
             or wall (run two sessions)",
        ),
        EventError::Empty => usage("--event needs cpu, offcpu, wall, alloc or heap"),
    })
}

/// What `profile`'s flags ask to sample, and how, checked.
pub(crate) fn sampling_options(args: &ProfileArgs) -> Result<collect::Options, Failure> {
    let unwind = Unwind::from_name(&args.unwind, args.stack_copy).ok_or_else(|| {
        usage(format!(
            "invalid --unwind {}: expected dwarf or fp",
            args.unwind
        ))
    })?;
    let events = parse_events(&args.event)?;
    // An option of an event not asked for would be ignored: say so instead.
    if args.alloc_rate.is_some() && !events.in_bytes() {
        return Err(usage("--alloc-rate needs --event alloc or heap"));
    }
    if args.python_allocators && !events.in_bytes() {
        return Err(usage("--python-allocators needs --event alloc or heap"));
    }
    if args.offcpu_min.is_some() && !events.off_cpu() {
        return Err(usage("--offcpu-min needs --event offcpu or wall"));
    }
    let defaults = collect::Options::default();
    let options = collect::Options {
        frequency: args.frequency,
        events,
        alloc_rate: args.alloc_rate.unwrap_or(defaults.alloc_rate),
        python_allocators: args.python_allocators,
        offcpu_min: match &args.offcpu_min {
            Some(d) => parse_duration(d)?,
            None => defaults.offcpu_min,
        },
        ring_buffer_size: args.ring_buffer_size,
        unwind,
        spans: !args.no_spans,
        follow_children: args.children,
        ..defaults
    };
    options.validate(10_000).map_err(|e| {
        usage(match e {
            Invalid::Frequency => format!(
                "invalid frequency {} for --frequency: expected 1 to 10000 Hz",
                args.frequency
            ),
            Invalid::RingBufferSize => format!(
                "invalid --ring-buffer-size {}: must be a power of two of at least 4096",
                args.ring_buffer_size
            ),
            Invalid::StackCopy => format!(
                "invalid --stack-copy {}: expected 8 to {} bytes",
                args.stack_copy,
                profiler_common::MAX_STACK_COPY
            ),
            Invalid::RingTooSmallForCopy { record, needed } => format!(
                "--ring-buffer-size {} is too small for --unwind dwarf with --stack-copy {}: \
                 give at least {needed} bytes (8 records of up to {record} bytes)",
                args.ring_buffer_size, args.stack_copy,
            ),
            Invalid::AllocRate => {
                "invalid --alloc-rate 0: expected 1 (every allocation) or more bytes".to_string()
            }
        })
    })?;
    Ok(options)
}

pub(crate) fn parse_pids(s: &str) -> Result<Vec<u32>, Failure> {
    let pids: Result<Vec<u32>, _> = s
        .split(',')
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| usage(format!("invalid pid '{}' in --pid", p.trim())))
        })
        .collect();
    let mut pids = pids?;
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// The format of each output: `--format` for all, else from each extension.
pub(crate) fn output_formats(
    outputs: &[PathBuf],
    format: Option<&str>,
) -> Result<Vec<Format>, Failure> {
    let forced = match format {
        Some(name) => Some(Format::from_name(name).ok_or_else(|| {
            usage(format!(
                "unknown output format '{name}': use svg, folded, pprof, speedscope or otlp"
            ))
        })?),
        None => None,
    };
    outputs
        .iter()
        .map(|path| {
            forced.or_else(|| Format::from_path(path)).ok_or_else(|| {
                usage(format!(
                    "unknown output format for '{}': use a .svg, .folded, .pb.gz, \
                     .speedscope.json or .otlp name, or --format svg|folded|pprof|speedscope|otlp",
                    path.display()
                ))
            })
        })
        .collect()
}

pub(crate) fn parse_group_by(name: Option<&str>) -> Result<Option<GroupBy>, Failure> {
    name.map(|name| {
        GroupBy::from_name(name).ok_or_else(|| {
            usage(format!(
                "invalid --group-by '{name}': expected span, span-name or thread"
            ))
        })
    })
    .transpose()
}

/// The OTLP exporter asked for with `--otlp-endpoint`: the environment's settings, then the flags.
pub(crate) fn otlp_config(args: &ProfileArgs) -> Result<Option<ExporterConfig>, Failure> {
    let Some(endpoint) = &args.otlp_endpoint else {
        if args.otlp_protocol.is_some() || !args.otlp_headers.is_empty() {
            return Err(usage(
                "--otlp-protocol and --otlp-header need --otlp-endpoint",
            ));
        }
        return Ok(None);
    };
    let mut config = ExporterConfig::from_env().map_err(usage)?;
    if let Some(p) = &args.otlp_protocol {
        config.set_protocol(Protocol::from_name(p).map_err(usage)?);
    }
    config.set_endpoint(endpoint).map_err(usage)?;
    for h in &args.otlp_headers {
        match h.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                config.headers.push((k.trim().to_string(), v.to_string()))
            }
            _ => {
                return Err(usage(format!(
                    "invalid --otlp-header {h:?}: expected KEY=VALUE"
                )))
            }
        }
    }
    Ok(Some(config))
}

/// Parses an id option with `parse`, or fails as a usage error naming the expected form.
fn parse_id<T>(
    value: Option<&str>,
    flag: &str,
    expected: &str,
    parse: fn(&str) -> Option<T>,
) -> Result<Option<T>, Failure> {
    value
        .map(|v| {
            parse(v).ok_or_else(|| usage(format!("invalid {flag} '{v}': expected {expected}")))
        })
        .transpose()
}

impl FilterArgs {
    pub(crate) fn parse(&self) -> Result<Filter, Failure> {
        const UUID: &str = "a UUID (8-4-4-4-12 hex digits)";
        let event = self
            .event
            .as_deref()
            .map(|e| {
                filter::EventFilter::from_name(e.trim()).ok_or_else(|| {
                    usage(format!(
                        "invalid --event '{e}': expected cpu, offcpu, alloc or heap"
                    ))
                })
            })
            .transpose()?;
        Ok(Filter {
            event,
            threads: self.thread.clone(),
            span_names: self
                .span
                .iter()
                .map(|n| spanprof_analysis::Pattern::new(n))
                .collect(),
            trace_id: parse_id(
                self.trace_id.as_deref(),
                "--trace-id",
                "32 hex digits",
                spanprof_profile::profile::parse_hex,
            )?,
            span_id: parse_id(
                self.span_id.as_deref(),
                "--span-id",
                "16 hex digits",
                spanprof_profile::profile::parse_hex,
            )?,
            base_id: parse_id(
                self.base_id.as_deref(),
                "--base-id",
                UUID,
                spanprof_profile::profile::parse_uuid,
            )?,
            osprofiler_id: parse_id(
                self.osprofiler_id.as_deref(),
                "--osprofiler-id",
                UUID,
                spanprof_profile::profile::parse_uuid,
            )?,
        })
    }
}

pub(crate) fn fail(e: anyhow::Error) -> Failure {
    // A command that cannot be executed exits as a shell would have it (127 / 126).
    let code = e
        .downcast_ref::<CannotRun>()
        .map_or(EXIT_FAILURE, CannotRun::exit_code);
    // One line: the chain joined with ": ".
    Failure(code, format!("{e:#}"))
}
