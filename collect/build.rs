//! Builds the eBPF object of `profiler-ebpf/` and embeds it: every `src/*.bpf.c` unit is
//! compiled on its own with clang (`-target bpf`, warnings are errors), then libbpf's static
//! linker (`bpftool gen object`) links the units into the one object `spanprof.bpf.o` that
//! `src/bpf.rs` loads. The linker resolves the units' `extern` maps, settings and functions
//! against their one definition (maps.bpf.c; python_walk.bpf.c, span_read.bpf.c and
//! user_stack.bpf.c for the global functions), so every program shares the same maps. Those
//! three are compiled a second time with `SPANPROF_TASK_READS`, with `*.task.c` (`spanprof
//! dump`'s task iterator): their functions then read another process's memory and are renamed
//! `*_task` (profiler-ebpf/src/helpers.h).
//!
//! clang is taken from `$SPANPROF_CLANG`, else `clang-19`, else `clang`; bpftool from
//! `$SPANPROF_BPFTOOL`, else `bpftool`, else `/usr/sbin/bpftool` (Debian installs it there, out of
//! a user's `PATH`). `cargo xtask deps` installs Debian's clang-19, libbpf-dev and bpftool.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The first of `candidates` that runs with `arg`, or a panic that says what to install.
fn find_tool(env_var: &str, candidates: &[&str], arg: &str, what: &str) -> String {
    println!("cargo:rerun-if-env-changed={env_var}");
    let candidates: Vec<String> = match env::var(env_var) {
        Ok(c) => vec![c],
        Err(_) => candidates.iter().map(|c| c.to_string()).collect(),
    };
    candidates
        .iter()
        .find(|c| Command::new(c).arg(arg).output().is_ok())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no {what} found (tried {candidates:?}, or set ${env_var}): install Debian's \
                 clang-19, libbpf-dev and bpftool (`cargo xtask deps` does it when run as root)"
            )
        })
}

/// The files of `dir` whose names end in one of `suffixes`, sorted (the link order).
fn files(dir: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| suffixes.iter().any(|s| n.ends_with(s)))
        })
        .collect();
    v.sort();
    v
}

/// Runs `cmd`; a failure, or any output on stderr (a warning), stops the build with it.
fn run(mut cmd: Command, what: &str, hint: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("failed to run {cmd:?}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "{what} {}{hint}:\n{stderr}",
        if out.status.success() {
            "printed warnings"
        } else {
            "failed"
        },
    );
}

/// The units whose global functions `spanprof dump`'s iterator calls, built a second time.
const TASK_READ_UNITS: [&str; 3] = ["python_walk.bpf.c", "span_read.bpf.c", "user_stack.bpf.c"];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let ebpf = manifest.join("../profiler-ebpf");
    let src = ebpf.join("src");
    let include = ebpf.join("include");
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    // The directories too, so that a unit or header added or removed reruns this script.
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed={}", include.display());
    for f in files(&src, &[".c", ".h"])
        .into_iter()
        .chain(files(&include, &[".h"]))
    {
        println!("cargo:rerun-if-changed={}", f.display());
    }

    let clang = find_tool(
        "SPANPROF_CLANG",
        &["clang-19", "clang"],
        "--version",
        "clang",
    );
    let bpftool = find_tool(
        "SPANPROF_BPFTOOL",
        &["bpftool", "/usr/sbin/bpftool"],
        "version",
        "bpftool",
    );
    let arch_include = format!(
        "/usr/include/{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").unwrap()
    );

    // maps.bpf.c, which defines the maps and settings the others declare `extern`, goes first:
    // libbpf 1.1's linker (Debian 12's bpftool) leaves every map at offset 0 of the `.maps`
    // BTF section when the first object it reads has them as externs, and the kernel then
    // rejects the object's BTF ("Invalid offset").
    let mut units = files(&src, &[".bpf.c"]);
    let first = units
        .iter()
        .position(|u| u.ends_with("maps.bpf.c"))
        .unwrap_or_else(|| panic!("no maps.bpf.c in {}", src.display()));
    let maps = units.remove(first);
    units.insert(0, maps);
    // `spanprof dump`'s task iterator (`*.task.c`) and the units whose functions it calls, built
    // again to read another process's memory (helpers.h, SPANPROF_TASK_READS), their global
    // functions renamed: linked into the same object, after the sampling build.
    let mut builds: Vec<(PathBuf, bool)> = units.iter().map(|u| (u.clone(), false)).collect();
    for unit in TASK_READ_UNITS {
        builds.push((src.join(unit), true));
    }
    for unit in files(&src, &[".task.c"]) {
        builds.push((unit, true));
    }
    let mut objects = Vec::new();
    for (unit, task_reads) in &builds {
        let name = unit.file_name().unwrap().to_str().unwrap();
        let object = out_dir.join(if *task_reads {
            name.replace(".bpf.c", ".task.o")
                .replace(".task.c", ".task.o")
        } else {
            name.replace(".bpf.c", ".o")
        });
        let mut cmd = Command::new(&clang);
        if *task_reads {
            cmd.arg("-DSPANPROF_TASK_READS");
        }
        cmd.args(["-g", "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86"])
            .args(["-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"])
            .arg("-I")
            .arg(&include)
            .arg("-I")
            .arg(&arch_include)
            .arg("-c")
            .arg(unit)
            .arg("-o")
            .arg(&object);
        run(
            cmd,
            &format!("compiling {}", unit.display()),
            " (is libbpf-dev installed?)",
        );
        objects.push(object);
    }
    let mut cmd = Command::new(&bpftool);
    cmd.args(["gen", "object"])
        .arg(out_dir.join("spanprof.bpf.o"))
        .args(&objects);
    run(cmd, "linking the eBPF object with bpftool gen object", "");
}
