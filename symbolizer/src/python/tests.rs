//! Tests of the whole chain against real interpreters, and of the walker against garbage.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::detect::{detect, detect_with, DetectError, NotPython, PythonProcess};
use super::memory::{FixtureMemory, LiveMemory, ProcessMemory};
use super::names::CodeNames;
use super::offsets::{self, DebugOffsets, DEBUG_OFFSETS_LEN};
use super::walk::{code_info, walk_thread, walk_thread_state, CodeInfo, TypeAddrs, MAX_FRAMES};
use profiler_common::PyFrame;

fn workload() -> PathBuf {
    super::header_check::manifest_dir().join("../tests/workloads/py_known_stack.py")
}

/// Kills the child when a test fails halfway.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(python: &Path) -> Guard {
    let mut child = Command::new(python)
        .arg(workload())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", python.display()));
    let stdout = child.stdout.take().expect("piped stdout");
    let guard = Guard(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read workload output");
    assert_eq!(
        line.trim(),
        "ready",
        "{} did not get ready",
        python.display()
    );
    guard
}

/// Line of `needle` (1-based) in the workload.
fn line_of(needle: &str) -> u32 {
    let text = std::fs::read_to_string(workload()).expect("read workload");
    let idx = text
        .lines()
        .position(|l| l.contains(needle))
        .expect("needle in workload");
    idx as u32 + 1
}

/// Line (1-based) of the workload line that is exactly `stmt` once indented away.
fn line_of_stmt(stmt: &str) -> u32 {
    let text = std::fs::read_to_string(workload()).expect("read workload");
    let idx = text
        .lines()
        .position(|l| l.trim() == stmt)
        .expect("statement in workload");
    idx as u32 + 1
}

