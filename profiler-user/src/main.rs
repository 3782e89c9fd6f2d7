//! The `spanprof` command line.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use spanprof::aggregate;
use spanprof::collect::{self, EventError, EventSet, Invalid, Unwind};
use spanprof::command::CannotRun;
use spanprof::export::{ExporterConfig, Protocol};
use spanprof::filter::{self, Filter};
use spanprof::format::{self, Format};
use spanprof::profile::{GroupBy, Profile};
use spanprof::session::{self, Ending, Options, Target};
use spanprof::write::PendingOutput;
use spanprof::{stats, summary};

/// Exit status for bad command-line input.
const EXIT_USAGE: u8 = 2;
/// Exit status for a failed session.
const EXIT_FAILURE: u8 = 1;
/// Largest profile file `report`, `diff` and `check` read.
const MAX_INPUT_BYTES: u64 = 1 << 30;
/// Exit status of `check` and `diff` when a budget is exceeded or a function regressed.
const EXIT_BUDGET: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "spanprof",
    version,
    about = "Low-overhead eBPF sampling profiler with trace correlation"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
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
    /// Profile the host (or selected processes) continuously, exporting OTLP profiles.
    Daemon(DaemonArgs),
    /// Check that profiling works here: calibrated workloads (or a target) profiled and
    /// compared with their truth, with every figure; exit 1 when a check fails.
    Verify(VerifyArgs),
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
struct VerifyArgs {
    /// Check these running processes instead of the built-in workloads.
    #[arg(short, long, value_name = "PID[,PID…]", conflicts_with = "command")]
    pid: Option<String>,
    /// How long a --pid target is profiled.
    #[arg(short, long, value_name = "DURATION", default_value = "10s")]
    duration: String,
    /// Samples per second on each CPU.
    #[arg(short = 'F', long, default_value_t = 499)]
    frequency: u64,
    /// The Python of the Python workloads (default: python3 on PATH).
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Also send the profile to this OTLP collector and check its answer.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (default from OTEL_EXPORTER_OTLP_PROTOCOL, else grpc).
    #[arg(long, value_name = "PROTOCOL")]
    otlp_protocol: Option<String>,
    /// Command to run and check, after `--`.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  spanprof daemon --config /etc/spanprof/spanprof.toml\n  \
                  OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317 spanprof daemon\n\n\
                  Signals: SIGTERM flushes the current window and exits; SIGHUP reloads the \
                  configuration. Metrics on http://127.0.0.1:9464/metrics by default."
)]
struct DaemonArgs {
    /// Configuration file (TOML); without one: every process, cpu at 19 Hz, 60 s windows,
    /// exported as the OTEL_EXPORTER_OTLP_* variables say.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  spanprof profile --pid 1234 --duration 30s -o flame.svg\n  \
                  spanprof profile -o run.pb.gz -o run.svg -- ./bench --fast\n\n\
                  Formats (from the extension, or --format for every output): .svg flame graph, \
                  .folded stacks, .pb.gz pprof, .speedscope.json, .otlp OTLP profiles.\n\
                  Exit status: the command's in `-- CMD` mode; 2 for bad arguments; 1 for other errors."
)]
struct ProfileArgs {
    /// Processes to profile, comma-separated.
    #[arg(short, long, value_name = "PID[,PID…]", conflicts_with = "command")]
    pid: Option<String>,
    /// How long to profile (e.g. 30s, 500ms, 2m). Default: until the targets exit or Ctrl-C.
    #[arg(short, long, value_name = "DURATION")]
    duration: Option<String>,
    /// What to sample, comma-separated or repeated: `cpu` (on-CPU stacks), `offcpu` (time
    /// blocked, with its reason: sleep, lock, io, gil, other), `wall` (both, as wall-clock time);
    /// or memory: `alloc` (sampled allocations), `heap` (those not freed at the end).
    #[arg(short, long, value_name = "EVENT[,EVENT…]", default_value = "cpu")]
    event: Vec<String>,
    // NB: these two defaults are applied in code (giving the flag without alloc, heap, offcpu
    // or wall is an error), so the help text states them the way clap states its own; the
    // documentation check (`cargo xtask docs`) reads `[default: …]` from this help.
    #[arg(long, value_name = "BYTES", help = format!(
        "With alloc or heap: bytes allocated between two samples on average (1: every \
         allocation) [default: {}]",
        spanprof::profile::DEFAULT_ALLOC_RATE
    ))]
    alloc_rate: Option<u64>,
    #[arg(long, value_name = "DURATION", help = format!(
        "With offcpu or wall: blocked intervals shorter than this are not counted \
         [default: {}]",
        spanprof::offcpu::DEFAULT_MIN
    ))]
    offcpu_min: Option<String>,
    /// Samples per second on each CPU; off-CPU intervals are sampled at the same rate of time
    /// (an interval of 1/HZ or more is always kept).
    #[arg(short = 'F', long, default_value_t = collect::options::DEFAULT_FREQUENCY, value_name = "HZ")]
    frequency: u64,
    /// Output file; repeat for several formats of the same profile.
    #[arg(short, long = "output", value_name = "FILE")]
    output: Vec<PathBuf>,
    /// Format of every output (svg, folded, pprof, speedscope, otlp), instead of the extension.
    #[arg(long, value_name = "FORMAT")]
    format: Option<String>,
    /// Drop kernel frames.
    #[arg(long)]
    no_kernel: bool,
    /// One frame per Python function instead of one per line: `f (app.py)`.
    #[arg(long)]
    no_lines: bool,
    /// Keep only Python frames (native and kernel frames are dropped).
    #[arg(long)]
    python_only: bool,
    /// Do not read span contexts (OpenTelemetry, OSProfiler) of Python threads.
    #[arg(long)]
    no_spans: bool,
    /// With --pid, also profile processes the targets start (always on for a command).
    #[arg(long)]
    children: bool,
    /// Size of the kernel-to-user sample ring buffer in bytes (a power of two, ≥ 4096).
    #[arg(long, default_value_t = collect::options::DEFAULT_RING_BUFFER_BYTES, value_name = "BYTES")]
    ring_buffer_size: u32,
    /// How native user stacks are unwound: `dwarf` (the kernel copies the stack, spanprof
    /// unwinds it with the modules' .eh_frame, frame pointers where a module has none) or `fp`
    /// (the kernel follows frame pointers: cheaper, but cut short in code built without them).
    #[arg(long, default_value = "dwarf", value_name = "MODE")]
    unwind: String,
    /// With --unwind dwarf: bytes of user stack copied per sample (8 to 32768).
    #[arg(long, default_value_t = collect::options::DEFAULT_STACK_COPY, value_name = "BYTES")]
    stack_copy: u32,
    /// Write per-process statistics (how many stacks were complete, truncated or failed, and
    /// why) as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
    #[command(flatten)]
    privacy: PrivacyArgs,
    /// Put every sample under a root frame named after its span (`span`) or its thread
    /// (`thread`: `[thread NAME]`, the Python thread name where there is one).
    #[arg(long, value_name = "GROUP")]
    group_by: Option<String>,
    /// No progress bar or progress lines.
    #[arg(long)]
    quiet: bool,
    /// Send the profile to this OTLP collector at the end of the session (e.g.
    /// http://localhost:4317); the OTEL_EXPORTER_OTLP_[PROFILES_]* variables give the rest.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// OTLP protocol: grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_[PROFILES_]PROTOCOL,
    /// else grpc).
    #[arg(long, value_name = "PROTOCOL")]
    otlp_protocol: Option<String>,
    /// An extra OTLP request header, KEY=VALUE (repeatable; added to
    /// OTEL_EXPORTER_OTLP_[PROFILES_]HEADERS).
    #[arg(long = "otlp-header", value_name = "KEY=VALUE")]
    otlp_headers: Vec<String>,
    /// Command to run and profile, after `--`.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// The sample filters `report`, `diff` and `check` share; a sample must match them all.
