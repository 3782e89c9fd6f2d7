//! The unwind part (`unwind` block): `cpu_split_nofp` under `spanprof --unwind dwarf`,
//! `--unwind fp` and `perf record --call-graph dwarf`; `perf script` folded here, and the
//! shape of the stacks each profiler got.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::json::Json;
use super::measure::{
    bpf_figures, folded_stacks, machine, mb, median, per_sample_us, percent, rounds, run_alone,
    secs, version, wait_usage, BpfFigures, BpfWindow, Target, TargetRun, Usage,
};
use super::profilers::{run_perf, run_spanprof, OtherRun, SpanprofRun};
use super::Config;

/// The unwind part: its target (built by `cargo xtask workloads`) and the rate of every
/// profiler in it.
const UNWIND_TARGET: &str = "cpu_split_nofp";
const UNWIND_HZ: u32 = 499;
/// `perf record --call-graph dwarf`'s default stack dump per sample, in bytes.
const PERF_STACK_DUMP: u32 = 8192;
/// `/bin/sh -c GATE PROGRAM SECONDS`: prints the shell's pid, waits for the release (a byte,
/// then EOF, on stdin) and execs PROGRAM, which keeps the pid. cpu_split works for a time from
/// its start and waits for nothing, so the gate sits before its exec: every profiler attaches
/// to the pid while the shell waits, follows the exec, and the target's seconds start at the
/// release in every configuration.
const GATE: &str = r#"echo $$; read gate; exec "$0" "$@""#;
/// The user frames of the work, leaf last, and the frames a sample of the work can end with.
const WORK_FRAMES: [&str; 3] = ["dispatcher", "hot_alpha", "hot_beta"];
const FULL_PATHS: [&[&str]; 3] = [
    &["main", "dispatcher", "hot_alpha"],
    &["main", "dispatcher", "hot_beta"],
    &["main", "dispatcher"],
];
/// The outermost frame of the target's main thread.
const ROOT_FRAME: &str = "_start";

/// What the user stacks of one run look like, from its folded stacks.
#[derive(Debug, Clone, Copy, Default)]
struct UnwindShape {
    samples: u64,
    /// Samples whose user stack has a frame of the work (dispatcher, hot_alpha or hot_beta),
    /// whatever else it has: a frame-pointer walk that stops at the leaf still counts.
    work: u64,
    /// Of those, the samples whose user stack ends with the whole path:
    /// main;dispatcher;hot_alpha or main;dispatcher;hot_beta (or main;dispatcher).
    full: u64,
    /// Of those, the samples whose user stack also starts at the process's root, `_start`.
    rooted: u64,
    /// Samples whose leaf user frame is hot_alpha, hot_beta.
    alpha: u64,
    beta: u64,
    /// User frames summed over every sample.
    user_frames: u64,
}

impl UnwindShape {
    fn add(&mut self, o: &Self) {
        self.samples += o.samples;
        self.work += o.work;
        self.full += o.full;
        self.rooted += o.rooted;
        self.alpha += o.alpha;
        self.beta += o.beta;
        self.user_frames += o.user_frames;
    }
}

/// A kernel frame (`name_[k]`, as spanprof and [`fold_perf_script`] write them) or a
/// placeholder such as `[truncated]` or `[no stack]` (an unknown frame, `[unknown] (module+0x…)`,
/// is a user frame).
fn not_user_frame(frame: &str) -> bool {
    frame.ends_with("_[k]") || (frame.starts_with('[') && frame.ends_with(']'))
}

fn unwind_shape<'a>(stacks: impl IntoIterator<Item = (&'a str, u64)>) -> UnwindShape {
    let mut s = UnwindShape::default();
    for (stack, n) in stacks {
        let user: Vec<&str> = stack.split(';').filter(|f| !not_user_frame(f)).collect();
        s.samples += n;
        s.user_frames += user.len() as u64 * n;
        if user.iter().any(|f| WORK_FRAMES.contains(f)) {
            s.work += n;
            if FULL_PATHS.iter().any(|path| user.ends_with(path)) {
                s.full += n;
                if user.first() == Some(&ROOT_FRAME) {
                    s.rooted += n;
                }
            }
        }
        match user.last() {
            Some(&"hot_alpha") => s.alpha += n,
            Some(&"hot_beta") => s.beta += n,
            _ => {}
        }
    }
    s
}

