//! Python: interpreters, py-spy, the Python workloads and Python frames in folded output
//! (`qualname (file.py:LINE)`, or `qualname (file.py)` with `--no-lines`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{missing_prerequisite, path_from_env, workspace_root, Background, FoldedStack};

/// The pyenv root: `PYENV_ROOT`, else `/root/.pyenv`.
pub fn pyenv_root() -> PathBuf {
    match std::env::var_os("PYENV_ROOT") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from("/root/.pyenv"),
    }
}

/// The pyenv build of CPython 3.`minor`: `<pyenv root>/versions/3.<minor>.<patch>/bin/python3.<minor>`,
/// the highest patch release when there are several.
#[track_caller]
pub fn pyenv_python(minor: u8) -> PathBuf {
    let versions = pyenv_root().join("versions");
    let prefix = format!("3.{minor}.");
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(&versions)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let patch: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
                    let bin = entry.path().join(format!("bin/python3.{minor}"));
                    bin.is_file().then_some((patch, bin))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => missing_prerequisite(
            &format!(
                "CPython 3.{minor} from pyenv ({}/3.{minor}.*/bin/python3.{minor})",
                versions.display()
            ),
            &format!("`pyenv install 3.{minor}` (set PYENV_ROOT if pyenv lives elsewhere)"),
        ),
    }
}

/// An interpreter installed by the system's packages, e.g. Debian's `/usr/bin/python3.11`.
#[track_caller]
pub fn system_python(path: &str, package: &str) -> PathBuf {
    let bin = PathBuf::from(path);
    if !bin.is_file() {
        missing_prerequisite(
            &format!("the system interpreter {path}"),
            &format!("`apt-get install -y {package}`"),
        );
    }
    bin
}

/// py-spy, the reference for Python stacks: `SPANPROF_PYSPY`, else `target/venv/bin/py-spy`.
#[track_caller]
pub fn py_spy() -> PathBuf {
    let bin = path_from_env("SPANPROF_PYSPY", "target/venv/bin/py-spy");
    if !bin.is_file() {
        missing_prerequisite(
            &format!("py-spy at {}", bin.display()),
            "`cargo xtask deps` (installs py-spy from PyPI into target/venv)",
        );
    }
    bin
}

/// A Python workload's source, `tests/workloads/<name>` (Python workloads
/// are run from the source tree, not built).
#[track_caller]
pub fn py_workload_source(name: &str) -> PathBuf {
    let path = workspace_root().join("tests/workloads").join(name);
    if !path.is_file() {
        missing_prerequisite(
            &format!("the Python workload {}", path.display()),
            "restore it from the repository",
        );
    }
    path
}

/// Starts the Python workload `script` (in `tests/workloads`) under `python`
/// with `args`, and waits until it prints `ready PID` on stderr. Its stdout
/// (the workload's JSON result, if any) comes with [`Background::finish`];
/// dropping it kills it.
#[track_caller]
pub fn start_py_workload(python: &Path, script: &str, args: &[&str]) -> Background {
    let mut cmd = Command::new(python);
    cmd.arg(py_workload_source(script)).args(args);
    start_ready(cmd, script)
}

/// [`start_py_workload`] with environment variables.
#[track_caller]
pub fn start_py_workload_env(
    python: &Path,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Background {
    let mut cmd = Command::new(python);
    cmd.arg(py_workload_source(script))
        .args(args)
        .envs(env.iter().copied());
    start_ready(cmd, script)
}

/// Spawns a workload command and waits for its `ready PID` line on stderr.
#[track_caller]
pub(crate) fn start_ready(cmd: Command, script: &str) -> Background {
    let mut workload = Background::spawn(cmd);
    let line = workload.wait_for_stderr("ready ", Duration::from_secs(30));
    let pid: Option<u32> = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok());
    assert_eq!(
        pid,
        Some(workload.pid()),
        "{script} printed {line:?} instead of `ready {}`",
        workload.pid()
    );
    workload
}

/// Starts `py-spy record` on `pid` for `seconds` at `rate` Hz, writing its
/// raw (folded) output to `out`. It runs until done: call
/// [`Background::finish`], then read `out` with [`read_folded`].
#[track_caller]
pub fn start_py_spy(pid: u32, rate: u32, seconds: u32, out: &Path) -> Background {
    let mut cmd = Command::new(py_spy());
    cmd.args(["record", "--format", "raw", "--pid"])
        .arg(pid.to_string())
        .arg("--rate")
        .arg(rate.to_string())
        .arg("--duration")
        .arg(seconds.to_string())
        .arg("-o")
        .arg(out);
    Background::spawn(cmd)
}

