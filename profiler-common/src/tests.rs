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
        // The header is the record up to `stack`; `stack` and `py` are checked below.
        SAMPLE_HEADER_SIZE
            + 2 * MAX_STACK_DEPTH * 8
            + MAX_PY_FRAMES * PY_FRAME_SIZE
            + size_of::<SpanRecord>()
            + MAX_STACK_COPY,
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
                comm,
                py_len,
                py_status,
                span_len,
                ustack_copy_len,
                user_ip,
                user_sp,
                user_bp,
                ustack_copy_status,
                event,
                weight,
                blocked_ns,
                syscall_nr,
                offcpu_flags,
                syscall_arg0,
                alloc_id
            );
            f.push((
                "struct spanprof_sample, stack".into(),
                SAMPLE_HEADER_SIZE,
                2 * MAX_STACK_DEPTH * 8,
            ));
            f.push((
                "struct spanprof_sample, py".into(),
                SAMPLE_HEADER_SIZE + 2 * MAX_STACK_DEPTH * 8,
                MAX_PY_FRAMES * PY_FRAME_SIZE,
            ));
            f.push((
                "struct spanprof_sample, span".into(),
                SAMPLE_HEADER_SIZE + 2 * MAX_STACK_DEPTH * 8 + MAX_PY_FRAMES * PY_FRAME_SIZE,
                size_of::<SpanRecord>(),
            ));
            f.push((
                "struct spanprof_sample, ustack".into(),
                SAMPLE_HEADER_SIZE
                    + 2 * MAX_STACK_DEPTH * 8
                    + MAX_PY_FRAMES * PY_FRAME_SIZE
                    + size_of::<SpanRecord>(),
                MAX_STACK_COPY,
            ));
            f
        },
    ));
    structs.push((
        "struct spanprof_span",
        size_of::<SpanRecord>(),
        align_of::<SpanRecord>(),
        fields!(
            SpanRecord,
            "struct spanprof_span",
            trace_id,
            span_id,
            osp_base,
            osp_current,
            osp_parent,
            flags,
            otel_name_len,
            osp_name_len,
            thread_name_len,
            _pad,
            otel_name,
            osp_name,
            thread_name
        ),
    ));
    structs.push((
        "struct spanprof_span_proc",
        size_of::<SpanProc>(),
        align_of::<SpanProc>(),
        fields!(
            SpanProc,
            "struct spanprof_span_proc",
            otel_var,
            otel_key,
            otel_key_hash,
            context_name,
            context_name_hash,
            hamt_bitmap_type,
            hamt_array_type,
            hamt_collision_type,
            osp_local,
            osp_local_hash,
            osp_profiler_name,
            osp_profiler_name_hash,
            osp_profiler_type,
            osp_stack_name,
            osp_stack_name_hash,
            name_attr,
            name_attr_hash,
            str_type,
            otel_var_hash,
            tstate_context,
            context_vars,
            hamt_root,
            tstate_local,
            local_kind,
            dict_kind,
            dict_values,
            attr_kind,
            type_flags,
            type_dictoffset,
            type_basicsize,
            type_cached_keys,
            long_kind,
            str_data,
            tls_kind,
            tls_offset,
            tls_module,
            osp_keys,
            tuple_items,
            green_kind,
            green_tls_kind,
            green_tls_offset,
            green_tls_module,
            green_type,
            dict_type,
            threading_active
        ),
    ));
    structs.push((
        "struct spanprof_offcpu_task",
        size_of::<OffCpuTask>(),
        align_of::<OffCpuTask>(),
        fields!(
            OffCpuTask,
            "struct spanprof_offcpu_task",
            off_ts,
            off_ip,
            off_sp,
            weight_ns,
            blocked_ns,
            pending_ip,
            pending_sp,
            runnable_ts,
            _reserved,
            off_flags,
            flags,
            kstack_len,
            _pad,
            kstack
        ),
    ));
    structs.push((
        "struct spanprof_alloc_key",
        size_of::<AllocKey>(),
        align_of::<AllocKey>(),
        fields!(AllocKey, "struct spanprof_alloc_key", tgid, _pad, addr),
    ));
    structs.push((
        "struct spanprof_live_alloc",
        size_of::<LiveAlloc>(),
        align_of::<LiveAlloc>(),
        fields!(LiveAlloc, "struct spanprof_live_alloc", alloc_id, size),
    ));
    structs.push((
        "struct spanprof_target",
        size_of::<Target>(),
        align_of::<Target>(),
        fields!(Target, "struct spanprof_target", flags, parent_tgid),
    ));
    structs.push((
        "struct spanprof_py_frame",
        size_of::<PyFrame>(),
        align_of::<PyFrame>(),
        fields!(
            PyFrame,
            "struct spanprof_py_frame",
            code,
            check,
            instr,
            flags
        ),
    ));
    structs.push((
        "struct spanprof_exec",
        size_of::<ExecRecord>(),
        align_of::<ExecRecord>(),
        fields!(ExecRecord, "struct spanprof_exec", kind, pid, time_ns),
    ));
    structs.push((
        "struct spanprof_py_proc",
        size_of::<PyProc>(),
        align_of::<PyProc>(),
        fields!(
            PyProc,
            "struct spanprof_py_proc",
            runtime_addr,
            runtime_interp_head,
            interp_threads_head,
            tstate_next,
            tstate_match,
            tstate_thread,
            tstate_frame,
            cframe_current,
            frame_previous,
            frame_code,
            frame_instr,
            frame_entry,
            instr_kind,
            entry_kind,
            code_adaptive,
            code_firstlineno,
            code_filename,
            frame_size,
            code_size,
            code_name,
            frame_window,
            name_hash,
            code_linetable,
            name_data,
            code_version
        ),
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
        ("SPANPROF_RECORD_EXEC", RECORD_EXEC as u64),
        ("SPANPROF_RECORD_EXIT", RECORD_EXIT as u64),
        ("SPANPROF_RECORD_REFUSED", RECORD_REFUSED as u64),
        ("SPANPROF_MAX_PY_FRAMES", MAX_PY_FRAMES as u64),
        ("SPANPROF_PY_OUTER_FRAMES", PY_OUTER_FRAMES as u64),
        ("SPANPROF_PY_WALK_FRAMES", PY_WALK_FRAMES as u64),
        ("SPANPROF_PY_SKIPPED", PY_SKIPPED as u64),
        ("SPANPROF_PY_SKIPPED_SHIFT", PY_SKIPPED_SHIFT as u64),
        ("SPANPROF_PY_FRAME_SIZE", PY_FRAME_SIZE as u64),
        ("SPANPROF_PY_NONE", PY_NONE as u64),
        ("SPANPROF_PY_OK", PY_OK as u64),
        ("SPANPROF_PY_NO_THREAD", PY_NO_THREAD as u64),
        ("SPANPROF_PY_READ_FAILED", PY_READ_FAILED as u64),
        ("SPANPROF_PY_STATUS_MASK", PY_STATUS_MASK as u64),
        ("SPANPROF_PY_TRUNCATED", PY_TRUNCATED as u64),
        ("SPANPROF_PY_FRAME_ENTRY", PY_FRAME_ENTRY as u64),
        ("SPANPROF_PY_MATCH_NATIVE_TID", PY_MATCH_NATIVE_TID as u64),
        ("SPANPROF_PY_MATCH_PTHREAD", PY_MATCH_PTHREAD as u64),
        ("SPANPROF_PY_INSTR_LASTI_BYTES", PY_INSTR_LASTI_BYTES as u64),
        ("SPANPROF_PY_INSTR_LASTI_UNITS", PY_INSTR_LASTI_UNITS as u64),
        ("SPANPROF_PY_INSTR_POINTER", PY_INSTR_POINTER as u64),
        ("SPANPROF_PY_ENTRY_EVERY_FRAME", PY_ENTRY_EVERY_FRAME as u64),
        ("SPANPROF_PY_ENTRY_FIELD", PY_ENTRY_FIELD as u64),
        ("SPANPROF_PY_ENTRY_SHIM", PY_ENTRY_SHIM as u64),
        ("SPANPROF_PY_NO_OFFSET", PY_NO_OFFSET as u64),
        ("SPANPROF_PY_FRAME_BLOCK", PY_FRAME_BLOCK as u64),
        ("SPANPROF_PY_CODE_BLOCK", PY_CODE_BLOCK as u64),
        ("SPANPROF_PY_WINDOW", PY_WINDOW as u64),
        ("SPANPROF_PY_NAME_READ", PY_NAME_READ as u64),
        ("SPANPROF_SAMPLE_HEADER_SIZE", SAMPLE_HEADER_SIZE as u64),
        ("SPANPROF_SCRATCH_SLOTS", SCRATCH_SLOTS as u64),
        ("SPANPROF_ALLOC_GAPS", ALLOC_GAPS as u64),
        ("SPANPROF_MAX_STACK_COPY", MAX_STACK_COPY as u64),
        ("SPANPROF_USTACK_COPY_NONE", USTACK_COPY_NONE as u64),
        ("SPANPROF_USTACK_COPY_OK", USTACK_COPY_OK as u64),
        ("SPANPROF_USTACK_COPY_FAULT", USTACK_COPY_FAULT as u64),
        ("SPANPROF_USTACK_COPY_NO_REGS", USTACK_COPY_NO_REGS as u64),
        ("SPANPROF_USTACK_COPY_SHORT", USTACK_COPY_SHORT as u64),
        ("SPANPROF_EVENT_CPU", EVENT_CPU as u64),
        ("SPANPROF_EVENT_OFFCPU", EVENT_OFFCPU as u64),
        ("SPANPROF_EVENT_ALLOC", EVENT_ALLOC as u64),
        ("SPANPROF_ALLOC_MALLOC", ALLOC_MALLOC),
        ("SPANPROF_ALLOC_PY_MALLOC", ALLOC_PY_MALLOC),
        ("SPANPROF_ALLOC_PY_CALLOC", ALLOC_PY_CALLOC),
        ("SPANPROF_ALLOC_PY_REALLOC", ALLOC_PY_REALLOC),
        ("SPANPROF_ALLOC_PY_FREE", ALLOC_PY_FREE),
        ("SPANPROF_ALLOC_PY_ARENA", ALLOC_PY_ARENA),
        ("SPANPROF_PY_SMALL_REQUEST", PY_SMALL_REQUEST),
        ("SPANPROF_ALLOC_CALLOC", ALLOC_CALLOC),
        ("SPANPROF_ALLOC_REALLOC", ALLOC_REALLOC),
        ("SPANPROF_ALLOC_MEMALIGN", ALLOC_MEMALIGN),
        ("SPANPROF_ALLOC_POSIX_MEMALIGN", ALLOC_POSIX_MEMALIGN),
        ("SPANPROF_ALLOC_MMAP", ALLOC_MMAP),
        ("SPANPROF_OFFCPU_IOWAIT", OFFCPU_IOWAIT as u64),
        ("SPANPROF_OFFCPU_NO_USER", OFFCPU_NO_USER as u64),
        ("SPANPROF_TARGET_EXPLICIT", TARGET_EXPLICIT as u64),
        ("SPANPROF_TARGET_CHILD", TARGET_CHILD as u64),
        ("SPANPROF_TARGET_SEEN", TARGET_SEEN as u64),
        ("SPANPROF_TARGET_SEEN_MAIN", TARGET_SEEN_MAIN as u64),
        ("SPANPROF_ERR_COUNT", ERROR_COUNT as u64),
        ("SPANPROF_ERR_RINGBUF_FULL", ErrorCode::RingbufFull as u64),
        ("SPANPROF_ERR_KSTACK", ErrorCode::KernelStack as u64),
        ("SPANPROF_ERR_USTACK", ErrorCode::UserStack as u64),
        ("SPANPROF_ERR_PID_MAP_FULL", ErrorCode::PidMapFull as u64),
        ("SPANPROF_ERR_PY_READ", ErrorCode::PythonRead as u64),
        ("SPANPROF_ERR_SPAN_READ", ErrorCode::SpanRead as u64),
        (
            "SPANPROF_ERR_OFFCPU_DROPPED",
            ErrorCode::OffCpuDropped as u64,
        ),
        (
            "SPANPROF_ERR_OFFCPU_STORAGE",
            ErrorCode::OffCpuStorage as u64,
        ),
        ("SPANPROF_ERR_HEAP_FULL", ErrorCode::HeapFull as u64),
        ("SPANPROF_ERR_RUNNABLE_NS", ErrorCode::RunnableNs as u64),
        ("SPANPROF_ERR_ALLOC_BUSY", ErrorCode::AllocBusy as u64),
        ("SPANPROF_ERR_OFFCPU_MISSED", ErrorCode::OffCpuMissed as u64),
        ("SPANPROF_ERR_OFFCPU_LATE", ErrorCode::OffCpuLate as u64),
        ("SPANPROF_SPAN_OTEL", SPAN_OTEL as u64),
        ("SPANPROF_SPAN_OSP", SPAN_OSP as u64),
        ("SPANPROF_SPAN_OSP_PARENT", SPAN_OSP_PARENT as u64),
        ("SPANPROF_SPAN_OTEL_NAME", SPAN_OTEL_NAME as u64),
        ("SPANPROF_SPAN_OSP_NAME", SPAN_OSP_NAME as u64),
        ("SPANPROF_SPAN_NAME_MAX", SPAN_NAME_MAX as u64),
        ("SPANPROF_SPAN_PUBLISHED", SPAN_PUBLISHED as u64),
        ("SPANPROF_TLS_NONE", TLS_NONE as u64),
        ("SPANPROF_TLS_STATIC", TLS_STATIC as u64),
        ("SPANPROF_TLS_DTV", TLS_DTV as u64),
        ("SPANPROF_NO_KEY", NO_KEY as u64),
        ("SPANPROF_ATTR_DICTOFFSET", ATTR_DICTOFFSET as u64),
        ("SPANPROF_ATTR_MANAGED", ATTR_MANAGED as u64),
        ("SPANPROF_ATTR_TAGGED", ATTR_TAGGED as u64),
        ("SPANPROF_ATTR_INLINE", ATTR_INLINE as u64),
        ("SPANPROF_DICT_SIZE", DICT_SIZE as u64),
        ("SPANPROF_DICT_LOG2", DICT_LOG2 as u64),
        ("SPANPROF_LONG_SIZE", LONG_SIZE as u64),
        ("SPANPROF_LONG_TAG", LONG_TAG as u64),
        ("SPANPROF_LOCAL_TSTATE_DICT", LOCAL_TSTATE_DICT as u64),
        ("SPANPROF_LOCAL_LOCALDICTS", LOCAL_LOCALDICTS as u64),
        ("SPANPROF_GREEN_NONE", GREEN_NONE as u64),
        ("SPANPROF_GREEN_EVENTLET", GREEN_EVENTLET as u64),
        ("SPANPROF_GREEN_GEVENT", GREEN_GEVENT as u64),
    ];
    for (name, value) in consts {
        c += &format!("_Static_assert({name} == {value}, \"value of {name}\");\n");
    }
    c
}