/// One frame line of `perf script`, `addr sym+off (dso)` trimmed, as a folded frame: the
/// symbol without its offset, `[unknown] (dso file name)` when perf has none, `_[k]` appended
/// to kernel frames (a kernel dso, or an address in the kernel half).
fn perf_frame(line: &str) -> String {
    let (addr, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest = rest.trim();
    let (sym, dso) = match rest.rsplit_once(" (") {
        Some((sym, dso)) => (sym.trim(), dso.strip_suffix(')').unwrap_or(dso)),
        None => match rest.strip_prefix('(') {
            Some(dso) => ("", dso.strip_suffix(')').unwrap_or(dso)),
            None => (rest, ""),
        },
    };
    let name = sym.rsplit_once("+0x").map_or(sym, |(name, _)| name);
    let kernel = dso.contains("kernel.kallsyms")
        || dso.starts_with("[kernel")
        || u64::from_str_radix(addr, 16).is_ok_and(|a| a >= 0xffff_8000_0000_0000);
    let mut name = if name.is_empty() || name == "[unknown]" {
        format!("[unknown] ({})", dso.rsplit('/').next().unwrap_or(dso))
    } else {
        name.replace(';', ":")
    };
    if kernel {
        name.push_str("_[k]");
    }
    name
}

/// Folds `perf script` output: per sample a header line (`comm pid time: period event:`), one
/// line per frame, leaf first (`\t addr sym+off (dso)`), and a blank line. Returns the root-first
/// `;`-joined stacks and their sample counts (a sample without frames is `[no stack]`).
fn fold_perf_script(text: &str) -> BTreeMap<String, u64> {
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    let mut sample: Option<Vec<String>> = None;
    let mut end = |sample: &mut Option<Vec<String>>| {
        if let Some(mut frames) = sample.take() {
            frames.reverse();
            let stack = if frames.is_empty() {
                "[no stack]".to_string()
            } else {
                frames.join(";")
            };
            *stacks.entry(stack).or_default() += 1;
        }
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            end(&mut sample);
        } else if line.starts_with(char::is_whitespace) {
            if let Some(frames) = sample.as_mut() {
                frames.push(perf_frame(line.trim()));
            }
        } else {
            end(&mut sample);
            sample = Some(Vec::new());
        }
    }
    end(&mut sample);
    stacks
}

/// `perf script -i DATA`: its own CPU and peak RSS (the DWARF unwinding happens there) and the
/// samples folded; its output folded is written to `folded`, its stderr to `err`.
fn perf_script(data: &Path, folded: &Path, err: &Path) -> Result<(Usage, BTreeMap<String, u64>)> {
    let err_file = std::fs::File::create(err)
        .with_context(|| format!("failed to create {}", err.display()))?;
    let mut child = Command::new("perf")
        .args(["script", "-i"])
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err_file)
        .spawn()
        .context("failed to start perf script")?;
    let mut bytes = Vec::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_end(&mut bytes)?;
    let (status, usage) = wait_usage(&mut child)?;
    if status != 0 {
        bail!(
            "perf script failed (wait status {status}); its errors are in {}",
            err.display()
        );
    }
    let stacks = fold_perf_script(&String::from_utf8_lossy(&bytes));
    let text: String = stacks.iter().map(|(s, n)| format!("{s} {n}\n")).collect();
    std::fs::write(folded, text)
        .with_context(|| format!("failed to write {}", folded.display()))?;
    Ok((usage, stacks))
}

