//! `cargo xtask deps`: the machine-level prerequisites of building and testing.
//!
//! Debian packages come from apt-get (only when root, and only the missing
//! ones); the Python packages of the independent pprof decoder, and py-spy
//! (the reference the Python-stack tests compare with), go into a venv in
//! `target/venv` so the system Python stays untouched. The tracing libraries
//! the span-correlation tests run in their workloads (OpenTelemetry's SDK and
//! OSProfiler) go, per pyenv CPython 3.8–3.13, into `target/span-libs/3.X`
//! (`pip install --target`), which the workloads get as their `PYTHONPATH`.
//! memray, the reference of the allocation benchmark, is installed the same way into
//! `target/bench-libs/3.X`, by the benchmark itself and for its interpreter only ([`memray`]).
//! Google's pprof, the tool pprof files are checked with, is built from Debian's source into
//! `target/tools/pprof` ([`google_pprof`]).
//!
//! Every step checks first and does nothing when its result is there and works, so a second
//! run takes a few seconds. Runs of this task (alone, or inside `test`, `demo` and `bench`) in
//! the same workspace at the same time take turns on a lock file, `target/.xtask-deps.lock`:
//! they share the directories they fill (two concurrent installs of `spanprof-context` once
//! removed each other's build copy: `removing target/span-libs/3.10.spanprof-context-src: No
//! such file or directory`).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cache;
use crate::run::{is_root, step, Cmd};

/// Debian packages the build and the tests need, and why.
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("clang-19", "compiles the eBPF programs"),
    ("libbpf-dev", "bpf_helpers.h and friends"),
    (
        "bpftool",
        "links the eBPF units into one object (bpftool gen object); BPF run-time statistics in benchmarks",
    ),
    ("linux-perf", "the reference profiler in benchmarks"),
    (
        "python3.11-dev",
        "headers of Debian's python3.11 for the C extension workload of the unwinding tests",
    ),
    ("chromium", "renders the flamegraph SVG in tests"),
    ("python3-venv", "the venv of the pprof decoder"),
    (
        "openssl",
        "makes the CA and server certificates of the OTLP TLS test",
    ),
    (
        "gcc",
        "builds the C test workloads and the frame-pointer CPython",
    ),
    (
        "g++",
        "builds the C++ workload of the unwinding tests (nofp_strings)",
    ),
    ("make", "builds the frame-pointer CPython"),
    (
        "curl",
        "downloads the CPython source the frame-pointer build uses",
    ),
    (
        "debuginfod",
        "the debuginfod server the symbolization tests fetch debug files from",
    ),
    (
        "golang-go",
        "builds Google's pprof, the reader the symbolization tests check pprof files with",
    ),
    ("zsh", "loads the zsh completions spanprof generates"),
    ("fish", "runs the fish completions spanprof generates"),
    ("man-db", "renders the manual pages spanprof generates (man -l)"),
    ("tmux", "the terminal `spanprof top` is tested in (send-keys, capture-pane)"),
    (
        "libcap2-bin",
        "setcap, which the package test copies into the rootfs for the postinst (cargo xtask dist)",
    ),
    ("binutils", "objcopy and objdump: cargo xtask dist strips the binary, reads its glibc needs"),
    (
        "golang-github-google-pprof-dev",
        "the source of Google's pprof (the pprof bundled with Go 1.19 misreads local build ids)",
    ),
];

/// CPython 3.11 built with frame pointers, as Fedora, Ubuntu 24.04 and others ship it: the
/// tests of mixed native/Python stacks through the interpreter need one, and neither pyenv's
/// nor Debian's builds keep frame pointers. The source is Debian's upstream tarball (Debian
/// is reachable where python.org may not be), checked by its SHA-256 from Debian's `Sources`.
const FP_PYTHON_URL: &str =
    "https://deb.debian.org/debian/pool/main/p/python3.11/python3.11_3.11.2.orig.tar.gz";
