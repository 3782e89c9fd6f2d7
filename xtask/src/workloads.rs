//! `cargo xtask workloads`: the C programs the integration tests profile.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

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
///
/// Besides the workloads of [`WORKLOADS`] it builds `cpu_split_stripped`:
/// cpu_split with the same flags but no `-g`, then `strip -s`, so it has
/// neither debug information nor a symbol table (its `.dynsym` only lists
/// libc imports) while frame pointers still let the profiler walk it. The
/// symbols it lost are kept as text, `nm -S --defined-only` of the binary
/// before stripping, in `cpu_split_stripped.symbols`, so that tests can check
/// which function an `[unknown] (cpu_split_stripped+0x…)` frame is in.
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
    build_stripped(&src, &out)?;
    Ok(out)
}

/// `cpu_split_stripped` and `cpu_split_stripped.symbols`; see [`build`].
fn build_stripped(src: &Path, out: &Path) -> Result<()> {
    let unstripped = out.join("cpu_split_stripped.unstripped");
    let stripped = out.join("cpu_split_stripped");
    Cmd::new("gcc")
        .args(CFLAGS.iter().filter(|flag| **flag != "-g"))
        .arg("-o")
        .arg(&unstripped)
        .arg(src.join("cpu_split.c"))
        .run()?;
    let nm = Cmd::new("nm")
        .args(["-S", "--defined-only"])
        .arg(&unstripped)
        .output()?;
    if !nm.status.success() {
        bail!(
            "nm {} failed with {}: {}",
            unstripped.display(),
            nm.status,
            String::from_utf8_lossy(&nm.stderr)
        );
    }
    let symbols = out.join("cpu_split_stripped.symbols");
    std::fs::write(&symbols, &nm.stdout)
        .with_context(|| format!("cannot write {}", symbols.display()))?;
    Cmd::new("strip")
        .arg("-s")
        .arg("-o")
        .arg(&stripped)
        .arg(&unstripped)
        .run()?;
    // NB: no unstripped copy stays beside the stripped one, where a
    // symbolizer looking for separate debug files might find it.
    std::fs::remove_file(&unstripped)
        .with_context(|| format!("cannot remove {}", unstripped.display()))?;
    Ok(())
}
