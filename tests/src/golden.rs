//! Golden recordings: the five sessions recorded with `spanprof profile --record`
//! (`tests/golden/NAME/session.rec.gz`) and the outputs a replay of each must write
//! (`tests/golden/NAME/profile.*`), compared by [`compare_outputs`]: folded stacks, SVG and
//! speedscope byte for byte, pprof and OTLP once decoded by the independent decoders
//! (`tests/tools/decode_pprof.py`, `decode_otlp.py`).
//!
//! `tests/tests/golden.rs` replays the committed recordings (no root); with `SPANPROF_BLESS=1`
//! it rewrites the expected outputs from them instead. `tests/tests/replay_live.rs` (root)
//! runs each [`SESSIONS`] live with `--record`, checks that the replay writes what the session
//! wrote, and with `SPANPROF_GOLDEN_RECORD=1` (`cargo xtask golden`) replaces the committed
//! recordings and outputs with the new ones.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{
    decode_pprof, otlp, py_workload_source, pyenv_python, run_with_timeout, span_libs,
    spanprof_command, workload_path, workspace_root, RunOutput, TempDir,
};

/// The outputs of every golden session, one per format.
pub const OUTPUTS: [&str; 5] = [
    "profile.folded",
    "profile.svg",
    "profile.speedscope.json",
    "profile.pb.gz",
    "profile.otlp",
];

/// The recording's name in a golden directory.
pub const RECORDING: &str = "session.rec.gz";

/// The golden sessions: native (C, on-CPU), Python (pyenv CPython 3.12), spans
/// (OpenTelemetry), off-CPU and allocations (alloc and heap).
pub const SESSIONS: [&str; 5] = ["native", "python", "spans", "offcpu", "alloc"];

/// The CPython minor version of the Python sessions.
pub const PYTHON_MINOR: u8 = 12;

/// `tests/golden`.
pub fn golden_root() -> PathBuf {
    workspace_root().join("tests/golden")
}

/// `spanprof profile` of golden session `name`, recording to `dir/session.rec.gz` and writing
/// every [`OUTPUTS`] into `dir`. Run under a mount and UTS namespace of its own where the host
/// name is `golden` and `/etc/machine-id` a fixed one, so the committed files do not carry
/// the recording machine's.
#[track_caller]
pub fn record_command(name: &str, dir: &Path) -> Command {
    let mut args: Vec<OsString> = vec!["profile".into(), "--quiet".into()];
    let event = match name {
        "offcpu" => "offcpu",
        "alloc" => "alloc,heap",
        _ => "cpu",
    };
    args.extend(["--event".into(), event.into(), "-F".into(), "49".into()]);
    args.extend(["--record".into(), dir.join(RECORDING).into()]);
    for out in OUTPUTS {
        args.extend(["-o".into(), dir.join(out).into()]);
    }
    args.push("--".into());
    let python = || pyenv_python(PYTHON_MINOR).into_os_string();
    let command: Vec<OsString> = match name {
        "native" => vec![workload_path("cpu_split").into(), "1".into()],
        "python" => vec![
            python(),
            py_workload_source("py_split.py").into(),
            "1".into(),
        ],
        "spans" => vec![
            python(),
            py_workload_source("py_span_workload.py").into(),
            "otel_threads".into(),
            "1.5".into(),
            dir.join("truth.jsonl").into(),
        ],
        "offcpu" => vec![workload_path("offcpu_sleep").into(), "5".into()],
        "alloc" => vec![workload_path("alloc_sizes").into(), "1".into()],
        other => panic!("no golden session {other}"),
    };
    args.extend(command);
    let machine_id = dir.join("machine-id");
    std::fs::write(&machine_id, "0123456789abcdef0123456789abcdef\n")
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", machine_id.display()));
    let spanprof = spanprof_command(&args);
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--uts", "--", "sh", "-c"])
        .arg(
            "mount --bind \"$1\" /etc/machine-id && echo golden > /proc/sys/kernel/hostname \
             && shift && exec \"$@\"",
        )
        .arg("sh")
        .arg(&machine_id)
        .arg(spanprof.get_program())
        .args(spanprof.get_args());
    if name == "spans" {
        cmd.env("PYTHONPATH", span_libs(PYTHON_MINOR))
            .env("PYTHONNOUSERSITE", "1");
    }
    cmd
}