#[derive(Debug, clap::Args)]
struct FilterArgs {
    /// Keep one measure: `cpu` or `offcpu` (of a `cpu,offcpu` or `wall` profile), `alloc` or
    /// `heap` (of an `alloc,heap` profile).
    #[arg(long, value_name = "EVENT")]
    event: Option<String>,
    /// Keep samples of this thread (its name or id); repeat for several.
    #[arg(long, value_name = "NAME|TID")]
    thread: Vec<String>,
    /// Keep samples of this OpenTelemetry trace (32 hex digits).
    #[arg(long, value_name = "HEX")]
    trace_id: Option<String>,
    /// Keep samples of this OpenTelemetry span (16 hex digits).
    #[arg(long, value_name = "HEX")]
    span_id: Option<String>,
    /// Keep samples of this OSProfiler trace (its base id, a UUID).
    #[arg(long, value_name = "UUID")]
    base_id: Option<String>,
    /// Keep samples taken in this OSProfiler trace point (its own id, not a parent's).
    #[arg(long, value_name = "UUID")]
    osprofiler_id: Option<String>,
    /// Keep samples in spans (OpenTelemetry) or trace points (OSProfiler) of this name, a glob
    /// (`GET /servers*`); repeat for several.
    #[arg(long = "span", value_name = "NAME")]
    span: Vec<String>,
}

/// What the outputs may not show (see docs/privacy.md).
#[derive(Debug, clap::Args)]
struct PrivacyArgs {
    /// Reduce every file path in the outputs (modules, source files, the executable, the
    /// target's command line) to its base name: `--redact-paths` or `--redact-paths=basename`;
    /// `--redact-paths=hash` keeps the base name behind a hash of the directory
    /// (`<3f2a9c1b>/libc.so.6`).
    #[arg(long, value_name = "MODE", num_args = 0..=1, require_equals = true,
          default_missing_value = "basename")]
    redact_paths: Option<String>,
    /// Leave a sample label or resource attribute out of the pprof and OTLP outputs, e.g.
    /// thread.name, span.name, process.command_line, host.name; repeat for several.
    #[arg(long = "drop-label", value_name = "KEY")]
    drop_label: Vec<String>,
}

