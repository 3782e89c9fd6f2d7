//! The cold part of CPython's interpreter loop in a stripped build.
//!
//! GCC splits a function compiled with profile feedback into a hot part (the symbol) and a
//! cold part (`_PyEval_EvalFrameDefault.cold`, a local symbol that stripping removes). Debian's
//! PGO builds of 3.13–3.15 run much of the loop in the cold part (sid's 3.14.10: a hot part of
//! 1,184 bytes), so a native stack's interpreter frame is often there, and without its range
//! the Python frames cannot be put in place of it.
//!
//! Without a symbol, the cold part is the unwind-table entry (FDE) that the hot part branches
//! into, within its own section (not the PLT), and that starts inside a frame: a function's
//! own code starts with the return address just pushed (CFA = `rsp` + 8), the split-off part
//! with the whole frame of the function set up (sid's 3.15: CFA = `rbp` + 16). The hot part is decoded instruction by instruction (iced-x86) from its symbol's start, so
//! only real branch targets count; a tail call lands on a function's start (CFA = `rsp` + 8)
//! and is not taken for a cold part.

use gimli::{CfaRule, CieOrFde, UnwindSection, X86_64};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};
use object::{Object, ObjectSection};

/// The longest hot part decoded.
const MAX_HOT: u64 = 1 << 20;

/// `[start, end)` (link-time addresses) of the cold part of the function whose hot part is
/// `hot` (`[start, end)`), in the ELF image `data`; `None` when no such part is found.
pub fn cold_part<'a, R: object::ReadRef<'a>>(data: R, hot: (u64, u64)) -> Option<(u64, u64)> {
    let elf = object::File::parse(data).ok()?;
    let (start, end) = hot;
    if end <= start || end - start > MAX_HOT {
        return None;
    }
    // The hot part's bytes, from the section that holds it.
    let text = elf
        .sections()
        .find(|s| s.address() <= start && end <= s.address().saturating_add(s.size()))?;
    let bytes = text.data().ok()?;
    let from = usize::try_from(start - text.address()).ok()?;
    let code = bytes.get(from..from + usize::try_from(end - start).ok()?)?;

    let mut targets = Vec::new();
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut ins);
        if ins.is_invalid() {
            return None;
        }
        if matches!(
            ins.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
        ) && ins.is_jmp_short_or_near() | ins.is_jcc_short_or_near()
        {
            let t = ins.near_branch_target();
            if !(start..end).contains(&t) {
                targets.push(t);
            }
        }
    }
    if targets.is_empty() {
        return None;
    }

    let eh = elf.section_by_name(".eh_frame")?;
    let eh_data = eh.data().ok()?;
    let eh_frame = gimli::EhFrame::new(eh_data, gimli::LittleEndian);
    let bases = gimli::BaseAddresses::default()
        .set_eh_frame(eh.address())
        .set_text(text.address());
    targets.sort_unstable();
    targets.dedup();
    // Only the hot part's own section: a jump to the PLT (whose FDE starts at CFA = rsp + 16)
    // is a tail call, not a split-off part.
    let section = (text.address(), text.address().saturating_add(text.size()));
    let mut ctx = gimli::UnwindContext::new();
    let mut found: Option<(u64, u64)> = None;
    let mut entries = eh_frame.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
            continue;
        };
        let (s, e) = (
            fde.initial_address(),
            fde.initial_address().saturating_add(fde.len()),
        );
        let first = targets.partition_point(|&t| t < s);
        if targets.get(first).is_none_or(|&t| t >= e)
            || (s..e).contains(&start)
            || s < section.0
            || e > section.1
        {
            continue;
        }
        let Ok(mut rows) = fde.rows(&eh_frame, &bases, &mut ctx) else {
            continue;
        };
        let Ok(Some(row)) = rows.next_row() else {
            continue;
        };
        // The whole frame of the function set up: the CFA is not rsp plus the return address
        // alone (sid's 3.15: rbp + 16, its frame pointer).
        let mid_frame = !matches!(
            row.cfa(),
            CfaRule::RegisterAndOffset { register, offset: 8 } if *register == X86_64::RSP
        );
        if mid_frame {
            if found.is_some_and(|f| f != (s, e)) {
                // Two candidates: not the one split-off part expected.
                return None;
            }
            found = Some((s, e));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_empty_ranges_find_nothing() {
        assert_eq!(cold_part(&b"not an elf"[..], (0x1000, 0x2000)), None);
        let exe = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(cold_part(&exe[..], (0x2000, 0x1000)), None);
        assert_eq!(cold_part(&exe[..], (0, 1 << 40)), None);
    }
}
