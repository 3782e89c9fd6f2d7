//! Checks that the Rust mirror and the C header agree on every size, offset and constant.

extern crate std;

use super::*;
use core::mem::{align_of, offset_of, size_of};
use std::format;
use std::string::String;
use std::vec;
use std::vec::Vec;

/// Field offsets and sizes, as Rust lays them out.
macro_rules! fields {
    ($ty:ty, $cname:literal, $($f:ident),+) => {{
        let mut v: Vec<(String, usize, usize)> = Vec::new();
        $(
            let size = {
                fn size_of_field<T, F>(_: impl Fn(&T) -> &F) -> usize { size_of::<F>() }
                size_of_field(|x: &$ty| &x.$f)
            };
            v.push((format!("{}, {}", $cname, stringify!($f)), offset_of!($ty, $f), size));
        )+
        v
    }};
}

fn c_asserts() -> String {
    let mut c = String::from("#include <stddef.h>\n#include \"spanprof_abi.h\"\n");
    let mut structs = Vec::new();
    structs.push((
        "struct spanprof_sample",
        // The header is the record up to `stack`; `stack` itself is checked below.
        SAMPLE_HEADER_SIZE + 2 * MAX_STACK_DEPTH * 8,
        align_of::<SampleHeader>(),
        {
            let mut f = fields!(
                SampleHeader,
                "struct spanprof_sample",
                kind,
                cpu,
                pid,
                tid,
                time_ns,
                kstack_len,
                ustack_len,
                comm
            );
            f.push((
                "struct spanprof_sample, stack".into(),
                SAMPLE_HEADER_SIZE,
                2 * MAX_STACK_DEPTH * 8,
            ));
            f
        },
    ));
    structs.push((
        "struct spanprof_target",
        size_of::<Target>(),
        align_of::<Target>(),
        fields!(Target, "struct spanprof_target", flags, parent_tgid),
    ));
    for (name, size, align, fields) in &structs {
        c += &format!("_Static_assert(sizeof({name}) == {size}, \"size of {name}\");\n");
        c += &format!("_Static_assert(_Alignof({name}) == {align}, \"align of {name}\");\n");
        let mut covered = 0;
        for (field, offset, fsize) in fields {
            c +=
                &format!("_Static_assert(offsetof({field}) == {offset}, \"offset of {field}\");\n");
            covered += fsize;
        }
        assert_eq!(
            covered, *size,
            "{name} has padding or fields missing from this test"
        );
    }
    let consts = [
        ("SPANPROF_MAX_STACK_DEPTH", MAX_STACK_DEPTH as u64),
        ("SPANPROF_TASK_COMM_LEN", TASK_COMM_LEN as u64),
        ("SPANPROF_RECORD_SAMPLE", RECORD_SAMPLE as u64),
        ("SPANPROF_SAMPLE_HEADER_SIZE", SAMPLE_HEADER_SIZE as u64),
        ("SPANPROF_TARGET_EXPLICIT", TARGET_EXPLICIT as u64),
        ("SPANPROF_TARGET_CHILD", TARGET_CHILD as u64),
        ("SPANPROF_ERR_COUNT", ERROR_COUNT as u64),
        ("SPANPROF_ERR_RINGBUF_FULL", ErrorCode::RingbufFull as u64),
        ("SPANPROF_ERR_KSTACK", ErrorCode::KernelStack as u64),
        ("SPANPROF_ERR_USTACK", ErrorCode::UserStack as u64),
        ("SPANPROF_ERR_PID_MAP_FULL", ErrorCode::PidMapFull as u64),
    ];
    for (name, value) in consts {
        c += &format!("_Static_assert({name} == {value}, \"value of {name}\");\n");
    }
    c
}

#[test]
fn rust_layout_matches_c_header() {
    let dir = std::env::temp_dir().join(format!("spanprof-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("abi_check.c");
    std::fs::write(&file, c_asserts()).unwrap();
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/../profiler-ebpf/include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .args(["-std=c11", "-fsyntax-only", "-I", include])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("failed to run {cc}: {e}"));
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        out.status.success(),
        "C header and Rust ABI disagree:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn error_codes_fit_the_map() {
    for code in ErrorCode::ALL {
        assert!((code as u32) < ERROR_COUNT);
    }
}

#[test]
fn header_size_matches() {
    assert_eq!(size_of::<SampleHeader>(), SAMPLE_HEADER_SIZE);
}

/// An 8-aligned record: the header, then `frames`.
fn record(kstack_len: i32, ustack_len: i32, frames: &[u64]) -> Vec<u64> {
    let mut words = vec![0u64; SAMPLE_HEADER_SIZE / 8 + frames.len()];
    // SAFETY: the buffer holds the header; SampleHeader is Pod.
    let header = unsafe { &mut *(words.as_mut_ptr() as *mut SampleHeader) };
    header.kind = RECORD_SAMPLE;
    header.kstack_len = kstack_len;
    header.ustack_len = ustack_len;
    header.comm[..3].copy_from_slice(b"abc");
    words[SAMPLE_HEADER_SIZE / 8..].copy_from_slice(frames);
    words
}

fn bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u64s viewed as bytes.
    unsafe { core::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 8) }
}

#[test]
fn from_bytes_splits_kernel_and_user_frames() {
    let r = record(2, 3, &[1, 2, 10, 20, 30]);
    let s = Sample::from_bytes(bytes(&r)).unwrap();
    assert_eq!(s.kernel_stack(), [1, 2]);
    assert_eq!(s.user_stack(), [10, 20, 30]);
    assert_eq!(s.comm(), b"abc");
    // -EFAULT kernel stack (user mode): all frames are user frames.
    let r = record(-14, 2, &[10, 20]);
    let s = Sample::from_bytes(bytes(&r)).unwrap();
    assert!(s.kernel_stack().is_empty());
    assert_eq!(s.user_stack(), [10, 20]);
}

#[test]
fn from_bytes_never_trusts_the_lengths() {
    // Lengths beyond the record are clamped to what it holds.
    let r = record(1000, 1000, &[1, 2, 3]);
    let s = Sample::from_bytes(bytes(&r)).unwrap();
    assert_eq!(s.kernel_stack(), [1, 2, 3]);
    assert!(s.user_stack().is_empty());
    let r = record(1, 1000, &[1, 2, 3]);
    let s = Sample::from_bytes(bytes(&r)).unwrap();
    assert_eq!((s.kernel_stack(), s.user_stack()), (&[1][..], &[2, 3][..]));
    // Short, foreign or misaligned records are refused.
    assert!(Sample::from_bytes(&bytes(&r)[..40]).is_none());
    let mut foreign = record(0, 0, &[]);
    foreign[0] = 7;
    assert!(Sample::from_bytes(bytes(&foreign)).is_none());
    assert!(Sample::from_bytes(&bytes(&r)[1..]).is_none());
}
