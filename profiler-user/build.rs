//! Compiles the C eBPF programs in `profiler-ebpf/` with clang and embeds the object.
//!
//! clang is taken from `$SPANPROF_CLANG`, else `clang-19`, else `clang`. `cargo xtask deps`
//! installs Debian's clang-19 and libbpf-dev.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let ebpf = manifest.join("../profiler-ebpf");
    let src = ebpf.join("src/spanprof.bpf.c");
    let include = ebpf.join("include");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("spanprof.bpf.o");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed={}", include.display());
    println!("cargo:rerun-if-env-changed=SPANPROF_CLANG");

    let candidates = match env::var("SPANPROF_CLANG") {
        Ok(c) => vec![c],
        Err(_) => vec!["clang-19".to_string(), "clang".to_string()],
    };
    let clang = candidates
        .iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok())
        .unwrap_or_else(|| {
            panic!(
                "no clang found (tried {candidates:?}): install Debian's clang-19 and libbpf-dev \
                 (`cargo xtask deps` does it when run as root)"
            )
        });
    let arch_include = format!(
        "/usr/include/{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").unwrap()
    );
    let status = Command::new(clang)
        .args(["-g", "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86"])
        .args(["-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"])
        .arg("-I")
        .arg(&include)
        .arg("-I")
        .arg(&arch_include)
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("failed to run {clang}: {e}"));
    assert!(
        status.success(),
        "compiling {} failed: is libbpf-dev installed?",
        src.display()
    );
}
