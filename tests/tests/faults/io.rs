//! Outputs that are not regular files, inputs that are not profiles: character devices and
//! FIFOs are written into and never replaced; block devices and sockets are refused with one
//! line; a FIFO, a device or a huge file given as input is refused at once, without reading it.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use spanprof_tests::{
    args, assert_error, parse_folded, profiling_lock, require_root, run_spanprof, spanprof_bin,
    workload_path, TempDir,
};

/// `mknod PATH` with `mode` (file type and permissions) and device `major:minor`.
fn mknod(path: &Path, mode: libc::mode_t, major: u32, minor: u32) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; mknod only creates the node.
    let rc = unsafe { libc::mknod(c.as_ptr(), mode, libc::makedev(major, minor)) };
    assert_eq!(
        rc,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// A pseudo-terminal in raw mode: its master, its slave (held open, so that reading the master
/// waits for data rather than failing while nothing else has the slave open), and the slave's
/// path in devpts (a pty's slave opens only through devpts, not through a node made elsewhere).
fn raw_pty() -> (File, File, String) {
    // SAFETY: plain libc calls on the descriptor they return; every result is checked.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(
            master >= 0,
            "posix_openpt: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let mut term: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(master, &mut term), 0);
        libc::cfmakeraw(&mut term);
        assert_eq!(libc::tcsetattr(master, libc::TCSANOW, &term), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(master, name.as_mut_ptr(), name.len()), 0);
        let slave = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .to_string();
        let held = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(&slave)
            .unwrap();
        (File::from_raw_fd(master), held, slave)
    }
}

