use super::sections::{hdr_points_at, scan};
use super::*;

#[test]
fn exec_mappings_keeps_executable_lines_with_their_paths() {
    let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234 /usr/bin/my prog\n\
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:01 1234 /usr/bin/my prog\n\
7ffd1e9f0000-7ffd1e9f2000 r-xp 00000000 00:00 0                          [vdso]\n\
7f0000000000-7f0000001000 rwxp 00000000 00:00 0 \n";
    let maps = exec_mappings(text);
    assert_eq!(maps.len(), 3);
    assert_eq!(maps[0].path, "/usr/bin/my prog");
    assert_eq!(
        (maps[0].start, maps[0].end, maps[0].offset),
        (0x55d0c0a01000, 0x55d0c0a02000, 0x1000)
    );
    assert_eq!(maps[1].path, "[vdso]");
    assert_eq!(maps[2].path, "");
}

/// A CIE, then an FDE, one of them (`in_cie`) setting the CFA to the expression
/// `DW_OP_skip target` (no compiler writes a backward one, which would loop), then the
/// terminator. The FDE is at offset 24.
fn eh_frame_with_skip(target: i16, in_cie: bool) -> Vec<u8> {
    let t = target.to_le_bytes();
    let expression = [0x0f, 3, 0x2f, t[0], t[1]];
    let mut v = Vec::new();
    // CIE: id 0, version 1, "zR", code align 1, data align -8, RA r16, augmentation data:
    // pcrel sdata4; then the CFA rule (the expression, or r7+8), r16 at cfa-8, nops.
    let mut cie = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b];
    if in_cie {
        cie.extend_from_slice(&expression);
    } else {
        cie.extend_from_slice(&[0x0c, 7, 8]);
    }
    cie.extend_from_slice(&[0x90, 1]);
    cie.resize(20, 0);
    v.extend_from_slice(&20u32.to_le_bytes());
    v.extend_from_slice(&cie);
    // FDE: CIE pointer (back to offset 0 from offset 28), pc_begin, pc_range, no
    // augmentation data, the expression unless the CIE has it, nops.
    let mut fde = Vec::new();
    fde.extend_from_slice(&28u32.to_le_bytes());
    fde.extend_from_slice(&0x100i32.to_le_bytes());
    fde.extend_from_slice(&0x10u32.to_le_bytes());
    fde.push(0);
    if !in_cie {
        fde.extend_from_slice(&expression);
    }
    fde.resize(fde.len().next_multiple_of(4), 0);
    v.extend_from_slice(&(fde.len() as u32).to_le_bytes());
    v.extend_from_slice(&fde);
    v.extend_from_slice(&0u32.to_le_bytes());
    v
}

#[test]
fn tables_with_a_backward_branch_are_rejected() {
    let eh = |v: &[u8]| scan(gimli::EhFrame::new(v, gimli::LittleEndian), 0x1000);
    for in_cie in [false, true] {
        assert_eq!(
            eh(&eh_frame_with_skip(-3, in_cie)),
            None,
            "in CIE: {in_cie}"
        );
        assert_eq!(
            eh(&eh_frame_with_skip(0, in_cie)),
            Some(vec![24]),
            "in CIE: {in_cie}"
        );
    }
    // Garbage is refused too.
    assert_eq!(eh(&[0xffu8; 64]), None);
}

/// An `.eh_frame_hdr` at 0x2000 for an `.eh_frame` at 0x1000 whose one table row points at
/// `fde` (an offset in the `.eh_frame`).
fn eh_frame_hdr(fde: i32) -> Vec<u8> {
    let mut v = vec![1, 0x1b, 0x03, 0x3b];
    // eh_frame_ptr, pc-relative from its own address (0x2004).
    v.extend_from_slice(&(0x1000i32 - 0x2004).to_le_bytes());
    v.extend_from_slice(&1u32.to_le_bytes());
    // (initial location, FDE address), relative to the header's start.
    v.extend_from_slice(&(0x100i32 - 0x2000).to_le_bytes());
    v.extend_from_slice(&(0x1000 + fde - 0x2000).to_le_bytes());
    v
}

#[test]
fn a_header_pointing_past_the_fdes_checked_is_not_used() {
    assert!(hdr_points_at(&eh_frame_hdr(24), 0x2000, 0x1000, &[24]));
    assert!(!hdr_points_at(&eh_frame_hdr(8), 0x2000, 0x1000, &[24]));
    assert!(!hdr_points_at(&[0xff; 8], 0x2000, 0x1000, &[24]));
}

#[test]
fn labels_name_every_status_once() {
    let all = [
        UnwindStatus::Complete,
        UnwindStatus::Unchecked,
        UnwindStatus::Truncated(TruncatedBy::StackCopy),
        UnwindStatus::Failed(FailedBy::OutsideStack),
    ];
    for s in all {
        assert_eq!(UnwindStatus::from_label(s.kind(), s.reason()), Some(s));
    }
    assert_eq!(UnwindStatus::from_label("complete", Some("x")), None);
}

/// This test process's own stack, copied as the kernel would, unwinds to the root with
/// the unwind tables of the test binary and libc.
#[test]
fn unwinds_this_threads_own_stack_to_the_root() {
    let (n, status, names) = own_stack();
    assert_eq!(status, UnwindStatus::Complete, "{n} frames");
    assert!(n >= 5, "only {n} frames");
    assert!(names > 0);
}

/// A process that exited keeps the modules read while it lived until the second sweep
/// after, and then the unwind tables of its module files go.
#[test]
fn an_exited_process_keeps_its_modules_until_the_second_sweep() {
    let mut child = crate::test_child::sleeping();
    let pid = child.id();
    let mut unwinders = Unwinders::new();
    unwinders.refresh(pid);
    let known = unwinders.procs[&pid].known.len();
    assert!(known >= 2, "{known} mappings");
    assert!(unwinders.table_files() >= 2);
    assert!(unwinders.table_bytes() > 0);
    child.kill().unwrap();
    child.wait().unwrap();
    // Gone: what was read stays (a zombie's empty map too).
    unwinders.next_drain();
    assert!(!unwinders.refresh(pid));
    let p = &unwinders.procs[&pid];
    assert!(!p.gone);
    assert_eq!(p.known.len(), known);
    unwinders.sweep();
    assert!(unwinders.procs.contains_key(&pid));
    assert!(unwinders.table_files() >= 2, "still held");
    unwinders.sweep();
    assert!(!unwinders.procs.contains_key(&pid));
    assert_eq!((unwinders.table_files(), unwinders.table_bytes()), (0, 0));
    assert!(unwinders.files.is_empty());
}

#[inline(never)]
fn own_stack() -> (usize, UnwindStatus, usize) {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers, touches no memory.
    unsafe {
        std::arch::asm!("lea {ip}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp",
                ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp);
    }
    // The test thread's stack, from sp up to its end (the maps say where).
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let end = maps
        .lines()
        .filter_map(|l| {
            let (s, e) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            ))
        })
        .find(|&(s, e)| s <= sp && sp < e)
        .unwrap()
        .1;
    let len = ((end - sp) as usize).min(256 << 10);
    let mut bytes = vec![0u8; len];
    LiveMemory::new(std::process::id())
        .read(sp, &mut bytes)
        .unwrap();
    let mut unwinders = Unwinders::new();
    let mut out = [0u64; 256];
    let copy = StackCopy {
        ip,
        sp,
        bp,
        bytes: &bytes,
        reached_top: (end - sp) as usize == len,
    };
    let (n, status) = unwinders.unwind(std::process::id(), &copy, &mut out);
    (n, status, unwinders.stats().modules_read as usize)
}
