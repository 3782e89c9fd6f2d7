//! `spanprof report`: a pprof file written by `spanprof profile` read back.
//! Its folded stacks are the session's own, it writes private files, and a
//! filter that matches nothing, a bad file or a bad argument is one `error: `
//! line with exit code 1 (2 for arguments) and no output file. (Profiles with
//! real spans are tested with the span workloads.)

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use spanprof_tests::{
    args, assert_error, assert_private_output, decode_pprof, folded_total, profile_pid,
    profiling_lock, read_folded, require_profiling, run_spanprof, RunOutput, TempDir, Workload,
};

/// Exit code of usage errors (bad arguments).
const USAGE: i32 = 2;
/// Exit code of the other errors.
const FAILURE: i32 = 1;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// One session on cpu_split, written as pprof and folded stacks, shared by
/// the tests of this file.
struct Session {
    dir: TempDir,
}

impl Session {
    fn pprof(&self) -> PathBuf {
        self.dir.join("profile.pb.gz")
    }

    fn folded_text(&self) -> String {
        read_text(&self.dir.join("profile.folded"))
    }
}

fn session() -> &'static Session {
    static SESSION: OnceLock<Session> = OnceLock::new();
    SESSION.get_or_init(|| {
        require_profiling();
        let _lock = profiling_lock();
        let dir = TempDir::new("report");
        let workload = Workload::start("cpu_split", 10.0);
        let out = profile_pid(
            workload.pid(),
            "2s",
            199,
            &[&dir.join("profile.pb.gz"), &dir.join("profile.folded")],
            &[],
        );
        drop(workload);
        out.assert_success();
        let session = Session { dir };
        assert!(
            folded_total(&read_folded(&session.dir.join("profile.folded"))) > 0,
            "the session has no samples\n{out}"
        );
        session
    })
}

#[track_caller]
fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// `spanprof report PROFILE` then `extra`.
fn report(profile: &Path, extra: &[&str]) -> RunOutput {
    let mut args = args!["report", profile];
    args.extend(extra.iter().map(std::ffi::OsString::from));
    run_spanprof(args)
}

