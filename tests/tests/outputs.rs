//! The output formats, written from one session with several `-o`: pprof
//! decoded by an independent decoder (Python `protobuf`, public
//! profile.proto), folded, a flamegraph SVG rendered in headless Chromium, and
//! speedscope JSON. They agree with each other and are private (mode 0600).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use spanprof_tests::{
    args, assert_private_output, c_function_lines, chromium_command, decode_pprof, folded_count,
    folded_total, python, read_folded, require_profiling, run_spanprof, run_with_timeout,
    svg_title_and_subtitle, workload_path, workspace_root, FoldedStack, TempDir, Workload,
};

const FREQUENCY: u64 = 199;

/// One session on cpu_split, written in every format, shared by the tests
/// of this file (each checks one format).
struct Session {
    dir: TempDir,
    pid: u32,
    stderr: String,
}

impl Session {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn folded(&self) -> Vec<FoldedStack> {
        read_folded(&self.path("profile.folded"))
    }
}

fn session() -> &'static Session {
    static SESSION: OnceLock<Session> = OnceLock::new();
    SESSION.get_or_init(|| {
        require_profiling();
        let dir = TempDir::new("outputs");
        let workload = Workload::start("cpu_split", 10.0);
        let pid = workload.pid();
        let out = run_spanprof(args![
            "profile",
            "--pid",
            pid.to_string(),
            "--duration",
            "3s",
            "--frequency",
            FREQUENCY.to_string(),
            "-o",
            dir.join("profile.folded"),
            "-o",
            dir.join("profile.pb.gz"),
            "-o",
            dir.join("profile.svg"),
            "-o",
            dir.join("profile.speedscope.json"),
        ]);
        drop(workload);
        out.assert_success();
        Session {
            dir,
            pid,
            stderr: out.to_string(),
        }
    })
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string in {v}"))
}

#[test]
fn all_outputs_are_written_with_mode_0600() {
    let s = session();
    for name in [
        "profile.folded",
        "profile.pb.gz",
        "profile.svg",
        "profile.speedscope.json",
    ] {
        assert_private_output(&s.path(name));
    }
    // Nothing else (no temporary or partial files) is left beside them.
    assert_eq!(
        s.dir.entries(),
        [
            "profile.folded",
            "profile.pb.gz",
            "profile.speedscope.json",
            "profile.svg"
        ]
    );
}

