//! Native: `alloc_sizes` under `--event alloc,heap`.

use std::collections::BTreeMap;

use spanprof_tests::{last_json_line, workload_path, RunOutput, TempDir};

use crate::common::require_alloc_profiling;
use crate::profile::{profile_command, Profile};

const NATIVE: &str = "alloc_sizes";

/// Each function of `alloc_sizes` and the size of its allocations: one size, or two for
/// alloc_realloc (realloc(NULL, 2048) then realloc(p, 16384)).
pub(super) const NATIVE_FUNCTIONS: [(&str, &[f64]); 8] = [
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
pub(super) struct NativeTruth {
    pub(super) calls: f64,
    pub(super) bytes: f64,
    pub(super) kept_calls: f64,
    pub(super) kept_bytes: f64,
}

/// Runs `alloc_sizes SCALE` under `--event alloc,heap` at `rate`; the profile, the truth by
/// function and the run.
pub(super) fn run_native(
    rate: u64,
    scale: u32,
) -> (Profile, BTreeMap<&'static str, NativeTruth>, RunOutput) {
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

pub(super) fn native_names() -> Vec<&'static str> {
    NATIVE_FUNCTIONS.iter().map(|(n, _)| *n).collect()
}

/// The allocations of a function, by size: `calls` spread evenly over its sizes.
pub(super) fn native_allocs(sizes: &[f64], calls: f64) -> Vec<(f64, f64)> {
    sizes
        .iter()
        .map(|&s| (s, calls / sizes.len() as f64))
        .collect()
}
