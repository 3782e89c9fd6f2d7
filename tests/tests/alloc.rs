//! Allocation profiling (`--event alloc`, `--event heap`, `--event alloc,heap`) against the
//! allocations the workloads know they made.
//!
//! Sampling: an allocation of `s` bytes is sampled with probability `p = 1 - exp(-s/R)` (`R`
//! = `--alloc-rate`, default 512 KiB) and then weighs `1/p` allocations and `s/p` bytes, so the
//! estimate of a function's bytes is unbiased with variance `Σ s² (1-p)/p` over its
//! allocations (and `Σ (1-p)/p` for its count). Every statistical bound below is derived from
//! that variance (σ), computed from the workload's own truth and printed in the table; each
//! test also checks that its fixed bound is at least 4.5σ, so that it fails a biased profiler
//! without failing a correct one more than about once in 150 000 runs. With
//! `--alloc-rate 1` every allocation is sampled (`p = 1`) and the figures are exact.
//!
//! - `python_alloc_*` (pyenv 3.9, 3.11, 3.12, 3.13; `--event alloc`, default rate, pprof and
//!   folded): `tests/workloads/py_alloc.py`'s `big_buffers` (5 rounds of 64 malloc(1 MiB + 1),
//!   what `bytearray(1 MiB)` asks the C library for) and `small_objects` (bytes objects of 128,
//!   256 and 512 bytes, served by pymalloc from arenas of 1 MiB, 256 KiB up to 3.9, each an
//!   anonymous mmap of CPython's, which spanprof probes with the C library's mmap): sample
//!   types `[alloc_objects/count, alloc_space/bytes]`, period type `space/bytes`, period 524288;
//!   the bytes under each function within ±10% of its truth (big_buffers: its mallocs;
//!   small_objects: the arenas CPython allocated during the call, which the workload counts
//!   with `sys._debugmallocstats()`), big_buffers' count within ±10% of its 320 calls; at least
//!   95% of each function's bytes under the Python path `<module> -> main -> FUNCTION` at the
//!   line the source marks (`# alloc: big`, `# alloc: small`); the folded output of the same
//!   session weighs each function the same bytes. The ratio of small_objects' bytes to the
//!   `sys.getsizeof` of the objects it made (pymalloc's overhead: ~4% with 1 MiB arenas, ~10%
//!   with 256 KiB ones, by the workload's own count) is printed.
//! - `python_alloc_debian_3_11`: the same with Debian's `/usr/bin/python3.11`, whose symbol
//!   table is stripped (no symbol of its arena allocator): its arenas are mmaps all the same.
//! - `python_heap_leak_*` (pyenv 3.12, Debian's python3.11; `--event heap`, default rate):
//!   `tests/workloads/py_leak.py` leaks 40 000 bytes(10 000) (401.7 MB with its list) from
//!   `leak` and allocates and frees twice as much in `churn`: sample types `[inuse_objects/count,
//!   inuse_space/bytes]`; `leak` holds at least 80% of the profile's in-use bytes and is within
//!   ±20% of its truth (each 10 033-byte object is sampled with p = 1.9%: ~760 samples, σ =
//!   3.6%, so ±20% is 5.5σ); `churn`, whose truth is 0, at most 1% of leak's truth (~8 sampled
//!   allocations whose frees were missed).
//! - `native_every_allocation` (`--event alloc,heap --alloc-rate 1`): `alloc_sizes` (built by
//!   `cargo xtask workloads` from `xtask/workloads/alloc_sizes.c`) makes known malloc, calloc,
//!   realloc, posix_memalign, aligned_alloc and memalign calls from one function each: sample
//!   types `[alloc_objects/count, alloc_space/bytes, inuse_objects/count, inuse_space/bytes]`,
//!   period 1; each function's allocations and bytes exactly its calls and their sizes, and its
//!   in-use objects and bytes exactly what it kept; every one of its samples under `main ->
//!   run_all -> FUNCTION`; no sample lost. The workload holds glibc's traps for a profiler of
//!   the malloc family, each in a function of its own, each of which must count once, under
//!   that function: `realloc(NULL, n)` jumps to `malloc` (a tail call: no realloc frame), and
//!   a uretprobe on realloc has then replaced the return address `malloc` finds on the stack by
//!   the kernel's trampoline, which the unwinder must see through; `posix_memalign` with an
//!   alignment of 16 calls `malloc`; `aligned_alloc` and `memalign` are one function at one
//!   address (glibc 2.36), so two probes on their two names fire twice per call.
//! - `native_default_rate` (`--event alloc,heap`, default rate, the same workload at 4 times the
//!   calls): each function's four figures within 5σ (plus one sample's weight, for functions with
//!   only a few expected samples) of its truth (0 for what it did not keep), and the eight
//!   functions' bytes together, whose σ is small enough for a tight bound (1.9%, mostly
//!   alloc_big's 400 × 1 MiB and alloc_realloc's), within 10%.
//!
//! The Python workloads are profiled by pid (`--pid`), held before any work until spanprof says
//! it is profiling ([`profile_gated`]), so that every allocation of the work has its Python
//! frames; the native one is started by spanprof (`-- alloc_sizes`), whose C library spanprof
//! probes before the command runs.
//!
//! Failure messages carry the per-function table (also printed by `--nocapture` runs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use spanprof_tests::{
    args, decode_pprof, last_json_line, profiling_lock, py_workload_source, pyenv_python,
    read_folded, require_root, run_spanprof, sample_functions, spanprof_bin, spanprof_command,
    start_py_workload, system_python, workload_path, Background, FoldedStack, RunOutput, TempDir,
    RUN_TIMEOUT,
};