#[test]
fn pprof_decodes_and_agrees_with_folded() {
    let s = session();
    let folded = s.folded();
    let prof = decode_pprof(&s.path("profile.pb.gz"));

    // Sample type samples/count first; period cpu/nanoseconds of 1e9/Hz.
    let first_type = &prof["sample_types"][0];
    assert_eq!(str_of(first_type, "type"), "samples", "{first_type}");
    assert_eq!(str_of(first_type, "unit"), "count", "{first_type}");
    let period_type = &prof["period_type"];
    assert_eq!(str_of(period_type, "type"), "cpu", "{period_type}");
    assert_eq!(str_of(period_type, "unit"), "nanoseconds", "{period_type}");
    let period = prof["period"].as_i64().expect("period");
    let expected = 1_000_000_000 / FREQUENCY as i64;
    assert!(
        (period - expected).abs() <= 1,
        "period {period}, expected 1e9/{FREQUENCY} = {expected}"
    );

    // The same samples as the folded output of the same session.
    let total = prof["totals"]["samples"].as_u64().expect("totals.samples");
    assert!(total > 0, "empty pprof:\n{}", s.stderr);
    // The first mapping, which pprof prints as `File:`, is the target's executable.
    let exe = workload_path("cpu_split")
        .canonicalize()
        .expect("the workload exists");
    assert_eq!(
        prof["mappings"][0]["filename"].as_str(),
        exe.to_str(),
        "{}",
        prof["mappings"]
    );
    // Then their CPU time, as Go's CPU profiles give it: each count times the period.
    let second_type = &prof["sample_types"][1];
    assert_eq!(str_of(second_type, "type"), "cpu", "{second_type}");
    assert_eq!(str_of(second_type, "unit"), "nanoseconds", "{second_type}");
    assert_eq!(
        prof["totals"]["cpu"].as_i64(),
        Some(total as i64 * period),
        "cpu/nanoseconds total is not samples × period"
    );
    assert_eq!(
        total,
        folded_total(&folded),
        "pprof and folded totals differ"
    );
    let samples = prof["samples"].as_array().expect("samples");
    let pprof_count = |name: &str| -> u64 {
        samples
            .iter()
            .filter(|smp| {
                smp["stack_root_first"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|f| f == name)
            })
            .map(|smp| smp["values"][0].as_u64().unwrap())
            .sum()
    };
    for name in ["hot_alpha", "hot_beta", "dispatcher"] {
        assert_eq!(
            pprof_count(name),
            folded_count(&folded, |st| st.contains(name)),
            "samples containing {name} differ between pprof and folded"
        );
    }
    let full_path = samples.iter().any(|smp| {
        let names: Vec<&str> = smp["stack_root_first"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        spanprof_tests::contains_seq(&names, &["main", "dispatcher", "hot_alpha"])
    });
    assert!(full_path, "no pprof sample has main;dispatcher;hot_alpha");

    // Labels: thread.id (num) and thread.name (str) on every sample; the
    // workload is single-threaded, so its thread id is its pid.
    for smp in samples {
        let labels = smp["labels"].as_array().expect("labels");
        let tid = labels
            .iter()
            .find(|l| l["key"] == "thread.id")
            .unwrap_or_else(|| panic!("sample without thread.id: {smp}"));
        let tid = tid["num"]
            .as_u64()
            .unwrap_or_else(|| panic!("thread.id is not a number: {tid}"));
        let name = labels
            .iter()
            .find(|l| l["key"] == "thread.name")
            .unwrap_or_else(|| panic!("sample without thread.name: {smp}"));
        let name = name["str"]
            .as_str()
            .unwrap_or_else(|| panic!("thread.name is not a string: {name}"));
        assert_eq!(tid, u64::from(s.pid), "thread.id of {smp}");
        assert_eq!(name, "cpu_split", "thread.name of {smp}");
    }
}

#[test]
fn pprof_has_files_lines_and_mappings_from_dwarf() {
    let s = session();
    let prof = decode_pprof(&s.path("profile.pb.gz"));
    let source_path = workspace_root().join("tests/workloads/cpu_split.c");
    let source = std::fs::read_to_string(&source_path).expect("cpu_split.c");

    let frames: Vec<&Value> = prof["samples"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|smp| smp["stack"].as_array().unwrap())
        .collect();
    for function in ["hot_alpha", "hot_beta", "dispatcher", "main"] {
        let (first, last) = c_function_lines(&source, function);
        let of_function: Vec<&&Value> = frames
            .iter()
            .filter(|f| f["function"] == function)
            .collect();
        assert!(
            !of_function.is_empty(),
            "no frame of {function} in the pprof"
        );
        for frame in of_function {
            let file = frame["file"].as_str().unwrap_or("");
            assert!(
                file.ends_with("cpu_split.c"),
                "{function} has file {file:?}, expected …/cpu_split.c: {frame}"
            );
            let line = frame["line"].as_i64().unwrap_or(0);
            assert!(
                (first..=last).contains(&line),
                "{function} frame at line {line}, outside its body {first}..={last}: {frame}"
            );
            let start_line = frame["start_line"].as_i64().unwrap_or(0);
            assert!(
                start_line == 0 || start_line == first,
                "{function} has start_line {start_line}, defined at {first}: {frame}"
            );
            let mapping = frame["mapping"].as_str().unwrap_or("");
            assert!(
                mapping.ends_with("/cpu_split"),
                "{function} frame's mapping is {mapping:?}, expected …/cpu_split: {frame}"
            );
        }
    }
    let mappings = prof["mappings"].as_array().expect("mappings");
    assert!(
        mappings.iter().any(|m| m["filename"]
            .as_str()
            .is_some_and(|f| f.ends_with("/cpu_split"))),
        "no mapping of the cpu_split executable: {mappings:?}"
    );
}

#[test]
fn folded_is_well_formed_and_complete() {
    let s = session();
    // read_folded checks every line's shape.
    let folded = s.folded();
    assert!(folded_total(&folded) > 0, "empty folded output");
    assert!(
        folded
            .iter()
            .any(|st| st.contains_seq(&["main", "dispatcher", "hot_alpha"])),
        "no main;dispatcher;hot_alpha stack"
    );
}

#[test]
fn svg_is_well_formed_xml() {
    let s = session();
    let svg = s.path("profile.svg");
    let mut cmd = Command::new(python());
    cmd.args([
        "-c",
        "import sys, xml.etree.ElementTree as ET\n\
         root = ET.parse(sys.argv[1]).getroot()\n\
         text = ' '.join(t for e in root.iter() for t in (e.text,) if t)\n\
         print(root.tag)\n\
         print('hot_alpha' in text)",
    ])
    .arg(&svg);
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    out.assert_success();
    let mut lines = out.stdout.lines();
    assert_eq!(
        lines.next(),
        Some("{http://www.w3.org/2000/svg}svg"),
        "root element is not an SVG svg element:\n{out}"
    );
    assert_eq!(
        lines.next(),
        Some("True"),
        "no element text mentions hot_alpha"
    );
}

#[test]
fn svg_title_names_the_target_and_subtitle_the_session() {
    let s = session();
    let (title, subtitle) = svg_title_and_subtitle(&s.path("profile.svg"));
    assert_eq!(
        title,
        format!("spanprof: pid {} (cpu_split)", s.pid),
        "SVG title"
    );
    // `3.0 s at 199 Hz, 1190 samples`: the same count as the folded output.
    let total = folded_total(&s.folded());
    let expected_tail = format!(" s at {FREQUENCY} Hz, {total} samples");
    let seconds = subtitle
        .strip_suffix(&expected_tail)
        .unwrap_or_else(|| panic!("SVG subtitle {subtitle:?} does not end in {expected_tail:?}"));
    let seconds: f64 = seconds
        .parse()
        .unwrap_or_else(|_| panic!("SVG subtitle {subtitle:?} does not start with seconds"));
    assert!(
        (2.9..=3.5).contains(&seconds),
        "SVG subtitle {subtitle:?}: a 3 s session"
    );
}

#[test]
fn svg_renders_in_headless_chromium() {
    let s = session();
    let svg = s.path("profile.svg");
    let browser_dir = TempDir::new("chromium");
    let url = format!("file://{}", svg.display());

    let mut dump = chromium_command(&browser_dir.join("dump"));
    dump.arg("--dump-dom").arg(&url);
    let out = run_with_timeout(dump, Duration::from_secs(120));
    out.assert_success();
    assert!(
        out.stdout.contains("hot_alpha") && out.stdout.contains("dispatcher"),
        "the DOM Chromium rendered does not show hot_alpha and dispatcher:\n{}",
        &out.stdout[..out.stdout.len().min(4000)]
    );

    let png = browser_dir.join("flamegraph.png");
    let mut shot = chromium_command(&browser_dir.join("shot"));
    shot.arg(format!("--screenshot={}", png.display()))
        .arg("--window-size=1200,900")
        .arg(&url);
    let out = run_with_timeout(shot, Duration::from_secs(120));
    out.assert_success();
    let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot: {e}\n{out}"));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 5000,
        "the screenshot is not a plausible PNG ({} bytes)",
        bytes.len()
    );
}