/// `spanprof replay RECORDING -o DIR/OUTPUT…` of every [`OUTPUTS`], which must succeed.
#[track_caller]
pub fn replay(recording: &Path, dir: &Path) -> RunOutput {
    let mut args: Vec<OsString> = vec!["replay".into(), recording.into()];
    for out in OUTPUTS {
        args.extend(["-o".into(), dir.join(out).into()]);
    }
    let out = run_with_timeout(spanprof_command(args), crate::RUN_TIMEOUT);
    out.assert_success();
    out
}

/// The first line where two texts differ, for a message.
fn first_difference(expected: &[u8], actual: &[u8]) -> String {
    let (e, a) = (
        String::from_utf8_lossy(expected),
        String::from_utf8_lossy(actual),
    );
    let mut lines = e.lines().zip(a.lines()).enumerate();
    match lines.find(|(_, (x, y))| x != y) {
        Some((i, (x, y))) => {
            let cut = |s: &str| s.chars().take(300).collect::<String>();
            format!(
                "line {}:\n  expected: {}\n  actual:   {}",
                i + 1,
                cut(x),
                cut(y)
            )
        }
        None => format!(
            "{} lines expected, {} written",
            e.lines().count(),
            a.lines().count()
        ),
    }
}

/// The differences between the outputs in `expected` and those in `actual` (each of
/// [`OUTPUTS`]): folded, SVG and speedscope byte for byte, pprof and OTLP decoded.
#[track_caller]
pub fn compare_outputs(expected: &Path, actual: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for name in OUTPUTS {
        let (e, a) = (expected.join(name), actual.join(name));
        let read = |p: &Path| std::fs::read(p).map_err(|err| format!("{}: {err}", p.display()));
        let (eb, ab) = match (read(&e), read(&a)) {
            (Ok(eb), Ok(ab)) => (eb, ab),
            (Err(err), _) | (_, Err(err)) => {
                problems.push(err);
                continue;
            }
        };
        let same = match name {
            "profile.pb.gz" => decode_pprof(&e) == decode_pprof(&a),
            "profile.otlp" => otlp::decode_file(&e) == otlp::decode_file(&a),
            _ => eb == ab,
        };
        if !same {
            let detail = match name {
                "profile.pb.gz" => first_difference(
                    pretty(decode_pprof(&e)).as_bytes(),
                    pretty(decode_pprof(&a)).as_bytes(),
                ),
                "profile.otlp" => first_difference(
                    pretty(otlp::decode_file(&e)).as_bytes(),
                    pretty(otlp::decode_file(&a)).as_bytes(),
                ),
                _ => first_difference(&eb, &ab),
            };
            problems.push(format!(
                "{} differs from {}: {detail}",
                a.display(),
                e.display()
            ));
        }
    }
    problems
}

fn pretty(v: serde_json::Value) -> String {
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

/// Copies the files `names` from `from` into `to` (created if missing).
#[track_caller]
pub fn copy_files(from: &Path, to: &Path, names: &[&str]) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("cannot create {}: {e}", to.display()));
    for name in names {
        std::fs::copy(from.join(name), to.join(name)).unwrap_or_else(|e| {
            panic!(
                "cannot copy {name} from {} to {}: {e}",
                from.display(),
                to.display()
            )
        });
    }
}

/// A temporary directory for the outputs of a replay of golden session `name`.
pub fn replay_dir(name: &str) -> TempDir {
    TempDir::new(&format!("golden-{name}"))
}