/// Detects, walks the main thread, and checks the known stack.
fn check_known_stack(python: &Path) -> PythonProcess {
    let child = start(python);
    let pid = child.0.id();
    let proc = detect(pid).unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    let off = proc
        .offsets()
        .unwrap_or_else(|| panic!("{}: no offsets for {}", python.display(), proc.version));
    let mem = LiveMemory::new(pid);
    if proc.version.minor >= 13 {
        let mut raw = vec![0u8; DEBUG_OFFSETS_LEN];
        mem.read(proc.runtime_addr, &mut raw)
            .expect("read _PyRuntime");
        let dbg = DebugOffsets::parse(&raw).expect("parse _Py_DebugOffsets");
        dbg.check(off)
            .expect("3.13 table agrees with _Py_DebugOffsets");
    }
    let types = TypeAddrs {
        code: proc.code_type_addr,
        unicode: proc.unicode_type_addr,
    };
    let sleep_line = line_of_stmt("time.sleep(30)");
    // "ready" is printed just before the sleep: until `print` has returned, the innermost
    // frame is still on the line above. Walk again until it is in the sleep.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (stack, infos) = loop {
        let stack = walk_thread(&mem, off, proc.runtime_addr, pid)
            .unwrap_or_else(|e| panic!("{}: walk: {e}", python.display()));
        let infos: Vec<CodeInfo> = stack
            .frames
            .iter()
            .map(|f| code_info(&mem, off, types, f.code).expect("code info"))
            .collect();
        let in_sleep = match (stack.frames.first(), infos.first()) {
            (Some(f), Some(i)) => i.line(f.instr_offset) == Some(sleep_line),
            _ => false,
        };
        if in_sleep || std::time::Instant::now() > deadline {
            break (stack, infos);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let names: Vec<&str> = infos.iter().map(|i| i.name.as_str()).collect();
    let middle = if proc.version.minor >= 11 {
        "K.middle_b"
    } else {
        "middle_b"
    };
    assert_eq!(
        names,
        ["inner_c", middle, "outer_a", "<module>"],
        "{} ({})",
        python.display(),
        proc.version
    );
    assert!(!stack.truncated);
    for info in &infos {
        assert!(info.filename.ends_with("py_known_stack.py"), "{info:?}");
    }
    let lines: Vec<u32> = infos.iter().map(|i| i.first_line).collect();
    assert_eq!(
        lines[..3],
        [
            line_of("def inner_c"),
            line_of("def middle_b"),
            line_of("def outer_a"),
        ]
    );
    // A module's first line is 1 from 3.10 on (its first statement's line before that).
    let module_line = if proc.version.minor >= 10 {
        1
    } else {
        line_of("import time")
    };
    assert_eq!(lines[3], module_line, "{}", proc.version);
    // The innermost frame is inside its function's bytecode, past the print call.
    assert!(stack.frames[0].instr_offset > 0, "{:?}", stack.frames[0]);
    // Each frame is on the line of the call it is suspended in.
    let call_lines: Vec<Option<u32>> = stack
        .frames
        .iter()
        .zip(&infos)
        .map(|(f, i)| i.line(f.instr_offset))
        .collect();
    let expected = [
        sleep_line,
        line_of_stmt("inner_c()"),
        line_of_stmt("K().middle_b()"),
        line_of_stmt("outer_a()"),
    ];
    assert_eq!(
        call_lines,
        expected.map(Some),
        "{} ({}): frames {:?}",
        python.display(),
        proc.version,
        stack.frames
    );
    for info in &infos {
        assert!(
            !info.line_table.is_empty() && !info.line_table_truncated,
            "{info:?}"
        );
    }
    proc
}

/// pyenv's interpreters for 3.8–3.13, `(minor, path)`.
fn pyenv_pythons() -> Vec<(u8, PathBuf)> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir(root.join("versions")) else {
        return found;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.split('.');
        let (Some("3"), Some(minor)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(minor) = minor.parse::<u8>() else {
            continue;
        };
        let bin = entry.path().join(format!("bin/python3.{minor}"));
        if (8..=13).contains(&minor) && bin.exists() && parts.all(|p| p.parse::<u8>().is_ok()) {
            found.push((minor, bin));
        }
    }
    found.sort();
    found
}

#[test]
fn known_stack_on_every_pyenv_version() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let pythons = pyenv_pythons();
    for minor in 8..=13u8 {
        let Some((_, bin)) = pythons.iter().find(|(m, _)| *m == minor) else {
            assert!(!ci, "python 3.{minor} is missing under pyenv");
            eprintln!("note: python 3.{minor} not found under pyenv, not tested");
            continue;
        };
        let proc = check_known_stack(bin);
        eprintln!(
            "3.{minor}: {} from {:?} in {}",
            proc.version,
            proc.version_source,
            proc.module.display()
        );
        assert_eq!(proc.version.minor, minor);
        assert!(proc.version.patch.is_some(), "{proc:?}");
    }
}

/// The code objects on a waiting thread's stack, named ahead by `read_ahead`, name its frames
/// after the process is gone (as when a process's last wait is sampled as it exits); without
/// it, nothing can be read then. Every pyenv version (3.8-3.11: the check value of names).
#[test]
fn frames_named_ahead_outlive_the_process() {
    let pythons = pyenv_pythons();
    assert!(
        !pythons.is_empty() || std::env::var("CI").is_err(),
        "no pyenv python"
    );
    for (minor, python) in pythons {
        named_ahead_outlive(minor, &python);
    }
}

