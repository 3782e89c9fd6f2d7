//! Reading spanprof's outputs: the summary's first line, SVG titles, pprof files through the
//! independent decoder and their samples' labels and functions, output file modes, and the
//! line numbers of a C workload's functions.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{python, run_with_timeout, workspace_root};

/// The first line of spanprof's end-of-session summary:
/// `spanprof: N samples, M lost, from P process(es) in S s at F Hz: TARGET`,
/// and the pids of its `processes: PID (name), …` line when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub samples: u64,
    pub lost: u64,
    pub processes: u64,
    pub frequency: u64,
    pub target: String,
    /// The pids of the `processes:` line (empty without one).
    pub pids: Vec<u32>,
}

/// Finds and parses the summary in spanprof's stderr; `Err` says what is
/// missing or malformed.
pub fn parse_summary(stderr: &str) -> Result<Summary, String> {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("spanprof: ") && l.contains(" samples, ") && l.contains(" lost, "))
        .ok_or("no `spanprof: N samples, M lost, …` summary line")?;
    let bad = |what: &str| format!("summary line {line:?}: {what}");
    let rest = line.strip_prefix("spanprof: ").expect("checked");
    let (samples, rest) = rest
        .split_once(" samples, ")
        .ok_or_else(|| bad("no sample count"))?;
    let (lost, rest) = rest
        .split_once(" lost, from ")
        .ok_or_else(|| bad("no lost count"))?;
    let (processes, rest) = rest
        .split_once(" process")
        .ok_or_else(|| bad("no process count"))?;
    let (_, rest) = rest.split_once(" at ").ok_or_else(|| bad("no frequency"))?;
    let (frequency, target) = rest.split_once(" Hz: ").ok_or_else(|| bad("no target"))?;
    let number = |s: &str, what: &str| -> Result<u64, String> {
        s.parse()
            .map_err(|_| bad(&format!("{what} {s:?} is not a number")))
    };
    let mut pids = Vec::new();
    if let Some(procs) = stderr.lines().find_map(|l| l.strip_prefix("processes: ")) {
        for entry in procs.split(", ") {
            let pid = entry.split(' ').next().unwrap_or_default();
            pids.push(
                pid.parse()
                    .map_err(|_| format!("processes line {procs:?}: bad pid {pid:?}"))?,
            );
        }
    }
    Ok(Summary {
        samples: number(samples, "sample count")?,
        lost: number(lost, "lost count")?,
        processes: number(processes, "process count")?,
        frequency: number(frequency, "frequency")?,
        target: target.to_owned(),
        pids,
    })
}

/// The texts of the flame graph's title and subtitle elements (ids `title`
/// and `subtitle`), read with Python's XML parser.
#[track_caller]
pub fn svg_title_and_subtitle(path: &Path) -> (String, String) {
    let mut cmd = Command::new(python());
    cmd.args([
        "-c",
        "import sys, xml.etree.ElementTree as ET\n\
         root = ET.parse(sys.argv[1]).getroot()\n\
         by_id = {e.get('id'): ''.join(e.itertext()) for e in root.iter() if e.get('id')}\n\
         print(by_id.get('title', '<no title element>'))\n\
         print(by_id.get('subtitle', '<no subtitle element>'))",
    ])
    .arg(path);
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    out.assert_success();
    let mut lines = out.stdout.lines().map(str::to_owned);
    let title = lines.next().unwrap_or_default();
    let subtitle = lines.next().unwrap_or_default();
    (title, subtitle)
}

/// The decoder script, `tests/tools/decode_pprof.py`.
pub fn decoder_script() -> PathBuf {
    workspace_root().join("tests/tools/decode_pprof.py")
}

/// Decodes a pprof file with the independent Python decoder; `Err` has its
/// complaint when the file breaks an invariant of the format.
#[track_caller]
pub fn try_decode_pprof(path: &Path) -> Result<serde_json::Value, String> {
    let mut cmd = Command::new(python());
    cmd.arg(decoder_script()).arg(path);
    let out = run_with_timeout(cmd, Duration::from_secs(120));
    if !out.status.success() {
        return Err(out.to_string());
    }
    serde_json::from_str(&out.stdout).map_err(|e| format!("decoder printed invalid JSON: {e}"))
}

