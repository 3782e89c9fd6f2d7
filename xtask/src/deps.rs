//! `cargo xtask deps`: the machine-level prerequisites of building and testing.
//!
//! Debian packages come from apt-get (only when root, and only the missing
//! ones); the Python packages of the independent pprof decoder, and py-spy
//! (the reference the Python-stack tests compare with), go into a venv in
//! `target/venv` so the system Python stays untouched.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::run::{is_root, step, Cmd};

/// Debian packages the build and the tests need, and why.
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("clang-19", "compiles the eBPF programs"),
    ("libbpf-dev", "bpf_helpers.h and friends"),
    (
        "bpftool",
        "reads the kernel's BPF run-time statistics in benchmarks",
    ),
    ("linux-perf", "the reference profiler in benchmarks"),
    ("chromium", "renders the flamegraph SVG in tests"),
    ("python3-venv", "the venv of the pprof decoder"),
    (
        "gcc",
        "builds the C test workloads and the frame-pointer CPython",
    ),
    ("make", "builds the frame-pointer CPython"),
    (
        "curl",
        "downloads the CPython source the frame-pointer build uses",
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

/// PyPI packages of `tests/tools/decode_pprof.py`, and py-spy (a binary in
/// the venv's `bin/`), and the modules that prove the Python ones are installed.
const PYTHON_PACKAGES: &[&str] = &["protobuf", "grpcio-tools", PY_SPY_PACKAGE];
const PYTHON_PROBE: &str = "import google.protobuf, grpc_tools.protoc";
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
}

pub fn ensure(root: &Path) -> Result<Env> {
    debian_packages()?;
    let (python, py_spy) = python_venv(root)?;
    let fp_python = frame_pointer_python(root)?;
    Ok(Env {
        python,
        py_spy,
        fp_python,
    })
}

/// Builds (once, into `target/fp-python`) CPython 3.11 with frame pointers; ~3 minutes on 2
/// CPUs. Only the interpreter and its pure-Python library: no optional extension modules
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
    let build = root.join("target/fp-python-build");
    if build.exists() {
        std::fs::remove_dir_all(&build).with_context(|| format!("removing {}", build.display()))?;
    }
    if prefix.exists() {
        std::fs::remove_dir_all(&prefix)
            .with_context(|| format!("removing {}", prefix.display()))?;
    }
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
