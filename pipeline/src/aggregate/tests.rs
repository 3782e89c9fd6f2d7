//! Unit tests of the aggregator: records as the BPF programs write them, counted and merged.

use super::*;
use crate::count::{block_facts, EMPTY};
use crate::offcpu::BlockFacts;
use crate::python::TOKEN_ENTRY;
use crate::python::{MergeInfo, Unread};
use crate::resolve::{
    off_cpu_key, span_context, Resolver, PY_FLAG_READ_FAILED, PY_FLAG_TRUNCATED, PY_WITH_FRAMES,
};
use profiler_common::Sample as SampleRecord;
use profiler_common::{SampleHeader, RECORD_SAMPLE, SAMPLE_HEADER_SIZE};
use profiler_common::{
    SpanRecord, EVENT_OFFCPU, OFFCPU_IOWAIT, OFFCPU_NO_USER, SPAN_OSP, SPAN_OTEL,
};
use symbolizer::unwind::UnwindStatus;

/// An 8-aligned ring buffer record as the BPF program writes it.
fn record(pid: u32, tid: u32, kstack: &[u64], ustack: &[u64]) -> Vec<u64> {
    let mut words = vec![0u64; SAMPLE_HEADER_SIZE / 8];
    words.extend_from_slice(kstack);
    words.extend_from_slice(ustack);
    // SAFETY: the buffer holds the header; SampleHeader is plain old data.
    let h = unsafe { &mut *(words.as_mut_ptr() as *mut SampleHeader) };
    h.kind = RECORD_SAMPLE;
    h.pid = pid;
    h.tid = tid;
    h.kstack_len = kstack.len() as i32;
    h.ustack_len = ustack.len() as i32;
    h.comm[..4].copy_from_slice(b"test");
    words
}

fn sample(words: &[u64]) -> SampleRecord<'_> {
    // SAFETY: u64s viewed as bytes.
    let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 8) };
    SampleRecord::from_bytes(bytes).unwrap()
}

#[test]
fn counts_per_thread_and_stack_and_queues_new_addresses_once() {
    let mut agg = Aggregator::new(Options::default());
    let mut py = Python::new(false, false);
    let r1 = record(10, 11, &[0xffff_0010], &[0x1000, 0x2000]);
    agg.record(&sample(&r1), &mut py);
    agg.record(&sample(&r1), &mut py);
    agg.record(&sample(&record(10, 12, &[], &[0x1000, 0x2000])), &mut py);
    assert_eq!(agg.samples(), 3);
    assert_eq!(agg.count.counts.len(), 2, "two threads");
    // In the kernel, the user leaf is the return address of the system call.
    assert_eq!(
        agg.count.counts[&(10, 11, 0, 1, 1, EMPTY, 0, UnwindStatus::Unchecked, 0)].samples,
        2
    );
    assert_eq!(agg.count.user[&10].by_id()[1], [0xfff, 0x1fff]);
    // In user mode the leaf is the interrupted instruction itself.
    assert_eq!(
        agg.count.counts[&(10, 12, 0, EMPTY, 2, EMPTY, 0, UnwindStatus::Unchecked, 0)].samples,
        1
    );
    assert_eq!(agg.count.user[&10].by_id()[2], [0x1000, 0x1fff]);
    assert_eq!(agg.count.pending[&10], vec![0xfff, 0x1fff, 0x1000, 0x1fff]);
}

#[test]
fn a_thread_that_renames_itself_with_its_comm_is_one_thread() {
    let mut agg = Aggregator::new(Options::default());
    let mut py = Python::new(false, false);
    let mut r = record(10, 11, &[], &[0x1000]);
    agg.record(&sample(&r), &mut py);
    // SAFETY: the buffer holds the header; SampleHeader is plain old data.
    let h = unsafe { &mut *(r.as_mut_ptr() as *mut SampleHeader) };
    h.comm[..4].copy_from_slice(b"next");
    agg.record(&sample(&r), &mut py);
    assert!(agg.count.thread_names.is_empty());
    let key = (10, 11, 0, EMPTY, 1, EMPTY, 0, UnwindStatus::Unchecked, 0);
    assert_eq!(agg.count.counts[&key].samples, 2);
    assert_eq!(&agg.count.threads[&(10, 11)][..4], b"next");
}

