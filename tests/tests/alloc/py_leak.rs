//! Python: `py_leak.py` under `--event heap` (objects of 10 033 bytes) and `--event alloc,heap`
//! (64 KiB buffers).

use spanprof_tests::{last_json_line, profiling_lock, read_folded, TempDir};

use crate::common::{mb, require_alloc_profiling, Interp, BOTH_TYPES, DEFAULT_RATE, HEAP_TYPES};
use crate::profile::{
    check_design, conclude, folded_per_function, per_function, profile_gated, profile_gated_with,
    render, row_problems, summary, sums_of, Profile, Row,
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

/// The rate of the 64 KiB sessions: a 64 KiB buffer is sampled with p = 1 - e⁻⁴ = 98.2%.
const BUFFER_RATE: u64 = 16 * 1024;

/// The size of the buffers: what each `bytes` object asks the C library for.
const BUFFER: f64 = 65_536.0;

/// `py_leak.py 10 100 65536` (1000 buffers of 64 KiB kept by `leak`, 2000 made and freed by
/// `churn`) under `--event alloc,heap --alloc-rate 16384`, with `--python-allocators` or
/// without: the same truth either way, since the buffers are the C library's (pymalloc hands
/// requests over 512 bytes on, and its probes must not count them a second time). `leak`'s
/// in-use bytes and objects and its allocated bytes within 5% of its truth (σ 0.43% and
/// 0.41%: 11σ), `churn`'s allocated bytes within 5% of its 2000 buffers and its in-use bytes
/// at most 1% of `leak`'s; `[pymalloc arena]` is known, so an arena mapped under `leak` is not
/// its buffers.
pub(super) fn python_heap_64k(interp: &Interp, allocators: bool) {
    require_alloc_profiling();
    let _lock = profiling_lock();
    let tmp = TempDir::new("alloc-64k");
    let pprof = tmp.join("heap.pb.gz");
    let rate = BUFFER_RATE.to_string();
    let mut extra = vec!["--alloc-rate", rate.as_str()];
    if allocators {
        extra.push("--python-allocators");
    }
    let (out, workload_out) = profile_gated_with(
        &interp.path,
        PY_LEAK,
        &["10", "100", "65536"],
        "alloc,heap",
        &extra,
        &[&pprof],
    );
    let json = last_json_line(&workload_out.stdout);
    let num = |section: &str, key: &str| {
        json[section][key]
            .as_f64()
            .unwrap_or_else(|| panic!("no {section}.{key} in {json}\n{out}"))
    };
    let leak_objects = num("leak", "objects");
    let leak_truth = num("leak", "inuse_bytes");
    let churn_objects = num("churn", "objects");
    let churn_truth = num("churn", "allocated_bytes");
    let label = format!(
        "{}{}",
        interp.label,
        if allocators {
            " --python-allocators"
        } else {
            ""
        }
    );

    let profile = Profile::read(&pprof);
    let mut problems = Vec::new();
    profile.check_shape(&BOTH_TYPES, BUFFER_RATE, &mut problems);
    let table = per_function(&profile, &["leak", "churn", "[pymalloc arena]"]);
    let leak = sums_of(&table, "leak");
    let churn = sums_of(&table, "churn");
    let kept = [(BUFFER, leak_objects)];
    let churned = [(BUFFER, churn_objects)];
    let bound = 0.05;
    for (what, truth, sigma) in [
        (
            "leak's in-use bytes",
            leak_truth,
            sigma_bytes(&kept, BUFFER_RATE),
        ),
        (
            "leak's in-use objects",
            leak_objects,
            sigma_count(&kept, BUFFER_RATE),
        ),
        (
            "churn's bytes",
            churn_truth,
            sigma_bytes(&churned, BUFFER_RATE),
        ),
    ] {
        check_design(what, bound * truth, sigma, &mut problems);
    }
    let rows = vec![
        Row {
            what: "leak: inuse_space".into(),
            measured: leak.get("inuse_space"),
            truth: leak_truth,
            sigma: sigma_bytes(&kept, BUFFER_RATE),
            allowed: bound * leak_truth,
        },
        Row {
            what: "leak: inuse_objects".into(),
            measured: leak.get("inuse_objects"),
            // The buffers and the list's array.
            truth: leak_objects + 1.0,
            sigma: sigma_count(&kept, BUFFER_RATE),
            allowed: bound * leak_objects,
        },
        Row {
            what: "leak: alloc_space (buffers)".into(),
            measured: leak.get("alloc_space"),
            truth: leak_objects * BUFFER,
            sigma: sigma_bytes(&kept, BUFFER_RATE),
            allowed: bound * leak_objects * BUFFER,
        },
        Row {
            what: "churn: alloc_space".into(),
            measured: churn.get("alloc_space"),
            truth: churn_truth,
            sigma: sigma_bytes(&churned, BUFFER_RATE),
            allowed: bound * churn_truth,
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
    let report = format!(
        "{label}, 64 KiB buffers: {} pprof samples, {:.1} MB in use in all, {:.1} MB \
         allocated in all\n{}summary:\n{}\n",
        profile.samples.len(),
        mb(profile.total("inuse_space")),
        mb(profile.total("alloc_space")),
        render(&rows),
        summary(&out)
    );
    conclude(&label, &problems, &report, &out);
}
