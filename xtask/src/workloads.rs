//! `cargo xtask workloads`: the C programs the integration tests profile.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::run::{step, Cmd};

/// The workloads, each built from `tests/workloads/<name>.c`; `fixed_work`
/// is the target of `cargo xtask bench`.
pub const WORKLOADS: &[&str] = &["cpu_split", "syscall_heavy", "forker", "fixed_work"];

/// NB: `-mno-omit-leaf-frame-pointer` and frame pointers everywhere: the
/// profiler unwinds user stacks with frame pointers, and the tests check full
/// call paths.
const CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-Wall",
    "-Wextra",
    "-Werror",
];

/// Builds every workload into `target/workloads/` and returns that directory.
pub fn build(root: &Path) -> Result<PathBuf> {
    let src = root.join("tests/workloads");
    let out = root.join("target/workloads");
    std::fs::create_dir_all(&out)?;
    step(&format!(
        "building the test workloads into {}",
        out.display()
    ));
    for name in WORKLOADS {
        Cmd::new("gcc")
            .args(CFLAGS)
            .arg("-o")
            .arg(out.join(name))
            .arg(src.join(format!("{name}.c")))
            .run()?;
    }
    Ok(out)
}
