//! 8. The Python view: a workload split between pure-Python arithmetic and zlib
//!    (`py_native_split.py`, which measures its own split), profiled by pid from its first
//!    chunk of work to its exit. Every output puts the Python function first at its measured
//!    share, the native library's frames under the Python function that called them, and no
//!    function of the interpreter among the first rows; the same file read with `--view full`
//!    (or `--native`) shows the interpreter's functions.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use spanprof_tests::rootfs::{
    exec_mapped_files, rootfs, rootfs_debug_files, start_confined_py, Confinement, RootfsDir,
};
use spanprof_tests::{
    args, folded_total, is_kernel_frame, last_json_line, parse_py_frame, profiling_lock,
    read_folded, run_spanprof, spanprof_command, start_py_workload, Background, RunOutput, TempDir,
    RUN_TIMEOUT,
};

use crate::common::{require_python_profiling, top, Interp};

/// CPU seconds of work: ~2000 samples at 499 Hz whatever the machine's load.
const CPU_SECONDS: &str = "4";
const FREQUENCY: u64 = 499;

/// A running `py_native_split.py` waiting for its go file.
struct Waiting {
    workload: Background,
    pid: u32,
    /// Where the test creates the go file (a host path).
    go: PathBuf,
    /// The interpreter's files (executable, libpython) and their debug files, as host paths.
    interpreter_files: Vec<PathBuf>,
    /// libz's file, as a host path.
    libz_files: Vec<PathBuf>,
    label: String,
}

/// The files of `pid` that hold the interpreter: a mapped executable file named `python…` or
/// `libpython…`, not an extension module (`….cpython-3X-….so`).
fn interpreter_files(files: &[PathBuf]) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|f| {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            (name.starts_with("python") || name.starts_with("libpython"))
                && !name.contains(".cpython-")
        })
        .cloned()
        .collect()
}

/// The mapped files of libz (`libz.so.1…`).
fn libz_files(files: &[PathBuf]) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|f| {
            f.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libz.so"))
        })
        .cloned()
        .collect()
}

/// The functions `files` define (`nm --defined-only`, with and without `-D`; binutils, not
/// spanprof), GCC's clone suffixes (`x_add.cold`) left out as symbolizers do.
fn defined_symbols(files: &[PathBuf]) -> HashSet<String> {
    let mut names = HashSet::new();
    for file in files {
        for dynamic in [true, false] {
            let mut cmd = std::process::Command::new("nm");
            cmd.arg("--defined-only");
            if dynamic {
                cmd.arg("-D");
            }
            let out = cmd.arg(file).output().expect("run nm (binutils)");
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(name) = line.split_whitespace().nth(2) {
                    let name = name.split('@').next().unwrap_or(name);
                    names.insert(name.split('.').next().unwrap_or(name).to_string());
                }
            }
        }
    }
    names
}

fn pyenv_waiting(interp: &Interp, tmp: &TempDir) -> Waiting {
    let go = tmp.join("go");
    let go_arg = go.to_str().expect("UTF-8 path").to_owned();
    let workload = start_py_workload(&interp.path, "py_native_split.py", &[CPU_SECONDS, &go_arg]);
    let pid = workload.pid();
    let mapped: Vec<PathBuf> = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("read the workload's maps")
        .lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
        .filter_map(|l| l.split_whitespace().nth(5).map(PathBuf::from))
        .collect();
    Waiting {
        workload,
        pid,
        go,
        interpreter_files: interpreter_files(&mapped),
        libz_files: libz_files(&mapped),
        label: interp.label.clone(),
    }
}