/// Compiles the asserts of [`c_asserts`] with `cc` and `args`; the compiler's errors if they fail.
fn compile_asserts(cc: &str, args: &[&str]) -> Result<(), String> {
    // NB: the target in the name too: the host's and the BPF check may use one compiler, and
    // they run at once.
    let target = if args.contains(&"bpf") { "bpf" } else { "host" };
    let dir = std::env::temp_dir().join(format!(
        "spanprof-abi-{}-{}-{target}",
        std::process::id(),
        cc.replace('/', "_")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("abi_check.c");
    std::fs::write(&file, c_asserts()).unwrap();
    let include = ebpf_include();
    let out = std::process::Command::new(cc)
        .args(args)
        .args(["-std=c11", "-fsyntax-only", "-I", &include])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("failed to run {cc}: {e}"));
    std::fs::remove_dir_all(&dir).ok();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// profiler-ebpf/include, from the `CARGO_MANIFEST_DIR` `cargo test` gives the running test
/// (else the one it was built with): a test binary built in one clone can run in another
/// (`cargo xtask test` shares its build directory), which must check its own header.
fn ebpf_include() -> String {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| String::from(env!("CARGO_MANIFEST_DIR")));
    format!("{manifest}/../profiler-ebpf/include")
}

/// The header as user space would see it in C: the host's compiler (`$CC`, else `cc`).
#[test]
fn rust_layout_matches_c_header() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if let Err(e) = compile_asserts(&cc, &[]) {
        panic!("C header and Rust ABI disagree:\n{e}");
    }
}