/// The last line of `stdout` that is a JSON object, parsed.
#[track_caller]
pub fn last_json_line(stdout: &str) -> serde_json::Value {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in the output:\n{stdout}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON line {line:?}: {e}"))
}

/// One Python frame of folded output: `qualname (file.py:LINE)`, or
/// `qualname (file.py)` without a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyFrame<'a> {
    pub qualname: &'a str,
    pub file: &'a str,
    pub line: Option<u32>,
}

/// Parses a Python frame; `None` for native, kernel and marker frames. The
/// file is a `.py` file (a base name in spanprof's output, a package path in
/// py-spy's), or a pseudo-file such as
/// `<frozen importlib._bootstrap>` or `<string>`.
pub fn parse_py_frame(frame: &str) -> Option<PyFrame<'_>> {
    let inner = frame.strip_suffix(')')?;
    let (qualname, location) = inner.rsplit_once(" (")?;
    if qualname.is_empty() || qualname.starts_with('[') || qualname.ends_with("_[k]") {
        return None;
    }
    let (file, line) = match location.rsplit_once(':') {
        Some((file, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => {
            (file, Some(line.parse().ok()?))
        }
        _ => (location, None),
    };
    let python_file =
        file.ends_with(".py") && file.len() > 3 || file.starts_with('<') && file.ends_with('>');
    python_file.then_some(PyFrame {
        qualname,
        file,
        line,
    })
}

/// True for a Python frame (see [`parse_py_frame`]).
pub fn is_py_frame(frame: &str) -> bool {
    parse_py_frame(frame).is_some()
}

impl FoldedStack {
    /// The Python frames, root first.
    pub fn py_frames(&self) -> Vec<PyFrame<'_>> {
        self.frames
            .iter()
            .filter_map(|f| parse_py_frame(f))
            .collect()
    }

    /// The qualnames of the Python frames, root first.
    pub fn py_qualnames(&self) -> Vec<&str> {
        self.py_frames().iter().map(|f| f.qualname).collect()
    }

    /// The innermost Python frame.
    pub fn py_leaf(&self) -> Option<PyFrame<'_>> {
        self.frames.iter().rev().find_map(|f| parse_py_frame(f))
    }
}

/// Profiles a started `py_callbacks.py` (`--pid`, 2.5 s at 2999 Hz), waits for it to end and
/// judges the profile with [`callback_problems`], and the Python version it ran by `label`:
/// the problems, the stacks and spanprof's run.
pub fn callback_session(
    workload: Background,
    folded: &Path,
    label: &str,
) -> (Vec<String>, Vec<FoldedStack>, crate::RunOutput) {
    // 2999 Hz: ~7300 samples, where the split's binomial standard deviation is 0.6 points.
    // At 999 Hz (~2400 samples, 1.0 point) a CI run on a loaded machine, which takes away the
    // sampler's regular spacing, measured 3.4 points off; 10 runs alone were within 1.6.
    let out = crate::profile_pid(workload.pid(), "2500ms", 2999, &[folded], &[]);
    let ran = workload.finish(Duration::from_secs(30));
    ran.assert_success();
    out.assert_success();
    let stacks = crate::read_folded(folded);
    let truth = last_json_line(&ran.stdout);
    let mut problems = callback_problems(&stacks, &out.stderr, &truth, label);
    if !truth["version"].as_str().is_some_and(|v| label.contains(v)) {
        problems.push(format!(
            "the workload ran {:?}, not {label}",
            truth["version"]
        ));
    }
    (problems, stacks, out)
}