/// The Python view of `py_native_split.py` run by `waiting`'s interpreter (see the module).
fn python_view_puts_the_users_code_first(waiting: Waiting, tmp: &TempDir) {
    let Waiting {
        workload,
        pid,
        go,
        interpreter_files,
        libz_files,
        label,
    } = waiting;
    assert!(
        !interpreter_files.is_empty(),
        "{label}: no interpreter file among the files pid {pid} maps"
    );
    let interpreter_names = defined_symbols(&interpreter_files);
    let interpreter_modules: Vec<String> = interpreter_files
        .iter()
        .filter_map(|f| f.file_name()?.to_str().map(str::to_owned))
        .collect();
    // An interpreter function as a row or frame name shows it: a name its files define, or
    // an unknown address in one of them.
    let is_interpreter = |name: &str| {
        let base = name.split(" (").next().unwrap_or(name);
        interpreter_names.contains(base)
            || interpreter_modules
                .iter()
                .any(|m| name.starts_with(&format!("[unknown] ({m}")))
    };
    let is_python = |name: &str| name.ends_with(".py)") || parse_py_frame(name).is_some();

    let pb = tmp.join("run.pb.gz");
    let folded = tmp.join("run.folded");
    let svg = tmp.join("run.svg");
    let speedscope = tmp.join("run.speedscope.json");
    let _lock = profiling_lock();
    let mut session = Background::spawn(spanprof_command(args![
        "profile",
        "--pid",
        pid.to_string(),
        "-F",
        FREQUENCY.to_string(),
        "-o",
        &pb,
        "-o",
        &folded,
        "-o",
        &svg,
        "-o",
        &speedscope,
    ]));
    session.wait_for_stderr("spanprof: profiling", Duration::from_secs(30));
    std::fs::write(&go, b"").expect("create the go file");
    let workload_out = workload.finish(RUN_TIMEOUT);
    let out = session.finish(RUN_TIMEOUT);
    workload_out.assert_success();
    out.assert_success();
    let truth = last_json_line(&workload_out.stdout);
    let truth_arith = 100.0 * truth["truth"]["arith"].as_f64().expect("truth.arith");
    let truth_squeeze = 100.0 * truth["truth"]["squeeze"].as_f64().expect("truth.squeeze");
    let stacks = read_folded(&folded);
    let mut problems = Vec::new();

    // The report, in the default view.
    let report = report_json(&pb, &[]);
    let rows = report["functions"].as_array().expect("functions");
    let name = |i: usize| rows.get(i).and_then(|r| r["name"].as_str()).unwrap_or("");
    let share = |i: usize| {
        100.0
            * rows
                .get(i)
                .map_or(0.0, |r| r["self_share"].as_f64().unwrap())
    };
    if !name(0).starts_with("arith (") {
        problems.push(format!("the first row is {:?}, not arith", name(0)));
    } else if (share(0) - truth_arith).abs() > 5.0 {
        problems.push(format!(
            "arith's self share {:.1}% is not within ±5 points of the truth {truth_arith:.1}%",
            share(0)
        ));
    }
    let second = name(1);
    if second.is_empty() || is_python(second) || is_interpreter(second) {
        problems.push(format!(
            "the second row {second:?} is not native code outside the interpreter (libz, zlib)"
        ));
    }
    for i in 0..5.min(rows.len()) {
        if !is_python(name(i)) && is_interpreter(name(i)) {
            problems.push(format!(
                "row {} is the interpreter's function {:?} ({:.1}% self)",
                i + 1,
                name(i),
                share(i)
            ));
        }
    }

    // `squeeze` holds zlib's share of the time, and libz's frames are the leaves of most of it
    // (the rest is the zlib module, memcpy, malloc and page faults: libz's leaves were 80–99%
    // of squeeze's samples in 27 runs of 3.8–3.13, so their share of all samples, bound to
    // zlib's measured share, varied with them and failed a 0.8× bound on a loaded machine).
    let total = folded_total(&stacks);
    let libz_names = defined_symbols(&libz_files);
    let is_libz = |f: &str| {
        libz_names.contains(f.split(" (").next().unwrap_or(f))
            || f.starts_with("[unknown] (libz.so")
    };
    let (mut libz, mut under_squeeze, mut squeeze) = (0u64, 0u64, 0u64);
    for s in &stacks {
        if s.py_qualnames().contains(&"squeeze") {
            squeeze += s.count;
        }
        if !s
            .frames
            .iter()
            .rev()
            .find(|f| !is_kernel_frame(f))
            .is_some_and(|leaf| is_libz(leaf))
        {
            continue;
        }
        libz += s.count;
        if s.py_leaf().is_some_and(|p| p.qualname == "squeeze") {
            under_squeeze += s.count;
        }
    }
    let squeeze_share = 100.0 * squeeze as f64 / total.max(1) as f64;
    if (squeeze_share - truth_squeeze).abs() > 5.0 {
        problems.push(format!(
            "squeeze's total share {squeeze_share:.1}% is not within ±5 points of the truth \
             {truth_squeeze:.1}%"
        ));
    }
    if (libz as f64) < 0.65 * squeeze as f64 {
        problems.push(format!(
            "libz's frames are the leaves of {libz} samples, under two thirds of squeeze's \
             {squeeze}"
        ));
    }
    if (under_squeeze as f64) < 0.99 * libz as f64 {
        problems.push(format!(
            "only {under_squeeze} of the {libz} samples in libz are under squeeze"
        ));
    }

    // The session's summary names arith first.
    let first_top = out
        .stderr
        .split_once("top functions (self):\n")
        .and_then(|(_, rest)| rest.lines().next())
        .unwrap_or("");
    if !first_top.contains("arith (") {
        problems.push(format!(
            "the summary's first function is not arith: {first_top:?}"
        ));
    }

    // Folded, SVG and speedscope agree with the report.
    let folded_arith: u64 = stacks
        .iter()
        .filter(|s| {
            s.frames
                .last()
                .and_then(|f| parse_py_frame(f))
                .is_some_and(|p| p.qualname == "arith")
        })
        .map(|s| s.count)
        .sum();
    let report_arith = rows.first().and_then(|r| r["self"].as_u64()).unwrap_or(0);
    if folded_arith != report_arith {
        problems.push(format!(
            "arith's self samples: {folded_arith} in the folded file, {report_arith} in the report"
        ));
    }
    // The SVG names frames as flame graphs do: kernel frames without `_[k]`, a module's
    // unknown addresses as one `[unknown] (libz.so.1)`.
    let as_in_svg = |f: &str| -> String {
        let f = f.strip_suffix("_[k]").unwrap_or(f);
        match f
            .strip_prefix("[unknown] (")
            .and_then(|r| r.rsplit_once("+0x"))
        {
            Some((module, _)) => format!("[unknown] ({module})"),
            None => f.to_string(),
        }
    };
    let in_folded: HashSet<String> = stacks
        .iter()
        .flat_map(|s| s.frames.iter().map(|f| as_in_svg(f)))
        .collect();
    let svg_frames = svg_titles(&svg);
    let svg_arith: u64 = svg_frames
        .iter()
        .filter(|(n, _)| n.starts_with("arith ("))
        .map(|(_, c)| c)
        .sum();
    let folded_with_arith: u64 = stacks
        .iter()
        .filter(|s| s.py_qualnames().contains(&"arith"))
        .map(|s| s.count)
        .sum();
    if svg_arith != folded_with_arith {
        problems.push(format!(
            "arith's frames have {svg_arith} samples in the SVG, {folded_with_arith} in the folded file"
        ));
    }
    for (n, _) in &svg_frames {
        if n != "all" && !in_folded.contains(n) {
            problems.push(format!("the SVG's frame {n:?} is in no folded stack"));
        }
    }
    let (ss_arith, ss_total) = speedscope_self(&speedscope, "arith");
    let ss_share = 100.0 * ss_arith / ss_total.max(1.0);
    let folded_share = 100.0 * folded_arith as f64 / total.max(1) as f64;
    if (ss_share - folded_share).abs() > 1e-6 {
        problems.push(format!(
            "arith's self share: {ss_share:.3}% in speedscope, {folded_share:.3}% folded"
        ));
    }

    // The full view of the same file: the interpreter's functions are there; --native says
    // the same.
    let full = report_json(&pb, &["--view", "full"]);
    let full_rows = full["functions"].as_array().expect("functions");
    let interpreter_rows: Vec<&str> = full_rows
        .iter()
        .filter(|r| r["self"].as_u64().unwrap_or(0) > 0)
        .filter_map(|r| r["name"].as_str())
        .filter(|n| !is_python(n) && is_interpreter(n))
        .collect();
    if interpreter_rows.is_empty() {
        problems.push("--view full shows no function of the interpreter".to_string());
    }
    if report_json(&pb, &["--native"]) != full {
        problems.push("--native and --view full differ".to_string());
    }

    let rows_text: Vec<String> = rows
        .iter()
        .take(8)
        .map(|r| {
            format!(
                "{:.1}% {}",
                100.0 * r["self_share"].as_f64().unwrap(),
                r["name"]
            )
        })
        .collect();
    assert!(
        problems.is_empty(),
        "{label}:\n- {}\ntruth: arith {truth_arith:.1}%, squeeze {truth_squeeze:.1}%\n\
         report rows: {rows_text:#?}\nfull view's interpreter rows: {:?}\nheaviest stacks:\n{}\n{out}",
        problems.join("\n- "),
        interpreter_rows.iter().take(8).collect::<Vec<_>>(),
        top(&stacks)
    );
}