const FP_PYTHON_SHA256: &str = "2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849";
const FP_PYTHON_DIR: &str = "Python-3.11.2";
const FP_PYTHON_CFLAGS: &str = "-O2 -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer";

/// PyPI packages of the tests' venv: `protobuf` and `grpcio-tools` for
/// `tests/tools/decode_pprof.py`; `opentelemetry-proto` (the OTLP profiles messages of
/// OpenTelemetry proto v1.10.0, `v1development`; it needs protobuf >= 5, < 8) for
/// `tests/tools/decode_otlp.py` and `tests/tools/otlp_http_sink.py`; PyYAML to read the
/// example GitHub workflow (`examples/ci/`); and py-spy (a binary
/// in the venv's `bin/`). The probe imports the modules that prove the Python ones are
/// installed; the venv counts as ready only when it succeeds.
const PYTHON_PACKAGES: &[&str] = &[
    "protobuf",
    "grpcio-tools",
    "opentelemetry-proto==1.45.2",
    "PyYAML",
    PY_SPY_PACKAGE,
];
const PYTHON_PROBE: &str = "import google.protobuf, grpc_tools.protoc, yaml, \
    opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2";
/// The py-spy release the Python-stack tests are checked against (the same
/// version as the py-spy crate of the workspace).
const PY_SPY_PACKAGE: &str = "py-spy==0.4.3";

/// What later steps need from the prepared machine.
#[derive(Debug)]
pub struct Env {
    /// The venv's interpreter, with protobuf and grpcio-tools.
    pub python: PathBuf,
    /// The venv's py-spy.
    pub py_spy: PathBuf,
    /// CPython 3.11 built with frame pointers.
    pub fp_python: PathBuf,
    /// `target/span-libs`: one `3.X` directory of tracing libraries per pyenv CPython.
    pub span_libs: PathBuf,
    /// Google's pprof, built from Debian's source ([`google_pprof`]).
    pub google_pprof: PathBuf,
}

pub fn ensure(root: &Path) -> Result<Env> {
    let _lock = lock(root)?;
    debian_packages()?;
    let (python, py_spy) = python_venv(root)?;
    let fp_python = frame_pointer_python(root)?;
    let span_libs = span_libs(root)?;
    let google_pprof = google_pprof(root)?;
    Ok(Env {
        python,
        py_spy,
        fp_python,
        span_libs,
        google_pprof,
    })
}

/// Google's pprof, built into `target/tools/pprof` from Debian's
/// `golang-github-google-pprof-dev` source (GOPATH mode: Debian's Go packages are a GOPATH
/// tree) by Debian's Go, with its build cache in `target/tools/go-cache`. A build takes a few
/// seconds; one that runs is kept.
fn google_pprof(root: &Path) -> Result<PathBuf> {
    let tools = root.join("target/tools");
    let pprof = tools.join("pprof");
    let works = || Cmd::new(&pprof).arg("-h").quiet().succeeds();
    if pprof.is_file() && works() {
        step(&format!("Google's pprof ready: {}", pprof.display()));
        return Ok(pprof);
    }
    std::fs::create_dir_all(&tools).with_context(|| format!("creating {}", tools.display()))?;
    step(&format!(
        "building Google's pprof from /usr/share/gocode into {}",
        pprof.display()
    ));
    Cmd::new("go")
        .args(["build", "-o"])
        .arg(&pprof)
        .arg("github.com/google/pprof")
        .env("GO111MODULE", "off")
        .env("GOPATH", "/usr/share/gocode")
        .env("GOCACHE", tools.join("go-cache"))
        .env("GOFLAGS", "")
        .run()?;
    if !works() {
        bail!("{} was built but `pprof -h` fails", pprof.display());
    }
    Ok(pprof)
}

