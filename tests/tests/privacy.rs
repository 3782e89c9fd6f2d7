//! Privacy controls: `--redact-paths` leaves no directory name in any output format,
//! `--drop-label` leaves the label out of pprof and OTLP, output files are 0600 and never
//! written through a symlink, another user's FIFO or terminal link gets no output, and a FIFO
//! without a reader does not hold the session.
//!
//! The workload is a Python script in a directory whose name is a needle
//! (`very-private-checkout`); CPython 3.12 from pyenv runs it, so the profile holds the paths of
//! pyenv's interpreter, the C library, the script and the test's temporary directory. Every
//! output is searched byte for byte (gzip undone) for those directories, and pprof and OTLP are
//! also decoded by the independent decoders to check what was kept.

use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use spanprof_tests::otlp;
use spanprof_tests::{
    args, assert_error, assert_private_output, decode_pprof, profiling_lock, pyenv_python,
    pyenv_root, require_profiling, run_spanprof, sample_str_labels, workspace_root, RunOutput,
    TempDir,
};

const SECRET_DIR: &str = "very-private-checkout";
/// spanprof's exit status for runtime errors.
const FAILURE: i32 = 1;

/// A CPU-bound script with two functions of known names, in two threads.
const SCRIPT: &str = r#"
import threading, time

def private_hot():
    total = 0
    for i in range(20000):
        total += i * i
    return total

def private_worker(stop):
    while time.monotonic() < stop:
        private_hot()

stop = time.monotonic() + 1.5
t = threading.Thread(target=private_worker, args=(stop,))
t.start()
private_worker(stop)
t.join()
"#;

/// The two sessions every test here reads: one plain, one with the privacy flags.
struct Runs {
    _tmp: TempDir,
    dir: PathBuf,
    script: PathBuf,
    plain: RunOutput,
    private: RunOutput,
}

impl Runs {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Formats written by the private session, by file name.
const PRIVATE_OUTPUTS: [&str; 6] = [
    "r.svg",
    "r.pb.gz",
    "r.folded",
    "r.speedscope.json",
    "r.otlp",
    "r.stats.json",
];

fn runs() -> &'static Runs {
    static RUNS: OnceLock<Runs> = OnceLock::new();
    RUNS.get_or_init(|| {
        require_profiling();
        let python = pyenv_python(12);
        let tmp = TempDir::new("privacy");
        let dir = tmp.path().to_path_buf();
        let secret = dir.join(SECRET_DIR).join("srv");
        std::fs::create_dir_all(&secret).unwrap();
        let script = secret.join("private_app.py");
        std::fs::write(&script, SCRIPT).unwrap();
        let _lock = profiling_lock();
        let session = |extra: &[&str], outputs: &[&str]| {
            let mut a = args!["profile", "--duration", "10s", "-F", "199"];
            a.extend(extra.iter().map(std::ffi::OsString::from));
            for o in outputs {
                a.push("-o".into());
                a.push(dir.join(o).into());
            }
            a.push("--".into());
            a.push(python.clone().into());
            a.push(script.clone().into());
            let out = run_spanprof(a);
            out.assert_success();
            out
        };
        let plain = session(&[], &["u.pb.gz", "u.otlp"]);
        let stats = dir.join("r.stats.json");
        let stats = stats.to_str().expect("UTF-8 temp path");
        let private = session(
            &[
                "--redact-paths",
                "--drop-label",
                "thread.name",
                "--drop-label",
                "process.command_line",
                "--drop-label",
                "host.name",
                "--stats",
                stats,
            ],
            &PRIVATE_OUTPUTS[..5],
        );
        Runs {
            _tmp: tmp,
            dir,
            script,
            plain,
            private,
        }
    })
}

/// A file's bytes, gzip undone.
fn contents(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_end(&mut out)
            .unwrap();
        out
    } else {
        bytes
    }
}

/// Directories of this machine that a profile of the workload names unless redacted: the
/// script's, the temporary directory's, pyenv's, the C library's, the checkout's.
fn directory_needles(r: &Runs) -> Vec<String> {
    let parent = r.script.parent().unwrap().to_str().unwrap().to_string();
    vec![
        SECRET_DIR.to_string(),
        parent,
        r.dir.to_str().unwrap().to_string(),
        pyenv_root().to_str().unwrap().to_string(),
        "/versions/3.12".to_string(),
        "x86_64-linux-gnu".to_string(),
        "/usr/".to_string(),
        workspace_root().to_str().unwrap().to_string(),
    ]
}

fn find(haystack: &[u8], needle: &str) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
}

