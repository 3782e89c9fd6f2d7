//! Python: `py_small_leak.py` under `--event heap` (default mode): small objects leaked by
//! `leak_fn` live in pymalloc arenas that `churn_fn` mapped, so the arenas' bytes must be shown
//! as `[pymalloc arena]`, never as memory `churn_fn` holds.

use spanprof_tests::{last_json_line, profiling_lock, TempDir};

use crate::common::{mb, require_alloc_profiling, Interp, DEFAULT_RATE, HEAP_TYPES};
use crate::profile::{per_function, profile_gated, summary, sums_of, Profile};

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
    println!("{report}");
    assert!(
        problems.is_empty(),
        "{}:\n- {}\n{report}\n{out}",
        interp.label,
        problems.join("\n- ")
    );
}
