//! Checks that the Rust mirror and the C header agree on every size, offset and constant.

extern crate std;

use super::*;
use core::mem::{align_of, offset_of, size_of};
use std::format;
use std::string::String;
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
        size_of::<SampleRecord>(),
        align_of::<SampleRecord>(),
        fields!(
            SampleRecord,
            "struct spanprof_sample",
            kind,
            cpu,
            pid,
            tid,
            time_ns,
            kstack_len,
            ustack_len,
            comm,
            kstack,
            ustack
        ),
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
fn from_bytes_rejects_short_and_foreign_records() {
    #[repr(C, align(8))]
    struct Buf([u8; size_of::<SampleRecord>()]);
    let mut buf = Buf([0; size_of::<SampleRecord>()]);
    assert!(
        SampleRecord::from_bytes(&buf.0).is_none(),
        "kind 0 is not a sample"
    );
    buf.0[..4].copy_from_slice(&RECORD_SAMPLE.to_ne_bytes());
    // kstack_len = 3, ustack_len = -14 (EFAULT)
    let k = offset_of!(SampleRecord, kstack_len);
    buf.0[k..k + 4].copy_from_slice(&3i32.to_ne_bytes());
    let u = offset_of!(SampleRecord, ustack_len);
    buf.0[u..u + 4].copy_from_slice(&(-14i32).to_ne_bytes());
    let rec = SampleRecord::from_bytes(&buf.0).unwrap();
    assert_eq!(rec.kernel_stack().len(), 3);
    assert!(rec.user_stack().is_empty());
    assert!(SampleRecord::from_bytes(&buf.0[..100]).is_none());
    // A length beyond the array is clamped, never read past the end.
    buf.0[k..k + 4].copy_from_slice(&1000i32.to_ne_bytes());
    let rec = SampleRecord::from_bytes(&buf.0).unwrap();
    assert_eq!(rec.kernel_stack().len(), MAX_STACK_DEPTH);
}
