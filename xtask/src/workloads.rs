//! `cargo xtask workloads`: the C programs the integration tests profile.
//!
//! Most are built with frame pointers everywhere ([`CFLAGS`]); the workloads of the `.eh_frame`
//! unwinding tests (`tests/tests/unwind.rs`) are built without any ([`NOFP_CFLAGS`]), as
//! distributions build their libraries, and the build checks with `objdump` that their hot
//! paths really set up no frame pointer, so that a frame-pointer walk cannot pass those tests.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::run::{step, Cmd};

/// The workloads, each built from `tests/workloads/<name>.c`; `fixed_work`
/// is the target of `cargo xtask bench`, `ci_bench` that of the CI examples.
pub const WORKLOADS: &[&str] = &[
    "cpu_split",
    "syscall_heavy",
    "forker",
    "fixed_work",
    "ci_bench",
    "short_children",
    "alternate",
];

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

/// The flags of the workloads of the unwinding tests: no frame pointer in any function, leaf
/// or not (`-DWORKLOAD_NO_FRAME_POINTER` makes `KEEP_FRAME_POINTER()` of `common.h` a no-op,
/// since taking a frame's address forces a frame pointer).
const NOFP_CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fomit-frame-pointer",
    "-momit-leaf-frame-pointer",
    "-DWORKLOAD_NO_FRAME_POINTER",
    "-Wall",
    "-Wextra",
    "-Werror",
];

/// Debian's interpreter, the one the C extension workload is built for (`python3.11-dev`).
const SYSTEM_PYTHON: &str = "/usr/bin/python3.11";

/// Builds every workload into `target/workloads/` and returns that directory.
///
/// Besides the workloads of [`WORKLOADS`] it builds `ci_bench_slow` (`ci_bench` with
/// `-DSLOW_RENDER`: its `render_output` does twice the work), `short_children_big`
/// (`short_children` with `-DBIG_BINARY`, at `-O0`) and `cpu_split_stripped`:
/// cpu_split with the same flags but no `-g`, then `strip -s`, so it has
/// neither debug information nor a symbol table (its `.dynsym` only lists
/// libc imports) while frame pointers still let the profiler walk it. The
/// symbols it lost are kept as text, `nm -S --defined-only` of the binary
/// before stripping, in `cpu_split_stripped.symbols`, so that tests can check
/// which function an `[unknown] (cpu_split_stripped+0x…)` frame is in.
///
/// `libspanprof_plt.so`, `plt_calls` and `plt_calls_ibt` ([`build_plt`]) for the PLT tests;
/// `libspanprof_hidden.so` and `hidden_main` ([`build_hidden`]) for the build-id tests.
///
/// Then, without frame pointers ([`NOFP_CFLAGS`]), for the unwinding tests:
/// - `cpu_split_nofp` (PIE) and `cpu_split_nofp_nopie` (`-no-pie`): cpu_split;
/// - `qsort_callback`: CPU time in a comparison callback below libc's `qsort`;
/// - `dlopen_late` and `libspanprof_plugin.so` (from `plugin.c`), which `dlopen_late` loads
///   from its own directory half a second after it started;
/// - `nofp_strings` (C++, `g++`) and `nofp_rust` (`rustc -O`): string sorting and hashing,
///   whose `%rbp` holds pointers to heap data (a frame-pointer walk reads data as frames);
/// - `cext/spanprof_cext<EXT_SUFFIX>` (from `spanprof_cext.c`): a C extension module for
///   Debian's `/usr/bin/python3.11`, which `tests/workloads/py_cext.py` imports.
///
/// And, with frame pointers, the off-CPU workloads of [`OFFCPU_WORKLOADS`] (their sources are in
/// `xtask/workloads/`).
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
    // The second build of the CI benchmark, with one function made slower.
    Cmd::new("gcc")
        .args(CFLAGS)
        .arg("-DSLOW_RENDER")
        .arg("-o")
        .arg(out.join("ci_bench_slow"))
        .arg(src.join("ci_bench.c"))
        .run()?;
    // Big: 16000 more functions, a few MB of symbols, DWARF and unwind tables (the memory
    // tests' distinct binaries). NB: -O0, which gcc builds in a fraction of -O2's time.
    Cmd::new("gcc")
        .args(CFLAGS.iter().map(|f| if *f == "-O2" { "-O0" } else { *f }))
        .arg("-DBIG_BINARY")
        .arg("-o")
        .arg(out.join("short_children_big"))
        .arg(src.join("short_children.c"))
        .run()?;
    build_stripped(&src, &out)?;
    build_hidden(&src, &out)?;
    build_plt(&src, &out)?;
    build_without_frame_pointers(&src, &out)?;
    build_python_extension(&src, &out)?;
    build_offcpu(root, &out)?;
    // A native program publishing OTEP 4947 thread contexts: its TLS symbol exported
    // (-rdynamic puts it in .dynsym, where readers look for it).
    Cmd::new("gcc")
        .args(CFLAGS)
        .args(["-pthread", "-rdynamic", "-o"])
        .arg(out.join("native_thread_ctx"))
        .arg(src.join("native_thread_ctx.c"))
        .run()?;
    Ok(out)
}