fn named_ahead_outlive(minor: u8, python: &Path) {
    let mut child = start(python);
    let pid = child.0.id();
    let proc = detect(pid).unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    let off = proc.offsets().expect("offsets");
    let types = TypeAddrs {
        code: proc.code_type_addr,
        unicode: proc.unicode_type_addr,
    };
    let mut ahead = CodeNames::new(LiveMemory::new(pid), off, types);
    let mut cold = CodeNames::new(LiveMemory::new(pid), off, types);
    let mut named = Vec::new();
    let mut budget = 1000;
    let read = ahead.read_ahead(proc.runtime_addr, &mut budget, |info| {
        named.push(info.name.clone());
        named.len() as u32 - 1
    });
    assert_eq!(read, named.len(), "3.{minor}");
    assert!(budget < 1000, "3.{minor}: no frame walked");
    assert!(named.iter().any(|n| n == "outer_a"), "3.{minor}: {named:?}");
    // The frames as the kernel would record them, with their check values, read now.
    let stack = walk_thread(&LiveMemory::new(pid), off, proc.runtime_addr, pid).expect("walk");
    let frames: Vec<PyFrame> = stack
        .frames
        .iter()
        .map(|f| PyFrame {
            code: f.code,
            check: ahead.check_now(f.code).expect("a live code object"),
            instr: f.instr_offset,
            flags: 0,
        })
        .collect();
    assert_eq!(frames.len(), 4, "3.{minor}: {frames:?}");
    // Read ahead again: nothing new; and nothing at all without a budget.
    assert_eq!(
        ahead.read_ahead(proc.runtime_addr, &mut 1000, |_| u32::MAX),
        0
    );
    assert_eq!(cold.read_ahead(proc.runtime_addr, &mut 0, |_| u32::MAX), 0);
    let _ = child.0.kill();
    let _ = child.0.wait();
    let names: Vec<&str> = frames
        .iter()
        .map(|f| {
            let (func, _) = ahead
                .resolve(f, |_| panic!("read again from a gone process"))
                .unwrap_or_else(|| panic!("3.{minor}: not named from what was read ahead"));
            named[func as usize].as_str()
        })
        .collect();
    assert_eq!(names[0], "inner_c", "3.{minor}");
    assert_eq!(names[2..], ["outer_a", "<module>"], "3.{minor}");
    assert!(frames.iter().all(|f| cold.resolve(f, |_| 0).is_none()));
}

/// A file found without CPython is not read again; a CPython's file is still found, and would
/// be skipped only if it were remembered (the set is keyed by the file, not by the process).
#[test]
fn files_without_python_are_remembered() {
    let mut seen = NotPython::default();
    let sleep = Guard(
        Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("start sleep"),
    );
    // The parent of a vfork-style spawn resumes as the exec replaces the child's memory,
    // before the kernel maps the new executable: wait until its maps show the executable.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let me = std::env::current_exe().expect("own executable");
    let pid = sleep.0.id();
    while !std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
        exe != me
            && std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
                maps.lines()
                    .any(|l| l.ends_with(exe.to_str().unwrap_or("-")))
            })
    }) {
        assert!(std::time::Instant::now() < deadline, "sleep never ran");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let err = detect_with(sleep.0.id(), &mut seen).expect_err("sleep is not Python");
    assert!(matches!(err, DetectError::NotPython(_)), "{err}");
    assert_eq!(seen.len(), 1, "sleep's executable is remembered");

    let Some((_, python)) = pyenv_pythons().into_iter().next_back() else {
        assert!(std::env::var("CI").is_err(), "no pyenv python");
        return;
    };
    let child = start(&python);
    let pid = child.0.id();
    let found = detect_with(pid, &mut seen).expect("a CPython next to a remembered file");
    assert_eq!(seen.len(), 1);
    let file = std::fs::File::open(&found.module).expect("open the CPython module");
    seen.remember(&file);
    let err = detect_with(pid, &mut seen).expect_err("its module is remembered as not Python");
    assert!(matches!(err, DetectError::NotPython(_)), "{err}");
    assert!(detect(pid).is_ok(), "a fresh set finds it again");
}

#[test]
fn known_stack_on_debian_python() {
    let bin = Path::new("/usr/bin/python3.11");
    if !bin.exists() {
        eprintln!("note: {} not present, not tested", bin.display());
        return;
    }
    let proc = check_known_stack(bin);
    eprintln!(
        "debian: {} from {:?}, load bias {:#x}",
        proc.version, proc.version_source, proc.load_bias
    );
    assert_eq!(proc.module, bin);
}