#[test]
fn speedscope_json_parses_and_agrees_with_folded() {
    let s = session();
    let path = s.path("profile.speedscope.json");
    let text = std::fs::read_to_string(&path).expect("speedscope file");
    let doc: Value = serde_json::from_str(&text).expect("speedscope JSON parses");
    assert_eq!(
        doc["$schema"], "https://www.speedscope.app/file-format-schema.json",
        "speedscope $schema"
    );
    let frames = doc["shared"]["frames"].as_array().expect("shared.frames");
    assert!(
        frames.iter().any(|f| f["name"] == "hot_alpha"),
        "no hot_alpha frame in shared.frames"
    );
    let profiles = doc["profiles"].as_array().expect("profiles");
    assert!(!profiles.is_empty(), "no profiles");

    let folded_total = folded_total(&s.folded());
    let mut weight_total = 0f64;
    let mut unit = None;
    for p in profiles {
        assert_eq!(
            p["type"], "sampled",
            "only sampled profiles are expected: {p}"
        );
        let samples = p["samples"].as_array().expect("samples");
        let weights = p["weights"].as_array().expect("weights");
        assert_eq!(
            samples.len(),
            weights.len(),
            "samples and weights differ in length"
        );
        for stack in samples {
            for idx in stack
                .as_array()
                .expect("a sample is an array of frame indices")
            {
                let idx = idx.as_u64().expect("frame index") as usize;
                assert!(idx < frames.len(), "frame index {idx} out of range");
            }
        }
        weight_total += weights
            .iter()
            .map(|w| w.as_f64().expect("a weight is a number"))
            .sum::<f64>();
        let this_unit = p["unit"].as_str().expect("unit").to_owned();
        assert!(
            unit.get_or_insert_with(|| this_unit.clone()) == &this_unit,
            "profiles use different units"
        );
    }
    match unit.as_deref() {
        Some("none") => assert_eq!(weight_total, folded_total as f64, "weights vs folded total"),
        Some("nanoseconds") => {
            let period = 1_000_000_000 / FREQUENCY;
            let expected = (folded_total * period) as f64;
            assert!(
                (weight_total - expected).abs() <= folded_total as f64,
                "weights {weight_total} ns vs {folded_total} samples of {period} ns"
            );
        }
        other => panic!("unexpected speedscope unit {other:?}"),
    }
}