/// What surrounds the first `needle` in `haystack`, for a failure message.
fn around(haystack: &[u8], at: usize) -> String {
    let start = at.saturating_sub(60);
    let end = (at + 60).min(haystack.len());
    String::from_utf8_lossy(&haystack[start..end]).into_owned()
}

/// The control: without the flags, the outputs do name the directories and labels the private
/// session must leave out, so the searches below can fail.
#[test]
fn unredacted_outputs_name_the_directories() {
    let r = runs();
    for file in ["u.pb.gz", "u.otlp"] {
        let bytes = contents(&r.path(file));
        assert!(
            find(&bytes, SECRET_DIR).is_some(),
            "{file} does not name {SECRET_DIR}: the check below proves nothing"
        );
    }
    assert!(
        r.plain.stderr.contains(SECRET_DIR),
        "the plain summary does not name {SECRET_DIR}\n{}",
        r.plain
    );
    let pprof = decode_pprof(&r.path("u.pb.gz"));
    let named = pprof["samples"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| sample_str_labels(s).contains_key("thread.name"));
    assert!(named, "a sample of the plain run has no thread.name");
}

#[test]
fn redact_paths_leaves_no_directory_in_any_output_format() {
    let r = runs();
    let needles = directory_needles(r);
    let mut problems = Vec::new();
    for file in PRIVATE_OUTPUTS {
        let path = r.path(file);
        assert_private_output(&path);
        let bytes = contents(&path);
        for needle in &needles {
            if let Some(at) = find(&bytes, needle) {
                problems.push(format!("{file} names {needle:?}: …{}…", around(&bytes, at)));
            }
        }
    }
    // What it prints on stderr (the start line, progress, the summary) shows no more than
    // the files; the `wrote PATH` lines name the outputs the user asked for.
    assert!(
        r.private.stderr.contains("spanprof: profiling"),
        "{}",
        r.private
    );
    let printed: String = r
        .private
        .stderr
        .lines()
        .filter(|l| !l.starts_with("wrote "))
        .collect::<Vec<_>>()
        .join("\n");
    for needle in &needles {
        if let Some(at) = find(printed.as_bytes(), needle) {
            problems.push(format!(
                "stderr names {needle:?}: …{}…",
                around(printed.as_bytes(), at)
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n{}",
        problems.join("\n"),
        r.private
    );

    // What is kept: base names, read by the independent decoders.
    let pprof = decode_pprof(&r.path("r.pb.gz"));
    let files: Vec<&str> = pprof["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["filename"].as_str())
        .collect();
    assert!(
        files.contains(&"private_app.py"),
        "no function of file private_app.py in {files:?}"
    );
    assert!(
        files.iter().all(|f| !f.contains('/')),
        "a function's file keeps a directory: {files:?}"
    );
    let mappings: Vec<&str> = pprof["mappings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["filename"].as_str())
        .collect();
    assert!(
        mappings.iter().any(|m| m.starts_with("libc.so")),
        "no libc mapping by base name in {mappings:?}"
    );
    assert!(
        mappings.iter().all(|m| !m.contains('/')),
        "a mapping keeps a directory: {mappings:?}"
    );
    let decoded = otlp::decode_file(&r.path("r.otlp"));
    otlp::assert_valid(&decoded);
    let resource = &decoded["resources"][0]["attributes"];
    assert_eq!(
        resource["process.executable.path"].as_str(),
        Some("python3.12"),
        "{resource:#}"
    );
}

#[test]
fn dropped_labels_are_left_out_of_pprof_and_otlp() {
    let r = runs();
    let pprof = decode_pprof(&r.path("r.pb.gz"));
    let samples = pprof["samples"].as_array().unwrap();
    assert!(
        samples.len() > 10,
        "{} samples\n{}",
        samples.len(),
        r.private
    );
    for s in samples {
        let keys: Vec<&str> = s["labels"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l["key"].as_str())
            .collect();
        assert!(!keys.contains(&"thread.name"), "thread.name kept: {keys:?}");
        assert!(
            keys.contains(&"thread.id"),
            "thread.id dropped too: {keys:?}"
        );
    }
    let comments: Vec<&str> = pprof["comments"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        comments.iter().all(|c| !c.starts_with("host:")),
        "host comment kept: {comments:?}"
    );
    assert!(
        comments.contains(&"target: [command line dropped]"),
        "{comments:?}"
    );
    let decoded = otlp::decode_file(&r.path("r.otlp"));
    otlp::assert_valid(&decoded);
    for resource in decoded["resources"].as_array().unwrap() {
        let attrs = &resource["attributes"];
        for key in ["process.command_line", "host.name"] {
            assert!(attrs.get(key).is_none(), "{key} kept: {attrs:#}");
        }
        assert!(attrs.get("process.pid").is_some(), "{attrs:#}");
    }
    let otlp_samples = otlp::samples(&decoded, "samples/count");
    assert!(!otlp_samples.is_empty());
    for s in otlp_samples {
        assert!(s["attributes"].get("thread.name").is_none(), "{s:#}");
        assert!(s["attributes"].get("thread.id").is_some(), "{s:#}");
    }
    // In the plain run the same resource has its command line (the control).
    let plain = otlp::decode_file(&r.path("u.otlp"));
    assert!(
        plain["resources"][0]["attributes"]
            .get("process.command_line")
            .is_some(),
        "{plain:#}"
    );
}

/// `report --redact-paths=hash` on the plain profile: the directories go, a hash of each
/// stands before its base name.
#[test]
fn report_redacts_a_written_profile_with_hashed_directories() {
    let r = runs();
    let outs = [
        "h.svg",
        "h.pb.gz",
        "h.folded",
        "h.speedscope.json",
        "h.otlp",
    ];
    let mut a = args!["report", r.path("u.pb.gz"), "--redact-paths=hash"];
    for o in outs {
        a.push("-o".into());
        a.push(r.path(o).into());
    }
    let out = run_spanprof(a);
    out.assert_success();
    let needles = directory_needles(r);
    for file in outs {
        let bytes = contents(&r.path(file));
        for needle in &needles {
            assert!(
                find(&bytes, needle).is_none(),
                "{file} names {needle:?}: …{}…",
                find(&bytes, needle).map_or(String::new(), |at| around(&bytes, at))
            );
        }
    }
    let pprof = decode_pprof(&r.path("h.pb.gz"));
    let hashed = pprof["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["filename"].as_str())
        .find(|f| f.ends_with(">/private_app.py"))
        .unwrap_or_else(|| panic!("no hashed private_app.py in {:#}", pprof["functions"]));
    assert_eq!(hashed.len(), "<01234567>/private_app.py".len(), "{hashed}");
}

#[test]
fn an_output_path_that_is_a_symlink_is_refused() {
    let r = runs();
    let tmp = TempDir::new("privacy-symlink");
    let victim = tmp.join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    let link = tmp.join("flame.svg");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let out = run_spanprof(args!["report", r.path("u.pb.gz"), "-o", &link]);
    assert_error(&out, FAILURE, &["symbolic link", "flame.svg"]);
    let out = run_spanprof(args![
        "profile",
        "--duration",
        "1s",
        "-o",
        &link,
        "--",
        "/bin/true"
    ]);
    assert_error(&out, FAILURE, &["symbolic link", "flame.svg"]);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced"
    );
    assert_eq!(tmp.entries().len(), 2, "files left: {:?}", tmp.entries());
}

#[test]
fn privacy_flags_are_checked() {
    let r = runs();
    let profile = r.path("u.pb.gz");
    let out = run_spanprof(args!["report", &profile, "--drop-label", "thread"]);
    assert_error(&out, 2, &["--drop-label 'thread'", "thread.name"]);
    let out = run_spanprof(args!["report", &profile, "--redact-paths=full"]);
    assert_error(&out, 2, &["--redact-paths=full", "basename or hash"]);
}

/// The longest an output test's run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The uid of `nobody`: "another user" of the tests below.
const OTHER_UID: u32 = 65534;

/// A `profile` run short enough for output tests: a shell loop of a few ms of CPU.
fn short_profile(outputs: &[&Path]) -> std::process::Command {
    let mut cmd = spanprof_tests::spanprof_command(["profile"]);
    for o in outputs {
        cmd.arg("-o").arg(o);
    }
    cmd.args([
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done",
    ]);
    cmd
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo");
}

/// Changes the owner of `path` itself (not what a link points to) to [`OTHER_UID`].
fn give_to_other_user(path: &Path) {
    std::os::unix::fs::lchown(path, Some(OTHER_UID), Some(OTHER_UID)).expect("lchown");
}

/// Reads what is waiting at the non-blocking descriptor `fd`, without waiting.
fn pending_bytes(fd: i32) -> usize {
    let mut buf = [0u8; 65536];
    // SAFETY: reading into a local buffer of its size.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    n.max(0) as usize
}

/// In a sticky shared directory, another user's FIFO (with a reader of theirs waiting) and
/// another user's symbolic link to a terminal are planted at root's output paths: each output
/// is refused with a line naming the owner, no byte reaches the reader or the terminal, and
/// the session's other output is written.
#[test]
fn another_user_s_fifo_or_terminal_link_gets_no_output() {
    spanprof_tests::require_root();
    let tmp = TempDir::new("privacy-planted");
    let shared = tmp.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();

    // Their FIFO, a reader of theirs already waiting on it.
    let fifo = shared.join("flame.svg");
    mkfifo(&fifo);
    give_to_other_user(&fifo);
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    // Their link to a terminal (a pseudo-terminal the test opens; its reading end is kept).
    // SAFETY: posix_openpt, grantpt, unlockpt and ptsname on the descriptor just opened.
    let (master, pts) = unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK);
        assert!(m >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let name = std::ffi::CStr::from_ptr(libc::ptsname(m))
            .to_str()
            .unwrap()
            .to_owned();
        (m, PathBuf::from(name))
    };
    // The slave must be open for the master to read anything written to it.
    let _slave = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&pts)
        .unwrap();
    let link = shared.join("run.folded");
    std::os::unix::fs::symlink(&pts, &link).unwrap();
    give_to_other_user(&link);
    let mine = tmp.join("mine.folded");

    for (planted, what) in [
        (&fifo, "FIFO owned by another user (uid 65534)"),
        (&link, "symbolic link owned by another user (uid 65534)"),
    ] {
        let out = spanprof_tests::run_with_timeout(short_profile(&[planted, &mine]), RUN_TIMEOUT);
        assert_error(
            &out,
            FAILURE,
            &[what, planted.file_name().unwrap().to_str().unwrap()],
        );
    }
    // The report writes into such nodes no more than a session does.
    let r = runs();
    let out = run_spanprof(args!["report", r.path("u.pb.gz"), "-o", &fifo]);
    assert_error(&out, FAILURE, &["owned by another user"]);
    use std::os::fd::AsRawFd;
    assert_eq!(
        pending_bytes(reader.as_raw_fd()),
        0,
        "bytes reached their FIFO"
    );
    assert_eq!(pending_bytes(master), 0, "bytes reached their terminal");
    // SAFETY: closing the master the test opened.
    unsafe { libc::close(master) };

    // Root's own FIFO in the same place is written into.
    let own = shared.join("own.folded");
    mkfifo(&own);
    let taker = {
        let own = own.clone();
        std::thread::spawn(move || std::fs::read(own).unwrap())
    };
    let out = spanprof_tests::run_with_timeout(short_profile(&[&own, &mine]), RUN_TIMEOUT);
    out.assert_success();
    assert!(
        !taker.join().unwrap().is_empty(),
        "nothing came through root's own FIFO"
    );
    assert!(mine.is_file());
}

/// A FIFO output nobody reads: the session gives up on it after its bound
/// (`write::FIFO_WAIT`, 10 s) with a line, and writes its other output; a SIGTERM during that
/// wait ends it at once, the other output written too.
#[test]
fn a_fifo_without_a_reader_does_not_hold_the_session() {
    spanprof_tests::require_root();
    let tmp = TempDir::new("privacy-fifo-wait");
    let fifo = tmp.join("nobody.folded");
    mkfifo(&fifo);
    let other = tmp.join("other.svg");
    let failed_with = |out: &RunOutput, line: &str| {
        assert_eq!(out.code(), FAILURE, "{out}");
        assert!(
            out.stderr
                .lines()
                .any(|l| l.starts_with("error: cannot write output")
                    && l.contains("nobody.folded")
                    && l.ends_with(line)),
            "no line ending {line:?}: {out}"
        );
        assert!(out.stderr.contains("wrote "), "{out}");
        assert!(other.is_file(), "{out}");
    };
    let out = spanprof_tests::run_with_timeout(short_profile(&[&fifo, &other]), RUN_TIMEOUT);
    failed_with(&out, "no reader opened the FIFO within 10 s");
    assert!(
        out.stderr.contains("waiting up to 10 s for a reader"),
        "{out}"
    );

    std::fs::remove_file(&other).unwrap();
    let mut session = spanprof_tests::Background::spawn(short_profile(&[&fifo, &other]));
    session.wait_for_stderr("waiting up to 10 s for a reader", RUN_TIMEOUT);
    session.signal(libc::SIGTERM);
    let out = session.finish(RUN_TIMEOUT);
    failed_with(
        &out,
        "a stop signal came while waiting for a reader of the FIFO",
    );
}