/// Decodes a pprof file, panicking with the decoder's complaint when invalid.
#[track_caller]
pub fn decode_pprof(path: &Path) -> serde_json::Value {
    try_decode_pprof(path).unwrap_or_else(|e| panic!("pprof {} is invalid:\n{e}", path.display()))
}

/// The permission bits of a file.
#[track_caller]
pub fn file_mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("cannot stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Asserts that an output file exists, is not empty and has mode 0600.
#[track_caller]
pub fn assert_private_output(path: &Path) {
    let meta = std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("output {} was not written: {e}", path.display()));
    assert!(meta.len() > 0, "output {} is empty", path.display());
    let mode = meta.permissions().mode() & 0o7777;
    assert_eq!(
        mode,
        0o600,
        "output {} has mode {mode:o}, expected 600",
        path.display()
    );
}

/// Line numbers `(first, last)` of the definition of C function `name` in a
/// workload's source: from the line with `name(` to the next line that is `}`.
#[track_caller]
pub fn c_function_lines(source: &str, name: &str) -> (i64, i64) {
    let lines: Vec<&str> = source.lines().collect();
    let signature = format!(" {name}(");
    let start = lines
        .iter()
        .position(|l| l.contains(&signature) && !l.trim_end().ends_with(';'))
        .unwrap_or_else(|| panic!("no definition of {name} in the source"));
    let end = lines[start..]
        .iter()
        .position(|l| *l == "}")
        .map(|i| start + i)
        .unwrap_or_else(|| panic!("no end of {name} in the source"));
    (start as i64 + 1, end as i64 + 1)
}

/// The string labels of a decoded pprof sample (see [`decode_pprof`]), by key.
pub fn sample_str_labels(sample: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    sample["labels"]
        .as_array()
        .map(|labels| {
            labels
                .iter()
                .filter_map(|l| {
                    Some((l["key"].as_str()?.to_owned(), l["str"].as_str()?.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The numeric label `key` of a decoded pprof sample.
pub fn sample_num_label(sample: &serde_json::Value, key: &str) -> Option<i64> {
    sample["labels"]
        .as_array()?
        .iter()
        .find(|l| l["key"] == key)
        .and_then(|l| l["num"].as_i64())
}

/// The function names of a decoded pprof sample, leaf first, each cut at ` (` (the bare
/// qualname of a Python frame).
pub fn sample_functions(sample: &serde_json::Value) -> Vec<String> {
    sample["stack_leaf_first"]
        .as_array()
        .map(|frames| {
            frames
                .iter()
                .filter_map(|f| f.as_str())
                .map(|f| f.split(" (").next().unwrap_or(f).to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_c_function_lines() {
        let src = "int x;\n\nvoid f(void);\n__attribute__((noinline)) void f(void)\n{\n\tx++;\n}\n";
        assert_eq!(c_function_lines(src, "f"), (4, 7));
    }

    #[test]
    fn parses_the_summary() {
        let stderr = "spanprof: profiling pid 7 (a), pid 9 (b) at 99 Hz for 2s; Ctrl-C to stop early\n\
                      spanprof: 221 samples, 3 lost, from 2 processes in 2.0 s at 99 Hz: pid 7 (a), pid 9 (b)\n\
                      processes: 7 (a), 9 (b x)\n\
                      top functions (self):\n";
        assert_eq!(
            parse_summary(stderr).unwrap(),
            Summary {
                samples: 221,
                lost: 3,
                processes: 2,
                frequency: 99,
                target: "pid 7 (a), pid 9 (b)".into(),
                pids: vec![7, 9],
            }
        );
        let one = "spanprof: 0 samples, 0 lost, from 1 process in 0.1 s at 499 Hz: sh -c x\n";
        let summary = parse_summary(one).unwrap();
        assert_eq!((summary.samples, summary.processes), (0, 1));
        assert!(summary.pids.is_empty());
        assert!(
            parse_summary("spanprof: 12 samples, lots lost, from 1 process in 1 s at 9 Hz: x")
                .is_err()
        );
        assert!(parse_summary("error: nothing").is_err());
    }

    /// The decoder's own checks on hand-made good and broken profiles.
    #[test]
    fn pprof_decoder_self_test() {
        let mut cmd = Command::new(python());
        cmd.arg(decoder_script()).arg("--self-test");
        let out = run_with_timeout(cmd, Duration::from_secs(120));
        out.assert_success();
        assert!(out.stdout.contains("self-test: ok"), "{out}");
    }
}