/// `libspanprof_hidden.so` (from `hidden_lib.c`, `-fvisibility=hidden`, then `strip -s`: its
/// hot functions have no symbol left anywhere in it), its unstripped build in
/// `unstripped/libspanprof_hidden.so` (the copy a symbol server or `PPROF_BINARY_PATH` serves
/// by build id: a directory no debug-file lookup searches), and `hidden_main`, which runs the
/// library's hot loop and finds it in its own directory (`-rpath $ORIGIN`). The build checks
/// that the stripped library exports `hidden_lib_entry` alone.
fn build_hidden(src: &Path, out: &Path) -> Result<()> {
    let dir = out.join("unstripped");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let unstripped = dir.join("libspanprof_hidden.so");
    let stripped = out.join("libspanprof_hidden.so");
    Cmd::new("gcc")
        .args(CFLAGS)
        .args(["-shared", "-fPIC", "-fvisibility=hidden", "-o"])
        .arg(&unstripped)
        .arg(src.join("hidden_lib.c"))
        .run()?;
    Cmd::new("strip")
        .arg("-s")
        .arg("-o")
        .arg(&stripped)
        .arg(&unstripped)
        .run()?;
    let nm = Cmd::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&stripped)
        .quiet()
        .output()?;
    let exported: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    if !nm.status.success() || exported != ["hidden_lib_entry"] {
        bail!(
            "{} should export hidden_lib_entry alone, nm -D says: {exported:?}",
            stripped.display()
        );
    }
    Cmd::new("gcc")
        .args(CFLAGS)
        .arg("-o")
        .arg(out.join("hidden_main"))
        .arg(src.join("hidden_main.c"))
        .arg("-L")
        .arg(out)
        .args(["-lspanprof_hidden", "-Wl,-rpath,$ORIGIN"])
        .run()?;
    Ok(())
}

/// `libspanprof_plt.so` (from `plt_lib.c`) and the two builds of `plt_calls`, which call it
/// through their PLT in a hot loop: `plt_calls` (lazy binding, `.plt`) and `plt_calls_ibt`
/// (`-z ibtplt -z now`: the calls go through `.plt.sec`). They find the library in their own
/// directory (`-rpath $ORIGIN`).
fn build_plt(src: &Path, out: &Path) -> Result<()> {
    Cmd::new("gcc")
        .args(CFLAGS)
        .args(["-shared", "-fPIC", "-o"])
        .arg(out.join("libspanprof_plt.so"))
        .arg(src.join("plt_lib.c"))
        .run()?;
    for (name, flags) in [
        ("plt_calls", &[][..]),
        ("plt_calls_ibt", &["-Wl,-z,ibtplt", "-Wl,-z,now"][..]),
    ] {
        Cmd::new("gcc")
            .args(CFLAGS)
            .arg("-o")
            .arg(out.join(name))
            .arg(src.join("plt_calls.c"))
            .arg("-L")
            .arg(out)
            .args(["-lspanprof_plt", "-Wl,-rpath,$ORIGIN"])
            .args(flags)
            .run()?;
    }
    Ok(())
}

/// The off-CPU workloads, each built from `xtask/workloads/<name>.c` with [`CFLAGS`] and
/// `-pthread`: `offcpu_sleep` (nanosleep 100 ms × 5, for `tests/tests/offcpu/`) and
/// `offcpu_pingpong` (two threads passing a byte through pipes, the target of
/// `cargo xtask bench --only offcpu`).
pub const OFFCPU_WORKLOADS: &[&str] = &["offcpu_sleep", "offcpu_pingpong"];

/// The allocation workload, built from `xtask/workloads/alloc_sizes.c` like the off-CPU ones:
/// known calls of the malloc family from one function each, for `tests/tests/alloc/`.
pub const ALLOC_WORKLOADS: &[&str] = &["alloc_sizes"];