#[test]
fn off_cpu_records_add_their_weight_under_their_facts() {
    let mut agg = Aggregator::new(Options::default());
    let mut py = Python::new(false, false);
    let mut r = record(10, 11, &[0xffff_0010], &[0x1000]);
    // SAFETY: the buffer holds the header; SampleHeader is plain old data.
    let h = unsafe { &mut *(r.as_mut_ptr() as *mut SampleHeader) };
    h.event = EVENT_OFFCPU;
    h.weight = 10_000_000;
    h.syscall_nr = 230;
    h.syscall_arg0 = 1;
    agg.record(&sample(&r), &mut py);
    agg.record(&sample(&r), &mut py);
    agg.record(&sample(&record(10, 11, &[0xffff_0010], &[0x1000])), &mut py);
    let off = off_cpu_key(unsafe { &*(r.as_ptr() as *const SampleHeader) });
    assert_eq!(
        block_facts(off),
        BlockFacts {
            syscall: Some(230),
            arg0_zero: false,
            iowait: false
        }
    );
    let key = (10, 11, 0, 1, 1, EMPTY, 0, UnwindStatus::Unchecked, off);
    assert_eq!(agg.count.counts[&key].off_cpu_ns, 20_000_000);
    assert_eq!(agg.count.counts[&key].samples, 0);
    // The timer sample of the same stack is counted apart.
    let key = (10, 11, 0, 1, 1, EMPTY, 0, UnwindStatus::Unchecked, 0);
    assert_eq!(agg.count.counts[&key].samples, 1);
    assert_eq!(agg.count.counts[&key].off_cpu_ns, 0);
    // A record without its user stack has no system call to go by.
    h.offcpu_flags = OFFCPU_NO_USER | OFFCPU_IOWAIT;
    h.syscall_arg0 = 0;
    assert_eq!(
        block_facts(off_cpu_key(h)),
        BlockFacts {
            syscall: None,
            arg0_zero: true,
            iowait: true
        }
    );
}

#[test]
fn a_reused_tid_under_another_pid_is_another_thread() {
    let mut agg = Aggregator::new(Options::default());
    let mut py = Python::new(false, false);
    agg.record(&sample(&record(10, 11, &[], &[0x1000])), &mut py);
    agg.record(
        &sample(&record(20, 11, &[], &[0x1000, 0x2000, 0x3000])),
        &mut py,
    );
    assert_eq!(agg.count.threads.len(), 2);
    assert_eq!(
        agg.count.counts[&(10, 11, 0, EMPTY, 1, EMPTY, 0, UnwindStatus::Unchecked, 0)].samples,
        1
    );
    assert_eq!(
        agg.count.counts[&(20, 11, 0, EMPTY, 1, EMPTY, 0, UnwindStatus::Unchecked, 0)].samples,
        1
    );
}

const EVAL: &[(u64, u64)] = &[(0x5000, 0x6000)];

fn info(native_trusted: bool, markers: bool) -> Option<MergeInfo<'static>> {
    Some(MergeInfo {
        eval_ranges: EVAL,
        markers,
        native_trusted,
    })
}

fn merged(native: &[u64], python: &[u64], info: Option<MergeInfo<'_>>) -> Vec<Piece> {
    let mut out = Vec::new();
    merge(native, python, info, &mut out);
    out
}

use Piece::{Native as N, NativeCode as C, Python as P, Unread as U};
const E: u64 = TOKEN_ENTRY;