/// Takes the lock of this task (`target/.xtask-deps.lock`), waiting, with a message, while
/// another process holds it; released when the file is dropped (or the process ends).
fn lock(root: &Path) -> Result<File> {
    let target = root.join("target");
    std::fs::create_dir_all(&target).with_context(|| format!("creating {}", target.display()))?;
    let path = target.join(".xtask-deps.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            step(&format!(
                "waiting for another `cargo xtask deps` (or test, demo, bench) of this workspace \
                 to finish ({})",
                path.display()
            ));
            file.lock()
                .with_context(|| format!("locking {}", path.display()))?;
        }
        Err(TryLockError::Error(err)) => {
            return Err(err).with_context(|| format!("locking {}", path.display()));
        }
    }
    Ok(file)
}

/// Removes the directory `dir` and everything in it; nothing to do when it does not exist.
fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err).with_context(|| format!("removing {}", dir.display())),
    }
}

/// Builds (once, into `target/fp-python`, or copies from the cache: `cache.rs`) CPython 3.11
/// with frame pointers; ~3 minutes on 2 CPUs. Only the interpreter and its pure-Python library: no optional extension modules
/// whose development packages would be needed.
fn frame_pointer_python(root: &Path) -> Result<PathBuf> {
    let prefix = root.join("target/fp-python");
    let python = prefix.join("bin/python3.11");
    // What the build was made from: a change of source or flags rebuilds it.
    let stamp = prefix.join("spanprof-build-stamp");
    let want_stamp = format!("{FP_PYTHON_URL}\n{FP_PYTHON_SHA256}\n{FP_PYTHON_CFLAGS}\n");
    let works = || {
        Cmd::new(&python)
            .args(["-c", "import sys, json, asyncio, subprocess, ctypes"])
            .quiet()
            .succeeds()
    };
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want_stamp) && works() {
        step(&format!(
            "frame-pointer CPython ready: {}",
            python.display()
        ));
        return Ok(python);
    }
    if cache::restore("fp-python", &prefix, "spanprof-build-stamp", &want_stamp) && works() {
        step(&format!(
            "frame-pointer CPython ready: {}",
            python.display()
        ));
        return Ok(python);
    }
    let build = root.join("target/fp-python-build");
    remove_dir(&build)?;
    remove_dir(&prefix)?;
    std::fs::create_dir_all(&build)?;
    let tarball = build.join("python.tar.gz");
    step(&format!("downloading {FP_PYTHON_URL}"));
    Cmd::new("curl")
        .args(["-fsSL", "--retry", "3", "-o"])
        .arg(&tarball)
        .arg(FP_PYTHON_URL)
        .run()?;
    let sum = Cmd::new("sha256sum").arg(&tarball).quiet().output()?;
    let sum = String::from_utf8_lossy(&sum.stdout);
    if sum.split_whitespace().next() != Some(FP_PYTHON_SHA256) {
        bail!("{FP_PYTHON_URL}: SHA-256 {sum} is not the expected {FP_PYTHON_SHA256}");
    }
    Cmd::new("tar")
        .args(["xzf", "python.tar.gz"])
        .current_dir(&build)
        .run()?;
    let src = build.join(FP_PYTHON_DIR);
    step(&format!(
        "building CPython 3.11 with {FP_PYTHON_CFLAGS} into {} (a few minutes)",
        prefix.display()
    ));
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    let configure = Cmd::new("./configure")
        .arg(format!("--prefix={}", prefix.display()))
        .arg(format!("CFLAGS={FP_PYTHON_CFLAGS}"))
        .args(["--without-ensurepip", "--disable-test-modules"]);
    let make = Cmd::new("make").arg(format!("-j{jobs}"));
    let install = Cmd::new("make").arg("install");
    for (what, cmd) in [
        ("configure", configure),
        ("make", make),
        ("install", install),
    ] {
        // Compiler output would drown the CI log: it goes to a file, shown in part on failure
        // (the build directory is kept then).
        let out = cmd.current_dir(&src).output()?;
        let log = build.join(format!("{what}.log"));
        let mut text = out.stdout.clone();
        text.extend_from_slice(&out.stderr);
        std::fs::write(&log, &text)?;
        if !out.status.success() {
            let text = String::from_utf8_lossy(&text);
            let errors: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("error") || l.contains("Error"))
                .take(20)
                .collect();
            bail!(
                "CPython {what} failed ({}); full log: {}\n{}",
                out.status,
                log.display(),
                errors.join("\n")
            );
        }
    }
    std::fs::remove_dir_all(&build).ok();
    if !works() {
        bail!(
            "the frame-pointer CPython at {} does not run",
            python.display()
        );
    }
    std::fs::write(&stamp, want_stamp)?;
    cache::store("fp-python", &prefix);
    Ok(python)
}