/// The header as the eBPF programs see it: the compiler, target and flags that
/// collect/build.rs compiles them with (clang from `$SPANPROF_CLANG`, else `clang-19`,
/// else `clang`), so the layout checked is the one in the loaded object.
#[test]
fn rust_layout_matches_c_header_for_bpf() {
    let clang = match std::env::var("SPANPROF_CLANG") {
        Ok(c) => c,
        Err(_) => ["clang-19", "clang"]
            .into_iter()
            .find(|c| {
                std::process::Command::new(c)
                    .arg("--version")
                    .output()
                    .is_ok()
            })
            .expect("no clang-19 or clang (install Debian's clang-19, or set SPANPROF_CLANG)")
            .into(),
    };
    let arch_include = format!("/usr/include/{}-linux-gnu", std::env::consts::ARCH);
    let args = [
        "-O2",
        "-target",
        "bpf",
        "-D__TARGET_ARCH_x86",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
        &arch_include,
    ];
    if let Err(e) = compile_asserts(&clang, &args) {
        panic!("C header (as the BPF programs are compiled) and Rust ABI disagree:\n{e}");
    }
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

#[test]
fn from_bytes_reads_python_frames_after_the_native_ones_and_clamps_them() {
    // 1 kernel frame, 1 user frame, then two Python frames of 3 words each.
    let py = [0x1000, 0x2000, (1u64 << 32) | 40, 0x3000, 0x4000, 6];
    let mut frames = vec![7, 8];
    frames.extend_from_slice(&py);
    let mut r = record(1, 1, &frames);
    // SAFETY: the buffer holds the header.
    let header = unsafe { &mut *(r.as_mut_ptr() as *mut SampleHeader) };
    header.py_len = 2;
    header.py_status = PY_OK | PY_TRUNCATED;
    let s = Sample::from_bytes(bytes(&r)).unwrap();
    assert_eq!((s.kernel_stack(), s.user_stack()), (&[7][..], &[8][..]));
    assert_eq!(
        s.python_stack(),
        [
            PyFrame {
                code: 0x1000,
                check: 0x2000,
                instr: 40,
                flags: 1
            },
            PyFrame {
                code: 0x3000,
                check: 0x4000,
                instr: 6,
                flags: 0
            }
        ]
    );
    assert_eq!(s.python_status(), PY_OK);
    assert!(s.python_truncated());
    // A py_len beyond the record is clamped to the whole frames it holds.
    header.py_len = 1000;
    let cut = &bytes(&r)[..bytes(&r).len() - 8];
    assert_eq!(Sample::from_bytes(cut).unwrap().python_stack().len(), 1);
}

#[test]
fn check_value_matches_the_c_macro() {
    let dir = std::env::temp_dir().join(format!("spanprof-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (
            0x7f00_1234_5678u64,
            0x5555_0000_1000u64,
            10i32,
            0x5555_0000_2000u64,
            7u32,
        ),
        (0, 0, 0, 0, 0),
        (u64::MAX, 1, -1, u64::MAX, u32::MAX),
    ];
    let mut c = String::from("#include <stdio.h>\n#include \"spanprof_abi.h\"\nint main(void) {\n");
    for (name, file, first, table, version) in cases {
        c += &format!(
            "printf(\"%llu\\n\", (unsigned long long)SPANPROF_PY_CHECK({name}ULL, {file}ULL, \
             {first}, {table}ULL, {version}U));\n"
        );
        c += &format!(
            "printf(\"%llu\\n\", (unsigned long long)SPANPROF_PY_NAME({name}ULL, {file}ULL, \
             {table}ULL));\n"
        );
    }
    c += "return 0;\n}\n";
    let src = dir.join("check.c");
    let exe = dir.join("check");
    std::fs::write(&src, c).unwrap();
    let include = ebpf_include();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = std::process::Command::new(&cc)
        .args(["-std=c11", "-I", &include, "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("failed to run {cc}: {e}"));
    assert!(built.success());
    let out = std::process::Command::new(&exe).output().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let got: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let want: Vec<u64> = cases
        .iter()
        .flat_map(|&(n, f, l, t, v)| {
            [
                PyFrame::check_value(n, f, l, t, v),
                PyFrame::name_part(n, f, t),
            ]
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn records_of_every_kind_are_told_apart() {
    let exec = [u64::from(RECORD_EXEC) | (42u64 << 32), 5];
    match Record::from_bytes(bytes(&exec)) {
        Some(Record::Exec(e)) => assert_eq!((e.pid, e.time_ns), (42, 5)),
        other => panic!("{other:?}"),
    }
    let exit = [u64::from(RECORD_EXIT) | (43u64 << 32), 6];
    match Record::from_bytes(bytes(&exit)) {
        Some(Record::Exit(e)) => assert_eq!((e.pid, e.time_ns), (43, 6)),
        other => panic!("{other:?}"),
    }
    assert!(
        Record::from_bytes(&bytes(&exec)[..8]).is_none(),
        "short exec record"
    );
    assert!(matches!(
        Record::from_bytes(bytes(&record(0, 0, &[]))),
        Some(Record::Sample(_))
    ));
    assert!(Record::from_bytes(bytes(&[9u64])).is_none(), "unknown kind");
}

#[test]
fn from_bytes_reads_the_span_after_every_frame() {
    // 1 kernel, 1 user frame, 1 Python frame (3 words), then a span record (34 words).
    let mut frames = vec![1, 2, 0x1000, 0x2000, 7];
    let mut span = [0u64; 34];
    span[0] = u64::from_ne_bytes([0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6]);
    // flags, otel_name_len 3, osp_name_len 0; then otel_name.
    span[9] = u64::from(SPAN_OTEL | SPAN_OTEL_NAME) | 3 << 32;
    span[10] = u64::from_ne_bytes(*b"GET\0\0\0\0\0");
    frames.extend_from_slice(&span);
    let mut r = record(1, 1, &frames);
    // SAFETY: the buffer holds the header; SampleHeader is Pod.
    let header = unsafe { &mut *(r.as_mut_ptr() as *mut SampleHeader) };
    header.py_len = 1;
    header.span_len = size_of::<SpanRecord>() as u32;
    let s = Sample::from_bytes(bytes(&r)).unwrap();
    assert_eq!(s.python_stack().len(), 1);
    let span = s.span().unwrap();
    assert_eq!(span.flags, SPAN_OTEL | SPAN_OTEL_NAME);
    assert_eq!(span.trace_id[..4], [0x4b, 0xf9, 0x2f, 0x35]);
    assert_eq!(span.otel_name(), Some(&b"GET"[..]));
    assert_eq!(span.osp_name(), None);

    // A span cut short by the record's end, or of another size, is not read.
    let short = &bytes(&r)[..bytes(&r).len() - 8];
    assert!(Sample::from_bytes(short).unwrap().span().is_none());
    // SAFETY: as above.
    let header = unsafe { &mut *(r.as_mut_ptr() as *mut SampleHeader) };
    header.span_len = 8;
    assert!(Sample::from_bytes(bytes(&r)).unwrap().span().is_none());
    header.span_len = 0;
    assert!(Sample::from_bytes(bytes(&r)).unwrap().span().is_none());
}