/// The default `--alloc-rate`: one sample per 512 KiB allocated on average.
const DEFAULT_RATE: u64 = 524_288;
/// A bound must be at least this many σ of the estimate it bounds.
const MIN_SIGMAS: f64 = 4.5;
/// The sample types of each kind of memory profile (Go's order when both).
const ALLOC_TYPES: [&str; 2] = ["alloc_objects/count", "alloc_space/bytes"];
const HEAP_TYPES: [&str; 2] = ["inuse_objects/count", "inuse_space/bytes"];
const BOTH_TYPES: [&str; 4] = [
    "alloc_objects/count",
    "alloc_space/bytes",
    "inuse_objects/count",
    "inuse_space/bytes",
];

/// A CPython interpreter under test.
struct Interp {
    path: PathBuf,
    minor: u8,
    label: String,
}

impl Interp {
    #[track_caller]
    fn pyenv(minor: u8) -> Self {
        let path = pyenv_python(minor);
        let label = format!("pyenv {}", path.display());
        Self { path, minor, label }
    }

    #[track_caller]
    fn debian_3_11() -> Self {
        Self {
            path: system_python("/usr/bin/python3.11", "python3.11"),
            minor: 11,
            label: "Debian /usr/bin/python3.11".into(),
        }
    }
}

/// Everything a test here needs before it takes the lock.
#[track_caller]
fn require_alloc_profiling() {
    require_root();
    spanprof_bin();
}

fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}

// ---------------------------------------------------------------------------
// Sampling theory
// ---------------------------------------------------------------------------

/// The probability that an allocation of `size` bytes is sampled at `rate`.
fn p_sampled(size: f64, rate: u64) -> f64 {
    if rate <= 1 {
        1.0
    } else {
        1.0 - (-size / rate as f64).exp()
    }
}

/// Allocations of one size: `(size in bytes, how many)`.
type Allocs = [(f64, f64)];

/// σ of the estimate of the bytes of `allocs` sampled at `rate`.
fn sigma_bytes(allocs: &Allocs, rate: u64) -> f64 {
    allocs
        .iter()
        .map(|&(s, n)| {
            let p = p_sampled(s, rate);
            n * s * s * (1.0 - p) / p
        })
        .sum::<f64>()
        .sqrt()
}

/// σ of the estimate of the number of `allocs` sampled at `rate`.
fn sigma_count(allocs: &Allocs, rate: u64) -> f64 {
    allocs
        .iter()
        .map(|&(s, n)| {
            let p = p_sampled(s, rate);
            n * (1.0 - p) / p
        })
        .sum::<f64>()
        .sqrt()
}

/// The expected number of samples of `allocs` at `rate`.
fn expected_samples(allocs: &Allocs, rate: u64) -> f64 {
    allocs.iter().map(|&(s, n)| n * p_sampled(s, rate)).sum()
}

// ---------------------------------------------------------------------------
// Decoded profiles
// ---------------------------------------------------------------------------

/// One decoded pprof sample, reduced to what the checks here need.
#[derive(Debug)]
struct Sample {
    /// Function names, root first (Python frames by qualname, without their location).
    functions: Vec<String>,
    /// The values, by sample type (`alloc_objects`, `alloc_space`, `inuse_objects`, …).
    values: BTreeMap<String, i64>,
}

impl Sample {
    fn value(&self, kind: &str) -> i64 {
        self.values.get(kind).copied().unwrap_or(0)
    }
}

/// A decoded profile.
#[derive(Debug)]
struct Profile {
    /// `type/unit` of each sample type, in order.
    types: Vec<String>,
    period_type: String,
    period: i64,
    samples: Vec<Sample>,
}

impl Profile {
    #[track_caller]
    fn read(path: &Path) -> Self {
        let json = decode_pprof(path);
        let pair = |v: &serde_json::Value| {
            format!(
                "{}/{}",
                v["type"].as_str().unwrap_or("?"),
                v["unit"].as_str().unwrap_or("?")
            )
        };
        let types: Vec<String> = json["sample_types"]
            .as_array()
            .expect("sample_types")
            .iter()
            .map(pair)
            .collect();
        let samples = json["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .map(|s| {
                let mut functions = sample_functions(s);
                functions.reverse();
                let values = types
                    .iter()
                    .zip(s["values"].as_array().expect("values"))
                    .map(|(t, v)| {
                        let kind = t.split('/').next().unwrap_or(t).to_owned();
                        (kind, v.as_i64().expect("integer value"))
                    })
                    .collect();
                Sample { functions, values }
            })
            .collect();
        Self {
            types,
            period_type: if json["period_type"].is_null() {
                "(none)".into()
            } else {
                pair(&json["period_type"])
            },
            period: json["period"].as_i64().unwrap_or(0),
            samples,
        }
    }

    /// The sum of `kind` over every sample.
    fn total(&self, kind: &str) -> f64 {
        self.samples.iter().map(|s| s.value(kind)).sum::<i64>() as f64
    }

    /// Checks the sample types, the period type and the period.
    fn check_shape(&self, types: &[&str], rate: u64, problems: &mut Vec<String>) {
        if self.types != types {
            problems.push(format!("sample types {:?}, expected {types:?}", self.types));
        }
        if self.period_type != "space/bytes" {
            problems.push(format!(
                "period type {:?}, expected \"space/bytes\"",
                self.period_type
            ));
        }
        if self.period != rate as i64 {
            problems.push(format!("period {}, expected the rate {rate}", self.period));
        }
        let negative = self
            .samples
            .iter()
            .filter(|s| s.values.values().any(|v| *v < 0))
            .count();
        if negative > 0 {
            problems.push(format!("{negative} sample(s) with a negative value"));
        }
    }
}