/// The speedscope file of a session is a timeline: `alternate`'s two threads each switch
/// between `phase_a` and `phase_b` every 40 ms of CPU (about 75 times in 3 s), and the
/// "time order" view's samples of each thread follow them (an aggregated file would switch
/// once).
#[test]
fn speedscope_time_order_is_a_timeline_of_each_thread() {
    require_profiling();
    let _lock = spanprof_tests::profiling_lock();
    let dir = TempDir::new("speedscope-timeline");
    let out = dir.join("alt.speedscope.json");
    let run = run_spanprof(args![
        "profile",
        "-F",
        "499",
        "--no-kernel",
        "--speedscope-per-thread",
        "-o",
        &out,
        "--",
        workload_path("alternate"),
        "3"
    ]);
    run.assert_success();
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let frames = json["shared"]["frames"].as_array().unwrap();
    let profiles = json["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 2, "{run}");
    for p in profiles {
        // The phases each sample is in, in the file's order; a switch is a change.
        let mut phases: Vec<&str> = Vec::new();
        for sample in p["samples"].as_array().unwrap() {
            let phase = sample
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|i| frames[i.as_u64().unwrap() as usize]["name"].as_str())
                .rfind(|n| *n == "phase_a" || *n == "phase_b");
            if let Some(phase) = phase {
                if phases.last() != Some(&phase) {
                    phases.push(phase);
                }
            }
        }
        let switches = phases.len().saturating_sub(1);
        assert!(
            (50..=90).contains(&switches),
            "{}: {switches} switches between phase_a and phase_b (truth about 75)\n{run}",
            p["name"]
        );
        let weights: u64 = p["weights"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_u64().unwrap())
            .sum();
        assert_eq!(Some(weights), p["endValue"].as_u64());
    }
}