/// spanprof's `--stats` file, its stack counts summed over its processes (the one target here).
#[derive(Debug, Clone, Default)]
struct StackStats {
    /// `dwarf` or `fp`: what spanprof says it did.
    unwind: String,
    /// Bytes of user stack copied per sample (0 with frame pointers).
    stack_copy_bytes: u64,
    complete: u64,
    truncated: u64,
    failed: u64,
    unchecked: u64,
    /// Samples per reason, for truncated and failed stacks.
    reasons: BTreeMap<String, u64>,
}

impl StackStats {
    fn add(&mut self, o: &Self) {
        self.complete += o.complete;
        self.truncated += o.truncated;
        self.failed += o.failed;
        self.unchecked += o.unchecked;
        for (reason, n) in &o.reasons {
            *self.reasons.entry(reason.clone()).or_default() += n;
        }
    }

    fn total(&self) -> u64 {
        self.complete + self.truncated + self.failed + self.unchecked
    }
}

/// `{"unwind":"dwarf","stack_copy_bytes":16384,"processes":[{"pid":…,"name":…,"samples":…,
/// "stacks":{"complete":…,"truncated":…,"failed":…,"unchecked":…,"reasons":{…}}}]}`.
fn parse_stack_stats(text: &str) -> Result<StackStats> {
    let json = Json::parse(text)?;
    let mut s = StackStats {
        unwind: json
            .get("unwind")
            .and_then(Json::as_str)
            .context("no \"unwind\"")?
            .to_string(),
        stack_copy_bytes: json
            .get("stack_copy_bytes")
            .and_then(Json::as_u64)
            .unwrap_or(0),
        ..StackStats::default()
    };
    let Some(Json::Arr(processes)) = json.get("processes") else {
        bail!("no \"processes\" array");
    };
    for p in processes {
        let stacks = p.get("stacks").context("a process without \"stacks\"")?;
        let count = |key: &str| {
            stacks
                .get(key)
                .and_then(Json::as_u64)
                .with_context(|| format!("no \"{key}\" count"))
        };
        let mut one = StackStats {
            complete: count("complete")?,
            truncated: count("truncated")?,
            failed: count("failed")?,
            unchecked: count("unchecked")?,
            ..StackStats::default()
        };
        if let Some(Json::Obj(reasons)) = stacks.get("reasons") {
            for (reason, n) in reasons {
                one.reasons.insert(reason.clone(), n.as_u64().unwrap_or(0));
            }
        }
        s.add(&one);
    }
    Ok(s)
}

/// One run of the unwind target under spanprof.
#[derive(Debug, Default)]
struct UnwindSpanprofRun {
    run: SpanprofRun,
    shape: UnwindShape,
    stats: StackStats,
}

/// One run of the unwind target under `perf record --call-graph dwarf`, then `perf script`.
#[derive(Debug, Default)]
struct UnwindPerfRun {
    run: OtherRun,
    /// Size of perf.data.
    data_bytes: u64,
    /// `perf script`'s own resource usage.
    script: Usage,
    shape: UnwindShape,
}

#[derive(Debug, Default)]
struct UnwindRound {
    alone: TargetRun,
    dwarf: UnwindSpanprofRun,
    fp: UnwindSpanprofRun,
    perf: UnwindPerfRun,
}