/// `spanprof report PROFILE --format json --top 0` with `extra`.
fn report_json(pb: &Path, extra: &[&str]) -> Value {
    let mut a = args!["report", pb, "--format", "json", "--top", "0"];
    a.extend(extra.iter().map(std::ffi::OsString::from));
    let out: RunOutput = run_spanprof(a);
    out.assert_success();
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("report JSON: {e}\n{out}"))
}

/// The frames of an inferno SVG: each `<title>`'s name and sample count
/// (`name (1,234 samples, 40.00%)`).
fn svg_titles(path: &Path) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(path).expect("read the SVG");
    let unescape = |s: &str| {
        s.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&")
    };
    text.split("<title>")
        .skip(1)
        .filter_map(|t| t.split_once("</title>").map(|(t, _)| unescape(t)))
        .filter_map(|t| {
            let (name, rest) = t.rsplit_once(" (")?;
            let count = rest.split(' ').next()?.replace(',', "").parse().ok()?;
            Some((name.to_string(), count))
        })
        .collect()
}

/// The weight of the samples whose leaf is the Python function `qualname`, and the total
/// weight, of a speedscope file.
fn speedscope_self(path: &Path, qualname: &str) -> (f64, f64) {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read speedscope")).unwrap();
    let frames = doc["shared"]["frames"].as_array().expect("shared.frames");
    let is_it: Vec<bool> = frames
        .iter()
        .map(|f| {
            f["name"]
                .as_str()
                .and_then(parse_py_frame)
                .is_some_and(|p| p.qualname == qualname)
        })
        .collect();
    let (mut own, mut total) = (0.0, 0.0);
    for p in doc["profiles"].as_array().expect("profiles") {
        let samples = p["samples"].as_array().expect("samples");
        let weights = p["weights"].as_array().expect("weights");
        for (s, w) in samples.iter().zip(weights) {
            let w = w.as_f64().expect("weight");
            total += w;
            let leaf = s.as_array().and_then(|s| s.last()).and_then(Value::as_u64);
            if leaf.is_some_and(|i| is_it.get(i as usize) == Some(&true)) {
                own += w;
            }
        }
    }
    (own, total)
}