/// Builds [`OFFCPU_WORKLOADS`] into `out`.
fn build_offcpu(root: &Path, out: &Path) -> Result<()> {
    let src = root.join("xtask/workloads");
    for name in OFFCPU_WORKLOADS.iter().chain(ALLOC_WORKLOADS) {
        Cmd::new("gcc")
            .args(CFLAGS)
            .arg("-pthread")
            .arg("-o")
            .arg(out.join(name))
            .arg(src.join(format!("{name}.c")))
            .run()?;
    }
    Ok(())
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

/// The workloads of the unwinding tests but the Python extension; see [`build`].
fn build_without_frame_pointers(src: &Path, out: &Path) -> Result<()> {
    let cpu_split = src.join("cpu_split.c");
    let hot_path = ["main", "dispatcher", "hot_alpha", "hot_beta"];

    let pie = out.join("cpu_split_nofp");
    Cmd::new("gcc")
        .args(NOFP_CFLAGS)
        .args(["-fPIE", "-pie", "-o"])
        .arg(&pie)
        .arg(&cpu_split)
        .run()?;
    check_elf_type(&pie, ElfType::Dyn)?;
    check_no_frame_pointer(&pie, &hot_path)?;

    let nopie = out.join("cpu_split_nofp_nopie");
    Cmd::new("gcc")
        .args(NOFP_CFLAGS)
        .args(["-fno-pie", "-no-pie", "-o"])
        .arg(&nopie)
        .arg(&cpu_split)
        .run()?;
    check_elf_type(&nopie, ElfType::Exec)?;
    check_no_frame_pointer(&nopie, &hot_path)?;

    let qsort = out.join("qsort_callback");
    Cmd::new("gcc")
        .args(NOFP_CFLAGS)
        .arg("-o")
        .arg(&qsort)
        .arg(src.join("qsort_callback.c"))
        .run()?;
    check_no_frame_pointer(&qsort, &["main", "sort_rounds", "cmp_items"])?;

    let plugin = out.join("libspanprof_plugin.so");
    Cmd::new("gcc")
        .args(NOFP_CFLAGS)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&plugin)
        .arg(src.join("plugin.c"))
        .run()?;
    check_no_frame_pointer(&plugin, &["plugin_run", "plugin_hot"])?;

    let dlopen = out.join("dlopen_late");
    Cmd::new("gcc")
        .args(NOFP_CFLAGS)
        .arg("-o")
        .arg(&dlopen)
        .arg(src.join("dlopen_late.c"))
        .arg("-ldl")
        .run()?;
    check_no_frame_pointer(&dlopen, &["main", "warm_up", "run_plugin"])?;

    // C++ and Rust whose %rbp holds heap pointers: a frame-pointer walk reads data as frames.
    let strings = out.join("nofp_strings");
    Cmd::new("g++")
        .args(NOFP_CFLAGS.iter().filter(|f| !f.starts_with("-D")))
        .arg("-o")
        .arg(&strings)
        .arg(src.join("nofp_strings.cpp"))
        .run()?;
    check_no_frame_pointer(&strings, &["main"])?;
    let rust = out.join("nofp_rust");
    Cmd::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .args(["-O", "-g", "-C", "force-frame-pointers=no", "-o"])
        .arg(&rust)
        .arg(src.join("nofp_rust.rs"))
        .run()?;
    Ok(())
}

/// `cext/spanprof_cext<EXT_SUFFIX>` for [`SYSTEM_PYTHON`], checked by importing it and calling
/// it once with that interpreter; see [`build`].
fn build_python_extension(src: &Path, out: &Path) -> Result<()> {
    let python = Path::new(SYSTEM_PYTHON);
    let fix = "install Debian's python3.11-dev (`cargo xtask deps` as root does)";
    if !python.is_file() {
        bail!("{SYSTEM_PYTHON} is missing: {fix}");
    }
    let query = Cmd::new(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX')); \
             print(sysconfig.get_paths()['include'])",
        ])
        .quiet()
        .output()?;
    if !query.status.success() {
        bail!(
            "{SYSTEM_PYTHON} could not tell its extension suffix and include directory: {}",
            String::from_utf8_lossy(&query.stderr)
        );
    }
    let answer = String::from_utf8_lossy(&query.stdout);
    let mut lines = answer.lines().map(str::trim);
    let (Some(suffix), Some(include)) = (lines.next(), lines.next()) else {
        bail!("{SYSTEM_PYTHON} printed {answer:?}, not an extension suffix and a directory");
    };
    let include = PathBuf::from(include);
    if !include.join("Python.h").is_file() {
        bail!(
            "{} is missing (the headers of {SYSTEM_PYTHON}): {fix}",
            include.join("Python.h").display()
        );
    }
    let dir = out.join("cext");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let module = dir.join(format!("spanprof_cext{suffix}"));
    Cmd::new("gcc")
        .args(NOFP_CFLAGS)
        .args(["-shared", "-fPIC", "-I"])
        .arg(&include)
        .arg("-o")
        .arg(&module)
        .arg(src.join("spanprof_cext.c"))
        .run()?;
    check_no_frame_pointer(
        &module,
        &["crunch", "crunch_outer", "crunch_inner", "mix_outer"],
    )?;
    Cmd::new(python)
        .args([
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); import spanprof_cext; \
             assert isinstance(spanprof_cext.crunch(1), int); \
             assert isinstance(spanprof_cext.mix(1), int)",
        ])
        .arg(&dir)
        .env("PYTHONNOUSERSITE", "1")
        .run()
        .with_context(|| format!("{SYSTEM_PYTHON} cannot import {}", module.display()))?;
    Ok(())
}