/// A terminal's output until every slave descriptor closed (a read then fails with EIO).
fn read_until_hangup(mut master: File) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match master.read(&mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

fn file_type(path: &Path) -> std::fs::FileType {
    std::fs::symlink_metadata(path).unwrap().file_type()
}

/// `spanprof profile -o NODE` for character devices made by the test: the null device stays a
/// character device (with the test's own mode), the full device's "no space left" is the
/// output's error (so the bytes were written into the device, not beside it), and the bytes
/// written through a symlink to a terminal (as `-o /dev/stdout` is) arrive at the terminal as
/// the session's folded stacks; `report` and `diff` write into them the same way, and into a
/// FIFO; nothing is ever created next to them.
#[test]
fn outputs_into_character_devices_and_fifos() {
    require_root();
    spanprof_bin();
    let dir = TempDir::new("faults-io-dev");
    let null = dir.join("null.folded");
    mknod(&null, libc::S_IFCHR | 0o644, 1, 3);
    let full = dir.join("full.svg");
    mknod(&full, libc::S_IFCHR | 0o600, 1, 7);
    let (master, held, slave) = raw_pty();
    let tty = dir.join("tty.folded");
    std::os::unix::fs::symlink(&slave, &tty).unwrap();
    let reader = std::thread::spawn(move || read_until_hangup(master));
    let pprof = dir.join("run.pb.gz");
    {
        let _lock = profiling_lock();
        let out = run_spanprof(args![
            "profile",
            "--duration",
            "2s",
            "-o",
            &null,
            "-o",
            &tty,
            "-o",
            &pprof,
            "-o",
            &full,
            "--",
            workload_path("cpu_split"),
            "3",
        ]);
        assert_eq!(out.code(), 1, "the full device's output failed: {out}");
        assert!(
            out.stderr.contains(&format!(
                "error: cannot write output {}: No space left on device",
                full.display()
            )),
            "{out}"
        );
        for written in [&null, &tty, &pprof] {
            let line = format!("wrote {}", written.display());
            assert!(out.stderr.contains(&line), "{line}: {out}");
        }
    }
    drop(held);
    let meta = std::fs::symlink_metadata(&null).unwrap();
    assert!(meta.file_type().is_char_device(), "{meta:?}");
    assert_eq!(meta.mode() & 0o7777, 0o644, "the node's mode is the test's");
    assert_eq!(meta.rdev(), libc::makedev(1, 3));
    assert!(file_type(&full).is_char_device());
    assert!(file_type(&tty).is_symlink());
    let text = String::from_utf8(reader.join().unwrap()).unwrap();
    let stacks = parse_folded(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(
        stacks
            .iter()
            .any(|s| s.frames.iter().any(|f| f == "hot_alpha")),
        "the terminal got the session's stacks: {text:?}"
    );
    assert_eq!(
        dir.entries(),
        ["full.svg", "null.folded", "run.pb.gz", "tty.folded"]
    );

    // report and diff into the device nodes, and into a FIFO with a reader.
    let (master, held, slave) = raw_pty();
    let tty2 = dir.join("tty2.folded");
    std::os::unix::fs::symlink(&slave, &tty2).unwrap();
    let reader = std::thread::spawn(move || read_until_hangup(master));
    let out = run_spanprof(args!["report", &pprof, "-o", &tty2, "-o", &null]);
    assert!(out.status.success(), "{out}");
    drop(held);
    let text = String::from_utf8(reader.join().unwrap()).unwrap();
    assert!(
        parse_folded(&text).is_ok_and(|s| !s.is_empty()),
        "report wrote folded stacks into the terminal: {text:?}"
    );
    let fifo = dir.join("diff.txt");
    mkfifo(&fifo);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let null_svg = dir.join("null.svg");
    mknod(&null_svg, libc::S_IFCHR | 0o644, 1, 3);
    let out = run_spanprof(args!["diff", &pprof, &pprof, "-o", &fifo, "-o", &null_svg]);
    assert!(out.status.success(), "{out}");
    let text = reader.join().unwrap();
    assert!(!text.trim().is_empty(), "{text}");
    assert!(file_type(&fifo).is_fifo());
    assert!(file_type(&null).is_char_device());
    assert!(file_type(&null_svg).is_char_device());
    assert_eq!(
        dir.entries(),
        [
            "diff.txt",
            "full.svg",
            "null.folded",
            "null.svg",
            "run.pb.gz",
            "tty.folded",
            "tty2.folded"
        ]
    );
}

/// A block device or a socket as an output is refused before the session, with one line, and
/// stays what it was.
#[test]
fn block_devices_and_sockets_are_refused_as_outputs() {
    require_root();
    spanprof_bin();
    let dir = TempDir::new("faults-io-refuse");
    let block = dir.join("loop.folded");
    mknod(&block, libc::S_IFBLK | 0o600, 7, 0);
    let sock = dir.join("sock.svg");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    for (node, kind) in [(&block, "block device"), (&sock, "socket")] {
        let out = run_spanprof(args![
            "profile",
            "--duration",
            "1s",
            "-o",
            node,
            "--",
            workload_path("cpu_split"),
            "1",
        ]);
        assert_error(
            &out,
            1,
            &[&format!(
                "cannot write output {}: it is a {kind}",
                node.display()
            )],
        );
    }
    assert!(file_type(&block).is_block_device());
    assert!(file_type(&sock).is_socket());
    let report = dir.join("in.folded");
    std::fs::write(&report, "main;work 3\n").unwrap();
    let out = run_spanprof(args!["report", &report, "-o", &block]);
    assert_error(&out, 1, &["it is a block device"]);
    assert!(file_type(&block).is_block_device());
}

/// `report`, `check` and `diff` given a FIFO nobody writes to, or a character device that
/// never ends (the zero device), exit at once with one error line; a 2 GB sparse file is
/// refused before it is read, with little memory.
#[test]
fn special_and_huge_inputs_are_refused_at_once() {
    require_root();
    spanprof_bin();
    let dir = TempDir::new("faults-io-inputs");
    let fifo = dir.join("in.pb.gz");
    mkfifo(&fifo);
    let zero = dir.join("zero.folded");
    mknod(&zero, libc::S_IFCHR | 0o600, 1, 5);
    let good = dir.join("good.folded");
    std::fs::write(&good, "main;work 3\n").unwrap();
    let huge = dir.join("huge.pb.gz");
    let f = File::create(&huge).unwrap();
    f.set_len(2_000_000_000).unwrap();
    assert!(
        std::fs::metadata(&huge).unwrap().blocks() < 1024,
        "the file is sparse"
    );
    drop(f);
    for input in [&fifo, &zero, &huge] {
        let runs: [Vec<&std::ffi::OsStr>; 4] = [
            vec!["report".as_ref(), input.as_os_str()],
            vec![
                "check".as_ref(),
                input.as_os_str(),
                "--max".as_ref(),
                "x=50%".as_ref(),
            ],
            vec!["diff".as_ref(), input.as_os_str(), good.as_os_str()],
            vec!["diff".as_ref(), good.as_os_str(), input.as_os_str()],
        ];
        for run in &runs {
            let (code, stderr, took, rss) = crate::run_bounded(run, Duration::from_secs(10));
            eprintln!(
                "{run:?}: exit {code} in {took:?}, peak RSS {} MB: {}",
                rss >> 20,
                stderr.trim()
            );
            assert_eq!(code, 1, "{run:?}: {stderr}");
            let lines: Vec<&str> = stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{run:?}: one error line: {stderr}");
            let shown = input.display().to_string();
            assert!(
                lines[0].contains(&shown),
                "{run:?} names the input: {stderr}"
            );
            if input == &huge {
                assert!(lines[0].contains("larger than 1024 MiB"), "{stderr}");
                assert!(
                    took < Duration::from_secs(1),
                    "{run:?}: refused in {took:?}"
                );
                assert!(rss < 100 << 20, "{run:?}: peak RSS {} MB", rss >> 20);
            } else {
                assert!(lines[0].contains("not a regular file"), "{stderr}");
                assert!(
                    took < Duration::from_secs(2),
                    "{run:?}: refused in {took:?}"
                );
            }
        }
    }
    assert!(file_type(&fifo).is_fifo());
    assert!(file_type(&zero).is_char_device());
}