/// cpu_split_nofp alone, under spanprof --unwind dwarf, spanprof --unwind fp and perf record
/// --call-graph dwarf, interleaved; the markdown of their figures.
pub(super) fn unwind(
    spanprof: &Path,
    workloads: &Path,
    out_dir: &Path,
    cfg: &Config,
) -> Result<String> {
    let program = workloads.join(UNWIND_TARGET);
    if !program.is_file() {
        bail!(
            "{} is missing (`cargo xtask workloads` builds it)",
            program.display()
        );
    }
    let perf_version = version(Path::new("perf"), &["--version"])
        .context("perf (Debian package linux-perf) is needed")?;
    let target = Target {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), GATE.into(), program.into_os_string()],
        env: Vec::new(),
    };
    let (seconds, n) = (cfg.unwind_seconds, cfg.rounds);
    let spanprof_run = |mode: &str| -> Result<UnwindSpanprofRun> {
        let out = out_dir.join(format!("unwind_{mode}.folded"));
        let stats_path = out_dir.join(format!("unwind_{mode}.stats.json"));
        // A stale file from an earlier run must not pass for this run's.
        let _ = std::fs::remove_file(&stats_path);
        let stats_arg = stats_path.to_string_lossy().into_owned();
        let extra = ["--unwind", mode, "--stats", stats_arg.as_str()];
        let run = run_spanprof(spanprof, &target, seconds, UNWIND_HZ, &extra, &out)?;
        let folded = std::fs::read_to_string(&out)
            .with_context(|| format!("failed to read {}", out.display()))?;
        let stats_text = std::fs::read_to_string(&stats_path)
            .with_context(|| format!("spanprof wrote no {}", stats_path.display()))?;
        let stats = parse_stack_stats(&stats_text)
            .with_context(|| format!("failed to parse {}", stats_path.display()))?;
        if stats.unwind != mode {
            bail!(
                "spanprof --unwind {mode} says it unwound with `{}` in {}",
                stats.unwind,
                stats_path.display()
            );
        }
        Ok(UnwindSpanprofRun {
            run,
            shape: unwind_shape(folded_stacks(&folded)),
            stats,
        })
    };
    let perf_run = || -> Result<UnwindPerfRun> {
        let data = out_dir.join("unwind_perf.data");
        let run = run_perf(
            &target,
            seconds,
            UNWIND_HZ,
            &["--call-graph", "dwarf"],
            &data,
        )?;
        let data_bytes = std::fs::metadata(&data)
            .with_context(|| format!("perf wrote no {}", data.display()))?
            .len();
        let (script, stacks) = perf_script(
            &data,
            &out_dir.join("unwind_perf.folded"),
            &out_dir.join("unwind_perf_script.err"),
        )?;
        Ok(UnwindPerfRun {
            run,
            data_bytes,
            script,
            shape: unwind_shape(stacks.iter().map(|(s, n)| (s.as_str(), *n))),
        })
    };
    let results = rounds("unwind", n, |i| {
        let mut r = UnwindRound::default();
        // Every configuration in each round, the order reversed every other round.
        if i % 2 == 0 {
            r.alone = run_alone(&target, seconds)?;
            r.dwarf = spanprof_run("dwarf")?;
            r.fp = spanprof_run("fp")?;
            r.perf = perf_run()?;
        } else {
            r.perf = perf_run()?;
            r.fp = spanprof_run("fp")?;
            r.dwarf = spanprof_run("dwarf")?;
            r.alone = run_alone(&target, seconds)?;
        }
        Ok(r)
    })?;
    std::fs::write(out_dir.join("unwind_rounds.txt"), format!("{results:#?}\n"))?;
    Ok(unwind_table(&results, cfg, &perf_version))
}

