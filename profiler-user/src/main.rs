//! The `spanprof` command line: each subcommand's driver ([`cli`] has the flags).

// Prints that never panic (`profiler_common::stderr_lossy!`): a closed stderr or stdout must
// not end a session before it writes its outputs.
#[allow(unused_macros)]
macro_rules! eprintln { ($($a:tt)*) => { profiler_common::stderr_line_lossy!($($a)*) } }
#[allow(unused_macros)]
macro_rules! eprint { ($($a:tt)*) => { profiler_common::stderr_lossy!($($a)*) } }
#[allow(unused_macros)]
macro_rules! println { ($($a:tt)*) => { profiler_common::stdout_line_lossy!($($a)*) } }
#[allow(unused_macros)]
macro_rules! print { ($($a:tt)*) => { profiler_common::stdout_lossy!($($a)*) } }

mod cli;
mod live;
mod manual;
mod usage;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use spanprof::export::{ExporterConfig, Protocol};
use spanprof::session::{self, Ending, Options, Target};
use spanprof_analysis::filter::Filter;
use spanprof_collect as collect;
use spanprof_pipeline::aggregate;
use spanprof_profile::format::budget::ReadBudget;
use spanprof_profile::format::speedscope::Threads;
use spanprof_profile::format::{self, Format};
use spanprof_profile::profile::{GroupBy, Profile, View};
use spanprof_profile::write::PendingOutput;

use cli::{
    fail, otlp_config, output_formats, parse_duration, parse_group_by, parse_pids,
    sampling_options, usage, CheckArgs, Cli, Cmd, DiffArgs, Failure, ProfileArgs, ReplayArgs,
    ReportArgs, VerifyArgs, EXIT_BUDGET, EXIT_FAILURE, EXIT_USAGE,
};
use spanprof::summary;
use spanprof_analysis::stats;
use spanprof_profile::wording;

/// Largest profile file `report`, `diff` and `check` read.
const MAX_INPUT_BYTES: u64 = 1 << 30;
/// How the profile outputs are shaped, besides their format.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// The frames shown (but by the formats that keep every frame).
    view: View,
    /// A synthetic root frame per span, thread or process.
    group: Option<GroupBy>,
    /// speedscope: a profile per thread rather than per thread name.
    speedscope: Threads,
}

/// `--speedscope-per-thread`, as speedscope's threads.
fn speedscope_threads(per_thread: bool) -> Threads {
    if per_thread {
        Threads::PerThread
    } else {
        Threads::ByName
    }
}

/// Renders `profile` in `format` (speedscope's threads grouped as `speedscope` says).
fn render(profile: &Profile, format: Format, speedscope: Threads) -> Result<Vec<u8>> {
    Ok(match format {
        Format::Speedscope => format::speedscope::render_threads(profile, speedscope)?,
        other => format::render(profile, other)?,
    })
}

