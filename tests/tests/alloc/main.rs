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
//! - `python_heap_64k_*` (pyenv 3.11, 3.13; `--event alloc,heap --alloc-rate 16384`, with and
//!   without `--python-allocators`): the same workload with 64 KiB buffers (`py_leak.py 10 100
//!   65536`: 1000 kept, 2000 freed): `leak`'s in-use bytes and objects and its allocated bytes,
//!   and `churn`'s allocated bytes, within 5% of their truth (each buffer sampled with p = 98.2%:
//!   σ ≈ 0.4%); churn's in-use bytes at most 1% of leak's. pymalloc's probes must leave these
//!   requests of more than 512 bytes to the C library's.
//! - `python_small_leak_arenas_*` (pyenv 3.11, 3.13; `--event heap`, default rate):
//!   `tests/workloads/py_small_leak.py` leaks 100 000 small tuples of two ints (12 MB) from
//!   `leak_fn` while `churn_fn` allocates and frees ~6 MiB of short strs a round, so the
//!   pymalloc arenas the leaked objects live in were mapped for churn_fn: the arenas' bytes must
//!   sit under the leaf frame `[pymalloc arena]` (at least half of leak_fn's bytes), churn_fn
//!   hold at most 1% of the bytes in use outside it, and the summary say how much is in arenas.
//! - `python_small_leak_allocators_*` (pyenv 3.8, 3.11, 3.13; `--event heap
//!   --python-allocators --alloc-rate 32768`): the same workload without mapped_fn, pymalloc's
//!   functions probed: leak_fn holds at least 80% of the bytes in use, within ±25% of its truth
//!   (4.8σ), churn_fn at most 1% of it, `[pymalloc arena]` at most 1% of the total.
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
//! it is profiling ([`profile::profile_gated`]), so that every allocation of the work has its
//! Python frames; the native one is started by spanprof (`-- alloc_sizes`), whose C library
//! spanprof probes before the command runs.
//!
//! Failure messages carry the per-function table (also printed by `--nocapture` runs).
//!
//! The tests are declared here; the sampling theory is in `sampling`, the decoded profiles and
//! their table in `profile`, the parts' checks in `py_alloc`, `py_leak` and `native`, what they
//! share in `common`.

use spanprof_tests::profiling_lock;

use common::{mb, Interp, BOTH_TYPES, DEFAULT_RATE};
use native::{native_allocs, native_names, run_native, NATIVE_FUNCTIONS};
use profile::{
    check_design, innermost, lost, per_function, render, row_problems, summary, sums_of, Row,
};
use py_alloc::python_alloc;
use py_leak::{python_heap_64k, python_heap_leak};
use py_small_leak::{python_small_leak_allocators, python_small_leak_arenas};
use sampling::{p_sampled, sigma_bytes, sigma_count};

mod common;
mod native;
mod profile;
mod py_alloc;
mod py_leak;
mod py_small_leak;
mod sampling;

// ---------------------------------------------------------------------------
// Sampling theory
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Decoded profiles
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Python: py_alloc.py under --event alloc
// ---------------------------------------------------------------------------

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

#[test]
fn python_heap_leak_3_12() {
    python_heap_leak(&Interp::pyenv(12));
}

#[test]
fn python_heap_leak_debian_3_11() {
    python_heap_leak(&Interp::debian_3_11());
}

#[test]
fn python_heap_64k_3_11() {
    python_heap_64k(&Interp::pyenv(11), false);
}

#[test]
fn python_heap_64k_allocators_3_11() {
    python_heap_64k(&Interp::pyenv(11), true);
}

#[test]
fn python_heap_64k_3_13() {
    python_heap_64k(&Interp::pyenv(13), false);
}

#[test]
fn python_heap_64k_allocators_3_13() {
    python_heap_64k(&Interp::pyenv(13), true);
}

// ---------------------------------------------------------------------------
// Python: py_small_leak.py under --event heap (small objects in pymalloc arenas)
// ---------------------------------------------------------------------------

#[test]
fn python_small_leak_arenas_3_11() {
    python_small_leak_arenas(&Interp::pyenv(11));
}

#[test]
fn python_small_leak_arenas_3_13() {
    python_small_leak_arenas(&Interp::pyenv(13));
}

/// 3.8: 256 KiB arenas mapped by `_PyObject_ArenaMmap`, `realloc(NULL, n)` inlined.
#[test]
fn python_small_leak_allocators_3_8() {
    python_small_leak_allocators(&Interp::pyenv(8));
}

#[test]
fn python_small_leak_allocators_3_11() {
    python_small_leak_allocators(&Interp::pyenv(11));
}

#[test]
fn python_small_leak_allocators_3_13() {
    python_small_leak_allocators(&Interp::pyenv(13));
}

// ---------------------------------------------------------------------------
// Native: alloc_sizes under --event alloc,heap
// ---------------------------------------------------------------------------

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