#[test]
fn trusted_native_stacks_put_each_run_at_its_interpreter_frame() {
    // leaf C function, eval (run 1), a C callback caller, eval (run 2), main.
    let native = [0x100, 0x5010, 0x200, 0x5020, 0x300];
    let python = [1, 2 | E, 3 | E];
    assert_eq!(
        merged(&native, &python, info(true, true)),
        [N(0x100), P(1), P(2 | E), N(0x200), P(3 | E), N(0x300)]
    );
    // A cut stack: runs left over follow what is leafward of the last interpreter frame.
    assert_eq!(
        merged(&native[..3], &python, info(true, true)),
        [N(0x100), P(1), P(2 | E), C, P(3 | E)]
    );
}

#[test]
fn runs_after_left_out_frames_go_with_the_outermost_interpreter_frames() {
    let gap = u64::from(crate::python::TRUNCATED_FUNCTION);
    // leaf, eval (run 0), cb0, eval (gap run, inner end), cb1, eval (left out), cb2,
    // eval (gap run, outer end), cb3, eval (run 2), main.
    let native = [
        0x100, 0x5010, 0x200, 0x5020, 0x210, 0x5030, 0x220, 0x5040, 0x230, 0x5050, 0x300,
    ];
    let python = [1 | E, 2, gap, 3 | E, 4 | E];
    assert_eq!(
        merged(&native, &python, info(true, true)),
        [
            N(0x100),
            P(1 | E),
            N(0x200),
            P(2),
            P(gap),
            P(3 | E),
            N(0x230),
            P(4 | E),
            N(0x300)
        ]
    );
    // As many interpreter frames as runs: the gap was inside one call, nothing native goes.
    let native = [0x100, 0x5010, 0x200, 0x5020, 0x230, 0x5050, 0x300];
    assert_eq!(
        merged(&native, &python, info(true, true)),
        [
            N(0x100),
            P(1 | E),
            N(0x200),
            P(2),
            P(gap),
            P(3 | E),
            N(0x230),
            P(4 | E),
            N(0x300)
        ]
    );
    // A walk cut short after the gap: the frames after it are not the outermost, so they are
    // not matched from the root; runs left over follow as for any stack.
    let cut_short = [1 | E, 2, gap, 3 | E, gap | E];
    let native = [
        0x100, 0x5010, 0x200, 0x5020, 0x210, 0x5030, 0x220, 0x5040, 0x230, 0x5050, 0x300,
    ];
    assert_eq!(
        merged(&native, &cut_short, info(true, true)),
        [
            N(0x100),
            P(1 | E),
            N(0x200),
            P(2),
            P(gap),
            P(3 | E),
            N(0x210),
            P(gap | E),
            N(0x220),
            N(0x5040),
            N(0x230),
            N(0x5050),
            N(0x300)
        ]
    );
    let native = [0x100, 0x5010, 0x200, 0x5020, 0x230, 0x5050, 0x300];
    // Fewer (a cut native stack): the runs left over follow, the marker among them.
    assert_eq!(
        merged(&native[..3], &python, info(true, true)),
        [N(0x100), P(1 | E), C, P(2), P(gap), P(3 | E), C, P(4 | E)]
    );
}

#[test]
fn untrusted_native_stacks_keep_only_the_leaf_function() {
    let python = [1, 2 | E, 3 | E];
    // In a C function called by the loop: it stays, garbage beyond it goes.
    assert_eq!(
        merged(&[0x100, 0x5010, 0x999], &python, info(false, true)),
        [N(0x100), P(1), P(2 | E), C, P(3 | E)]
    );
    // In the loop itself: only Python frames. 3.8–3.10: no markers.
    assert_eq!(
        merged(&[0x5010, 0x999], &python, info(false, false)),
        [P(1), P(2 | E), P(3 | E)]
    );
}

#[test]
fn stacks_without_python_frames_or_interpreter_keep_every_frame() {
    assert_eq!(merged(&[1, 2], &[], info(false, true)), [N(1), N(2)]);
    assert_eq!(merged(&[1, 2], &[7 | E], None), [N(1), P(7 | E)]);
}