impl PrivacyArgs {
    fn parse(&self) -> Result<spanprof::privacy::Privacy, Failure> {
        use spanprof::privacy::{PathMode, Privacy};
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
struct ReportArgs {
    /// A pprof file written by `spanprof profile` (`.pb.gz`, or not compressed), folded
    /// stacks (`.folded`) or an OTLP profiles request (`.otlp`).
    #[arg(value_name = "PROFILE")]
    profile: PathBuf,
    #[command(flatten)]
    filter: FilterArgs,
    /// Put every sample under a root frame named after its span (`span`) or its thread
    /// (`thread`: `[thread NAME]`, the Python thread name where there is one).
    #[arg(long, value_name = "GROUP")]
    group_by: Option<String>,
    /// Output file; repeat for several formats. `.txt` and `.json` get the table of
    /// functions, the other extensions the profile (see `spanprof profile --help`).
    #[arg(short, long = "output", value_name = "FILE")]
    output: Vec<PathBuf>,
    /// Format of every output, or of standard output: text (the default), json, svg,
    /// folded, pprof, speedscope or otlp.
    #[arg(long, value_name = "FORMAT")]
    format: Option<String>,
    /// Functions in the table (0: all of them).
    #[arg(long, default_value_t = 20, value_name = "N")]
    top: usize,
    #[command(flatten)]
    privacy: PrivacyArgs,
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
struct DiffArgs {
    /// The baseline profile (a pprof file written by `spanprof profile`).
    #[arg(value_name = "BASE")]
    base: PathBuf,
    /// The profile to compare with it.
    #[arg(value_name = "NEW")]
    new: PathBuf,
    #[command(flatten)]
    filter: FilterArgs,
    /// Output file: `.svg` a differential flame graph (red: grew, blue: shrank), `.txt` or
    /// `.json` the comparison; repeat for several.
    #[arg(short, long = "output", value_name = "FILE")]
    output: Vec<PathBuf>,
    /// Format of the comparison on standard output: text (the default) or json.
    #[arg(long, value_name = "FORMAT")]
    format: Option<String>,
    /// Functions listed as grown and as shrunk (0: all of them).
    #[arg(long, default_value_t = 10, value_name = "N")]
    top: usize,
    /// Exit 3 when a function's share grew by more than this many points of the total
    /// (e.g. 5%).
    #[arg(long, value_name = "PERCENT")]
    fail_on_regression: Option<String>,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
                  spanprof check run.pb.gz --max 'json_*=20%' --max-self 'memcpy*=5%'\n  \
                  spanprof check run.pb.gz --span-max 'GET /servers*=30ms'\n\n\
                  Patterns are globs (* and ?) matched against whole function names, or the \
                  name before its ` (` (a Python function: `handle` matches `handle (app.py)`). \
                  Exit status: 3 when a budget is exceeded; 2 for bad arguments; 1 for other \
                  errors.")]
struct CheckArgs {
    /// A pprof file written by `spanprof profile`, folded stacks (`.folded`) or an OTLP
    /// profiles request (`.otlp`).
    #[arg(value_name = "PROFILE")]
    profile: PathBuf,
    #[command(flatten)]
    filter: FilterArgs,
    /// PATTERN=PERCENT%: the samples with a matching function anywhere in the stack may be at
    /// most this share of the total; repeat for several.
    #[arg(long = "max", value_name = "PATTERN=PERCENT%")]
    max: Vec<String>,
    /// PATTERN=PERCENT%: the samples whose innermost function matches (self time) may be at
    /// most this share.
    #[arg(long = "max-self", value_name = "PATTERN=PERCENT%")]
    max_self: Vec<String>,
    /// NAME=DURATION: spans of this name (a glob; OpenTelemetry span or OSProfiler trace point)
    /// may take at most this long on average, as their samples show (e.g. 'GET /servers=30ms').
    #[arg(long = "span-max", value_name = "NAME=DURATION")]
    span_max: Vec<String>,
}

/// A one-line error and the exit status it gets.
struct Failure(u8, String);

fn usage(msg: impl Into<String>) -> Failure {
    Failure(EXIT_USAGE, msg.into())
}

fn parse_duration(s: &str) -> Result<Duration, Failure> {
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
fn sampling_options(args: &ProfileArgs) -> Result<collect::Options, Failure> {
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
    if args.offcpu_min.is_some() && !events.off_cpu() {
        return Err(usage("--offcpu-min needs --event offcpu or wall"));
    }
    let defaults = collect::Options::default();
    let options = collect::Options {
        frequency: args.frequency,
        events,
        alloc_rate: args.alloc_rate.unwrap_or(defaults.alloc_rate),
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

fn parse_pids(s: &str) -> Result<Vec<u32>, Failure> {
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
fn output_formats(outputs: &[PathBuf], format: Option<&str>) -> Result<Vec<Format>, Failure> {
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

fn parse_group_by(name: Option<&str>) -> Result<Option<GroupBy>, Failure> {
    name.map(|name| {
        GroupBy::from_name(name).ok_or_else(|| {
            usage(format!(
                "invalid --group-by '{name}': expected span or thread"
            ))
        })
    })
    .transpose()
}

/// Renders `profile` (grouped first if asked) into each pending output, printing `wrote …` or
/// the error per output; returns [`EXIT_FAILURE`] when one could not be written.
fn write_outputs(
    profile: &Profile,
    group: Option<GroupBy>,
    outputs: Vec<(PendingOutput, Format)>,
) -> u8 {
    let grouped = group.map(|g| profile.grouped(g));
    let profile = grouped.as_ref().unwrap_or(profile);
    commit_outputs(outputs, |format| Ok(format::render(profile, format)?))
}

fn profile(args: ProfileArgs) -> Result<u8, Failure> {
    let target = match (&args.pid, args.command.is_empty()) {
        (Some(p), true) => Target::Pids(parse_pids(p)?),
        (None, false) => Target::Command(args.command.clone()),
        (None, true) => return Err(usage("nothing to profile: give --pid PID or -- CMD ARGS…")),
        (Some(_), false) => return Err(usage("give either --pid or a command, not both")),
    };
    let duration = args.duration.as_deref().map(parse_duration).transpose()?;
    let sampling = sampling_options(&args)?;
    let formats = output_formats(&args.output, args.format.as_deref())?;
    let group = parse_group_by(args.group_by.as_deref())?;
    let exporter = otlp_config(&args)?;
    let privacy = args.privacy.parse()?;
    // From here on, Ctrl-C ends the session cleanly (and the temporary files are removed).
    collect::signals::install_session_handlers();
    // Create the (temporary) outputs before profiling, so an unwritable path fails in a moment
    // rather than after a 30 s session.
    let pending = pending_outputs(&args.output)?;
    let stats_out = args
        .stats
        .as_deref()
        .map(PendingOutput::create)
        .transpose()
        .map_err(fail)?;

    let stack_copy_bytes = sampling.unwind.stack_copy_bytes();
    let opts = Options {
        target,
        duration,
        aggregate: aggregate::Options {
            kernel: !args.no_kernel,
            lines: !args.no_lines,
            python_only: args.python_only,
            timestamps: exporter.is_some() || formats.contains(&Format::Otlp),
            ..aggregate::Options::default()
        },
        sampling,
        progress: !args.quiet,
        redact_paths: privacy.redact_paths,
    };
    let mut outcome = session::run(&opts).map_err(fail)?;
    // Before anything is printed or written: the summary shows no more than the files.
    privacy.apply(&mut outcome.profile);
    let profile = &outcome.profile;
    match &outcome.ending {
        Ending::Duration | Ending::CommandExited | Ending::TargetsExited(_) => {}
        Ending::Interrupted => eprintln!("spanprof: interrupted; writing what was gathered"),
    }
    for (pid, after) in &outcome.exited {
        eprintln!(
            "spanprof: process {pid} exited after {:.1} s",
            after.as_secs_f64()
        );
    }
    if let Ending::TargetsExited(_) = outcome.ending {
        eprintln!(
            "spanprof: every target exited; writing the {}{} gathered",
            summary::amount(profile, summary::total_weight(profile)),
            match summary::unit_suffix(profile) {
                "" => "",
                _ => " samples",
            }
        );
    }
    if outcome.symbolizer.process_gone > 0 {
        eprintln!(
            "spanprof: {} addresses could not be symbolized: their process exited first, or its \
             memory map was unreadable (see the [unknown] frames)",
            outcome.symbolizer.process_gone
        );
    }

    if !outcome.stack_copy.raised.is_empty() {
        let pids: Vec<String> = outcome
            .stack_copy
            .raised
            .iter()
            .take(10)
            .map(u32::to_string)
            .collect();
        eprintln!(
            "spanprof: {} bytes of stack cut short the stacks of {} process{} ({}{}): \
             {} bytes were copied from then on",
            outcome.stack_copy.default,
            outcome.stack_copy.raised.len(),
            if outcome.stack_copy.raised.len() == 1 {
                ""
            } else {
                "es"
            },
            pids.join(", "),
            if outcome.stack_copy.raised.len() > 10 {
                ", …"
            } else {
                ""
            },
            profiler_common::MAX_STACK_COPY
        );
    }
    if outcome.unwind.modules_rejected > 0 {
        eprintln!(
            "spanprof: {} module files have unwind tables with a DWARF expression that could loop: \
             their frames were unwound by frame pointer",
            outcome.unwind.modules_rejected
        );
    }
    if outcome.unwind.modules_unreadable > 0 {
        eprintln!(
            "spanprof: {} module files could not be read for their unwind tables: their frames \
             were unwound by frame pointer{}",
            outcome.unwind.modules_unreadable,
            spanprof::preflight::file_access_hint()
                .map_or(String::new(), |hint| format!(" ({hint})"))
        );
    }
    eprint!("{}", summary::render(profile, &outcome.errors));
    if let Some(line) = outcome
        .off_cpu_unseen
        .and_then(|u| u.line(profile.meta.events.wall))
    {
        eprintln!("{line}");
    }
    let mut status = write_outputs(profile, group, pending.into_iter().zip(formats).collect());
    if let Some(config) = exporter {
        let grouped = group.map(|g| profile.grouped(g));
        if !send_otlp(grouped.as_ref().unwrap_or(profile), config) {
            status = EXIT_FAILURE;
        }
    }
    if let Some(out) = stats_out {
        let dest = out.dest().display().to_string();
        match out.commit(stats::to_json(profile, stack_copy_bytes).as_bytes()) {
            Ok(()) => eprintln!("wrote {dest} (stats)"),
            Err(e) => {
                eprintln!("error: cannot write stats {dest}: {e:#}");
                status = EXIT_FAILURE;
            }
        }
    }
    let overhead = &outcome.overhead;
    let after = session::process_cpu_time().saturating_sub(overhead.cpu_at_end_of_sampling);
    eprintln!("{}", summary::overhead_line(profile, overhead, after));
    eprintln!(
        "{}",
        summary::Cost::of(profile, overhead).line(&profile.meta.events)
    );
    // The outputs are on disk before spanprof waits for a command that outlives the session.
    if let Some(cmd_status) = outcome.wait_command().map_err(fail)? {
        // A failed command's own status says more than ours.
        let code = u8::try_from(session::exit_code(cmd_status)).unwrap_or(EXIT_FAILURE);
        if code != 0 || status == 0 {
            status = code;
        }
    }
    Ok(status)
}

/// The OTLP exporter asked for with `--otlp-endpoint`: the environment's settings, then the flags.
fn otlp_config(args: &ProfileArgs) -> Result<Option<ExporterConfig>, Failure> {
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

fn verify(args: VerifyArgs) -> Result<u8, Failure> {
    let target = match (&args.pid, args.command.is_empty()) {
        (Some(p), _) => Some(Target::Pids(parse_pids(p)?)),
        (None, false) => Some(Target::Command(args.command.clone())),
        (None, true) => None,
    };
    let duration = parse_duration(&args.duration)?;
    // Every check's session follows the children of its workload.
    let sampling = collect::Options {
        frequency: args.frequency,
        follow_children: true,
        ..collect::Options::default()
    };
    if sampling.validate(10_000).is_err() {
        return Err(usage(format!(
            "invalid --frequency {}: expected 1 to 10000",
            args.frequency
        )));
    }
    let exporter = match &args.otlp_endpoint {
        None => None,
        Some(endpoint) => {
            let mut config = ExporterConfig::from_env().map_err(usage)?;
            if let Some(p) = &args.otlp_protocol {
                config.set_protocol(Protocol::from_name(p).map_err(usage)?);
            }
            config.set_endpoint(endpoint).map_err(usage)?;
            Some(config)
        }
    };
    collect::signals::install_session_handlers();
    let opts = spanprof::verify::VerifyOptions {
        target,
        duration,
        sampling,
        python: args.python,
        exporter,
    };
    eprintln!("spanprof verify: profiling calibrated workloads (a few seconds each)");
    let checks = spanprof::verify::run(&opts);
    write_stdout(spanprof::verify::table(&checks).as_bytes())?;
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.status == spanprof::verify::Status::Fail)
        .map(|c| c.name.as_str())
        .collect();
    if failed.is_empty() {
        Ok(0)
    } else {
        eprintln!("spanprof verify: failed: {}", failed.join(", "));
        Ok(EXIT_FAILURE)
    }
}

/// Sends the profile to the collector; prints what happened and returns whether it was taken.
fn send_otlp(profile: &Profile, config: ExporterConfig) -> bool {
    let endpoint = config.endpoint.clone();
    let protocol = config.protocol.name();
    let request = spanprof::format::otlp::request(profile);
    let profiles = spanprof::format::otlp::profile_count(&request);
    let result = spanprof::export::export_once(config, &request);
    match result {
        Ok(accepted) if accepted.rejected_profiles > 0 => {
            eprintln!(
                "error: {endpoint} ({protocol}) rejected {} of {profiles} profiles: {}",
                accepted.rejected_profiles, accepted.message
            );
            false
        }
        Ok(accepted) => {
            eprintln!(
                "sent {profiles} profiles of {} processes to {endpoint} ({protocol}){}",
                request.resource_profiles.len(),
                if accepted.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", accepted.message)
                }
            );
            true
        }
        Err(e) => {
            eprintln!("error: cannot send the profile to {endpoint} ({protocol}): {e}");
            false
        }
    }
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
    fn parse(&self) -> Result<Filter, Failure> {
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
                .map(|n| spanprof::analysis::Pattern::new(n))
                .collect(),
            trace_id: parse_id(
                self.trace_id.as_deref(),
                "--trace-id",
                "32 hex digits",
                spanprof::profile::parse_hex,
            )?,
            span_id: parse_id(
                self.span_id.as_deref(),
                "--span-id",
                "16 hex digits",
                spanprof::profile::parse_hex,
            )?,
            base_id: parse_id(
                self.base_id.as_deref(),
                "--base-id",
                UUID,
                spanprof::profile::parse_uuid,
            )?,
            osprofiler_id: parse_id(
                self.osprofiler_id.as_deref(),
                "--osprofiler-id",
                UUID,
                spanprof::profile::parse_uuid,
            )?,
        })
    }
}

/// Reads a profile spanprof wrote; one line on failure.
///
/// Only a regular file of at most [`MAX_INPUT_BYTES`] is read: the file is opened without
/// blocking (a FIFO or a device would otherwise hang the open or be read without end) and its
/// size is checked before any byte is read. Gzip data is decompressed as it is read, up to
/// [`MAX_INPUT_BYTES`] of output, so neither a huge file nor a gzip bomb fills the memory.
fn read_profile(path: &Path) -> Result<Profile, Failure> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let shown = path.display();
    let cannot = |e: std::io::Error| Failure(EXIT_FAILURE, format!("cannot read {shown}: {e}"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if !meta.is_file() {
        return Err(Failure(
            EXIT_FAILURE,
            format!("cannot read {shown}: not a regular file"),
        ));
    }
    let too_large = || {
        Failure(
            EXIT_FAILURE,
            format!("{shown}: larger than {} MiB", MAX_INPUT_BYTES >> 20),
        )
    };
    if meta.len() > MAX_INPUT_BYTES {
        return Err(too_large());
    }
    let mut input = std::io::BufReader::new(file.take(MAX_INPUT_BYTES + 1));
    let gzip = std::io::BufRead::fill_buf(&mut input)
        .map_err(cannot)?
        .starts_with(&[0x1f, 0x8b]);
    let mut bytes = Vec::with_capacity(if gzip { 0 } else { meta.len() as usize });
    let read = if gzip {
        read_capped(flate2::bufread::GzDecoder::new(input), &mut bytes)
    } else {
        input.read_to_end(&mut bytes)
    };
    read.map_err(|e| {
        if gzip {
            // NB: the words the readers use for the same fault, so every path says it alike.
            let what = match Format::from_path(path) {
                Some(Format::Otlp) => "not an OTLP profiles request: ",
                Some(Format::Folded) => "",
                _ => "not a pprof profile: ",
            };
            Failure(EXIT_FAILURE, format!("{shown}: {what}bad gzip data: {e}"))
        } else {
            cannot(e)
        }
    })?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(if gzip {
            Failure(
                EXIT_FAILURE,
                format!(
                    "{shown}: more than {} MiB uncompressed",
                    MAX_INPUT_BYTES >> 20
                ),
            )
        } else {
            too_large()
        });
    }
    let read = match Format::from_path(path) {
        Some(Format::Folded) => spanprof::format::folded::read_folded(&bytes),
        Some(Format::Otlp) => spanprof::format::otlp::read_otlp(&bytes),
        _ => spanprof::format::pprof::read_pprof(&bytes),
    };
    read.map_err(|e| {
        Failure(
            EXIT_FAILURE,
            format!("{shown}: {:#}", anyhow::Error::from(e)),
        )
    })
}

/// Reads `from` into `bytes` up to one byte past [`MAX_INPUT_BYTES`], growing the buffer at
/// most to that size (`read_to_end` would double it past the bound on its last byte).
fn read_capped(mut from: impl std::io::Read, bytes: &mut Vec<u8>) -> std::io::Result<usize> {
    let cap = MAX_INPUT_BYTES as usize + 1;
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = match from.read(&mut chunk) {
            Ok(0) => return Ok(bytes.len()),
            Ok(n) => n.min(cap - bytes.len()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if bytes.capacity() < bytes.len() + n {
            let grow = bytes.len().max(1 << 20).min(cap - bytes.len());
            bytes.reserve_exact(grow.max(n));
        }
        bytes.extend_from_slice(&chunk[..n]);
        if bytes.len() >= cap {
            return Ok(bytes.len());
        }
    }
}

/// A profile read and filtered, with what it had before: its total (e.g. `2696 samples`,
/// `405.5 ms`) and its number of span contexts.
struct Filtered {
    profile: Profile,
    /// The total and what follows it ([`summary::unit_suffix`]).
    before: (String, &'static str),
    spans: usize,
}

/// Reads a profile and applies the filter; fails when the filter leaves nothing.
fn read_filtered(path: &Path, filter: &Filter) -> Result<Filtered, Failure> {
    let mut profile = read_profile(path)?;
    // Weights: samples of an on-CPU profile, nanoseconds once off-CPU time is in it.
    let amount = |p: &Profile, w: u64| (summary::amount(p, w), summary::unit_suffix(p));
    let in_spans: u64 = profile
        .samples
        .iter()
        .filter(|s| s.span.is_some())
        .map(|s| profile.weight(s))
        .sum();
    let (before, in_spans, spans) = (
        amount(&profile, summary::total_weight(&profile)),
        summary::amount(&profile, in_spans),
        profile.spans.len(),
    );
    filter
        .apply(&mut profile)
        .map_err(|e| Failure(EXIT_FAILURE, format!("{}: {e}", path.display())))?;
    if !filter.is_empty() && summary::total_weight(&profile) == 0 {
        return Err(Failure(
            EXIT_FAILURE,
            format!(
                "no samples match {filter}: {} has {}{}, {in_spans} of them in {spans} spans",
                path.display(),
                before.0,
                before.1,
            ),
        ));
    }
    Ok(Filtered {
        profile,
        before,
        spans,
    })
}

/// What `report` and `diff` write: a table, or a profile (`report`) or a differential flame
/// graph (`diff`, as [`Format::Svg`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReportFormat {
    Text,
    Json,
    Profile(Format),
}

impl ReportFormat {
    fn from_name(name: &str) -> Option<ReportFormat> {
        match name.to_ascii_lowercase().as_str() {
            "text" => Some(ReportFormat::Text),
            "json" => Some(ReportFormat::Json),
            other => Format::from_name(other).map(ReportFormat::Profile),
        }
    }

    /// From a file name: `.txt`, `.json` (not `.speedscope.json`), or a profile's extension;
    /// in any case.
    fn from_path(path: &Path) -> Option<ReportFormat> {
        if let Some(f) = Format::from_path(path) {
            return Some(ReportFormat::Profile(f));
        }
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "txt" => Some(ReportFormat::Text),
            "json" => Some(ReportFormat::Json),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ReportFormat::Text => "text",
            ReportFormat::Json => "json",
            ReportFormat::Profile(f) => f.name(),
        }
    }
}

/// Renders and commits each output, printing `wrote FILE (FORMAT)` or the error per output;
/// [`EXIT_FAILURE`] when one could not be written.
fn commit_outputs<F: Copy + std::fmt::Display>(
    outputs: Vec<(PendingOutput, F)>,
    render: impl Fn(F) -> Result<Vec<u8>>,
) -> u8 {
    let mut status = 0;
    for (out, format) in outputs {
        let dest = out.dest().display().to_string();
        match render(format).and_then(|bytes| out.commit(&bytes)) {
            Ok(()) => eprintln!("wrote {dest} ({format})"),
            Err(e) => {
                eprintln!("error: cannot write output {dest}: {e:#}");
                status = EXIT_FAILURE;
            }
        }
    }
    status
}

impl std::fmt::Display for ReportFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The temporary files of `paths`, created now so that an unwritable path fails at once.
fn pending_outputs(paths: &[PathBuf]) -> Result<Vec<PendingOutput>, Failure> {
    paths
        .iter()
        .map(|p| PendingOutput::create(p))
        .collect::<Result<_>>()
        .map_err(fail)
}

fn report(args: ReportArgs) -> Result<u8, Failure> {
    let forced = args
        .format
        .as_deref()
        .map(|name| {
            ReportFormat::from_name(name).ok_or_else(|| {
                usage(format!(
                    "unknown format '{name}': use text, json, svg, folded, pprof, speedscope or otlp"
                ))
            })
        })
        .transpose()?;
    let formats: Vec<ReportFormat> = args
        .output
        .iter()
        .map(|path| {
            forced
                .or_else(|| ReportFormat::from_path(path))
                .ok_or_else(|| {
                    usage(format!(
                    "unknown output format for '{}': use a .txt, .json, .svg, .folded, .pb.gz, \
                     .speedscope.json or .otlp name, or --format",
                    path.display()
                ))
                })
        })
        .collect::<Result<_, _>>()?;
    let to_stdout = args.output.is_empty();
    let stdout_format = forced.unwrap_or(ReportFormat::Text);
    if to_stdout
        && matches!(
            stdout_format,
            ReportFormat::Profile(Format::Pprof | Format::Otlp)
        )
        && std::io::stdout().is_terminal()
    {
        return Err(usage(
            "a binary profile is not written to a terminal: give -o FILE or redirect the output",
        ));
    }
    let group = parse_group_by(args.group_by.as_deref())?;
    let filter = args.filter.parse()?;
    let privacy = args.privacy.parse()?;
    let mut read = read_filtered(&args.profile, &filter)?;
    privacy.apply(&mut read.profile);
    let profile = &read.profile;
    let grouped = group.map(|g| profile.grouped(g));
    let shown = grouped.as_ref().unwrap_or(profile);
    let functions = spanprof::analysis::Functions::of(shown);
    // A memory profile has no span times.
    let named = span_times(shown).unwrap_or_default();
    let render = |format: ReportFormat| -> Result<Vec<u8>> {
        Ok(match format {
            ReportFormat::Text => {
                spanprof::analysis::report_text(shown, &functions, &named, args.top).into_bytes()
            }
            ReportFormat::Json => {
                spanprof::analysis::report_json(shown, &functions, &named, args.top).into_bytes()
            }
            ReportFormat::Profile(f) => format::render(shown, f)?,
        })
    };
    let line = report_line(profile, &filter, &args.profile, &read.before, read.spans);
    if to_stdout {
        if !filter.is_empty() {
            eprintln!("{line}");
        }
        let bytes = render(stdout_format).map_err(fail)?;
        return write_stdout(&bytes);
    }
    let pending = pending_outputs(&args.output)?;
    eprintln!("{line}");
    if let Some(line) = summary::spans_line(profile) {
        eprintln!("{line}");
    }
    Ok(commit_outputs(
        pending.into_iter().zip(formats).collect(),
        render,
    ))
}

/// The sampled time of each span name of `profile` ([`spanprof::analysis::span_times`]).
fn span_times(profile: &Profile) -> Result<Vec<spanprof::analysis::SpanTime>, String> {
    spanprof::analysis::span_times(profile, spanprof::analysis::span_name_and_id)
}

/// Writes `bytes` to standard output; a closed pipe (`| head`) is not an error.
fn write_stdout(bytes: &[u8]) -> Result<u8, Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(0),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(Failure(
            EXIT_FAILURE,
            format!("cannot write the report: {e}"),
        )),
    }
}

fn diff(args: DiffArgs) -> Result<u8, Failure> {
    use spanprof::analysis::{self, Diff};
    let threshold = args
        .fail_on_regression
        .as_deref()
        .map(|t| {
            analysis::parse_percent(t).ok_or_else(|| {
                usage(format!(
                    "invalid --fail-on-regression '{t}': expected points of the total with a %, \
                     e.g. 5%"
                ))
            })
        })
        .transpose()?;
    let json_stdout = match args.format.as_deref().map(ReportFormat::from_name) {
        None | Some(Some(ReportFormat::Text)) => false,
        Some(Some(ReportFormat::Json)) => true,
        _ => {
            return Err(usage(format!(
                "unknown format '{}' for diff: use text or json",
                args.format.as_deref().unwrap_or_default()
            )))
        }
    };
    let outs: Vec<ReportFormat> = args
        .output
        .iter()
        .map(|p| match ReportFormat::from_path(p) {
            Some(
                f @ (ReportFormat::Text | ReportFormat::Json | ReportFormat::Profile(Format::Svg)),
            ) => Ok(f),
            _ => Err(usage(format!(
                "unknown output format for '{}': diff writes .svg (a differential flame graph), \
                 .txt or .json",
                p.display()
            ))),
        })
        .collect::<Result<_, _>>()?;
    let filter = args.filter.parse()?;
    let base = read_filtered(&args.base, &filter)?.profile;
    let new = read_filtered(&args.new, &filter)?.profile;
    let d = Diff::of(&base, &new).map_err(|e| Failure(EXIT_FAILURE, e))?;
    let (base_name, new_name) = (
        args.base.display().to_string(),
        args.new.display().to_string(),
    );
    let text = analysis::diff_text((&base, &base_name), (&new, &new_name), &d, args.top);
    let json = analysis::diff_json(&base, &new, &d, args.top, threshold);
    let pending = pending_outputs(&args.output)?;
    let written = commit_outputs(pending.into_iter().zip(outs).collect(), |f| match f {
        ReportFormat::Json => Ok(json.clone().into_bytes()),
        ReportFormat::Profile(_) => Ok(format::svg::render_diff(
            &base, &new, &base_name, &new_name,
        )?),
        ReportFormat::Text => Ok(text.clone().into_bytes()),
    });
    let printed = write_stdout(if json_stdout {
        json.as_bytes()
    } else {
        text.as_bytes()
    })?;
    // An output not written is an error before any verdict.
    if written != 0 || printed != 0 {
        return Ok(EXIT_FAILURE);
    }
    let Some(threshold) = threshold else {
        return Ok(0);
    };
    let (verdict, failed) = analysis::verdict(&d, threshold);
    eprint!("{verdict}");
    Ok(if failed { EXIT_BUDGET } else { 0 })
}

fn check(args: CheckArgs) -> Result<u8, Failure> {
    use spanprof::analysis::{self, Budget, Functions, ShareKind};
    let mut budgets = Vec::new();
    for (values, kind) in [
        (&args.max, ShareKind::Total),
        (&args.max_self, ShareKind::Self_),
    ] {
        for v in values {
            budgets.push(Budget::parse(v, kind).map_err(usage)?);
        }
    }
    let span_budgets: Vec<analysis::SpanBudget> = args
        .span_max
        .iter()
        .map(|v| analysis::SpanBudget::parse(v).map_err(usage))
        .collect::<Result<_, _>>()?;
    if budgets.is_empty() && span_budgets.is_empty() {
        return Err(usage(
            "nothing to check: give --max, --max-self or --span-max",
        ));
    }
    let filter = args.filter.parse()?;
    let profile = read_filtered(&args.profile, &filter)?.profile;
    let functions = Functions::of(&profile);
    if functions.total == 0 {
        return Err(Failure(
            EXIT_FAILURE,
            format!(
                "{} has no samples: nothing to check",
                args.profile.display()
            ),
        ));
    }
    let mut out = format!(
        "spanprof check: {}: {}\n",
        args.profile.display(),
        analysis::run_line(&profile)
    );
    let mut crossed = 0;
    for b in &budgets {
        let r = analysis::measure(&profile, &functions, b);
        let matched = if r.matched == 0 {
            eprintln!(
                "spanprof check: warning: {} matches no function of {}",
                b.option(),
                args.profile.display()
            );
            "matches no function".to_string()
        } else {
            let more = r.matched.saturating_sub(r.functions.len());
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("{}{more}", r.functions.join(", "))
        };
        let kind = match b.kind {
            ShareKind::Total => "with callees",
            ShareKind::Self_ => "self",
        };
        let (share, max) = (
            analysis::percent_text(r.share),
            analysis::percent_text(b.max),
        );
        if r.crossed() {
            crossed += 1;
            out.push_str(&format!(
                "  OVER  {}: {share}% ({kind}), budget {max}%, {} points over: {matched}\n",
                b.option(),
                analysis::points_text(r.share - b.max).trim_start_matches('+'),
            ));
        } else {
            out.push_str(&format!(
                "  ok    {}: {share}% ({kind}), budget {max}%: {matched}\n",
                b.option(),
            ));
        }
    }
    // Each span name a --span-max matches is a budget of its own.
    let mut checked = budgets.len();
    if !span_budgets.is_empty() {
        let times = span_times(&profile)
            .map_err(|e| Failure(EXIT_FAILURE, format!("{}: {e}", args.profile.display())))?;
        for b in &span_budgets {
            let option = format!("--span-max '{}'", b.text);
            let found = b.measure(&times);
            if found.is_empty() {
                eprintln!(
                    "spanprof check: warning: {option} matches no span name of {} (spans are \
                     named when their samples carry span.name or osprofiler.name)",
                    args.profile.display()
                );
                out.push_str(&format!("  ok    {option}: matches no span name\n"));
            }
            for (t, over) in found {
                checked += 1;
                let what = format!(
                    "{}: {} on average over {} span{} ({} in all), budget {}",
                    t.name,
                    analysis::duration_text(t.mean_ns()),
                    t.spans,
                    if t.spans == 1 { "" } else { "s" },
                    analysis::duration_text(t.total_ns),
                    analysis::duration_text(b.max_ns),
                );
                if over {
                    crossed += 1;
                    out.push_str(&format!("  OVER  {option}: {what}\n"));
                } else {
                    out.push_str(&format!("  ok    {option}: {what}\n"));
                }
            }
        }
    }
    write_stdout(out.as_bytes())?;
    if crossed > 0 {
        eprintln!("spanprof check: {crossed} of {checked} budgets exceeded");
        return Ok(EXIT_BUDGET);
    }
    Ok(0)
}

/// `spanprof report: kept K of N samples, S of T spans (FILTER) from FILE: TARGET, …`; `before`
/// is N and its unit suffix, the profile's before the filter (which `--event` can change:
/// `kept 11 samples of 405.5 ms`).
fn report_line(
    profile: &Profile,
    filter: &Filter,
    file: &Path,
    before: &(String, &'static str),
    spans: usize,
) -> String {
    let m = &profile.meta;
    let filter = if filter.is_empty() {
        "no filter".to_string()
    } else {
        filter.to_string()
    };
    format!(
        "spanprof report: kept {}{} of {}{}, {} of {spans} spans ({filter}) from {}: \
         {}, {:.1} s {}",
        summary::amount(profile, summary::total_weight(profile)),
        if summary::unit_suffix(profile) == before.1 {
            ""
        } else {
            summary::unit_suffix(profile)
        },
        before.0,
        before.1,
        profile.spans.len(),
        file.display(),
        m.target,
        m.duration.as_secs_f64(),
        spanprof::wording::sampling(m),
    )
}

fn fail(e: anyhow::Error) -> Failure {
    // A command that cannot be executed exits as a shell would have it (127 / 126).
    let code = e
        .downcast_ref::<CannotRun>()
        .map_or(EXIT_FAILURE, CannotRun::exit_code);
    // One line: the chain joined with ": ".
    Failure(code, format!("{e:#}"))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            // One line, like every other error; `--help` has the rest.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("error: invalid arguments");
            eprintln!("{first} (see `spanprof --help`)");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = match cli.command {
        Cmd::Profile(args) => profile(args),
        Cmd::Report(args) => report(args),
        Cmd::Diff(args) => diff(args),
        Cmd::Check(args) => check(args),
        Cmd::Daemon(args) => spanprof::daemon::run(args.config)
            .map(|()| 0)
            .map_err(|e| Failure(EXIT_FAILURE, format!("{e:#}"))),
        Cmd::Verify(args) => verify(args),
        Cmd::VerifyWorkload { kind, out, seconds } => {
            spanprof::verify::workload(&kind, &out, seconds)
                .map(|()| 0)
                .map_err(|e| Failure(EXIT_FAILURE, format!("{e:#}")))
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Failure(code, msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(code)
        }
    }
}