/// The innermost of `known` on a stack (root first), `(other)` if none.
fn innermost<'a, S: AsRef<str>>(frames: &[S], known: &[&'a str]) -> &'a str {
    frames
        .iter()
        .rev()
        .find_map(|f| known.iter().find(|k| **k == f.as_ref()).copied())
        .unwrap_or("(other)")
}

/// The sum of each sample type per function (the innermost of `known` on each stack).
fn per_function(profile: &Profile, known: &[&'static str]) -> BTreeMap<&'static str, Sums> {
    let mut out: BTreeMap<&'static str, Sums> = BTreeMap::new();
    for s in &profile.samples {
        let sums = out.entry(innermost(&s.functions, known)).or_default();
        for (kind, v) in &s.values {
            *sums.0.entry(kind.clone()).or_default() += *v as f64;
        }
        sums.1 += 1;
    }
    out
}

/// Per sample type, the sum of the values; and the number of pprof samples (distinct stacks).
#[derive(Debug, Default, Clone)]
struct Sums(BTreeMap<String, f64>, u64);

impl Sums {
    fn get(&self, kind: &str) -> f64 {
        self.0.get(kind).copied().unwrap_or(0.0)
    }
}

fn sums_of(table: &BTreeMap<&'static str, Sums>, function: &str) -> Sums {
    table.get(function).cloned().unwrap_or_default()
}

/// The weight of each function (the innermost of `known`) in folded output.
fn folded_per_function(
    stacks: &[FoldedStack],
    known: &[&'static str],
) -> BTreeMap<&'static str, f64> {
    let mut out = BTreeMap::new();
    for s in stacks {
        let names: Vec<&str> = s
            .frames
            .iter()
            .map(|f| f.split(" (").next().unwrap_or(f))
            .collect();
        *out.entry(innermost(&names, known)).or_default() += s.count as f64;
    }
    out
}

/// The samples lost, from the summary's first line (`spanprof: …, N lost, from …`).
fn lost(out: &RunOutput) -> Option<u64> {
    out.stderr.lines().find_map(|l| {
        let (head, _) = l.strip_prefix("spanprof: ")?.split_once(" lost, from ")?;
        head.rsplit(", ").next()?.trim().parse().ok()
    })
}

/// The lines of spanprof's stderr worth showing with the table.
fn summary(out: &RunOutput) -> String {
    out.stderr
        .lines()
        .filter(|l| l.starts_with("spanprof") || l.contains("alloc") || l.contains("heap"))
        .take(12)
        .collect::<Vec<_>>()
        .join("\n")
}

/// One row of a table: a figure measured against its truth, with its σ and allowed error.
struct Row {
    what: String,
    measured: f64,
    truth: f64,
    sigma: f64,
    allowed: f64,
}

impl Row {
    fn ok(&self) -> bool {
        (self.measured - self.truth).abs() <= self.allowed
    }

    fn render(&self) -> String {
        let rel = |x: f64| {
            if self.truth != 0.0 {
                format!("{:+.1}%", 100.0 * x / self.truth)
            } else {
                "-".into()
            }
        };
        format!(
            "{:<44} {:>16.0} {:>16.0} {:>8} {:>8} {:>8}  {}",
            self.what,
            self.truth,
            self.measured,
            rel(self.measured - self.truth),
            if self.truth != 0.0 {
                format!("{:.1}%", 100.0 * self.sigma / self.truth)
            } else {
                format!("{:.0}", self.sigma)
            },
            if self.truth != 0.0 {
                format!("±{:.1}%", 100.0 * self.allowed / self.truth)
            } else {
                format!("≤{:.0}", self.allowed)
            },
            if self.ok() { "ok" } else { "FAIL" }
        )
    }
}

/// The table of rows, with a header.
fn render(rows: &[Row]) -> String {
    let mut text = format!(
        "{:<44} {:>16} {:>16} {:>8} {:>8} {:>8}\n",
        "figure", "truth", "spanprof", "error", "σ", "allowed"
    );
    for r in rows {
        text.push_str(&r.render());
        text.push('\n');
    }
    text
}

/// A problem for each row outside its bound.
fn row_problems(rows: &[Row], problems: &mut Vec<String>) {
    for r in rows.iter().filter(|r| !r.ok()) {
        problems.push(format!(
            "{}: {:.0}, truth {:.0}, allowed ±{:.0}",
            r.what, r.measured, r.truth, r.allowed
        ));
    }
}

/// A problem when a fixed relative bound is under [`MIN_SIGMAS`] σ: the workload is too
/// small for the bound to be trusted (a design error of the test, not of spanprof).
fn check_design(what: &str, bound: f64, sigma: f64, problems: &mut Vec<String>) {
    if bound < MIN_SIGMAS * sigma {
        problems.push(format!(
            "test design: {what}: the bound {bound:.0} is only {:.1}σ (σ = {sigma:.0}); make the \
             workload bigger",
            bound / sigma
        ));
    }
}

/// `spanprof profile --event EVENT [--alloc-rate R] -o OUTPUT… -- PROGRAM ARGS…`, which must
/// succeed.
#[track_caller]
fn profile_command(
    event: &str,
    rate: Option<u64>,
    outputs: &[&Path],
    command: &[&std::ffi::OsStr],
) -> RunOutput {
    let mut args = args!["profile", "--event", event];
    if let Some(rate) = rate {
        args.extend(args!["--alloc-rate", rate.to_string()]);
    }
    for out in outputs {
        args.extend(args!["-o", out]);
    }
    args.push("--".into());
    args.extend(command.iter().map(|a| a.to_os_string()));
    let out = run_spanprof(args);
    out.assert_success();
    out
}

/// `spanprof profile --event EVENT --pid PID -o OUTPUT…` on the Python workload `script`
/// started with `--wait` and `args` under `python`: the workload prints `ready PID` and waits
/// for SIGUSR1, which it gets once spanprof says it is profiling (its probes are attached and
/// the interpreter is known by then), so every allocation of the work is seen with its Python
/// frames; the session ends when the workload exits. Both must succeed; returns spanprof's run
/// and the workload's.
///
/// NB: not `-- PYTHON SCRIPT`: spanprof recognizes an interpreter it started only once it has
/// run for a while, and the allocations made before have no Python frames (in 2 of 6 runs by
/// hand of py_alloc.py under pyenv 3.11, 50 to 70 of big_buffers' first mallocs had none).
#[track_caller]
fn profile_gated(
    python: &Path,
    script: &str,
    args: &[&str],
    event: &str,
    outputs: &[&Path],
) -> (RunOutput, RunOutput) {
    let mut workload_args = vec!["--wait"];
    workload_args.extend(args);
    let workload = start_py_workload(python, script, &workload_args);
    let mut spanprof_args = args![
        "profile",
        "--event",
        event,
        "--pid",
        workload.pid().to_string()
    ];
    for out in outputs {
        spanprof_args.extend(args!["-o", out]);
    }
    let mut prof = Background::spawn(spanprof_command(spanprof_args));
    prof.wait_for_stderr("spanprof: profiling", Duration::from_secs(30));
    workload.signal(libc::SIGUSR1);
    let workload_out = workload.finish(RUN_TIMEOUT);
    let out = prof.finish(RUN_TIMEOUT);
    workload_out.assert_success();
    out.assert_success();
    (out, workload_out)
}

// ---------------------------------------------------------------------------
// Python: py_alloc.py under --event alloc
// ---------------------------------------------------------------------------

const PY_ALLOC: &str = "py_alloc.py";
const PY_FUNCTIONS: [&str; 2] = ["big_buffers", "small_objects"];

/// What `py_alloc.py` says it did.
#[derive(Debug)]
struct PyAllocTruth {
    arena_size: f64,
    big_calls: f64,
    big_size: f64,
    big_arenas: f64,
    small_arenas: f64,
    small_getsizeof: f64,
    small_objects: f64,
}

impl PyAllocTruth {
    #[track_caller]
    fn of(out: &RunOutput) -> Self {
        let json = last_json_line(&out.stdout);
        let num = |section: &str, key: &str| {
            json[section][key]
                .as_f64()
                .unwrap_or_else(|| panic!("no {section}.{key} in {json}\n{out}"))
        };
        Self {
            arena_size: json["arena_size"]
                .as_f64()
                .unwrap_or_else(|| panic!("no arena_size in {json}\n{out}")),
            big_calls: num("big_buffers", "calls"),
            big_size: num("big_buffers", "malloc_size"),
            big_arenas: num("big_buffers", "arenas"),
            small_arenas: num("small_objects", "arenas"),
            small_getsizeof: num("small_objects", "getsizeof_bytes"),
            small_objects: num("small_objects", "objects"),
        }
    }

    /// What a profiler of the malloc family and the arenas sees of `function`.
    fn allocs(&self, function: &str) -> Vec<(f64, f64)> {
        match function {
            "big_buffers" => vec![
                (self.big_size, self.big_calls),
                (self.arena_size, self.big_arenas),
            ],
            _ => vec![(self.arena_size, self.small_arenas)],
        }
    }

    fn bytes(&self, function: &str) -> f64 {
        self.allocs(function).iter().map(|(s, n)| s * n).sum()
    }
}

/// The line of `py_alloc.py` marked `# alloc: KEY`.
fn marked_line(key: &str) -> u32 {
    let path = py_workload_source(PY_ALLOC);
    let source = std::fs::read_to_string(&path).expect("readable workload");
    let marker = format!("# alloc: {key}");
    let index = source
        .lines()
        .position(|l| l.trim_end().ends_with(&marker))
        .unwrap_or_else(|| panic!("no line ending in {marker:?} in {}", path.display()));
    index as u32 + 1
}

/// Megabytes of small objects for an interpreter's arena size: enough arenas for σ ≈ 2.2%
/// (256 KiB arenas are sampled with p = 39%, 1 MiB ones with p = 86%: the smaller arenas need
/// about 2.5 times the bytes).
fn small_mib(interp: &Interp) -> &'static str {
    if interp.minor <= 9 {
        "800"
    } else {
        "320"
    }
}

/// Runs `py_alloc.py` under `--event alloc` and checks what the module documentation says.
fn python_alloc(interp: &Interp) {
    require_alloc_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("alloc-py");
    let pprof = tmp.join("alloc.pb.gz");
    let folded = tmp.join("alloc.folded");
    let (out, workload_out) = profile_gated(
        &interp.path,
        PY_ALLOC,
        &[small_mib(interp)],
        "alloc",
        &[&pprof, &folded],
    );
    let truth = PyAllocTruth::of(&workload_out);
    let profile = Profile::read(&pprof);
    let mut problems = Vec::new();
    profile.check_shape(&ALLOC_TYPES, DEFAULT_RATE, &mut problems);

    let table = per_function(&profile, &PY_FUNCTIONS);
    let mut rows = Vec::new();
    for function in PY_FUNCTIONS {
        let sums = sums_of(&table, function);
        let allocs = truth.allocs(function);
        let sigma = sigma_bytes(&allocs, DEFAULT_RATE);
        let bytes = truth.bytes(function);
        check_design(
            &format!("{function} bytes"),
            0.10 * bytes,
            sigma,
            &mut problems,
        );
        rows.push(Row {
            what: format!("{function}: alloc_space"),
            measured: sums.get("alloc_space"),
            truth: bytes,
            sigma,
            allowed: 0.10 * bytes,
        });
    }
    // big_buffers' count: its 320 mallocs (and the arenas it may have needed).
    let big_allocs = truth.allocs("big_buffers");
    let big_count: f64 = big_allocs.iter().map(|(_, n)| n).sum();
    let big_count_sigma = sigma_count(&big_allocs, DEFAULT_RATE);
    check_design(
        "big_buffers count",
        0.10 * big_count,
        big_count_sigma,
        &mut problems,
    );
    rows.push(Row {
        what: "big_buffers: alloc_objects".into(),
        measured: sums_of(&table, "big_buffers").get("alloc_objects"),
        truth: big_count,
        sigma: big_count_sigma,
        allowed: 0.10 * big_count,
    });
    row_problems(&rows, &mut problems);

    // Where the bytes are: the Python path and the marked line.
    let stacks = read_folded(&folded);
    for (function, key) in [("big_buffers", "big"), ("small_objects", "small")] {
        let line = marked_line(key);
        let under: Vec<&FoldedStack> = stacks
            .iter()
            .filter(|s| s.py_qualnames().contains(&function))
            .collect();
        let all: f64 = under.iter().map(|s| s.count as f64).sum();
        let placed: f64 = under
            .iter()
            .filter(|s| {
                s.py_qualnames() == ["<module>", "main", function]
                    && s.py_leaf().is_some_and(|f| {
                        f.file.ends_with(PY_ALLOC) && f.qualname == function && f.line == Some(line)
                    })
            })
            .map(|s| s.count as f64)
            .sum();
        if all == 0.0 || placed < 0.95 * all {
            problems.push(format!(
                "{function}: {:.1} of its {:.1} MB in the folded output have the Python path \
                 <module> -> main -> {function} at {PY_ALLOC}:{line} (expected ≥ 95%)",
                mb(placed),
                mb(all)
            ));
        }
    }
    // The folded output weighs the same bytes as the pprof's alloc_space.
    let folded_table = folded_per_function(&stacks, &PY_FUNCTIONS);
    for function in PY_FUNCTIONS {
        let pprof_bytes = sums_of(&table, function).get("alloc_space");
        let folded_bytes = folded_table.get(function).copied().unwrap_or(0.0);
        // Rounding: at most a byte per folded line and per pprof sample.
        let slack = (stacks.len() + profile.samples.len()) as f64;
        if (folded_bytes - pprof_bytes).abs() > slack {
            problems.push(format!(
                "{function}: the folded output weighs {folded_bytes:.0}, the pprof's alloc_space \
                 is {pprof_bytes:.0}: folded weights should be the allocated bytes"
            ));
        }
    }
    let small = sums_of(&table, "small_objects").get("alloc_space");
    let report = format!(
        "{}: {} pprof samples, {:.1} MB allocated in all; arenas of {} bytes\n{}\
         small_objects: {:.0} objects, sys.getsizeof {:.1} MB, arenas allocated during it {:.0} \
         ({:.1} MB, {:.3} × getsizeof); spanprof / getsizeof = {:.3}\n\
         expected samples: big_buffers {:.0}, small_objects {:.0}\nsummary:\n{}\n",
        interp.label,
        profile.samples.len(),
        mb(profile.total("alloc_space")),
        truth.arena_size,
        render(&rows),
        truth.small_objects,
        mb(truth.small_getsizeof),
        truth.small_arenas,
        mb(truth.bytes("small_objects")),
        truth.bytes("small_objects") / truth.small_getsizeof,
        small / truth.small_getsizeof,
        expected_samples(&truth.allocs("big_buffers"), DEFAULT_RATE),
        expected_samples(&truth.allocs("small_objects"), DEFAULT_RATE),
        summary(&out)
    );
    println!("{report}");
    assert!(
        problems.is_empty(),
        "{}:\n- {}\n{report}\n{out}",
        interp.label,
        problems.join("\n- ")
    );
}

#[test]
fn python_alloc_3_9() {
    python_alloc(&Interp::pyenv(9));
}

#[test]
fn python_alloc_3_11() {
    python_alloc(&Interp::pyenv(11));
}

#[test]
fn python_alloc_3_12() {
    python_alloc(&Interp::pyenv(12));
}

#[test]
fn python_alloc_3_13() {
    python_alloc(&Interp::pyenv(13));
}

/// Debian's own python3.11: stripped (no symbol of its arena allocator), statically linked
/// interpreter: its arenas are seen all the same, as anonymous mmaps.
#[test]
fn python_alloc_debian_3_11() {
    python_alloc(&Interp::debian_3_11());
}

// ---------------------------------------------------------------------------
// Python: py_leak.py under --event heap
// ---------------------------------------------------------------------------

const PY_LEAK: &str = "py_leak.py";
const LEAK_FUNCTIONS: [&str; 2] = ["leak", "churn"];

/// `py_leak.py` under `--event heap`; see the module documentation.
fn python_heap_leak(interp: &Interp) {
    require_alloc_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("alloc-leak");
    let pprof = tmp.join("heap.pb.gz");
    let folded = tmp.join("heap.folded");
    let (out, workload_out) = profile_gated(&interp.path, PY_LEAK, &[], "heap", &[&pprof, &folded]);
    let json = last_json_line(&workload_out.stdout);
    let num = |section: &str, key: &str| {
        json[section][key]
            .as_f64()
            .unwrap_or_else(|| panic!("no {section}.{key} in {json}\n{out}"))
    };
    let object_size = json["object_size"]
        .as_f64()
        .unwrap_or_else(|| panic!("no object_size in {json}\n{out}"));
    let leak_objects = num("leak", "objects");
    let leak_truth = num("leak", "inuse_bytes");
    let list_array = num("leak", "list_array_bytes");
    let churn_allocated = num("churn", "allocated_bytes");

    let profile = Profile::read(&pprof);
    let mut problems = Vec::new();
    profile.check_shape(&HEAP_TYPES, DEFAULT_RATE, &mut problems);
    let table = per_function(&profile, &LEAK_FUNCTIONS);
    let leak = sums_of(&table, "leak");
    let churn = sums_of(&table, "churn");
    let total = profile.total("inuse_space");

    let leak_allocs = [(object_size, leak_objects), (list_array, 1.0)];
    let sigma = sigma_bytes(&leak_allocs, DEFAULT_RATE);
    check_design(
        "leak's in-use bytes",
        0.20 * leak_truth,
        sigma,
        &mut problems,
    );
    let count_sigma = sigma_count(&leak_allocs, DEFAULT_RATE);
    let rows = vec![
        Row {
            what: "leak: inuse_space".into(),
            measured: leak.get("inuse_space"),
            truth: leak_truth,
            sigma,
            allowed: 0.20 * leak_truth,
        },
        Row {
            what: "leak: inuse_objects".into(),
            measured: leak.get("inuse_objects"),
            truth: leak_objects + 1.0,
            sigma: count_sigma,
            allowed: 0.20 * (leak_objects + 1.0),
        },
        Row {
            what: "churn: inuse_space".into(),
            measured: churn.get("inuse_space"),
            truth: 0.0,
            sigma: 0.0,
            allowed: 0.01 * leak_truth,
        },
    ];
    row_problems(&rows, &mut problems);
    if leak.get("inuse_space") < 0.80 * total {
        problems.push(format!(
            "leak holds {:.1} of the profile's {:.1} MB in use, less than 80%",
            mb(leak.get("inuse_space")),
            mb(total)
        ));
    }
    // The folded output weighs in-use bytes.
    let stacks = read_folded(&folded);
    let folded_leak = folded_per_function(&stacks, &LEAK_FUNCTIONS)
        .get("leak")
        .copied()
        .unwrap_or(0.0);
    let slack = (stacks.len() + profile.samples.len()) as f64;
    if (folded_leak - leak.get("inuse_space")).abs() > slack {
        problems.push(format!(
            "leak: the folded output weighs {folded_leak:.0}, the pprof's inuse_space is {:.0}: \
             folded weights of a heap profile should be the bytes in use",
            leak.get("inuse_space")
        ));
    }

    let report = format!(
        "{}: {} pprof samples, {:.1} MB in use in all ({:.1}% under leak); churn allocated \
         {:.1} MB and freed it all; leak's expected samples {:.0}\n{}summary:\n{}\n",
        interp.label,
        profile.samples.len(),
        mb(total),
        100.0 * leak.get("inuse_space") / total.max(1.0),
        mb(churn_allocated),
        expected_samples(&leak_allocs, DEFAULT_RATE),
        render(&rows),
        summary(&out)
    );
    println!("{report}");
    assert!(
        problems.is_empty(),
        "{}:\n- {}\n{report}\n{out}",
        interp.label,
        problems.join("\n- ")
    );
}

#[test]
fn python_heap_leak_3_12() {
    python_heap_leak(&Interp::pyenv(12));
}

#[test]
fn python_heap_leak_debian_3_11() {
    python_heap_leak(&Interp::debian_3_11());
}

// ---------------------------------------------------------------------------
// Native: alloc_sizes under --event alloc,heap
// ---------------------------------------------------------------------------

const NATIVE: &str = "alloc_sizes";

/// Each function of `alloc_sizes` and the size of its allocations: one size, or two for
/// alloc_realloc (realloc(NULL, 2048) then realloc(p, 16384)).
const NATIVE_FUNCTIONS: [(&str, &[f64]); 8] = [
    ("alloc_small", &[64.0]),
    ("alloc_big", &[1048576.0]),
    ("alloc_calloc", &[4096.0]),
    ("alloc_realloc", &[2048.0, 16384.0]),
    ("alloc_posix_memalign", &[1000.0]),
    ("alloc_aligned", &[8192.0]),
    ("alloc_memalign", &[3000.0]),
    ("alloc_memalign_relay", &[512.0]),
];

/// What `alloc_sizes` says one function did.
#[derive(Debug, Clone, Copy)]
struct NativeTruth {
    calls: f64,
    bytes: f64,
    kept_calls: f64,
    kept_bytes: f64,
}

/// Runs `alloc_sizes SCALE` under `--event alloc,heap` at `rate`; the profile, the truth by
/// function and the run.
fn run_native(rate: u64, scale: u32) -> (Profile, BTreeMap<&'static str, NativeTruth>, RunOutput) {
    require_alloc_profiling();
    let program = workload_path(NATIVE);
    let tmp = TempDir::new("alloc-native");
    let pprof = tmp.join("native.pb.gz");
    let scale = scale.to_string();
    let out = profile_command(
        "alloc,heap",
        Some(rate),
        &[&pprof],
        &[program.as_os_str(), scale.as_ref()],
    );
    let json = last_json_line(&out.stdout);
    let mut truths = BTreeMap::new();
    for (name, _) in NATIVE_FUNCTIONS {
        let f = &json["functions"][name];
        let num = |key: &str| {
            f[key]
                .as_f64()
                .unwrap_or_else(|| panic!("no functions.{name}.{key} in {json}\n{out}"))
        };
        truths.insert(
            name,
            NativeTruth {
                calls: num("calls"),
                bytes: num("bytes"),
                kept_calls: num("kept_calls"),
                kept_bytes: num("kept_bytes"),
            },
        );
    }
    (Profile::read(&pprof), truths, out)
}

fn native_names() -> Vec<&'static str> {
    NATIVE_FUNCTIONS.iter().map(|(n, _)| *n).collect()
}

