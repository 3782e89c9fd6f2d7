//! Golden recordings (`tests/golden/NAME/`): each committed recording of a session is replayed
//! by the built `spanprof replay` (no root, no BPF), and every output must equal the one
//! committed beside it: folded stacks, SVG and speedscope byte for byte, pprof and OTLP once
//! decoded by the independent decoders.
//!
//! A change of an output format is blessed with `SPANPROF_BLESS=1 cargo test -p
//! spanprof-tests --test golden`, which rewrites the expected outputs from the recordings;
//! `cargo xtask golden` (root) records the sessions anew (see docs/development.md).

use spanprof_tests::golden::{
    compare_outputs, copy_files, golden_root, replay, replay_dir, OUTPUTS, RECORDING, SESSIONS,
};
use spanprof_tests::{args, run_spanprof, TempDir};

fn bless() -> bool {
    std::env::var_os("SPANPROF_BLESS").is_some_and(|v| v == "1")
}

#[test]
fn replays_write_the_committed_outputs() {
    let mut problems = Vec::new();
    for name in SESSIONS {
        let golden = golden_root().join(name);
        let out = replay_dir(name);
        replay(&golden.join(RECORDING), out.path());
        if bless() {
            copy_files(out.path(), &golden, &OUTPUTS);
            eprintln!("blessed {}", golden.display());
            continue;
        }
        problems.extend(compare_outputs(&golden, out.path()));
    }
    assert!(
        problems.is_empty(),
        "replays of the golden recordings differ from their committed outputs (if the change \
         of format is intended: SPANPROF_BLESS=1 cargo test -p spanprof-tests --test golden):\n{}",
        problems.join("\n")
    );
}

/// The comparison fails when an expected file differs: one changed byte of a folded count, one
/// changed frame of a speedscope file, a pprof of another session.
#[test]
fn a_changed_expected_output_fails_the_comparison() {
    let golden = golden_root().join("native");
    let expected = TempDir::new("golden-changed");
    copy_files(&golden, expected.path(), &OUTPUTS);
    assert!(compare_outputs(&golden, expected.path()).is_empty());
    let folded = expected.join("profile.folded");
    let mut text = std::fs::read_to_string(&folded).unwrap();
    let last = text.pop().unwrap();
    let digit = text.pop().unwrap();
    text.push(if digit == '1' { '2' } else { '1' });
    text.push(last);
    std::fs::write(&folded, text).unwrap();
    std::fs::copy(
        golden_root().join("python/profile.pb.gz"),
        expected.join("profile.pb.gz"),
    )
    .unwrap();
    let problems = compare_outputs(expected.path(), &golden);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].contains("profile.folded"), "{}", problems[0]);
    assert!(problems[1].contains("profile.pb.gz"), "{}", problems[1]);
}

#[test]
fn damaged_recordings_are_one_line_errors() {
    let dir = TempDir::new("golden-damaged");
    let good = std::fs::read(golden_root().join("native").join(RECORDING)).unwrap();
    let cases: [(&str, Vec<u8>, &str); 3] = [
        // Cut in the middle of its gzip data: truncated, or bad gzip data.
        (
            "cut.rec.gz",
            good[..good.len() / 2].to_vec(),
            "cut.rec.gz: ",
        ),
        (
            "text.rec.gz",
            b"hello\n".to_vec(),
            "not a spanprof recording",
        ),
        ("empty.rec.gz", Vec::new(), "not a spanprof recording"),
    ];
    for (name, bytes, needle) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = run_spanprof(args!["replay", &path, "-o", dir.join("x.svg")]);
        assert_eq!(out.code(), 1, "{out}");
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(needle),
            "{out}"
        );
        assert!(!dir.join("x.svg").exists());
    }
}

/// `--record` keeps what `--redact-paths` and `--drop-label` would hide: refused together,
/// before anything is profiled (no root needed to be told).
#[test]
fn record_does_not_combine_with_privacy_flags() {
    let dir = TempDir::new("record-privacy");
    for flag in ["--redact-paths", "--drop-label=thread.name"] {
        let out = run_spanprof(args![
            "profile",
            "--record",
            dir.join("r.rec.gz"),
            flag,
            "--",
            "true"
        ]);
        assert_eq!(out.code(), 2, "{out}");
        assert!(
            out.stderr
                .contains("--record does not combine with --redact-paths or --drop-label"),
            "{out}"
        );
        assert!(dir.entries().is_empty(), "{:?}", dir.entries());
    }
}

/// `replay` takes the privacy flags: the paths of a recording are redacted in its outputs.
#[test]
fn replay_redacts_paths_when_asked() {
    let dir = TempDir::new("replay-redact");
    let recording = golden_root().join("native").join(RECORDING);
    let out = run_spanprof(args![
        "replay",
        &recording,
        "--redact-paths",
        "-o",
        dir.join("r.speedscope.json")
    ]);
    out.assert_success();
    let text = std::fs::read_to_string(dir.join("r.speedscope.json")).unwrap();
    assert!(text.contains("cpu_split.c"), "{text}");
    assert!(!text.contains("/workloads/"), "{text}");
}