fn is_installed(package: &str) -> Result<bool> {
    let out = Cmd::new("dpkg")
        .args(["-s", package])
        .quiet()
        .output()
        .context("failed to run dpkg (cargo xtask deps supports Debian-based machines)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(out.status.success()
        && stdout
            .lines()
            .any(|line| line.trim() == "Status: install ok installed"))
}

fn missing_packages() -> Result<Vec<&'static str>> {
    let mut missing = Vec::new();
    for (package, _) in DEBIAN_PACKAGES {
        if !is_installed(package)? {
            missing.push(*package);
        }
    }
    Ok(missing)
}

fn debian_packages() -> Result<()> {
    step("checking Debian packages");
    let missing = missing_packages()?;
    if missing.is_empty() {
        step(&format!(
            "all {} Debian packages are installed",
            DEBIAN_PACKAGES.len()
        ));
        return Ok(());
    }
    for (package, why) in DEBIAN_PACKAGES {
        if missing.contains(package) {
            step(&format!("  missing: {package} ({why})"));
        }
    }
    if !is_root() {
        bail!(
            "missing Debian packages: {list}; run this task as root to install them, or run \
             `apt-get install -y {list}`",
            list = missing.join(" ")
        );
    }
    step("installing the missing Debian packages with apt-get");
    Cmd::new("apt-get")
        .args(["update"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .run()?;
    Cmd::new("apt-get")
        .args(["install", "-y"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .run()?;
    let still = missing_packages()?;
    if !still.is_empty() {
        bail!(
            "apt-get finished but these packages are still not installed: {}",
            still.join(" ")
        );
    }
    step(&format!("installed: {}", missing.join(" ")));
    Ok(())
}

/// True when the venv's Python modules import and its py-spy runs.
fn venv_ready(python: &Path, py_spy: &Path) -> bool {
    python.is_file()
        && Cmd::new(python).args(["-c", PYTHON_PROBE]).succeeds()
        && py_spy.is_file()
        && Cmd::new(py_spy).args(["--version"]).succeeds()
}

fn python_venv(root: &Path) -> Result<(PathBuf, PathBuf)> {
    let venv = root.join("target/venv");
    let python = venv.join("bin/python");
    let py_spy = venv.join("bin/py-spy");
    if venv_ready(&python, &py_spy) {
        step(&format!(
            "Python venv ready: {} ({})",
            venv.display(),
            PYTHON_PACKAGES.join(", ")
        ));
        return Ok((python, py_spy));
    }
    // NB: Debian's interpreter, not a pyenv shim that may be first in PATH:
    // the venv must outlive changes to the user's Python set-up.
    let base = if Path::new("/usr/bin/python3").is_file() {
        PathBuf::from("/usr/bin/python3")
    } else {
        PathBuf::from("python3")
    };
    if !python.is_file() {
        step(&format!("creating the Python venv {}", venv.display()));
        Cmd::new(&base).args(["-m", "venv"]).arg(&venv).run()?;
    }
    step(&format!(
        "installing {} into the venv",
        PYTHON_PACKAGES.join(", ")
    ));
    Cmd::new(&python)
        .args(["-m", "pip", "install", "--quiet"])
        .args(PYTHON_PACKAGES)
        .run()?;
    if !venv_ready(&python, &py_spy) {
        bail!(
            "after pip install, the venv's Python still cannot `{PYTHON_PROBE}` or {} does not run",
            py_spy.display()
        );
    }
    step("Python venv ready");
    Ok((python, py_spy))
}

/// The tracing libraries of the span-correlation tests (`tests/tests/spans/`), per CPython
/// minor version: the newest releases that install on it (the SDK brings
/// `opentelemetry-api`; OSProfiler brings oslo.* and the rest of its requirements), and
/// `opentelemetry-proto` of the same release as the SDK (with protobuf), which the unit tests of
/// `python/spanprof-context` check the process context's encoding against, and its OTLP/HTTP
/// span exporter, which OSProfiler's OTLP driver exports with (`osprofiler_otlp_links`). Pinned so that the
/// in-memory layouts spanprof reads do not change under the tests; their own dependencies are
/// left to pip. All of them install on every version 3.8–3.13, from wheels (no compiler
/// needed). 3.11 and 3.13 also get eventlet and gevent (with greenlet), for the green-thread
/// tests.
const SPAN_LIBS: &[(u8, &[&str])] = &[
    (
        8,
        &[
            "opentelemetry-sdk==1.33.1",
            "opentelemetry-proto==1.33.1",
            "opentelemetry-exporter-otlp-proto-http==1.33.1",
            "osprofiler==4.2.0",
        ],
    ),
    (
        9,
        &[
            "opentelemetry-sdk==1.41.1",
            "opentelemetry-proto==1.41.1",
            "opentelemetry-exporter-otlp-proto-http==1.41.1",
            "osprofiler==4.3.0",
        ],
    ),
    (
        10,
        &[
            "opentelemetry-sdk==1.45.2",
            "opentelemetry-proto==1.45.2",
            "opentelemetry-exporter-otlp-proto-http==1.45.2",
            "osprofiler==4.4.0",
        ],
    ),
    (
        11,
        &[
            "opentelemetry-sdk==1.45.2",
            "opentelemetry-proto==1.45.2",
            "opentelemetry-exporter-otlp-proto-http==1.45.2",
            "osprofiler==4.4.0",
            "eventlet==0.41.3",
            "gevent==26.9.0",
            "greenlet==3.5.6",
        ],
    ),
    (
        12,
        &[
            "opentelemetry-sdk==1.45.2",
            "opentelemetry-proto==1.45.2",
            "opentelemetry-exporter-otlp-proto-http==1.45.2",
            "osprofiler==4.4.0",
        ],
    ),
    (
        13,
        &[
            "opentelemetry-sdk==1.45.2",
            "opentelemetry-proto==1.45.2",
            "opentelemetry-exporter-otlp-proto-http==1.45.2",
            "osprofiler==4.4.0",
            "eventlet==0.41.3",
            "gevent==26.9.0",
            "greenlet==3.5.6",
        ],
    ),
];
/// What proves a `target/span-libs/3.X` directory usable by its interpreter.
const SPAN_LIBS_PROBE: &str = "import opentelemetry.sdk.trace, opentelemetry.trace, \
     osprofiler.profiler, opentelemetry.proto.resource.v1.resource_pb2, \
     opentelemetry.exporter.otlp.proto.http.trace_exporter";

/// The pyenv build of CPython 3.`minor`, the highest patch release, found as the tests find it
/// (`PYENV_ROOT`, else `/root/.pyenv`).
pub(crate) fn pyenv_python(minor: u8) -> Option<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/root/.pyenv"), PathBuf::from);
    let prefix = format!("3.{minor}.");
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(root.join("versions"))
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let patch = entry
                .file_name()
                .to_str()?
                .strip_prefix(&prefix)?
                .parse()
                .ok()?;
            let bin = entry.path().join(format!("bin/python3.{minor}"));
            bin.is_file().then_some((patch, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// What proves the green-thread libraries usable, where they are installed.
const GREEN_LIBS_PROBE: &str = "import eventlet.corolocal, gevent.local, greenlet._greenlet";

/// True when `python` imports the tracing libraries from `dir` (and the green-thread ones, when
/// `packages` has them).
fn span_libs_work(python: &Path, dir: &Path, packages: &[&str]) -> bool {
    let probe = if packages.iter().any(|p| p.starts_with("gevent==")) {
        format!("{SPAN_LIBS_PROBE}; {GREEN_LIBS_PROBE}")
    } else {
        SPAN_LIBS_PROBE.to_owned()
    };
    Cmd::new(python)
        .args(["-c", &probe])
        .env("PYTHONPATH", dir)
        .env("PYTHONNOUSERSITE", "1")
        .succeeds()
}

/// Where the tracing libraries go: `SPANPROF_SPAN_LIBS` (where the tests look for them too),
/// else `target/span-libs`.
fn span_libs_base(root: &Path) -> Result<PathBuf> {
    match std::env::var_os("SPANPROF_SPAN_LIBS") {
        Some(dir) if !dir.is_empty() => Ok(std::env::current_dir()
            .context("the current directory")?
            .join(dir)),
        _ => Ok(root.join("target/span-libs")),
    }
}

/// Removes what an interrupted run left in `base`: `3.X.partial` (a pip install of the tracing
/// libraries), `3.X.old` (the directory it replaces) and `*.spanprof-context-src.PID` (a build
/// copy of `spanprof-context`). Only while holding the lock, so nothing there belongs to a
/// running install.
fn remove_leftovers(base: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(base) {
        Ok(entries) => entries,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err).with_context(|| format!("reading {}", base.display())),
    };
    for entry in entries {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".partial")
            || name.ends_with(".old")
            || name.contains(".spanprof-context-src")
        {
            step(&format!("removing the leftover {}", path.display()));
            remove_dir(&path)?;
        }
    }
    Ok(())
}

/// Installs (once) the tracing libraries for each pyenv CPython 3.8–3.13 into
/// `target/span-libs/3.X`; a stamp file (interpreter and packages) makes a later run a quick
/// import check. A missing pyenv version is skipped with a warning (its tests fail, saying so).
fn span_libs(root: &Path) -> Result<PathBuf> {
    let base = span_libs_base(root)?;
    remove_leftovers(&base)?;
    let mut ready = Vec::new();
    for (minor, packages) in SPAN_LIBS {
        let Some(python) = pyenv_python(*minor) else {
            eprintln!(
                "xtask: warning: no pyenv CPython 3.{minor}: no tracing libraries for it \
                 (`pyenv install 3.{minor}`); its span tests will fail"
            );
            continue;
        };
        let dir = base.join(format!("3.{minor}"));
        let stamp = dir.join("spanprof-stamp");
        let want_stamp = format!("{}\n{}\n", python.display(), packages.join(" "));
        if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want_stamp)
            && span_libs_work(&python, &dir, packages)
        {
            spanprof_context_lib(root, &python, &dir)?;
            ready.push(format!("3.{minor}"));
            continue;
        }
        // Into a fresh directory, with spanprof-context, swapped in once it all works: an
        // interrupted or failed install never leaves a half-filled `3.X` behind a valid-looking
        // stamp, and a test using the old `3.X` meanwhile keeps it until the swap.
        let partial = base.join(format!("3.{minor}.partial"));
        remove_dir(&partial)?;
        std::fs::create_dir_all(&partial)
            .with_context(|| format!("creating {}", partial.display()))?;
        step(&format!(
            "installing {} for CPython 3.{minor} into {}",
            packages.join(", "),
            dir.display()
        ));
        Cmd::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-warn-script-location",
                "--target",
            ])
            .arg(&partial)
            .args(*packages)
            .env("PIP_NO_INPUT", "1")
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .env("PYTHONNOUSERSITE", "1")
            .run()
            .with_context(|| format!("installing the tracing libraries for CPython 3.{minor}"))?;
        if !span_libs_work(&python, &partial, packages) {
            bail!(
                "after pip install, {} cannot `{SPAN_LIBS_PROBE}` (and, with eventlet and \
                 gevent, `{GREEN_LIBS_PROBE}`) with PYTHONPATH={}",
                python.display(),
                partial.display()
            );
        }
        std::fs::write(partial.join("spanprof-stamp"), want_stamp)?;
        spanprof_context_lib(root, &python, &partial)?;
        let old = base.join(format!("3.{minor}.old"));
        remove_dir(&old)?;
        match std::fs::rename(&dir, &old) {
            Ok(()) => {}
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Err(err) => {
                return Err(err)
                    .with_context(|| format!("moving {} to {}", dir.display(), old.display()))
            }
        }
        std::fs::rename(&partial, &dir)
            .with_context(|| format!("moving {} to {}", partial.display(), dir.display()))?;
        remove_dir(&old)?;
        ready.push(format!("3.{minor}"));
    }
    step(&format!(
        "tracing libraries (OpenTelemetry SDK, OSProfiler) ready in {} for CPython {}",
        base.display(),
        ready.join(", ")
    ));
    Ok(base)
}

/// The source of the `spanprof-context` Python package (the OTEP 4947/4719 context publisher),
/// relative to the workspace root.
const SPANPROF_CONTEXT_DIR: &str = "python/spanprof-context";
/// What proves it installed and its extension loads.
const SPANPROF_CONTEXT_PROBE: &str = "import spanprof_context, spanprof_context._native";

/// The files of `python/spanprof-context` that make up the installed package (the build
/// configuration and `src/`; not the tests, the benchmark or build leftovers), sorted.
fn spanprof_context_sources(src: &Path) -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name == "__pycache__" || name.ends_with(".egg-info") || name.ends_with(".so") {
                continue;
            }
            if path.is_dir() {
                walk(&path, out)?;
            } else {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut files: Vec<PathBuf> = ["pyproject.toml", "setup.py", "README.md"]
        .iter()
        .map(|f| src.join(f))
        .collect();
    walk(&src.join("src"), &mut files)?;
    files.sort();
    Ok(files)
}

/// Installs (once per change of its sources) the `spanprof-context` package into the
/// `target/span-libs/3.X` directory `dir` with `python`'s pip, after the tracing libraries.
/// Its stamp (`spanprof-context-stamp`: the interpreter and an FNV-1a hash of the package's
/// source files) makes a later run a quick import check. pip builds the C extension from a
/// fresh copy of the sources under `target/span-libs`, so the source tree gets no `build/`
/// directory; the build backend (setuptools) comes from PyPI through pip's build isolation.
fn spanprof_context_lib(root: &Path, python: &Path, dir: &Path) -> Result<()> {
    let src = root.join(SPANPROF_CONTEXT_DIR);
    let files = spanprof_context_sources(&src)?;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap_or(file);
        let data = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        for b in rel
            .to_string_lossy()
            .bytes()
            .chain([0])
            .chain(data)
            .chain([0])
        {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    let stamp = dir.join("spanprof-context-stamp");
    let want_stamp = format!("{}\n{hash:016x}\n", python.display());
    let works = || {
        Cmd::new(python)
            .args(["-c", SPANPROF_CONTEXT_PROBE])
            .env("PYTHONPATH", dir)
            .env("PYTHONNOUSERSITE", "1")
            .succeeds()
    };
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want_stamp) && works() {
        return Ok(());
    }
    // Named after this process too: even without the lock, no other run can remove it.
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("3.X");
    let copy = dir.with_file_name(format!(
        "{name}.spanprof-context-src.{}",
        std::process::id()
    ));
    remove_dir(&copy)?;
    for file in &files {
        let to = copy.join(file.strip_prefix(&src).unwrap_or(file));
        std::fs::create_dir_all(to.parent().unwrap_or(&copy))?;
        std::fs::copy(file, &to).with_context(|| format!("copying {}", file.display()))?;
    }
    let _ = std::fs::remove_file(&stamp);
    step(&format!(
        "installing spanprof-context ({SPANPROF_CONTEXT_DIR}) into {}",
        dir.display()
    ));
    let installed = Cmd::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "--no-deps",
            "--upgrade",
            "--target",
        ])
        .arg(dir)
        .arg(&copy)
        .env("PIP_NO_INPUT", "1")
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .env("PYTHONNOUSERSITE", "1")
        .run()
        .with_context(|| format!("installing spanprof-context into {}", dir.display()));
    let removed = remove_dir(&copy);
    installed?;
    removed?;
    if !works() {
        bail!(
            "after pip install, {} cannot `{SPANPROF_CONTEXT_PROBE}` with PYTHONPATH={}",
            python.display(),
            dir.display()
        );
    }
    std::fs::write(&stamp, want_stamp)?;
    Ok(())
}