/// The ELF file types the workloads are built as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ElfType {
    /// `ET_EXEC`: a position-dependent executable (`-no-pie`).
    Exec,
    /// `ET_DYN`: a position-independent executable or a shared object.
    Dyn,
}

/// Fails unless the 64-bit little-endian ELF file `path` has type `want` (`e_type`, the
/// 16-bit field at offset 16): the tests of PIE and non-PIE unwinding need what they ask for,
/// whatever the compiler's default.
fn check_elf_type(path: &Path, want: ElfType) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() < 18 || bytes[..4] != *b"\x7fELF" {
        bail!("{} is not an ELF file", path.display());
    }
    let got = match u16::from_le_bytes([bytes[16], bytes[17]]) {
        2 => ElfType::Exec,
        3 => ElfType::Dyn,
        other => bail!("{} has ELF type {other}", path.display()),
    };
    if got != want {
        bail!("{} is {got:?}, expected {want:?}", path.display());
    }
    Ok(())
}

/// Fails unless each of `functions` is in the disassembly of `path` (`objdump -d`) and none
/// of them sets up a frame pointer (see [`sets_up_frame_pointer`]): the unwinding tests would
/// otherwise pass with a frame-pointer walk.
fn check_no_frame_pointer(path: &Path, functions: &[&str]) -> Result<()> {
    let dump = Cmd::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(path)
        .quiet()
        .output()?;
    if !dump.status.success() {
        bail!(
            "objdump -d {} failed with {}: {}",
            path.display(),
            dump.status,
            String::from_utf8_lossy(&dump.stderr)
        );
    }
    let text = String::from_utf8_lossy(&dump.stdout);
    for name in functions {
        let header = format!("<{name}>:");
        // `  14bf:\tpush   %rbp` → `push %rbp`.
        let body: Vec<String> = text
            .lines()
            .skip_while(|line| !line.ends_with(&header))
            .skip(1)
            .take_while(|line| !line.trim().is_empty())
            .map(|line| {
                let instruction = line.split_once(":\t").map_or(line, |(_, insn)| insn);
                instruction.split_whitespace().collect::<Vec<_>>().join(" ")
            })
            .collect();
        if body.is_empty() {
            bail!(
                "{} has no function {name} (inlined or renamed?)",
                path.display()
            );
        }
        if let Some(at) = sets_up_frame_pointer(&body) {
            bail!(
                "{name} in {} sets up a frame pointer (its instruction {}: mov %rsp,%rbp), \
                 but it is built to have none",
                path.display(),
                at + 1
            );
        }
    }
    Ok(())
}

/// The index of the instruction that makes `%rbp` a frame pointer in `body` (instructions in
/// AT&T syntax, single-spaced): a `mov %rsp,%rbp` after a `push %rbp` with nothing between
/// them that moves `%rsp` (the compiler may schedule other instructions in between), so that
/// `%rbp` points to the saved `%rbp`. `%rbp` as a general register, even one set from `%rsp`
/// after more pushes (as `-O2` does for a pointer to a local), is no frame pointer.
fn sets_up_frame_pointer(body: &[String]) -> Option<usize> {
    let mut pushed = false;
    for (i, insn) in body.iter().enumerate() {
        if insn == "push %rbp" {
            pushed = true;
        } else if insn == "mov %rsp,%rbp" && pushed {
            return Some(i);
        } else if insn.starts_with("push") || insn.starts_with("pop") || insn.ends_with(",%rsp") {
            pushed = false;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::sets_up_frame_pointer;

    fn body(insns: &[&str]) -> Vec<String> {
        insns.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn finds_frame_pointer_set_ups() {
        // gcc -O2 -fno-omit-frame-pointer, with an instruction scheduled in between.
        let fp = body(&["push %rbp", "mov $0xea60,%edx", "mov %rsp,%rbp", "ret"]);
        assert_eq!(sets_up_frame_pointer(&fp), Some(2));
        // -O2 -fomit-frame-pointer: %rbp a callee-saved register pointing to a local.
        let local = body(&[
            "push %rbp",
            "push %rbx",
            "sub $0x10,%rsp",
            "mov %rsp,%rbp",
            "ret",
        ]);
        assert_eq!(sets_up_frame_pointer(&local), None);
        assert_eq!(sets_up_frame_pointer(&body(&["mov %rsp,%rbp"])), None);
    }
}