/// The allocations of a function, by size: `calls` spread evenly over its sizes.
fn native_allocs(sizes: &[f64], calls: f64) -> Vec<(f64, f64)> {
    sizes
        .iter()
        .map(|&s| (s, calls / sizes.len() as f64))
        .collect()
}

/// Every allocation sampled: exact figures; see the module documentation.
#[test]
fn native_every_allocation() {
    let _lock = profiling_lock();
    let (profile, truths, out) = run_native(1, 1);
    let mut problems = Vec::new();
    profile.check_shape(&BOTH_TYPES, 1, &mut problems);
    match lost(&out) {
        Some(0) => {}
        Some(n) => problems.push(format!(
            "{n} samples lost: with --alloc-rate 1 every allocation must be recorded"
        )),
        None => problems.push("no `N lost` in the summary".into()),
    }
    let names = native_names();
    let table = per_function(&profile, &names);
    let mut rows = Vec::new();
    for (name, _) in NATIVE_FUNCTIONS {
        let t = truths[name];
        let sums = sums_of(&table, name);
        for (kind, truth) in [
            ("alloc_objects", t.calls),
            ("alloc_space", t.bytes),
            ("inuse_objects", t.kept_calls),
            ("inuse_space", t.kept_bytes),
        ] {
            rows.push(Row {
                what: format!("{name}: {kind}"),
                measured: sums.get(kind),
                truth,
                sigma: 0.0,
                allowed: 0.0,
            });
        }
    }
    row_problems(&rows, &mut problems);
    // Every sample of a function is under main -> run_all -> function.
    for name in &names {
        let (mut whole, mut all) = (0.0, 0.0);
        for s in &profile.samples {
            if innermost(&s.functions, &names) != *name {
                continue;
            }
            all += s.value("alloc_objects") as f64;
            let f: Vec<&str> = s.functions.iter().map(String::as_str).collect();
            if spanprof_tests::contains_seq(&f, &["main", "run_all", name]) {
                whole += s.value("alloc_objects") as f64;
            }
        }
        if whole < all {
            problems.push(format!(
                "{name}: {:.0} of its {all:.0} allocations are not under main -> run_all -> {name}",
                all - whole
            ));
        }
    }
    let report = format!(
        "alloc_sizes 1, --alloc-rate 1: {} pprof samples, {:.0} allocations and {:.1} MB in \
         all, {:.1} MB in use at the end\n{}summary:\n{}\n",
        profile.samples.len(),
        profile.total("alloc_objects"),
        mb(profile.total("alloc_space")),
        mb(profile.total("inuse_space")),
        render(&rows),
        summary(&out)
    );
    println!("{report}");
    assert!(
        problems.is_empty(),
        "alloc_sizes, every allocation:\n- {}\n{report}\n{out}",
        problems.join("\n- ")
    );
}