fn arg(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

#[test]
fn report_gives_the_sessions_folded_stacks() {
    let s = session();
    let tmp = TempDir::new("report-same");
    let folded = tmp.join("again.folded");
    let pprof = tmp.join("again.pb.gz");
    let out = report(&s.pprof(), &["-o", arg(&folded), "-o", arg(&pprof)]);
    out.assert_success();
    let original = s.folded_text();
    assert_eq!(
        read_text(&folded),
        original,
        "report's folded stacks differ from the session's\n{out}"
    );
    let total = folded_total(&read_folded(&folded));
    assert!(
        out.stderr
            .contains(&format!("kept {total} of {total} samples, 0 of 0 spans")),
        "{out}"
    );
    assert!(
        !out.stderr.contains("spans:"),
        "no span, no spans line\n{out}"
    );
    for path in [&folded, &pprof] {
        assert_private_output(path);
    }
    assert_eq!(tmp.entries(), ["again.folded", "again.pb.gz"]);

    // The pprof report wrote is valid for an independent decoder, and reads
    // back to the same stacks once more.
    decode_pprof(&pprof);
    let twice = tmp.join("twice.folded");
    report(&pprof, &["-o", arg(&twice)]).assert_success();
    assert_eq!(read_text(&twice), original);
}

#[test]
fn group_by_span_puts_spanless_samples_under_no_span() {
    let s = session();
    let tmp = TempDir::new("report-group");
    let folded = tmp.join("grouped.folded");
    let out = report(
        &s.pprof(),
        &[
            "--group-by",
            "span",
            "--format",
            "folded",
            "-o",
            arg(&folded),
        ],
    );
    out.assert_success();
    let expected: String = s
        .folded_text()
        .lines()
        .map(|l| format!("[no span];{l}\n"))
        .collect();
    assert_eq!(read_text(&folded), expected);
}

#[test]
fn a_filter_that_matches_nothing_fails() {
    let s = session();
    let tmp = TempDir::new("report-nomatch");
    let total = folded_total(&read_folded(&s.dir.join("profile.folded")));
    let out = report(
        &s.pprof(),
        &[
            "--trace-id",
            &TRACE_ID.to_uppercase(),
            "-o",
            arg(&tmp.join("trace.svg")),
        ],
    );
    assert_error(
        &out,
        FAILURE,
        &[
            &format!("no samples match --trace-id {TRACE_ID}"),
            &format!("has {total} samples, 0 of them in 0 spans"),
        ],
    );
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn files_that_are_not_spanprof_profiles_fail() {
    let tmp = TempDir::new("report-bad");
    let out_file = tmp.join("out.folded");
    let text = tmp.join("notes.pb.gz");
    std::fs::write(&text, "not a profile\n").unwrap();
    let empty = tmp.join("empty.pprof");
    std::fs::write(&empty, "").unwrap();
    let bad_gzip = tmp.join("bad.pb.gz");
    std::fs::write(&bad_gzip, b"\x1f\x8b\x08\x00garbage").unwrap();
    let missing = tmp.join("missing.pb.gz");
    let cases: [(&Path, &[&str]); 4] = [
        (&text, &["notes.pb.gz: not a pprof profile"]),
        (&empty, &["empty.pprof: not a spanprof profile"]),
        (
            &bad_gzip,
            &["bad.pb.gz: not a pprof profile: bad gzip data"],
        ),
        (&missing, &["cannot read", "missing.pb.gz"]),
    ];
    for (file, needles) in cases {
        let out = report(file, &["-o", arg(&out_file)]);
        assert_error(&out, FAILURE, needles);
        assert!(!out_file.exists(), "{} written", out_file.display());
    }
    // Folded stacks are read as such (`.folded`); the same bytes under a pprof name are not a
    // pprof profile.
    let folded = session().dir.join("profile.folded");
    let misnamed = tmp.join("stacks.pb.gz");
    std::fs::copy(&folded, &misnamed).unwrap();
    let out = report(&misnamed, &["-o", arg(&out_file)]);
    assert_error(&out, FAILURE, &["stacks.pb.gz: not a"]);
    assert!(!out_file.exists());
}

#[test]
fn bad_arguments_are_usage_errors() {
    let s = session();
    let tmp = TempDir::new("report-usage");
    let out_file = tmp.join("out.folded");
    let o = arg(&out_file);
    let xyz = tmp.join("out.xyz");
    let cases: [(&[&str], &[&str]); 7] = [
        (
            &["--group-by", "trace", "-o", o],
            &["invalid --group-by 'trace'", "span"],
        ),
        (
            &["--trace-id", "4bf9", "-o", o],
            &["invalid --trace-id '4bf9'", "32 hex"],
        ),
        (
            &["--span-id", TRACE_ID, "-o", o],
            &["invalid --span-id", "16 hex"],
        ),
        (
            &["--base-id", "not-a-uuid", "-o", o],
            &["invalid --base-id", "UUID"],
        ),
        (&["-o", arg(&xyz)], &["unknown output format", "out.xyz"]),
        (&["--event", "sideways"], &["invalid --event 'sideways'"]),
        (&["--format", "yaml"], &["unknown format 'yaml'"]),
    ];
    for (extra, needles) in cases {
        let out = report(&s.pprof(), extra);
        assert_error(&out, USAGE, needles);
    }
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}

#[test]
fn profile_group_by_span_puts_spanless_samples_under_no_span() {
    require_profiling();
    let tmp = TempDir::new("profile-group");
    let folded = tmp.join("grouped.folded");
    let out = {
        let _lock = profiling_lock();
        let workload = Workload::start("cpu_split", 10.0);
        profile_pid(
            workload.pid(),
            "1s",
            199,
            &[&folded],
            &["--group-by", "span"],
        )
    };
    out.assert_success();
    let stacks = read_folded(&folded);
    assert!(folded_total(&stacks) > 0, "{out}");
    for stack in &stacks {
        assert_eq!(stack.frames[0], "[no span]", "{out}");
        assert!(stack.frames.len() > 1, "{out}");
    }
}

#[test]
fn profile_group_by_is_checked_before_profiling() {
    let tmp = TempDir::new("profile-group-usage");
    let out = run_spanprof(args![
        "profile",
        "--pid",
        "1",
        "--group-by",
        "trace",
        "-o",
        tmp.join("out.folded")
    ]);
    assert_error(
        &out,
        USAGE,
        &[
            "invalid --group-by 'trace'",
            "expected span, span-name or thread",
        ],
    );
    assert!(tmp.entries().is_empty(), "files left: {:?}", tmp.entries());
}