#[test]
fn interpreter_stacks_without_python_frames_carry_their_reason() {
    let no_thread = Unread::NoThread.token();
    // Frame pointers: the outermost interpreter frame becomes the marker; the rest stays.
    let native = [0x100, 0x5010, 0x200, 0x5020, 0x300];
    for (python, unread) in [
        (&[][..], Unread::NotFound),
        (&[no_thread][..], Unread::NoThread),
        (&[Unread::WalkFailed.token()][..], Unread::WalkFailed),
        (&[Unread::NoFrame.token()][..], Unread::NoFrame),
    ] {
        assert_eq!(
            merged(&native, python, info(true, true)),
            [N(0x100), N(0x5010), N(0x200), U(unread), N(0x300)]
        );
    }
    // Without: the leaf function (not the loop), then the marker.
    assert_eq!(
        merged(&native, &[no_thread], info(false, true)),
        [N(0x100), U(Unread::NoThread)]
    );
    assert_eq!(
        merged(&native[1..], &[], info(false, false)),
        [U(Unread::NotFound)]
    );
    // Not in the loop (a C thread), or not a Python process: no marker, every frame.
    assert_eq!(
        merged(&[0x100, 0x300], &[no_thread], info(true, true)),
        [N(0x100), N(0x300)]
    );
    assert_eq!(merged(&native, &[], None), native.map(N));
    // A real one-frame stack is a frame, not a marker.
    assert_eq!(
        merged(&native, &[7 | E], info(true, true)),
        [N(0x100), P(7 | E), N(0x200), N(0x5020), N(0x300)]
    );
}

#[test]
fn no_kernel_drops_kernel_stacks() {
    let mut agg = Aggregator::new(Options {
        kernel: false,
        ..Options::default()
    });
    let mut py = Python::new(false, false);
    agg.record(&sample(&record(10, 11, &[0xffff_0010], &[0x1000])), &mut py);
    assert_eq!(
        agg.count.counts[&(10, 11, 0, EMPTY, 1, EMPTY, 0, UnwindStatus::Unchecked, 0)].samples,
        1
    );
    assert_eq!(agg.count.kernel.ids.len(), 1, "only the empty stack");
}

/// A span record with OpenTelemetry ids and the given flags and names.
fn span_record(flags: u32, otel: &[u8], osp: &[u8]) -> SpanRecord {
    let mut r = SpanRecord {
        trace_id: [1; 16],
        span_id: [2; 8],
        osp_base: [3; 16],
        osp_current: [4; 16],
        osp_parent: [5; 16],
        flags,
        otel_name_len: otel.len() as u8,
        osp_name_len: osp.len() as u8,
        thread_name_len: 0,
        _pad: 0,
        otel_name: [0; profiler_common::SPAN_NAME_MAX],
        osp_name: [0; profiler_common::SPAN_NAME_MAX],
        thread_name: [0; profiler_common::SPAN_NAME_MAX],
    };
    r.otel_name[..otel.len()].copy_from_slice(otel);
    r.osp_name[..osp.len()].copy_from_slice(osp);
    r
}

