//! Build ids end to end: a program whose hot code is in a stripped shared library with hidden
//! symbols (`hidden_main` and `libspanprof_hidden.so`, see `tests/workloads/hidden_lib.c`).
//! spanprof cannot name those functions on this host; its pprof and OTLP files must carry the
//! library's build id and leave the frames as addresses, so that a tool holding the unstripped
//! copy names them: Google's pprof with the copy in `PPROF_BINARY_PATH`, found by build id,
//! gives the true 75/25 split of `hidden_alpha` and `hidden_beta`.
//!
//! The build id is read by `readelf -n`, the `htlhash` computed by Python's `hashlib`, the files
//! decoded by the independent decoders: none of it by spanprof's own code.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use spanprof_tests::{
    decode_pprof, google_pprof, otlp, profile_pid, profiling_lock, python, require_profiling,
    workloads_dir, TempDir, Workload,
};

const LIBRARY: &str = "libspanprof_hidden.so";

/// The GNU build id `readelf -n` prints for `path`.
fn readelf_build_id(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .expect("readelf runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {}:\n{text}", path.display()))
        .to_string()
}

/// OpenTelemetry's `htlhash` of `path`, by Python's hashlib as the specification spells it.
fn python_htlhash(path: &Path) -> String {
    let script = "import hashlib, sys\n\
        d = open(sys.argv[1], 'rb').read()\n\
        h = hashlib.sha256(d[:4096] + d[-4096:] + len(d).to_bytes(8, 'big'))\n\
        print(h.hexdigest()[:32])";
    let out = Command::new(python())
        .args(["-c", script])
        .arg(path)
        .output()
        .expect("python runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `pprof -top` of `profile` with `PPROF_BINARY_PATH=bins`: its text, and each row's flat
/// percentage by name.
fn pprof_top(profile: &Path, bins: &Path) -> (String, Vec<(String, f64)>) {
    let out = Command::new(google_pprof())
        .args(["-top", "-nodecount=50"])
        .arg(profile)
        .env("PPROF_BINARY_PATH", bins)
        // NB: pprof writes its cache and looks for binaries under $HOME/pprof otherwise.
        .env("HOME", bins)
        .output()
        .expect("Google's pprof runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "pprof -top failed:\n{text}");
    // Rows: flat flat% sum% cum cum% name
    let rows = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || !f[1].ends_with('%') || !f[4].ends_with('%') {
                return None;
            }
            let flat: f64 = f[1].trim_end_matches('%').parse().ok()?;
            Some((f[5..].join(" "), flat))
        })
        .collect();
    (text, rows)
}

#[test]
fn a_stripped_library_is_named_by_pprof_from_the_copy_its_build_id_finds() {
    require_profiling();
    let workloads = workloads_dir();
    let stripped = workloads.join(LIBRARY);
    let unstripped = workloads.join("unstripped").join(LIBRARY);
    let build_id = readelf_build_id(&stripped);
    assert_eq!(
        build_id,
        readelf_build_id(&unstripped),
        "strip kept the build id"
    );
    let htlhash = python_htlhash(&stripped);

    let _lock = profiling_lock();
    let tmp = TempDir::new("build-ids");
    let pprof = tmp.join("out.pb.gz");
    let otlp_file = tmp.join("out.otlp");
    let workload = Workload::start("hidden_main", 10.0);
    let out = profile_pid(workload.pid(), "2s", 499, &[&pprof, &otlp_file], &[]);
    drop(workload);
    out.assert_success();

    // pprof, by the independent decoder: the library's mapping has its build id, and its
    // frames are addresses without a name.
    let decoded = decode_pprof(&pprof);
    let mappings: Vec<&Value> = decoded["mappings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["filename"].as_str().is_some_and(|f| f.ends_with(LIBRARY)))
        .collect();
    assert_eq!(mappings.len(), 1, "{:#}", decoded["mappings"]);
    assert_eq!(mappings[0]["build_id"], build_id.as_str());
    let mut library_frames = 0;
    let mut total = 0i64;
    for sample in decoded["samples"].as_array().unwrap() {
        total += sample["values"][0].as_i64().unwrap();
        for frame in sample["stack"].as_array().unwrap() {
            if frame["mapping"]
                .as_str()
                .is_some_and(|m| m.ends_with(LIBRARY))
            {
                library_frames += 1;
                assert!(
                    frame["function"].is_null() && frame["line"].is_null(),
                    "a frame of the stripped library has a line: {frame}"
                );
            }
        }
    }
    assert!(total >= 300, "only {total} samples\n{out}");
    assert!(library_frames > 0, "no frame in {LIBRARY}\n{out}");

    // Google's pprof, with the unstripped copy where PPROF_BINARY_PATH has it by build id.
    let bins = tmp.join("bins");
    std::fs::create_dir_all(bins.join(&build_id)).unwrap();
    std::fs::copy(&unstripped, bins.join(&build_id).join(LIBRARY)).unwrap();
    let (text, rows) = pprof_top(&pprof, &bins);
    assert!(
        text.lines().next() == Some("File: hidden_main"),
        "pprof's File: is not the executable:\n{text}"
    );
    let flat = |name: &str| rows.iter().find(|(n, _)| n == name).map_or(0.0, |r| r.1);
    let (alpha, beta) = (flat("hidden_alpha"), flat("hidden_beta"));
    assert!(
        alpha + beta >= 90.0,
        "pprof names {alpha}% + {beta}% of the samples hidden_alpha/hidden_beta:\n{text}"
    );
    let split = 100.0 * alpha / (alpha + beta);
    assert!(
        (split - 75.0).abs() <= 5.0,
        "hidden_alpha is {split:.1}% of the library's time, truth 75%:\n{text}"
    );

    // Without the copy, the names are nowhere: they came from the file the build id found.
    let empty = tmp.join("no-bins");
    std::fs::create_dir_all(&empty).unwrap();
    let (text, _) = pprof_top(&pprof, &empty);
    assert!(
        !text.contains("hidden_alpha") && !text.contains("hidden_beta"),
        "pprof names the hidden functions without their copy:\n{text}"
    );

    // OTLP, by the independent decoder: the mapping has both ids; no line on its frames.
    let decoded = otlp::decode_file(&otlp_file);
    otlp::assert_valid(&decoded);
    let mut seen = 0;
    for (_, profile) in otlp::profiles(&decoded) {
        for sample in profile["samples"].as_array().into_iter().flatten() {
            for frame in sample["frames"].as_array().into_iter().flatten() {
                if !frame["mapping"]
                    .as_str()
                    .is_some_and(|m| m.ends_with(LIBRARY))
                {
                    continue;
                }
                seen += 1;
                let attrs = &frame["mapping_attributes"];
                assert_eq!(
                    attrs["process.executable.build_id.gnu"],
                    build_id.as_str(),
                    "{frame}"
                );
                assert_eq!(
                    attrs["process.executable.build_id.htlhash"],
                    htlhash.as_str(),
                    "{frame}"
                );
                assert_eq!(frame["function"], "", "{frame}");
            }
        }
    }
    assert!(seen > 0, "no OTLP frame in {LIBRARY}");
}