/// The markdown of the unwind part's figures.
fn unwind_table(results: &[UnwindRound], cfg: &Config, perf_version: &str) -> String {
    let (seconds, n) = (cfg.unwind_seconds, cfg.rounds);
    let med = |f: &dyn Fn(&UnwindRound) -> f64| median(results.iter().map(f).collect());
    let us = |ns: f64| ns / 1000.0;
    // The work of a CPU-bound target that runs a fixed time is its user CPU time.
    let slowdown = |t: &dyn Fn(&UnwindRound) -> TargetRun| {
        med(&|r| secs(r.alone.user) / secs(t(r).user).max(1e-9))
    };
    let alone_user = med(&|r| secs(r.alone.user));
    let alone_wall = med(&|r| secs(r.alone.wall));

    // spanprof's two modes: one column each.
    struct SpanprofColumn {
        samples: f64,
        lost: u64,
        shape: UnwindShape,
        stats: StackStats,
        slowdown: f64,
        bpf: Option<BpfFigures>,
        own_us: f64,
        loop_us: f64,
        rss: u64,
    }
    let column = |get: fn(&UnwindRound) -> &UnwindSpanprofRun| {
        let mut shape = UnwindShape::default();
        let mut stats = StackStats::default();
        for r in results {
            shape.add(&get(r).shape);
            stats.add(&get(r).stats);
        }
        stats.stack_copy_bytes = results.first().map_or(0, |r| get(r).stats.stack_copy_bytes);
        let windows: Vec<BpfWindow> = results.iter().filter_map(|r| get(r).run.bpf).collect();
        SpanprofColumn {
            samples: med(&|r| get(r).run.samples as f64),
            lost: results.iter().map(|r| get(r).run.lost).sum(),
            shape,
            stats,
            slowdown: slowdown(&|r| get(r).run.target),
            bpf: bpf_figures(&windows),
            own_us: med(&|r| per_sample_us(get(r).run.own.cpu, get(r).run.samples)),
            loop_us: med(&|r| get(r).run.loop_us),
            rss: results
                .iter()
                .map(|r| get(r).run.own.max_rss_kib)
                .max()
                .unwrap_or(0),
        }
    };
    let cols = [column(|r| &r.dwarf), column(|r| &r.fp)];
    let mut perf_shape = UnwindShape::default();
    for r in results {
        perf_shape.add(&r.perf.shape);
    }
    let perf_samples = med(&|r| r.perf.run.samples as f64);
    let perf_slowdown = slowdown(&|r| r.perf.run.target);
    let record_us = med(&|r| per_sample_us(r.perf.run.own.cpu, r.perf.run.samples));
    let script_us = med(&|r| per_sample_us(r.perf.script.cpu, r.perf.run.samples));
    let perf_total_us =
        med(&|r| per_sample_us(r.perf.run.own.cpu + r.perf.script.cpu, r.perf.run.samples));
    let bytes = med(&|r| r.perf.data_bytes as f64 / r.perf.run.samples.max(1) as f64);
    let record_rss = results.iter().map(|r| r.perf.run.own.max_rss_kib).max();
    let script_rss = results.iter().map(|r| r.perf.script.max_rss_kib).max();

    let full =
        |s: &UnwindShape| format!("{:.1}% ({} of {})", percent(s.full, s.work), s.full, s.work);
    let rooted = |s: &UnwindShape| {
        format!(
            "{:.1}% ({} of {})",
            percent(s.rooted, s.work),
            s.rooted,
            s.work
        )
    };
    let alpha = |s: &UnwindShape| format!("{:.1}%", percent(s.alpha, s.alpha + s.beta));
    let depth = |s: &UnwindShape| format!("{:.2}", s.user_frames as f64 / s.samples.max(1) as f64);
    let verdict = |s: &StackStats| {
        let t = s.total();
        format!(
            "{:.1}% / {:.1}% / {:.1}% / {:.1}%",
            percent(s.complete, t),
            percent(s.truncated, t),
            percent(s.failed, t),
            percent(s.unchecked, t)
        )
    };
    let reasons = |s: &StackStats| {
        let mut r: Vec<(&String, &u64)> = s.reasons.iter().filter(|(_, &n)| n > 0).collect();
        r.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        if r.is_empty() {
            "none".to_string()
        } else {
            r.iter()
                .map(|(reason, n)| format!("{reason}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let bpf_cell = |c: &SpanprofColumn| match &c.bpf {
        Some(b) => format!("{:.2} µs ({} samples)", us(b.net_ns), b.target_samples),
        None => "not read".to_string(),
    };
    let total_cell = |c: &SpanprofColumn| match &c.bpf {
        Some(b) => format!("**{:.1} µs**", us(b.net_ns) + c.own_us),
        None => format!("≥ {:.1} µs (in-kernel not read)", c.own_us),
    };
    let [d, f] = &cols;
    let row =
        |label: &str, d: String, f: String, p: String| format!("| {label} | {d} | {f} | {p} |\n");
    let mut table = String::new();
    table += &row(
        "samples per run (median); lost, all rounds",
        format!("{:.0}; {} lost", d.samples, d.lost),
        format!("{:.0}; {} lost", f.samples, f.lost),
        format!("{perf_samples:.0}"),
    );
    table += &row(
        "**samples of the work with the whole path main;dispatcher;hot_\\*** (of those with dispatcher, hot_alpha or hot_beta; all rounds)",
        format!("**{}**", full(&d.shape)),
        format!("**{}**", full(&f.shape)),
        format!("**{}**", full(&perf_shape)),
    );
    table += &row(
        "the same, the stack also starting at the process's root (`_start`)",
        rooted(&d.shape),
        rooted(&f.shape),
        rooted(&perf_shape),
    );
    table += &row(
        "spanprof's own verdict (`--stats`, all rounds): complete / truncated / failed / unchecked",
        verdict(&d.stats),
        verdict(&f.stats),
        "n/a".to_string(),
    );
    table += &row(
        "reasons of truncated and failed stacks (`--stats`, samples, all rounds)",
        reasons(&d.stats),
        reasons(&f.stats),
        "n/a".to_string(),
    );
    table += &row(
        "hot_alpha's share of the samples whose leaf is hot_alpha or hot_beta (75% by construction)",
        alpha(&d.shape),
        alpha(&f.shape),
        alpha(&perf_shape),
    );
    table += &row(
        "mean user-stack depth, frames per sample (as each tool prints them, inlined frames included)",
        depth(&d.shape),
        depth(&f.shape),
        depth(&perf_shape),
    );
    table += &row(
        &format!("target's work, alone / profiled (user CPU time in its {seconds} s; median of {n} interleaved rounds)"),
        format!("{:.4}", d.slowdown),
        format!("{:.4}", f.slowdown),
        format!("{perf_slowdown:.4}"),
    );
    table += &row(
        "in-kernel time per target sample, net of the runs for other processes (BPF statistics, all rounds)",
        bpf_cell(d),
        bpf_cell(f),
        "n/a (perf copies the stack in the target's interrupt)".to_string(),
    );
    table += &row(
        "profiler's own CPU per sample, whole process (spanprof; perf record) (median)",
        format!("{:.1} µs", d.own_us),
        format!("{:.1} µs", f.own_us),
        format!("{record_us:.1} µs"),
    );
    table += &row(
        "spanprof's own CPU per sample in its sampling loop, as it reports it (median)",
        format!("{:.1} µs", d.loop_us),
        format!("{:.1} µs", f.loop_us),
        "n/a".to_string(),
    );
    table += &row(
        "`perf script`'s CPU per sample: DWARF unwinding and symbolization (median)",
        "n/a".to_string(),
        "n/a".to_string(),
        format!("{script_us:.1} µs"),
    );
    table += &row(
        "**CPU per sample, all told**: spanprof in-kernel + whole process; perf record + perf script (median)",
        total_cell(d),
        total_cell(f),
        format!("**{perf_total_us:.1} µs** + its in-kernel copy, not measured"),
    );
    table += &row(
        "bytes written per sample (perf.data size / samples, median)",
        "n/a".to_string(),
        "n/a".to_string(),
        format!("{bytes:.0} B"),
    );
    table += &row(
        "peak RSS (max): spanprof; perf record / perf script",
        format!("{:.1} MB", mb(d.rss)),
        format!("{:.1} MB", mb(f.rss)),
        format!(
            "{:.1} / {:.1} MB",
            mb(record_rss.unwrap_or(0)),
            mb(script_rss.unwrap_or(0))
        ),
    );

    format!(
        "Method: `tests/workloads/cpu_split.c` built by `cargo xtask workloads` without frame \
         pointers as `{UNWIND_TARGET}` (`-O2 -g -fomit-frame-pointer -momit-leaf-frame-pointer`): \
         main → dispatcher → hot_alpha (75% of the work) / hot_beta (25%). It works for a fixed \
         time and waits for nothing, so each run starts it behind a shell that prints its pid, \
         waits for the release and execs it (the pid stays): the profiler attaches to that pid \
         (`--pid`/`-p`) and follows the exec, and the {seconds} s of work start at the release in \
         every configuration. Each round runs it alone, under `spanprof profile --unwind dwarf` \
         (the kernel copies {} bytes of user stack per sample, spanprof unwinds them with \
         `.eh_frame`), `spanprof profile --unwind fp` (the kernel follows frame pointers) and \
         `perf record --call-graph dwarf` ({PERF_STACK_DUMP} bytes per sample, unwound by \
         `perf script`), all at {UNWIND_HZ} Hz of cpu-clock, the order reversed every other \
         round. Stacks: spanprof's folded output (`-o x.folded`) and `perf script`'s output \
         folded by the bench, kernel frames left out; a sample of the work is one whose user \
         stack has dispatcher, hot_alpha or hot_beta, and it has the whole path when its user \
         stack ends main;dispatcher;hot_alpha or main;dispatcher;hot_beta (or main;dispatcher). \
         Costs: spanprof's in-kernel time per target sample as in the native block (BPF \
         statistics, net of the runs for other processes) plus its whole-process CPU \
         (`wait4`) per sample; `perf record`'s and `perf script`'s own CPU (`wait4`) per sample \
         (perf copies the stack into its buffer in the target's interrupt, which is not \
         measured apart and shows at most in the target's work). The target's work is its user \
         CPU time in the fixed time, so the slowdown is alone / profiled.\n\n\
         Run of `cargo xtask bench --only unwind --rounds {n} --unwind-seconds {seconds}` on {}, \
         {perf_version}: target `{UNWIND_TARGET}` alone {alone_user:.2} s user CPU in \
         {alone_wall:.2} s (medians).\n\n\
         | figure | spanprof --unwind dwarf | spanprof --unwind fp | perf record --call-graph dwarf |\n\
         |---|---|---|---|\n\
         {table}",
        d.stats.stack_copy_bytes,
        machine(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `perf script` output as Debian's perf 6.1 prints it for `--call-graph dwarf`.
    const PERF_SCRIPT: &str = "\
cpu_split_nofp  6449 26844.392251:    2004008 cpu-clock: 
\t            1344 hot_alpha+0x24 (/tmp/cpu_split_nofp)
\t            13a4 dispatcher+0x4 (/tmp/cpu_split_nofp)
\t            11e4 main+0x124 (/tmp/cpu_split_nofp)
\t           27249 __libc_start_call_main+0x79 (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t           27304 __libc_start_main_impl+0x84 (inlined)
\t            1250 _start+0x20 (/tmp/cpu_split_nofp)

cpu_split_nofp  6449 26844.394256:    2004008 cpu-clock: 
\tffffffff81a0b2c1 asm_sysvec_apic_timer_interrupt+0x1 ([kernel.kallsyms])
\t            1384 hot_beta+0x24 (/tmp/cpu_split_nofp)
\t            13a9 dispatcher+0x9 (/tmp/cpu_split_nofp)
\t            11e4 main+0x124 (/tmp/cpu_split_nofp)

cpu_split_nofp  6449 26844.396259:    2004008 cpu-clock: 
\t            1344 hot_alpha+0x24 (/tmp/cpu_split_nofp)
\t        41d9a5b3 [unknown] ([unknown])

cpu_split_nofp  6449 26844.398268:    2004008 cpu-clock: 

cpu_split_nofp  6449 26844.400268:    2004008 cpu-clock: 
\t            1344 hot_alpha+0x24 (/tmp/cpu_split_nofp)
\t            13a4 dispatcher+0x4 (/tmp/cpu_split_nofp)
\t            11e4 main+0x124 (/tmp/cpu_split_nofp)
\t           27249 __libc_start_call_main+0x79 (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t           27304 __libc_start_main_impl+0x84 (inlined)
\t            1250 _start+0x20 (/tmp/cpu_split_nofp)
";

    #[test]
    fn perf_script_folds_root_first() {
        let stacks = fold_perf_script(PERF_SCRIPT);
        let full = "_start;__libc_start_main_impl;__libc_start_call_main;main;dispatcher;hot_alpha";
        assert_eq!(stacks.get(full), Some(&2));
        assert_eq!(
            stacks.get("main;dispatcher;hot_beta;asm_sysvec_apic_timer_interrupt_[k]"),
            Some(&1)
        );
        assert_eq!(stacks.get("[unknown] ([unknown]);hot_alpha"), Some(&1));
        assert_eq!(stacks.get("[no stack]"), Some(&1));
        assert_eq!(stacks.values().sum::<u64>(), 5);
    }

    #[test]
    fn unwind_shape_counts_whole_paths() {
        let stacks = fold_perf_script(PERF_SCRIPT);
        let s = unwind_shape(stacks.iter().map(|(k, n)| (k.as_str(), *n)));
        assert_eq!((s.samples, s.work, s.full, s.rooted), (5, 4, 3, 2));
        assert_eq!((s.alpha, s.beta), (3, 1));
        // 6 + 6 + 3 + 2 user frames; the kernel frame and `[no stack]` are not user frames.
        assert_eq!(s.user_frames, 17);

        // spanprof's folded output: a frame-pointer walk that stopped at the leaf, a stack cut
        // short under a placeholder, a stack reaching main from dispatcher as the leaf.
        let folded = "hot_alpha 7\n\
                      [truncated];dispatcher;hot_beta 2\n\
                      _start;__libc_start_main;main;dispatcher 1\n\
                      _start;__libc_start_main;main;dispatcher;hot_alpha;do_syscall_64_[k] 4\n\
                      _start;main 3\n";
        let s = unwind_shape(folded_stacks(folded));
        assert_eq!((s.samples, s.work, s.full, s.rooted), (17, 14, 5, 5));
        assert_eq!((s.alpha, s.beta), (11, 2));
        assert_eq!(s.user_frames, 7 + 2 * 2 + 4 + 4 * 5 + 3 * 2);
    }

    #[test]
    fn stack_stats_are_summed_over_processes() {
        let text = r#"{"unwind": "dwarf", "stack_copy_bytes": 16384, "processes": [
            {"pid": 12, "name": "cpu_split_nofp", "samples": 2490,
             "stacks": {"complete": 2480, "truncated": 6, "failed": 4, "unchecked": 0,
                        "reasons": {"stack copy too small": 6, "no CFI": 4}}},
            {"pid": 13, "name": "caf\u00e9 \"x\"", "samples": 10,
             "stacks": {"complete": 10, "truncated": 0, "failed": 0, "unchecked": 0,
                        "reasons": {}}}]}"#;
        let s = parse_stack_stats(text).unwrap();
        assert_eq!(s.unwind, "dwarf");
        assert_eq!(s.stack_copy_bytes, 16384);
        assert_eq!(
            (s.complete, s.truncated, s.failed, s.unchecked),
            (2490, 6, 4, 0)
        );
        assert_eq!(s.reasons.get("no CFI"), Some(&4));
        assert_eq!(s.total(), 2500);
        let fp = r#"{"unwind":"fp","processes":[{"pid":1,"name":"a","samples":3,
            "stacks":{"complete":0,"truncated":0,"failed":0,"unchecked":3,"reasons":{}}}]}"#;
        let s = parse_stack_stats(fp).unwrap();
        assert_eq!(
            (s.unwind.as_str(), s.unchecked, s.stack_copy_bytes),
            ("fp", 3, 0)
        );
        assert_eq!(
            Json::parse(r#"["\u00e9\ud83d\ude00", -1.5e3, true, null]"#).unwrap(),
            Json::Arr(vec![
                Json::Str("é😀".to_string()),
                Json::Num(-1500.0),
                Json::Bool(true),
                Json::Null
            ])
        );
        assert!(parse_stack_stats(r#"{"unwind":"dwarf"}"#).is_err());
        assert!(Json::parse(r#"{"a":1"#).is_err());
        assert!(Json::parse(r#"{"a":1} x"#).is_err());
    }
}