#[test]
fn span_names_come_with_their_ids_and_only_as_ascii() {
    use profiler_common::{SPAN_OSP_NAME, SPAN_OTEL_NAME};
    let both = span_context(&span_record(
        SPAN_OTEL | SPAN_OTEL_NAME | SPAN_OSP | SPAN_OSP_NAME,
        b"GET /servers/1",
        b"wsgi",
    ));
    assert_eq!(both.span_name.unwrap().as_str(), "GET /servers/1");
    assert_eq!(both.osprofiler_name.unwrap().as_str(), "wsgi");
    // Without the name flag, or without the ids' flag, no name; a zero length, none.
    let c = span_context(&span_record(SPAN_OTEL | SPAN_OSP, b"a", b"b"));
    assert_eq!((c.span_name, c.osprofiler_name), (None, None));
    let c = span_context(&span_record(SPAN_OTEL_NAME | SPAN_OSP, b"a", b""));
    assert_eq!(c.span_name, None);
    assert_eq!(c.trace_id, None);
    let c = span_context(&span_record(SPAN_OSP | SPAN_OSP_NAME, b"", b""));
    assert_eq!(c.osprofiler_name, None);
    // A byte of 0x80 or more: the str changed while it was read; dropped.
    let c = span_context(&span_record(SPAN_OTEL | SPAN_OTEL_NAME, b"caf\xe9", b""));
    assert_eq!(c.span_name, None);
    assert!(c.trace_id.is_some());
    // Names make contexts distinct.
    let a = span_context(&span_record(SPAN_OTEL | SPAN_OTEL_NAME, b"a", b""));
    let b = span_context(&span_record(SPAN_OTEL | SPAN_OTEL_NAME, b"b", b""));
    assert_ne!(a, b);
}

/// A sample record with `frames` Python frames (code addresses) and the kernel's `py_status`.
fn py_record(py_status: u32, frames: &[u64]) -> Vec<u64> {
    let mut words = record(10, 11, &[], &[0x1000]);
    for &code in frames {
        // A PyFrame: code, check, then instr and flags in one word.
        words.extend_from_slice(&[code, 0, 0]);
    }
    // SAFETY: as in `record`.
    let h = unsafe { &mut *(words.as_mut_ptr() as *mut SampleHeader) };
    h.py_status = py_status;
    h.py_len = frames.len() as _;
    words
}

#[test]
fn a_walk_that_read_nothing_is_unread_not_truncated() {
    use profiler_common::{PY_FRAME_SIZE, PY_OK, PY_READ_FAILED, PY_TRUNCATED};
    assert_eq!(PY_FRAME_SIZE, 24);
    let mut resolver = Resolver::new(&Options::default());
    let mut py = Python::new(false, false);
    let walk_failed = [Unread::WalkFailed.token()];
    for (status, frames, python, flags) in [
        // The first read faulted (a 3.11 call's C frame published before it was filled).
        (
            PY_READ_FAILED | PY_TRUNCATED,
            &[][..],
            &walk_failed[..],
            PY_FLAG_READ_FAILED,
        ),
        // Only frames naming no code object were read before the fault: nothing was read.
        (
            PY_READ_FAILED | PY_TRUNCATED,
            &[0x7000][..],
            &walk_failed[..],
            PY_FLAG_READ_FAILED,
        ),
        // Frames left but none kept.
        (PY_OK | PY_TRUNCATED, &[][..], &walk_failed[..], 0),
    ] {
        let words = py_record(status, frames);
        let r = resolver.resolve(&sample(&words), &mut py);
        assert_eq!(
            (r.python, r.python_flags),
            (python, flags),
            "{status:#x} {frames:?}"
        );
    }
    // A stack cut after frames that name code keeps them and its `[truncated]` marker: here
    // the process is unknown, so its frames are unknown too, and the cut is said only when
    // the walk did not fault.
    let words = py_record(PY_OK | PY_TRUNCATED, &[0x7000]);
    let r = resolver.resolve(&sample(&words), &mut py);
    assert_eq!(r.python.len(), 2);
    assert_eq!(r.python_flags, PY_WITH_FRAMES | PY_FLAG_TRUNCATED);
}

/// A record that carries only a thread's name is no span context.
#[test]
fn a_thread_name_alone_is_no_span() {
    let mut r = span_record(profiler_common::SPAN_THREAD_NAME, b"", b"");
    r.thread_name[..5].copy_from_slice(b"req-1");
    r.thread_name_len = 5;
    assert_eq!(r.thread_name(), Some(&b"req-1"[..]));
    assert!(!r.has_context());
    assert!(crate::resolve::span_context(&r).is_empty());
}