/// At the default rate: each figure within 5σ of its truth (plus one sample's weight); the
/// workload's total bytes, dominated by alloc_big's and alloc_realloc's (σ ≈ 2%), within 10%.
#[test]
fn native_default_rate() {
    const SCALE: u32 = 4;
    const SIGMAS: f64 = 5.0;
    let _lock = profiling_lock();
    let (profile, truths, out) = run_native(DEFAULT_RATE, SCALE);
    let mut problems = Vec::new();
    profile.check_shape(&BOTH_TYPES, DEFAULT_RATE, &mut problems);
    let names = native_names();
    let table = per_function(&profile, &names);
    let mut rows = Vec::new();
    let (mut all_allocs, mut all_bytes, mut all_measured) = (Vec::new(), 0.0, 0.0);
    for (name, sizes) in NATIVE_FUNCTIONS {
        let t = truths[name];
        let sums = sums_of(&table, name);
        let allocs = native_allocs(sizes, t.calls);
        let kept = native_allocs(sizes, t.kept_calls);
        // One sample of the smallest size weighs s/p bytes and 1/p allocations.
        let smallest = sizes.iter().copied().fold(f64::INFINITY, f64::min);
        let p = p_sampled(smallest, DEFAULT_RATE);
        for (kind, truth, sigma, one) in [
            (
                "alloc_objects",
                t.calls,
                sigma_count(&allocs, DEFAULT_RATE),
                1.0 / p,
            ),
            (
                "alloc_space",
                t.bytes,
                sigma_bytes(&allocs, DEFAULT_RATE),
                smallest / p,
            ),
            (
                "inuse_objects",
                t.kept_calls,
                sigma_count(&kept, DEFAULT_RATE),
                1.0 / p,
            ),
            (
                "inuse_space",
                t.kept_bytes,
                sigma_bytes(&kept, DEFAULT_RATE),
                smallest / p,
            ),
        ] {
            let allowed = if truth == 0.0 {
                // Nothing kept: a sample whose free was missed is a bug, whatever its weight.
                0.0
            } else {
                SIGMAS * sigma + one
            };
            rows.push(Row {
                what: format!("{name}: {kind}"),
                measured: sums.get(kind),
                truth,
                sigma,
                allowed,
            });
        }
        all_allocs.extend(allocs);
        all_bytes += t.bytes;
        all_measured += sums.get("alloc_space");
    }
    let sigma = sigma_bytes(&all_allocs, DEFAULT_RATE);
    check_design(
        "all functions' bytes",
        0.10 * all_bytes,
        sigma,
        &mut problems,
    );
    rows.push(Row {
        what: "all eight functions: alloc_space".into(),
        measured: all_measured,
        truth: all_bytes,
        sigma,
        allowed: 0.10 * all_bytes,
    });
    row_problems(&rows, &mut problems);
    let report = format!(
        "alloc_sizes {SCALE}, --alloc-rate {DEFAULT_RATE}: {} pprof samples, {:.1} MB allocated \
         and {:.1} MB in use in all; allowed: {SIGMAS}σ + one sample's weight\n{}summary:\n{}\n",
        profile.samples.len(),
        mb(profile.total("alloc_space")),
        mb(profile.total("inuse_space")),
        render(&rows),
        summary(&out)
    );
    println!("{report}");
    assert!(
        problems.is_empty(),
        "alloc_sizes, default rate:\n- {}\n{report}\n{out}",
        problems.join("\n- ")
    );
}