/// What is wrong with a profile of `py_callbacks.py` (C code calling back into Python, many
/// times a ms), with spanprof's `stderr`: every callback keeps its callers (`main -> run_map ->
/// tiny`, `main -> run_sorted -> tiny_key`), no stack reads `[truncated]` (it is 3 Python frames
/// deep), at least a tenth of the samples are in the callbacks, no sample in the interpreter
/// loop lacks both Python frames and a marker, the summary counts every sample marked
/// `[python frames not read: walk failed]`, and those are at most 5%; and the split of the
/// samples between `run_map` and `run_sorted` is within ±3 points of the one the workload
/// measured (`truth`, its JSON line), or 4 binomial standard deviations if the samples are too
/// few for 3 points to be that. Prints the figures.
pub fn callback_problems(
    stacks: &[FoldedStack],
    stderr: &str,
    truth: &serde_json::Value,
    label: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    let count = |pred: &dyn Fn(&FoldedStack) -> bool| -> u64 {
        stacks.iter().filter(|s| pred(s)).map(|s| s.count).sum()
    };
    let total = count(&|_| true);
    let truncated = count(&|s| s.frames.iter().any(|f| f == "[truncated]"));
    if truncated > 0 {
        problems.push(format!(
            "{truncated} samples read [truncated] though the stack is 3 Python frames deep"
        ));
    }
    let mut in_callbacks = 0;
    for (caller, callee) in [("run_map", "tiny"), ("run_sorted", "tiny_key")] {
        let callbacks = count(&|s| s.py_qualnames().last() == Some(&callee));
        let whole = count(&|s| s.py_qualnames().ends_with(&["main", caller, callee]));
        in_callbacks += callbacks;
        if whole != callbacks {
            problems.push(format!(
                "{} of {callbacks} samples in {callee} lack the callers main -> {caller}",
                callbacks - whole
            ));
        }
    }
    // ~7300 samples, most of them in the callbacks' C callers: 24-35% in the callbacks
    // themselves (measured alone and in the full suite).
    if in_callbacks < total / 10 {
        problems.push(format!(
            "only {in_callbacks} of {total} samples in the callbacks"
        ));
    }
    // Samples in the interpreter loop with neither Python frames nor a marker.
    let silent = count(&|s| {
        s.py_frames().is_empty()
            && !s
                .frames
                .iter()
                .any(|f| f.starts_with("[python frames not read"))
            && s.frames
                .iter()
                .any(|f| f.starts_with("_PyEval_EvalFrameDefault"))
    });
    if silent > 0 {
        problems.push(format!(
            "{silent} samples in the interpreter loop have neither Python frames nor a marker"
        ));
    }
    let marked = count(&|s| s.contains("[python frames not read: walk failed]"));
    let counted = stderr
        .lines()
        .find_map(|l| l.split_once("whose walk failed at a read: "))
        .and_then(|(_, rest)| rest.split(&[',', ';']).next()?.parse::<u64>().ok());
    // The summary counts every failed read, marked ones and those cut after some frames.
    if counted.is_none_or(|c| c < marked) {
        problems.push(format!(
            "the summary counts {counted:?} failed walks, the profile marks {marked}"
        ));
    }
    // Measured 0.5-0.9% on 3.11 and 3.12 (the few instructions of a call's entry), 0 before.
    if marked * 20 > total {
        problems.push(format!("{marked} of {total} samples are unread (> 5%)"));
    }
    // The split between the two callers, against the CPU time the workload measured around
    // each call.
    let under = |f: &str| count(&|s| s.py_qualnames().contains(&f));
    let (map, sorted) = (under("run_map"), under("run_sorted"));
    let share = 100.0 * map as f64 / (map + sorted).max(1) as f64;
    let want = 100.0 * truth["truth"]["run_map"].as_f64().unwrap_or(f64::NAN);
    let off = (share - want).abs();
    let n = (map + sorted).max(1) as f64;
    let sigma = (want * (100.0 - want) / n).sqrt();
    let bound = (4.0 * sigma).max(3.0);
    // At least 2000 samples: a starved run (7300 expected) would widen the bound past use.
    if map + sorted < (total / 2).max(2000) || off.is_nan() || off > bound {
        problems.push(format!(
            "run_map has {share:.1}% of the {} samples under run_map or run_sorted (of {total}), \
             the workload measured {want:.1}% (want within {bound:.1} points)",
            map + sorted
        ));
    }
    println!(
        "{label}: {total} samples, {in_callbacks} in callbacks, {marked} unread, summary \
         {counted:?}; run_map {share:.1}% (truth {want:.1}%)"
    );
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_folded;

    #[test]
    fn parses_python_frames() {
        assert_eq!(
            parse_py_frame("Worker.run (py_split.py:31)"),
            Some(PyFrame {
                qualname: "Worker.run",
                file: "py_split.py",
                line: Some(31)
            })
        );
        assert_eq!(
            parse_py_frame("<module> (py_split.py)"),
            Some(PyFrame {
                qualname: "<module>",
                file: "py_split.py",
                line: None
            })
        );
        assert_eq!(
            parse_py_frame("_find_and_load (<frozen importlib._bootstrap>:1176)").map(|f| f.line),
            Some(Some(1176))
        );
        for native in [
            "main",
            "_PyEval_EvalFrameDefault",
            "[unknown] (libc.so.6+0x2a1b0)",
            "[native code]",
            "[truncated]",
            "[no python frames]",
            "entry_SYSCALL_64_[k]",
            "operator() (foo.cc:12)",
        ] {
            assert_eq!(parse_py_frame(native), None, "{native}");
        }
        let stack = &parse_folded(
            "_start;main;<module> (a.py:3);f (a.py:7);PyObject_Call;g (a.py:9);malloc 2\n",
        )
        .unwrap()[0];
        assert_eq!(stack.py_qualnames(), ["<module>", "f", "g"]);
        assert_eq!(
            stack.py_leaf().map(|f| (f.qualname, f.line)),
            Some(("g", Some(9)))
        );
    }
}
