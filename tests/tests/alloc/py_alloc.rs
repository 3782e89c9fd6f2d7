//! Python: `py_alloc.py` under `--event alloc`.

use spanprof_tests::{
    last_json_line, profiling_lock, py_workload_source, read_folded, FoldedStack, RunOutput,
    TempDir,
};

use crate::common::{mb, require_alloc_profiling, Interp, ALLOC_TYPES, DEFAULT_RATE};
use crate::profile::{
    check_design, conclude, folded_per_function, per_function, profile_gated, render, row_problems,
    summary, sums_of, Profile, Row,
};
use crate::sampling::{expected_samples, sigma_bytes, sigma_count};

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
pub(super) fn python_alloc(interp: &Interp) {
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
    conclude(&interp.label, &problems, &report, &out);
}