/// Deterministic pseudo-random bytes (xorshift), so a failure reproduces.
fn garbage(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn walker_survives_garbage_and_loops() {
    const BASE: u64 = 0x10_0000;
    for off in offsets::ALL {
        // Random bytes, with some words pointing back into the region so walks go somewhere.
        for seed in 1..50u64 {
            let mut bytes = garbage(seed, 0x4000);
            for (i, w) in bytes.chunks_exact_mut(8).enumerate() {
                if i % 3 == 0 {
                    let p = BASE + (u64::from_le_bytes(w.try_into().unwrap()) % 0x4000);
                    w.copy_from_slice(&p.to_le_bytes());
                }
            }
            let mut mem = FixtureMemory::new();
            mem.insert(BASE, bytes);
            let _ = walk_thread(&mem, off, BASE + 0x100, 1234);
            if let Ok(stack) = walk_thread_state(&mem, off, BASE + 0x200) {
                assert!(stack.frames.len() <= MAX_FRAMES);
                for f in &stack.frames {
                    let _ = code_info(&mem, off, TypeAddrs::default(), f.code);
                }
            }
        }
        // A frame whose `previous` points at itself: one frame, marked truncated.
        let mut mem = FixtureMemory::new();
        mem.insert(BASE, vec![0; 0x4000]);
        let (tstate, frame, code) = (BASE, BASE + 0x1000, BASE + 0x2000);
        let cframe = BASE + 0x3000;
        match off.frame_layout {
            offsets::FrameLayout::CFrame { current_frame } => {
                mem.write_u64(tstate + off.tstate_frame, cframe);
                mem.write_u64(cframe + current_frame, frame);
            }
            _ => {
                mem.write_u64(tstate + off.tstate_frame, frame);
            }
        }
        mem.write_u64(frame + off.frame_previous, frame);
        mem.write_u64(frame + off.frame_code, code);
        let stack = walk_thread_state(&mem, off, tstate).expect("walk a looping stack");
        assert_eq!(stack.frames.len(), 1, "{:?}", off.version);
        assert!(stack.truncated);
        // The code object's strings are null pointers: an error, not a panic.
        assert!(code_info(&mem, off, TypeAddrs::default(), code).is_err());
    }
}

#[test]
fn line_table_reads_are_bounded() {
    use super::lines::MAX_LINE_TABLE;
    use super::walk::read_bytes;
    const BASE: u64 = 0x10_0000;
    let mut mem = FixtureMemory::new();
    mem.insert(BASE, vec![0xab; 0x2_0000]);
    let obj = BASE;
    // A small table is read whole.
    mem.write_u64(obj + 16, 6);
    assert_eq!(
        read_bytes(&mem, obj, MAX_LINE_TABLE),
        Ok((vec![0xab; 6], false))
    );
    // An empty one needs no data read.
    mem.write_u64(obj + 16, 0);
    assert_eq!(
        read_bytes(&mem, obj, MAX_LINE_TABLE),
        Ok((Vec::new(), false))
    );
    // A huge one is cut at the cap and marked.
    mem.write_u64(obj + 16, 1 << 40);
    let (bytes, truncated) = read_bytes(&mem, obj, MAX_LINE_TABLE).expect("capped read");
    assert_eq!((bytes.len(), truncated), (MAX_LINE_TABLE, true));
    // A negative size, a size past the mapping, and wild pointers are errors.
    mem.write_u64(obj + 16, u64::MAX);
    assert!(read_bytes(&mem, obj, MAX_LINE_TABLE).is_err());
    mem.write_u64(obj + 16, 0x2_0000);
    assert!(read_bytes(&mem, obj, 0x2_0000).is_err());
    for wild in [0, 8, u64::MAX, u64::MAX - 15] {
        assert!(read_bytes(&mem, wild, MAX_LINE_TABLE).is_err());
    }
}