/// Renders `profile` (grouped first if asked) into each pending output, in the view of `shape`
/// but for the formats that keep every frame ([`Format::keeps_every_frame`]), printing
/// `wrote …` or the error per output; returns [`EXIT_FAILURE`] when one could not be written.
fn write_outputs(profile: &Profile, shape: Shape, outputs: Vec<(PendingOutput, Format)>) -> u8 {
    let viewed = profile.in_view(shape.view);
    let grouped = shape.group.map(|g| (profile.grouped(g), viewed.grouped(g)));
    commit_outputs(outputs, |format| {
        let shown = match (&grouped, format.keeps_every_frame()) {
            (Some((full, _)), true) => full,
            (Some((_, viewed)), false) => viewed,
            (None, true) => profile,
            (None, false) => &viewed,
        };
        render(shown, format, shape.speedscope)
    })
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
    if args.record.is_some() && !privacy.is_empty() {
        // The recording keeps the facts the outputs are made of: it would show what the flags
        // hide. `replay` takes the same flags.
        return Err(usage(
            "--record does not combine with --redact-paths or --drop-label: record without \
             them, then give them to `spanprof replay`",
        ));
    }
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
    let record_out = args
        .record
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
            // A recording serves every format: OTLP's times too.
            // OTLP's times, and speedscope's timeline.
            timestamps: exporter.is_some()
                || formats.contains(&Format::Otlp)
                || formats.contains(&Format::Speedscope)
                || record_out.is_some(),
            record: record_out.is_some(),
            ..aggregate::Options::default()
        },
        sampling,
        progress: !args.quiet,
        redact_paths: privacy.redact_paths,
        debuginfod: !args.no_debuginfod,
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
            wording::amount(profile, wording::total_weight(profile)),
            match wording::unit_suffix(profile) {
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
            spanprof_collect::preflight::file_access_hint()
                .map_or(String::new(), |hint| format!(" ({hint})"))
        );
    }
    if let Some(warning) = args
        .python_only
        .then(|| summary::python_only_warning(profile))
        .flatten()
    {
        eprintln!("{warning}");
    }
    let view = args.view.view();
    eprint!(
        "{}",
        summary::render(&profile.in_view(view), &outcome.errors)
    );
    if let Some(line) = outcome
        .off_cpu_unseen
        .and_then(|u| u.line(profile.meta.events.wall))
    {
        eprintln!("{line}");
    }
    let shape = Shape {
        view,
        group,
        speedscope: speedscope_threads(args.speedscope_per_thread),
    };
    let mut status = write_outputs(profile, shape, pending.into_iter().zip(formats).collect());
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
    if let (Some(out), Some(recording)) = (record_out, outcome.recording.take()) {
        let dest = out.dest().display().to_string();
        match recording
            .map_err(anyhow::Error::msg)
            .and_then(|b| out.commit(&b))
        {
            Ok(()) => eprintln!("wrote {dest} (recording)"),
            Err(e) => {
                eprintln!("error: cannot write the recording {dest}: {e:#}");
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

/// `spanprof replay`: the outputs of a recorded session, written again from its recording.
fn replay(args: ReplayArgs) -> Result<u8, Failure> {
    let formats = output_formats(&args.output, args.format.as_deref())?;
    let group = parse_group_by(args.group_by.as_deref())?;
    let privacy = args.privacy.parse()?;
    let shown = args.recording.display();
    let mut replayed = spanprof_pipeline::replay::replay_file(&args.recording)
        .map_err(|e| Failure(EXIT_FAILURE, format!("{shown}: {e}")))?;
    privacy.apply(&mut replayed.profile);
    let profile = &replayed.profile;
    eprintln!(
        "spanprof replay: {shown}: {} samples recorded by spanprof {}",
        replayed.samples, replayed.header.spanprof
    );
    let mut errors = [0u64; profiler_common::ERROR_COUNT as usize];
    for (to, &from) in errors.iter_mut().zip(&replayed.errors) {
        *to = from;
    }
    let view = args.view.view();
    eprint!("{}", summary::render(&profile.in_view(view), &errors));
    let pending = pending_outputs(&args.output)?;
    let shape = Shape {
        view,
        group,
        speedscope: speedscope_threads(args.speedscope_per_thread),
    };
    Ok(write_outputs(
        profile,
        shape,
        pending.into_iter().zip(formats).collect(),
    ))
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
    if let Err(collect::Invalid::Frequency) = sampling.validate(10_000) {
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
    let endpoint = config.shown_endpoint();
    let protocol = config.protocol.name();
    let request = spanprof_profile::format::otlp::request(profile);
    let profiles = spanprof_profile::format::otlp::profile_count(&request);
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

/// Reads a profile spanprof wrote; one line on failure.
///
/// Only a regular file of at most [`MAX_INPUT_BYTES`] is read: the file is opened without
/// blocking (a FIFO or a device would otherwise hang the open or be read without end) and its
/// size is checked before any byte is read. Gzip data is decompressed as it is read, up to
/// [`MAX_INPUT_BYTES`] of output and a quarter of what a file of its size may take to read
/// ([`ReadBudget`]), and the readers check what decoding would take before they do, so neither
/// a huge file, a gzip bomb nor a small file that decodes big fills the memory.
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
    let budget = ReadBudget::for_file(meta.len());
    let mut input = std::io::BufReader::new(file.take(MAX_INPUT_BYTES + 1));
    let gzip = std::io::BufRead::fill_buf(&mut input)
        .map_err(cannot)?
        .starts_with(&[0x1f, 0x8b]);
    let mut bytes = Vec::with_capacity(if gzip { 0 } else { meta.len() as usize });
    let read = if gzip {
        let cap = MAX_INPUT_BYTES.min(budget.max_uncompressed());
        read_capped(flate2::bufread::GzDecoder::new(input), &mut bytes, cap)
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
    if gzip && bytes.len() as u64 > MAX_INPUT_BYTES.min(budget.max_uncompressed()) {
        return Err(Failure(
            EXIT_FAILURE,
            if bytes.len() as u64 > MAX_INPUT_BYTES {
                format!(
                    "{shown}: more than {} MiB uncompressed",
                    MAX_INPUT_BYTES >> 20
                )
            } else {
                format!("{shown}: {}", budget.decompressed_too_much())
            },
        ));
    }
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(too_large());
    }
    // A name that says nothing (py-spy's `--format raw` has no extension of its own): folded
    // text if every line is `STACK COUNT`, else pprof.
    let format = Format::from_path(path).or_else(|| looks_folded(&bytes).then_some(Format::Folded));
    let read = match format {
        Some(Format::Folded) => spanprof_profile::format::folded::read_folded(&bytes),
        Some(Format::Otlp) => spanprof_profile::format::otlp::read_otlp_within(&bytes, budget),
        _ => spanprof_profile::format::pprof::read_pprof_within(&bytes, budget),
    };
    read.map_err(|e| {
        Failure(
            EXIT_FAILURE,
            format!("{shown}: {:#}", anyhow::Error::from(e)),
        )
    })
}

/// Whether `bytes` read as folded stacks: UTF-8 text whose every non-blank line ends in a space
/// and a count (py-spy's stackless ` 10` included), with at least one such line.
fn looks_folded(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let mut lines = text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .peekable();
    lines.peek().is_some()
        && lines.all(|l| {
            l.rsplit_once(' ')
                .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Reads `from` into `bytes` up to one byte past `limit`, growing the buffer at most to that
/// size (`read_to_end` would double it past the bound on its last byte).
fn read_capped(
    mut from: impl std::io::Read,
    bytes: &mut Vec<u8>,
    limit: u64,
) -> std::io::Result<usize> {
    let cap = limit as usize + 1;
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
    /// The total and what follows it ([`wording::unit_suffix`]).
    before: (String, &'static str),
    spans: usize,
}

/// Reads a profile and applies the filter; fails when the filter leaves nothing.
fn read_filtered(path: &Path, filter: &Filter) -> Result<Filtered, Failure> {
    let mut profile = read_profile(path)?;
    // Weights: samples of an on-CPU profile, nanoseconds once off-CPU time is in it.
    let amount = |p: &Profile, w: u64| (wording::amount(p, w), wording::unit_suffix(p));
    let in_spans: u64 = profile
        .samples
        .iter()
        .filter(|s| s.span.is_some())
        .map(|s| profile.weight(s))
        .sum();
    let (before, in_spans, spans) = (
        amount(&profile, wording::total_weight(&profile)),
        wording::amount(&profile, in_spans),
        profile.spans.len(),
    );
    filter
        .apply(&mut profile)
        .map_err(|e| Failure(EXIT_FAILURE, format!("{}: {e}", path.display())))?;
    if !filter.is_empty() && wording::total_weight(&profile) == 0 {
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
    // A stop signal that comes while a FIFO waits for its reader ends that wait (a second one
    // ends spanprof).
    let at_start = spanprof_collect::signals::stop_signal();
    let give_up = move || spanprof_collect::signals::stop_signal() != at_start;
    for (out, format) in outputs {
        let dest = out.dest().display().to_string();
        match render(format).and_then(|bytes| out.commit_until(&bytes, &give_up)) {
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
    let view = args.view.view();
    let viewed = profile.in_view(view);
    let grouped = group.map(|g| (profile.grouped(g), viewed.grouped(g)));
    // The table and the formats written in a view; pprof and OTLP keep every frame.
    let (full, shown) = match &grouped {
        Some((full, viewed)) => (full, viewed),
        None => (profile, &*viewed),
    };
    let functions = spanprof_analysis::Functions::of(shown);
    // A memory profile has no span times.
    let named = span_times(shown).unwrap_or_default();
    let render = |format: ReportFormat| -> Result<Vec<u8>> {
        Ok(match format {
            ReportFormat::Text => {
                spanprof_analysis::report_text(shown, &functions, &named, args.top).into_bytes()
            }
            ReportFormat::Json => {
                spanprof_analysis::report_json(shown, &functions, &named, args.top).into_bytes()
            }
            ReportFormat::Profile(f) if f.keeps_every_frame() => format::render(full, f)?,
            ReportFormat::Profile(f) => {
                render(shown, f, speedscope_threads(args.speedscope_per_thread))?
            }
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

/// The sampled time of each span name of `profile` ([`spanprof_analysis::span_times`]).
fn span_times(profile: &Profile) -> Result<Vec<spanprof_analysis::SpanTime>, String> {
    spanprof_analysis::span_times(profile, spanprof_analysis::span_name_and_id)
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
    use spanprof_analysis::{self as analysis, Diff};
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
    let (base, new) = (
        read_filtered(&args.base, &filter)?.profile,
        read_filtered(&args.new, &filter)?.profile,
    );
    let view = comparable_view(args.view.view(), (&base, &args.base), (&new, &args.new));
    let (base, new) = (base.into_view(view), new.into_view(view));
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

/// The view two profiles compare in: `view`, unless it is the Python view and only one of them
/// marks the interpreter's frames (a file from before the marks, or folded stacks, beside a new
/// one), which would compare one's interpreter time as its Python functions' with the other's
/// as the interpreter's: then every frame, with a warning.
fn comparable_view(view: View, base: (&Profile, &Path), new: (&Profile, &Path)) -> View {
    use spanprof_profile::profile::FrameKind;
    let marked = |p: &Profile| p.frames.iter().any(|f| f.interpreter);
    let python = |p: &Profile| p.frames.iter().any(|f| f.kind == FrameKind::Python);
    let unmarked = [base, new]
        .into_iter()
        .find(|(p, _)| python(p) && !marked(p));
    match unmarked {
        Some((_, path)) if view == View::Python && (marked(base.0) || marked(new.0)) => {
            eprintln!(
                "spanprof diff: warning: {} does not mark the interpreter's frames (written by an \
                 older spanprof, or folded stacks): both profiles are compared with every frame \
                 (--view full)",
                path.display()
            );
            View::Full
        }
        _ => view,
    }
}

fn check(args: CheckArgs) -> Result<u8, Failure> {
    use spanprof_analysis::{self as analysis, Budget, Functions, ShareKind};
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
    let profile = read_filtered(&args.profile, &filter)?
        .profile
        .into_view(args.view.view());
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
    let (mut crossed, mut untimed, mut span_checked) = (0, 0, 0);
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
            let period = analysis::count_period(&profile);
            for (t, over) in found {
                checked += 1;
                span_checked += 1;
                if !t.timed(period) && t.mean_ns().saturating_add(period) <= b.max_ns {
                    // Too short to time, but within the budget whatever the sampling did: a
                    // sampled span is counted at most a period off.
                    out.push_str(&format!(
                        "  ok    {option}: {}: under {} on average over {} span{} (at most one \
                         {} sample off each), budget {}\n",
                        t.name,
                        analysis::duration_text(t.mean_ns().saturating_add(period)),
                        t.spans,
                        if t.spans == 1 { "" } else { "s" },
                        analysis::duration_text(period),
                        analysis::duration_text(b.max_ns),
                    ));
                    continue;
                }
                if !t.timed(period) {
                    // Whole samples per span: a mean of a period or two is not a time.
                    untimed += 1;
                    out.push_str(&format!(
                        "  ???   {option}: {}: cannot be timed at {} Hz: {:.1} samples a span \
                         ({} each; {} are needed); profile at {} Hz or more for spans of {}\n",
                        t.name,
                        profile.meta.frequency,
                        t.periods(period),
                        analysis::duration_text(period),
                        analysis::MIN_PERIODS_PER_SPAN,
                        analysis::rate_for(b.max_ns.min(t.mean_ns())),
                        analysis::duration_text(b.max_ns.min(t.mean_ns())),
                    ));
                    continue;
                }
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
    if untimed > 0 {
        eprintln!(
            "spanprof check: {untimed} of {span_checked} span budgets cannot be checked at \
             the profile's rate: not passed"
        );
        return Ok(EXIT_FAILURE);
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
        wording::amount(profile, wording::total_weight(profile)),
        if wording::unit_suffix(profile) == before.1 {
            ""
        } else {
            wording::unit_suffix(profile)
        },
        before.0,
        before.1,
        profile.spans.len(),
        file.display(),
        m.target,
        m.duration.as_secs_f64(),
        spanprof_profile::wording::sampling(m),
    )
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            // One line, like every other error (and a hint when one applies); `--help` has
            // the rest.
            let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
            // A value echoed back (an endpoint) shows no password.
            eprintln!(
                "{}",
                symbolizer::debuginfod::without_credentials(&usage::explain(&e, &args))
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Some(Failure(code, msg)) = live::privileges(&cli.command) {
        eprintln!("error: {msg}");
        return ExitCode::from(code);
    }
    let result = match cli.command {
        Cmd::Profile(args) => profile(args),
        Cmd::Report(args) => report(args),
        Cmd::Diff(args) => diff(args),
        Cmd::Check(args) => check(args),
        Cmd::Replay(args) => replay(args),
        Cmd::Daemon(args) => spanprof::daemon::run(args.config)
            .map(|()| 0)
            .map_err(|e| Failure(EXIT_FAILURE, format!("{e:#}"))),
        Cmd::Verify(args) => verify(args),
        Cmd::Dump(args) => live::dump(args),
        Cmd::Top(args) => live::top(args),
        Cmd::Completions { shell } => manual::completions(shell),
        Cmd::Man { dir } => manual::man_pages(dir.as_deref()),
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
