//! Python: `py_leak.py` under `--event heap`.

use spanprof_tests::{last_json_line, profiling_lock, read_folded, TempDir};

use crate::common::{mb, require_alloc_profiling, Interp, DEFAULT_RATE, HEAP_TYPES};
use crate::profile::{
    check_design, conclude, folded_per_function, per_function, profile_gated, render, row_problems,
    summary, sums_of, Profile, Row,
};
use crate::sampling::{expected_samples, sigma_bytes, sigma_count};

const PY_LEAK: &str = "py_leak.py";

const LEAK_FUNCTIONS: [&str; 2] = ["leak", "churn"];

/// `py_leak.py` under `--event heap`; see the module documentation.
pub(super) fn python_heap_leak(interp: &Interp) {
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
    conclude(&interp.label, &problems, &report, &out);
}