pub(super) fn python_view_of_a_pyenv_interpreter(interp: &Interp) {
    require_python_profiling();
    let tmp = TempDir::new("py-view");
    let waiting = pyenv_waiting(interp, &tmp);
    python_view_puts_the_users_code_first(waiting, &tmp);
}

/// sid's stripped `python3.14` in a container: its interpreter file and debug file are the
/// rootfs's.
pub(super) fn python_view_of_sid_3_14_in_a_container() {
    require_python_profiling();
    let root = rootfs();
    let dir = RootfsDir::new(&root, "py-view");
    let tmp = TempDir::new("py-view-sid");
    let go_inside = dir.inside.join("go");
    let workload = start_confined_py(
        &root,
        &dir,
        Confinement::Container,
        "/usr/bin/python3.14",
        "py_native_split.py",
        &[CPU_SECONDS, go_inside.to_str().expect("UTF-8 path")],
    );
    let pid = workload.pid();
    let mapped = exec_mapped_files(pid, &root, Confinement::Container);
    let mut files = interpreter_files(&mapped);
    let debug = rootfs_debug_files(&root, &files);
    files.extend(debug);
    assert!(!files.is_empty(), "no interpreter file in {mapped:?}");
    let waiting = Waiting {
        workload,
        pid,
        go: dir.host.join("go"),
        interpreter_files: files,
        libz_files: libz_files(&mapped),
        label: "sid's /usr/bin/python3.14 in a container".to_string(),
    };
    python_view_puts_the_users_code_first(waiting, &tmp);
    drop(dir);
}