/// memray, the reference profiler of the allocation benchmark (`cargo xtask bench --only
/// alloc`), pinned. Its extension module is built for one CPython version, and the bench runs
/// its target with a pyenv CPython (one with arena symbols, which spanprof needs to see small
/// objects) rather than the venv's Debian python3.11, so it is installed per interpreter, like
/// the tracing libraries: `pip install --target target/bench-libs/3.X`, given to the target as
/// `PYTHONPATH`. Only the bench installs it ([`memray`]); `cargo xtask deps` and the tests do
/// not need it.
const MEMRAY_PACKAGE: &str = "memray==1.20.0";
/// What proves a `target/bench-libs/3.X` directory usable by its interpreter.
const MEMRAY_PROBE: &str = "import memray, memray.commands";

/// Installs (once) [`MEMRAY_PACKAGE`] for `python` into `target/bench-libs/3.X` (3.X its
/// version) and returns that directory, for `PYTHONPATH`. A stamp file (interpreter and
/// package) makes a later run a quick import check; the install goes into `3.X.partial`,
/// renamed once `python` imports memray from it, so an interrupted install leaves no
/// half-filled directory behind a valid stamp.
pub fn memray(root: &Path, python: &Path) -> Result<PathBuf> {
    let _lock = lock(root)?;
    let version = Cmd::new(python)
        .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .quiet()
        .output()?;
    if !version.status.success() {
        bail!("{} cannot tell its version", python.display());
    }
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let base = root.join("target/bench-libs");
    let dir = base.join(&version);
    let stamp = dir.join("spanprof-stamp");
    let want_stamp = format!("{}\n{MEMRAY_PACKAGE}\n", python.display());
    let works = |dir: &Path| {
        Cmd::new(python)
            .args(["-c", MEMRAY_PROBE])
            .env("PYTHONPATH", dir)
            .env("PYTHONNOUSERSITE", "1")
            .quiet()
            .succeeds()
    };
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want_stamp) && works(&dir) {
        step(&format!("memray ready in {}", dir.display()));
        return Ok(dir);
    }
    let partial = base.join(format!("{version}.partial"));
    remove_dir(&partial)?;
    std::fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    step(&format!(
        "installing {MEMRAY_PACKAGE} for {} into {}",
        python.display(),
        dir.display()
    ));
    Cmd::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "--target",
        ])
        .arg(&partial)
        .arg(MEMRAY_PACKAGE)
        .env("PIP_NO_INPUT", "1")
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .env("PYTHONNOUSERSITE", "1")
        .run()
        .with_context(|| format!("installing {MEMRAY_PACKAGE} for {}", python.display()))?;
    if !works(&partial) {
        bail!(
            "after pip install, {} cannot `{MEMRAY_PROBE}` with PYTHONPATH={}",
            python.display(),
            partial.display()
        );
    }
    std::fs::write(partial.join("spanprof-stamp"), want_stamp)?;
    remove_dir(&dir)?;
    std::fs::rename(&partial, &dir)
        .with_context(|| format!("moving {} to {}", partial.display(), dir.display()))?;
    Ok(dir)
}
