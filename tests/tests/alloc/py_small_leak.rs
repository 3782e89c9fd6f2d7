//! Python: `py_small_leak.py` under `--event heap` (default mode): small objects leaked by
//! `leak_fn` live in pymalloc arenas that `churn_fn` mapped, so the arenas' bytes must be shown
//! as `[pymalloc arena]`, never as memory `churn_fn` holds.

use spanprof_tests::{last_json_line, profiling_lock, TempDir};

use crate::common::{mb, require_alloc_profiling, Interp, DEFAULT_RATE, HEAP_TYPES};
use crate::profile::{
    check_design, conclude, per_function, profile_gated, profile_gated_with, render, row_problems,
    summary, sums_of, Profile, Row,
};
use crate::sampling::sigma_bytes;

const ARENA: &str = "[pymalloc arena]";
const KNOWN: [&str; 4] = ["leak_fn", "churn_fn", "mapped_fn", ARENA];

/// See the module documentation.
pub(super) fn python_small_leak_arenas(interp: &Interp) {
    require_alloc_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("alloc-small-leak");
    let pprof = tmp.join("heap.pb.gz");
    let (out, workload_out) =
        profile_gated(&interp.path, "py_small_leak.py", &[], "heap", &[&pprof]);
    let json = last_json_line(&workload_out.stdout);
    let leak_truth = json["leak_fn"]["inuse_bytes"]
        .as_f64()
        .unwrap_or_else(|| panic!("no leak_fn.inuse_bytes in {json}\n{out}"));

    let profile = Profile::read(&pprof);
    let mut problems = Vec::new();
    profile.check_shape(&HEAP_TYPES, DEFAULT_RATE, &mut problems);
    // The innermost of the known frames: `[pymalloc arena]` is the leaf of an arena's stack.
    let table = per_function(&profile, &KNOWN);
    let arenas = sums_of(&table, ARENA).get("inuse_space");
    let churn = sums_of(&table, "churn_fn").get("inuse_space");
    let mapped = sums_of(&table, "mapped_fn").get("inuse_space");
    let total = profile.total("inuse_space");
    // mapped_fn's 1 MiB mappings come from the mmap module: never arenas. (8 of them, each
    // sampled with p = 86% at 512 KiB: none sampled once in 7 million runs.)
    let mapped_as_arenas: i64 = profile
        .samples
        .iter()
        .filter(|s| {
            s.functions.last().is_some_and(|f| f == ARENA)
                && s.functions.iter().any(|f| f == "mapped_fn")
        })
        .map(|s| s.value("inuse_space"))
        .sum();
    if mapped_as_arenas > 0 || mapped == 0.0 {
        problems.push(format!(
            "mapped_fn's 1 MiB mmaps (from the mmap module): {:.1} MB its own, {:.1} MB taken \
             for {ARENA}",
            mb(mapped),
            mb(mapped_as_arenas as f64)
        ));
    }
    // Every arena in use holds leaked objects; the leak needs at least its own bytes of them,
    // less one arena's estimate for sampling (1 MiB arenas sampled with p = 86% at 512 KiB).
    if arenas < 0.5 * leak_truth {
        problems.push(format!(
            "{ARENA} holds {:.1} MB in use, less than half of the {:.1} MB of small objects \
             leak_fn kept: the arenas' bytes are not shown as arenas",
            mb(arenas),
            mb(leak_truth)
        ));
    }
    // churn_fn frees everything it allocates: no byte in use is its own (its arenas are
    // `[pymalloc arena]`).
    if churn > 0.01 * total {
        problems.push(format!(
            "churn_fn holds {:.2} MB of the {:.1} MB in use outside {ARENA}, though it frees \
             all it allocates",
            mb(churn),
            mb(total)
        ));
    }
    if !out.stderr.contains(&format!("({ARENA}: ")) {
        problems.push(format!("the summary does not say how much is in {ARENA}"));
    }
    let report = format!(
        "{}: {} pprof samples, {:.1} MB in use in all: {:.1} MB in {ARENA}, {:.2} MB held by \
         churn_fn outside arenas; leak_fn kept {:.1} MB of small objects\nsummary:\n{}\n",
        interp.label,
        profile.samples.len(),
        mb(total),
        mb(arenas),
        mb(churn),
        mb(leak_truth),
        summary(&out)
    );
    conclude(&interp.label, &problems, &report, &out);
}

