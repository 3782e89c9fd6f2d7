//! `cargo xtask deps`: the machine-level prerequisites of building and testing.
//!
//! Debian packages come from apt-get (only when root, and only the missing
//! ones); the Python packages of the independent pprof decoder go into a venv
//! in `target/venv` so the system Python stays untouched.

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
    ("gcc", "builds the C test workloads"),
];

/// PyPI packages of `tests/tools/decode_pprof.py`, and the modules that prove
/// they are installed.
const PYTHON_PACKAGES: &[&str] = &["protobuf", "grpcio-tools"];
const PYTHON_PROBE: &str = "import google.protobuf, grpc_tools.protoc";

/// What later steps need from the prepared machine.
#[derive(Debug)]
pub struct Env {
    /// The venv's interpreter, with protobuf and grpcio-tools.
    pub python: PathBuf,
}

pub fn ensure(root: &Path) -> Result<Env> {
    debian_packages()?;
    let python = python_venv(root)?;
    Ok(Env { python })
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

fn python_venv(root: &Path) -> Result<PathBuf> {
    let venv = root.join("target/venv");
    let python = venv.join("bin/python");
    if python.is_file() && Cmd::new(&python).args(["-c", PYTHON_PROBE]).succeeds() {
        step(&format!(
            "Python venv ready: {} ({})",
            venv.display(),
            PYTHON_PACKAGES.join(", ")
        ));
        return Ok(python);
    }
    // NB: Debian's interpreter, not a pyenv shim that may be first in PATH:
    // the venv must outlive changes to the user's Python set-up.
    let base = if Path::new("/usr/bin/python3").is_file() {
        PathBuf::from("/usr/bin/python3")
    } else {
        PathBuf::from("python3")
    };
    step(&format!("creating the Python venv {}", venv.display()));
    Cmd::new(&base).args(["-m", "venv"]).arg(&venv).run()?;
    step(&format!(
        "installing {} into the venv",
        PYTHON_PACKAGES.join(", ")
    ));
    Cmd::new(&python)
        .args(["-m", "pip", "install", "--quiet"])
        .args(PYTHON_PACKAGES)
        .run()?;
    if !Cmd::new(&python).args(["-c", PYTHON_PROBE]).succeeds() {
        bail!("the venv's Python still cannot `{PYTHON_PROBE}` after pip install");
    }
    step("Python venv ready");
    Ok(python)
}
