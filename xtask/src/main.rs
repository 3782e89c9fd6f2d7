//! Build, test and demo tasks for spanprof: `cargo xtask <task>`.
//!
//! Overview: every task runs from the workspace root and prints what it does
//! as `xtask: ...` lines. `deps` makes a fresh Debian 12 machine ready (as
//! root it installs the missing Debian packages with apt-get and creates the
//! Python venv the tests decode pprof with), `workloads` builds the C test
//! workloads, `test` runs everything CI runs, `docs` checks that the documents
//! agree with the code, `demo` profiles a bundled workload.
//!
//! Design constraints: no network but the package registries, so everything
//! comes from Debian's packages, PyPI and crates.io; a failed step makes the
//! task exit non-zero with the failing step named.

mod bench;
mod bench_headline;
mod cache;
mod demo;
mod deps;
mod dist;
mod doc_check;
mod fuzz;
mod rootfs;
mod run;
mod workloads;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use crate::run::{cargo, is_root, step, Cmd};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  deps       install missing build and test prerequisites (Debian packages with
             apt-get when root; Python venv in target/venv with protobuf,
             grpcio-tools and py-spy)
  dist       build the release tarball and the Debian package into target/dist/
             (binary, manual pages, completions, systemd unit and configuration;
             the package's postinst gives the binary to a group spanprof with the
             profiling capabilities)
  workloads  build the C test workloads into target/workloads/
  rootfs     make the Debian sid root file system of the container and chroot
             tests in target/sid-rootfs (debootstrap; CPython 3.13, 3.14, 3.15,
             a debug 3.14, OpenTelemetry's SDK and OSProfiler for 3.14 and 3.15;
             needs root; a few minutes once, then nothing)
  test       deps, workloads, rootfs, release build, cargo fmt --check, clippy -D warnings,
             the documentation check (docs), then cargo test --workspace --release
             with the integration tests running the real binary (needs root), then
             every fuzz target for 20 s
  docs [--write-headline]
             release build, then check the documents against the code: the flag
             tables of README.md and docs/ against `spanprof SUB --help` (every flag
             exists, every stated default is the code's), relative links and their
             anchors, BENCHMARKS.md's headline table against its blocks, README.md's
             size (the daemon's key table is checked by a unit test of `cargo test`);
             --write-headline writes the headline table from the blocks first
  fuzz [--seconds N] [TARGET...]
             build the fuzz targets of fuzz/ (libFuzzer on stable Rust) and run
             each (default: all) for N seconds (default 60) from its seeds in
             fuzz/corpus/TARGET; a crash fails it, with the input saved in
             target/fuzz/artifacts/TARGET/
  golden     deps, workloads, release build, then record the five golden sessions
             anew (tests/golden/NAME: native, python, spans, offcpu, alloc; a few
             seconds each) with `spanprof profile --record`, check that each replay
             writes what the session wrote, and replace the committed recordings
             and expected outputs (needs root; see docs/development.md)
  demo       deps, release build, then profile a small Python service traced
             with OpenTelemetry (examples/demo/service.py) into demo.svg (a tower
             per endpoint) and demo.pb.gz, and print its report (needs root)
  bench [--rounds N] [--work ROUNDS] [--py-work UNITS] [--python PATH]
        [--unwind-seconds S] [--alloc-units UNITS] [--daemon-seconds S]
        [--only native|python|spans|unwind|offcpu|alloc|daemon|sid|session|dump]
        [--span-kinds both|otel|osprofiler|published]
        [--spanprof BIN]
             deps, workloads, release build, then the overhead benchmark, N
             interleaved rounds (default 8) of each part:
             native: the fixed_work target alone, under spanprof and under
               perf record -g at 99 Hz, ROUNDS units of work (default 60000,
               about 5 s);
             python: tests/workloads/bench_py_stack.py (50 Python frames deep)
               alone, under spanprof and under py-spy record at 99 Hz, UNITS
               units of work (default 450, about 5 s), run by PATH (default:
               the newest pyenv 3.12); then spanprof alone at 999 Hz for the
               in-kernel cost per sample;
             spans: tests/workloads/bench_py_span.py (the same work inside an
               OpenTelemetry span and an OSProfiler trace, libraries from
               target/span-libs/3.X) under spanprof with and without
               --no-spans, at 99 and 999 Hz: the in-kernel cost of reading
               span contexts per sample (--span-kinds otel or osprofiler: only
               that one; published: both, published by spanprof_context.install()
               as an OTEP 4947 thread context, which spanprof reads instead;
               each kind has its own block in BENCHMARKS.md);
             unwind: cpu_split_nofp (no frame pointers) alone, under spanprof
               --unwind dwarf, spanprof --unwind fp and perf record
               --call-graph dwarf at 499 Hz, S seconds each (default 5):
               stack completeness and depth, in-kernel and own CPU per
               sample, perf script's CPU and perf.data bytes per sample;
             offcpu: offcpu_pingpong (two threads, 200000 round trips through
               pipes) alone, under spanprof --event offcpu and under perf
               record -e sched:sched_switch -g: slowdown, context switches per
               second, in-kernel time per on_switch and on_sys_exit run;
             alloc: tests/workloads/py_alloc.py --bench UNITS (default 4000,
               a few seconds) alone, under spanprof --event alloc, --event
               heap and --event alloc --alloc-rate 1, and under memray run
               (PyPI memray 1.20.0, installed into target/bench-libs/3.X):
               slowdown, CPU time per allocator call, in-kernel time per run
               of each uprobe program;
             daemon: two busy tests/workloads/py_split.py (run by PATH), then
               spanprof daemon host-wide at 19 Hz (10 s windows, exported to a
               local OTLP/HTTP receiver) and perf record -F 19 -a -g, each
               measured for S seconds (default 30) after 5 s of warm-up: own
               CPU (% of a core), peak and end RSS, samples per second;
             sid: bench_py_stack.py under Debian sid's stripped python3.14 and
               python3.15 in a chroot of target/sid-rootfs (cargo xtask rootfs),
               spanprof alone at 99 and 999 Hz: in-kernel time per sample of
               the 50-frame stack, samples holding every frame;
             session: bench_py_stack.py with a 2-frame stack under spanprof,
               py-spy record and perf record -g at 99 Hz, each for 0.4 and 2
               times UNITS: a session's fixed CPU and its CPU per sample in
               steady state (the difference of the two), in-kernel time per
               sample;
             --only runs one part; --spanprof uses BIN instead of building
             target/release/spanprof. Prints the figures and updates their
             blocks in BENCHMARKS.md (needs root)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let task = args.first().map(String::as_str);
    if args.len() > 1 && !matches!(task, Some("bench" | "fuzz" | "docs")) {
        bail!("unexpected arguments after `{}`\n{USAGE}", args[0]);
    }
    match task {
        Some("deps") => deps::ensure(&root).map(|_| ()),
        Some("workloads") => workloads::build(&root).map(|_| ()),
        Some("rootfs") => {
            let env = deps::ensure(&root)?;
            rootfs::ensure(&root, &env.python).map(|_| ())
        }
        Some("test") => test(&root),
        Some("docs") => {
            match &args[1..] {
                [] => {}
                [flag] if flag == "--write-headline" => doc_check::write_headline(&root)?,
                _ => bail!("unexpected arguments after `docs`\n{USAGE}"),
            }
            doc_check::run(&root, &build_release(&root)?)
        }
        Some("dist") => dist::build(&root, &build_release(&root)?).map(|_| ()),
        Some("demo") => demo(&root),
        Some("golden") => golden(&root),
        Some("bench") => bench(&root, &args[1..]),
        Some("fuzz") => fuzz::task(&root, &args[1..]),
        Some("help" | "-h" | "--help") => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown task `{other}`\n{USAGE}"),
        None => bail!("no task given\n{USAGE}"),
    }
}

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

fn release_binary(root: &Path) -> PathBuf {
    root.join("target/release/spanprof")
}

fn build_release(root: &Path) -> Result<PathBuf> {
    build_release_in(root, None)
}

/// [`build_release`] with the cargo target directory `target_dir` (the workspace's `target/`
/// when `None`); the binary is copied to `target/release/spanprof` either way.
fn build_release_in(root: &Path, target_dir: Option<&Path>) -> Result<PathBuf> {
    step("building spanprof (release)");
    let mut build = cargo(root);
    build = build.args(["build", "--release", "-p", "spanprof"]);
    if let Some(dir) = target_dir {
        build = build.arg("--target-dir").arg(dir);
    }
    build.run()?;
    let bin = release_binary(root);
    if let Some(dir) = target_dir {
        let built = dir.join("release/spanprof");
        if let Some(parent) = bin.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        // NB: by a rename of a copy: a running spanprof of this path keeps its file.
        let partial = bin.with_extension("partial");
        std::fs::copy(&built, &partial)
            .and_then(|_| std::fs::rename(&partial, &bin))
            .with_context(|| format!("copying {} to {}", built.display(), bin.display()))?;
    }
    if !bin.is_file() {
        bail!("cargo build succeeded but {} is missing", bin.display());
    }
    Ok(bin)
}

/// `cargo install --locked --path profiler-user` as README's Install section has it, into
/// `target/install`; the installed binary must give the built one's `--version`.
fn cargo_install(root: &Path, target_dir: &Path, bin: &Path) -> Result<()> {
    step("installing: cargo install --locked --path profiler-user (README's Install)");
    let install_root = root.join("target/install");
    cargo(root)
        .args([
            "install",
            "--locked",
            "--force",
            "--path",
            "profiler-user",
            "--root",
        ])
        .arg(&install_root)
        .arg("--target-dir")
        .arg(target_dir)
        .run()?;
    let version = |b: &Path| -> Result<String> {
        let out = Cmd::new(b).arg("--version").quiet().output()?;
        if !out.status.success() {
            bail!("{} --version failed: {}", b.display(), out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let installed = install_root.join("bin/spanprof");
    let (got, want) = (version(&installed)?, version(bin)?);
    if got != want || !got.starts_with("spanprof ") {
        bail!(
            "{} --version says {got:?}, the build {want:?}",
            installed.display()
        );
    }
    println!("xtask: {} runs: {got}", installed.display());
    Ok(())
}

/// Everything CI runs. Lints and tests all run even when an earlier one
/// failed, so one CI log shows every problem; the task fails if any did.
fn test(root: &Path) -> Result<()> {
    let env = deps::ensure(root)?;
    let workloads = workloads::build(root)?;
    let rootfs = rootfs::ensure(root, &env.python)?;
    let mut failures: Vec<&str> = Vec::new();

    step("checking formatting: cargo fmt --all -- --check");
    if let Err(err) = cargo(root).args(["fmt", "--all", "--", "--check"]).run() {
        eprintln!("xtask: {err:#}");
        failures.push("cargo fmt --check");
    }

    step("checking formatting of the fuzz targets: cargo fmt --manifest-path fuzz/Cargo.toml -- --check");
    if let Err(err) = cargo(root)
        .args(["fmt", "--manifest-path", "fuzz/Cargo.toml", "--", "--check"])
        .run()
    {
        eprintln!("xtask: {err:#}");
        failures.push("cargo fmt --check (fuzz)");
    }

    // The workspace's builds (release, lints, debug tests) go to a cargo target directory in
    // the cache, held for the whole run: a fresh clone then compiles the workspace's own crates
    // only, not its ~400 dependencies (about 14 minutes of a CI run from nothing, measured:
    // 1054 s of compiling against 228 s).
    let _target_lock = cache::lock("workspace-target");
    let target_dir = cache::target_dir("workspace-target", root.join("target"));
    cache::prune(
        "workspace-target",
        &target_dir,
        cache::WORKSPACE_TARGET_LIMIT,
    );
    let bin = build_release_in(root, Some(&target_dir))?;

    step("linting: cargo clippy --workspace --all-targets -- -D warnings");
    if let Err(err) = cargo(root)
        .args(["clippy", "--workspace", "--all-targets", "--target-dir"])
        .arg(&target_dir)
        .args(["--", "-D", "warnings"])
        .run()
    {
        eprintln!("xtask: {err:#}");
        failures.push("cargo clippy");
    }

    step("linting the fuzz targets: cargo clippy --manifest-path fuzz/Cargo.toml -- -D warnings");
    if let Err(err) = cargo(root)
        .args([
            "clippy",
            "--manifest-path",
            "fuzz/Cargo.toml",
            "--all-targets",
        ])
        .arg("--target-dir")
        .arg(cache::target_dir(
            "fuzz-clippy-target",
            root.join("target/fuzz-clippy"),
        ))
        .args(["--", "-D", "warnings"])
        .run()
    {
        eprintln!("xtask: {err:#}");
        failures.push("cargo clippy (fuzz)");
    }

    step("checking the documents against the code (cargo xtask docs)");
    if let Err(err) = doc_check::run(root, &bin) {
        eprintln!("xtask: {err:#}");
        failures.push("documentation check");
    }

    // The release tarball and Debian package, which tests/tests/dist.rs installs and runs.
    let dist = match dist::build(root, &bin) {
        Ok(d) => Some(d),
        Err(err) => {
            eprintln!("xtask: {err:#}");
            failures.push("cargo xtask dist");
            None
        }
    };

    // README's install line, into a root of its own (its build is the one above: same target
    // directory, same profile), and the binary it installs runs.
    if let Err(err) = cargo_install(root, &target_dir, &bin) {
        eprintln!("xtask: {err:#}");
        failures.push("cargo install --locked --path profiler-user");
    }

    // README's first command, whose files tests/tests/demo.rs checks.
    let demo_dir = root.join("target/demo");
    if let Err(err) = demo::run(root, &bin, &env, &demo_dir) {
        eprintln!("xtask: {err:#}");
        failures.push("the demo");
    }

    step("testing: cargo test --workspace --release --no-fail-fast");
    if !is_root() {
        eprintln!("xtask: warning: not root: the integration tests that load eBPF will fail");
    }
    if let Err(err) = cargo(root)
        .args([
            "test",
            "--workspace",
            "--release",
            "--no-fail-fast",
            "--target-dir",
        ])
        .arg(&target_dir)
        .env("SPANPROF_BIN", &bin)
        .env("SPANPROF_DIST", dist.unwrap_or_default())
        .env("SPANPROF_WORKLOADS", &workloads)
        .env("SPANPROF_PYTHON", &env.python)
        .env("SPANPROF_PYSPY", &env.py_spy)
        .env("SPANPROF_FP_PYTHON", &env.fp_python)
        .env("SPANPROF_SPAN_LIBS", &env.span_libs)
        .env("SPANPROF_GOOGLE_PPROF", &env.google_pprof)
        .env("SPANPROF_ROOTFS", &rootfs)
        .env("SPANPROF_DEMO", &demo_dir)
        .run()
    {
        eprintln!("xtask: {err:#}");
        failures.push("cargo test");
    }

    // The readers of untrusted memory once more with overflow checks (a debug build): an
    // arithmetic overflow on garbage input must be a handled error, not a wrap that release
    // builds would hide.
    step("testing: cargo test -p symbolizer -p profiler-common --lib (debug, overflow checks)");
    if let Err(err) = cargo(root)
        .args([
            "test",
            "-p",
            "symbolizer",
            "-p",
            "profiler-common",
            "--lib",
            "--no-fail-fast",
            "--target-dir",
        ])
        .arg(&target_dir)
        .run()
    {
        eprintln!("xtask: {err:#}");
        failures.push("cargo test (debug)");
    }

    // Every reader of untrusted bytes under libFuzzer for a bounded time.
    match fuzz::build(root) {
        Ok(bins) => {
            if let Err(err) = fuzz::run(root, &bins, &fuzz::TARGETS, fuzz::TEST_SECONDS) {
                eprintln!("xtask: {err:#}");
                failures.push("fuzzing");
            }
        }
        Err(err) => {
            eprintln!("xtask: {err:#}");
            failures.push("fuzz build");
        }
    }

    if failures.is_empty() {
        step("all checks passed");
        Ok(())
    } else {
        bail!("failed: {}", failures.join(", "))
    }
}

/// Records the golden sessions anew: `tests/tests/replay_live.rs` with
/// `SPANPROF_GOLDEN_RECORD=1`, then the golden test against what it wrote.
fn golden(root: &Path) -> Result<()> {
    if !is_root() {
        bail!("`cargo xtask golden` needs root (it profiles the golden sessions)");
    }
    let env = deps::ensure(root)?;
    let workloads = workloads::build(root)?;
    let bin = build_release(root)?;
    for (test, record) in [("replay_live", "1"), ("golden", "0")] {
        step(&format!(
            "cargo test --release -p spanprof-tests --test {test}"
        ));
        cargo(root)
            .args(["test", "--release", "-p", "spanprof-tests", "--test", test])
            .args(["--", "--test-threads=1"])
            .env("SPANPROF_GOLDEN_RECORD", record)
            .env("SPANPROF_BIN", &bin)
            .env("SPANPROF_WORKLOADS", &workloads)
            .env("SPANPROF_PYTHON", &env.python)
            .env("SPANPROF_SPAN_LIBS", &env.span_libs)
            .run()?;
    }
    step("golden recordings written to tests/golden/: review and commit them");
    Ok(())
}

fn demo(root: &Path) -> Result<()> {
    let env = deps::ensure(root)?;
    let bin = build_release(root)?;
    if !is_root() {
        eprintln!("xtask: warning: not root: spanprof needs CAP_BPF and CAP_PERFMON");
    }
    let d = demo::run(root, &bin, &env, root)?;
    eprint!("{}", d.summary);
    print!("{}", d.report);
    step(&format!(
        "demo written:\n  flamegraph, a tower per endpoint: {}\n  pprof (spanprof report, go \
         tool pprof): {}",
        d.svg.display(),
        d.pprof.display()
    ));
    Ok(())
}

/// `bench [--rounds N] [--work ROUNDS] [--py-work UNITS] [--python PATH] [--unwind-seconds S]
/// [--alloc-units UNITS] [--daemon-seconds S] [--only PART] [--span-kinds KINDS]
/// [--spanprof BIN]`.
fn bench(root: &Path, args: &[String]) -> Result<()> {
    let mut rounds: usize = 8;
    let mut work: u64 = 60_000;
    let mut py_work: u64 = 450;
    let mut unwind_seconds: u64 = 5;
    let mut alloc_units: u64 = bench::alloc::DEFAULT_UNITS;
    let mut daemon_seconds: u64 = bench::daemon::DEFAULT_SECONDS;
    let mut python: Option<PathBuf> = None;
    let mut spanprof: Option<PathBuf> = None;
    let mut span_kinds = bench::SpanKinds::Both;
    let mut part = bench::Part::All;
    let positive = |flag: &str, value: &str| -> Result<u64> {
        value
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .with_context(|| format!("invalid {flag} `{value}`"))
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if matches!(flag.as_str(), "-h" | "--help") {
            print!("{USAGE}");
            return Ok(());
        }
        let value = it
            .next()
            .with_context(|| format!("`{flag}` needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--rounds" => rounds = positive(flag, value)? as usize,
            "--work" => work = positive(flag, value)?,
            "--py-work" => py_work = positive(flag, value)?,
            "--unwind-seconds" => unwind_seconds = positive(flag, value)?,
            "--alloc-units" => alloc_units = positive(flag, value)?,
            "--daemon-seconds" => daemon_seconds = positive(flag, value)?,
            "--python" => python = Some(PathBuf::from(value)),
            "--spanprof" => spanprof = Some(PathBuf::from(value)),
            "--span-kinds" => {
                span_kinds = match value.as_str() {
                    "both" => bench::SpanKinds::Both,
                    "otel" => bench::SpanKinds::Otel,
                    "osprofiler" => bench::SpanKinds::Osprofiler,
                    "published" => bench::SpanKinds::Published,
                    other => bail!(
                        "invalid --span-kinds `{other}` (both, otel, osprofiler or published)"
                    ),
                }
            }
            "--only" => {
                part = match value.as_str() {
                    "native" => bench::Part::Native,
                    "python" => bench::Part::Python,
                    "spans" => bench::Part::Spans,
                    "unwind" => bench::Part::Unwind,
                    "offcpu" => bench::Part::Offcpu,
                    "alloc" => bench::Part::Alloc,
                    "daemon" => bench::Part::Daemon,
                    "sid" => bench::Part::Sid,
                    "session" => bench::Part::Session,
                    "dump" => bench::Part::Dump,
                    other => {
                        bail!(
                            "invalid --only `{other}` (native, python, spans, unwind, offcpu, \
                             alloc, daemon, sid, session or dump)"
                        )
                    }
                }
            }
            other => bail!("unknown bench option `{other}`\n{USAGE}"),
        }
    }
    if unwind_seconds > 3600 {
        bail!("invalid --unwind-seconds `{unwind_seconds}` (1 to 3600)");
    }
    if daemon_seconds > 3600 {
        bail!("invalid --daemon-seconds `{daemon_seconds}` (1 to 3600)");
    }
    if !is_root() {
        bail!("`cargo xtask bench` needs root (eBPF, perf, kernel.bpf_stats_enabled)");
    }
    let python = match python {
        Some(p) => p,
        None => bench::default_python()
            .context("no pyenv CPython 3.12 (~/.pyenv/versions/3.12.*); pass --python PATH")?,
    };
    let env = deps::ensure(root)?;
    // Only the native, unwind and offcpu parts run C workloads.
    let workloads = match part {
        bench::Part::All | bench::Part::Native | bench::Part::Unwind | bench::Part::Offcpu => {
            Some(workloads::build(root)?)
        }
        bench::Part::Python
        | bench::Part::Spans
        | bench::Part::Alloc
        | bench::Part::Daemon
        | bench::Part::Sid
        | bench::Part::Session
        | bench::Part::Dump => None,
    };
    let bin = match spanprof {
        Some(bin) if bin.is_file() => bin,
        Some(bin) => bail!("--spanprof {}: no such file", bin.display()),
        None => build_release(root)?,
    };
    let cfg = bench::Config {
        rounds,
        part,
        work,
        py_work,
        unwind_seconds,
        python,
        py_spy: env.py_spy,
        span_libs: env.span_libs,
        span_kinds,
        alloc_units,
        daemon_seconds,
        venv_python: env.python,
    };
    bench::run(root, &bin, workloads.as_deref(), &cfg)
}