#[cfg(test)]
mod theory {
    use super::*;

    /// The σ formulas against a direct simulation-free check: at rate 1 nothing varies; a 1 MiB
    /// allocation at 512 KiB is sampled with p = 1 - e^-2.
    #[test]
    fn sigma_formulas() {
        assert_eq!(sigma_bytes(&[(64.0, 1000.0)], 1), 0.0);
        let p = 1.0 - (-2.0f64).exp();
        assert!((p_sampled(1048576.0, DEFAULT_RATE) - p).abs() < 1e-12);
        let s = sigma_bytes(&[(1048576.0, 100.0)], DEFAULT_RATE);
        let want = (100.0 * 1048576.0f64.powi(2) * (1.0 - p) / p).sqrt();
        assert!((s - want).abs() < 1e-6 * want);
        // Small allocations: each sample weighs about the rate, so σ ≈ sqrt(rate × bytes).
        let s = sigma_bytes(&[(64.0, 1e6)], DEFAULT_RATE);
        let approx = (DEFAULT_RATE as f64 * 64e6).sqrt();
        assert!((s / approx - 1.0).abs() < 0.01, "{s} vs {approx}");
        assert_eq!(
            innermost(
                &["main", "run_all", "alloc_big", "malloc"],
                &["run_all", "alloc_big"]
            ),
            "alloc_big"
        );
        assert_eq!(innermost(&["main"], &["alloc_big"]), "(other)");
    }
}