/// The rate of the `--python-allocators` sessions: leak_fn's 12.8 MB of 32- and 56-byte objects
/// give ~390 samples (σ 5%).
const SMALL_RATE: u64 = 32 * 1024;

/// `py_small_leak.py` (10 rounds of 10 000 tuples leaked and 20 000 strs churned, without
/// mapped_fn's mappings) under `--event heap --python-allocators
/// --alloc-rate 32768`: pymalloc's functions are probed, so each small object is charged to the
/// code that allocates it: leak_fn holds at least 80% of the bytes in use and is within ±25% of
/// its truth (4.8σ), churn_fn at most 1% of leak_fn's truth, and no arena is counted besides
/// its objects.
pub(super) fn python_small_leak_allocators(interp: &Interp) {
    require_alloc_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("alloc-small-allocators");
    let pprof = tmp.join("heap.pb.gz");
    let rate = SMALL_RATE.to_string();
    let (out, workload_out) = profile_gated_with(
        &interp.path,
        "py_small_leak.py",
        &["10", "10000", "20000", "0"],
        "heap",
        &["--python-allocators", "--alloc-rate", &rate],
        &[&pprof],
    );
    let json = last_json_line(&workload_out.stdout);
    let field = |f: &str, k: &str| {
        json[f][k]
            .as_f64()
            .unwrap_or_else(|| panic!("no {f}.{k} in {json}\n{out}"))
    };
    let leak_truth = field("leak_fn", "inuse_bytes");
    let objects = field("leak_fn", "objects");

    let profile = Profile::read(&pprof);
    let mut problems = Vec::new();
    profile.check_shape(&HEAP_TYPES, SMALL_RATE, &mut problems);
    let table = per_function(&profile, &KNOWN);
    let leak = sums_of(&table, "leak_fn").get("inuse_space");
    let churn = sums_of(&table, "churn_fn").get("inuse_space");
    let arenas = sums_of(&table, ARENA).get("inuse_space");
    let total = profile.total("inuse_space");
    // A tuple and two ints (32 bytes asked each, 3.11+) per leaked tuple; the list's array
    // (one block) is left out of σ.
    let sigma = sigma_bytes(&[(56.0, objects), (32.0, 2.0 * objects)], SMALL_RATE);
    check_design(
        "leak_fn's in-use bytes",
        0.25 * leak_truth,
        sigma,
        &mut problems,
    );
    let rows = vec![
        Row {
            what: "leak_fn: inuse_space".into(),
            measured: leak,
            truth: leak_truth,
            sigma,
            allowed: 0.25 * leak_truth,
        },
        Row {
            what: "churn_fn: inuse_space".into(),
            measured: churn,
            truth: 0.0,
            sigma: 0.0,
            allowed: 0.01 * leak_truth,
        },
    ];
    row_problems(&rows, &mut problems);
    if leak < 0.80 * total {
        problems.push(format!(
            "leak_fn holds {:.1} of the profile's {:.1} MB in use, less than 80%",
            mb(leak),
            mb(total)
        ));
    }
    // Arenas mapped while the probes are on are not counted (their objects are).
    if arenas > 0.01 * total {
        problems.push(format!(
            "{ARENA} holds {:.1} MB besides the objects in it",
            mb(arenas)
        ));
    }
    let report = format!(
        "{} --python-allocators: {} pprof samples, {:.1} MB in use in all ({:.1}% under \
         leak_fn), {:.2} MB in {ARENA}\n{}summary:\n{}\n",
        interp.label,
        profile.samples.len(),
        mb(total),
        100.0 * leak / total.max(1.0),
        mb(arenas),
        render(&rows),
        summary(&out)
    );
    conclude(&interp.label, &problems, &report, &out);
}
