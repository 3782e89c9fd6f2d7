//! The unwind sections of one module (`.eh_frame`, `.eh_frame_hdr`, `.debug_frame`, its
//! PT_LOAD segments and entry point), read from its ELF file or image, with the tables whose
//! expressions could loop rejected.

use std::sync::Arc;

use framehop::{ExplicitModuleSectionInfo, Module};
use object::{Object, ObjectSection, ObjectSegment};

/// Most bytes of one unwind section read from a module file (libpython's `.eh_frame` is about
/// 300 KiB; a larger one is no genuine module's).
const MAX_UNWIND_SECTION: u64 = 64 << 20;

/// A PT_LOAD segment: (p_offset, p_vaddr, p_filesz, executable).
type Load = (u64, u64, u64, bool);

/// Unwind sections of one module file, shared by every process that maps it.
#[derive(Debug)]
pub(super) struct Sections {
    /// Every PT_LOAD, to find a mapping's load bias.
    loads: Vec<Load>,
    /// The lowest PT_LOAD address, page-aligned: framehop's addresses are relative to it, in
    /// 32 bits.
    base: u64,
    text: Option<std::ops::Range<u64>>,
    eh_frame: Option<(std::ops::Range<u64>, Arc<[u8]>)>,
    eh_frame_hdr: Option<(std::ops::Range<u64>, Arc<[u8]>)>,
    debug_frame: Option<Arc<[u8]>>,
    got: Option<std::ops::Range<u64>>,
    /// The ELF entry point (`_start`), 0 for none.
    pub(super) entry: u64,
    /// The unwind tables hold an expression that can loop (a backward branch), which framehop
    /// would evaluate without a bound: they were dropped, and the module is unwound by frame
    /// pointer.
    pub(super) rejected: bool,
}

impl Sections {
    pub(super) fn from_object<'d, O: Object<'d>>(obj: &O) -> Sections {
        let range = |s: &O::Section<'_>| Some(s.address()..s.address().checked_add(s.size())?);
        let section = |name: &str| {
            let s = obj.section_by_name(name)?;
            // NB: checked before reading: object's ReadCache allocates the size it is asked.
            if s.size() > MAX_UNWIND_SECTION {
                return None;
            }
            let data = s.uncompressed_data().ok()?;
            if data.len() as u64 > MAX_UNWIND_SECTION {
                return None;
            }
            Some((range(&s)?, Arc::<[u8]>::from(&*data)))
        };
        let range_of = |name: &str| obj.section_by_name(name).and_then(|s| range(&s));
        let loads: Vec<Load> = obj
            .segments()
            .map(|seg| {
                let (off, size) = seg.file_range();
                let exec = matches!(seg.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
                (off, seg.address(), size, exec)
            })
            .collect();
        let mut eh_frame = section(".eh_frame");
        let mut eh_frame_hdr = section(".eh_frame_hdr");
        // framehop reads .debug_frame only for a module without .eh_frame.
        let mut debug_frame = if eh_frame.is_none() {
            section(".debug_frame").map(|(_, d)| d)
        } else {
            None
        };
        let mut rejected = false;
        if let Some((r, d)) = &eh_frame {
            match scan(gimli::EhFrame::new(d, gimli::LittleEndian), r.start) {
                None => rejected = true,
                // framehop finds FDEs through the header's table when there is one: it must
                // point only at FDEs the scan checked, else framehop indexes them itself.
                Some(fdes) => {
                    if eh_frame_hdr
                        .as_ref()
                        .is_some_and(|(hr, hd)| !hdr_points_at(hd, hr.start, r.start, &fdes))
                    {
                        eh_frame_hdr = None;
                    }
                }
            }
        }
        if let Some(d) = &debug_frame {
            rejected |= scan(gimli::DebugFrame::new(d, gimli::LittleEndian), 0).is_none();
        }
        if rejected {
            eh_frame = None;
            eh_frame_hdr = None;
            debug_frame = None;
        }
        Sections {
            base: loads.iter().map(|l| l.1).min().unwrap_or(0) & !0xfff,
            loads,
            text: range_of(".text"),
            eh_frame,
            eh_frame_hdr,
            debug_frame,
            got: range_of(".got"),
            entry: obj.entry(),
            rejected,
        }
    }

    /// The bytes of its unwind sections (copied out of the file).
    pub(super) fn bytes(&self) -> u64 {
        let len =
            |d: &Option<(std::ops::Range<u64>, Arc<[u8]>)>| d.as_ref().map_or(0, |(_, d)| d.len());
        (len(&self.eh_frame)
            + len(&self.eh_frame_hdr)
            + self.debug_frame.as_ref().map_or(0, |d| d.len())) as u64
    }

    pub(super) fn has_tables(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some()
    }

    pub(super) fn module(
        &self,
        name: String,
        avma: std::ops::Range<u64>,
        bias: u64,
    ) -> Module<Arc<[u8]>> {
        let info = ExplicitModuleSectionInfo {
            base_svma: self.base,
            text_svma: self.text.clone(),
            got_svma: self.got.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|(r, _)| r.clone()),
            eh_frame: self.eh_frame.as_ref().map(|(_, d)| d.clone()),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
            debug_frame: self.debug_frame.clone(),
            ..Default::default()
        };
        // NB: framehop takes an address relative to the module base in 32 bits, so the base is
        // the module's lowest address, not 0 (prelinked and high-linked modules).
        Module::new(name, avma, self.base.wrapping_add(bias), info)
    }

    /// The load bias of a mapping of file offset `offset` at `start`.
    pub(super) fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        let page = |x: u64| x & !0xfff;
        // NB: of the segments whose pages cover the offset, an executable one (this is an
        // executable mapping), then the last: with lld's layout the code segment starts in the
        // same page as the end of the read-only one.
        let &(p_offset, p_vaddr, _, _) = self
            .loads
            .iter()
            .filter(|&&(off, _, size, _)| {
                page(off) <= offset && offset < off.saturating_add(size.max(1))
            })
            .max_by_key(|&&(off, _, _, exec)| (exec, off))?;
        let vaddr = page(p_vaddr).wrapping_add(offset - page(p_offset));
        Some(start.wrapping_sub(vaddr))
    }
}

/// Checks every DWARF expression of the unwind tables, the FDEs' and their CIEs' initial
/// instructions: framehop evaluates expressions (PLT entries use one for the CFA) without an
/// iteration limit, so one that branches backwards, which no compiler emits, could hang the
/// unwinder. `None`: such an expression, or a malformed table; else the offsets of the FDEs
/// checked, sorted.
pub(super) fn scan<'a, S>(section: S, svma: u64) -> Option<Vec<usize>>
where
    S: gimli::UnwindSection<gimli::EndianSlice<'a, gimli::LittleEndian>>,
{
    use gimli::{CallFrameInstruction as I, CieOrFde, Operation};
    let encoding = gimli::Encoding {
        address_size: 8,
        format: gimli::Format::Dwarf32,
        version: 4,
    };
    let bases = gimli::BaseAddresses::default().set_eh_frame(svma);
    let expression_loops = |e: &gimli::UnwindExpression<usize>| -> bool {
        let Ok(expr) = e.get(&section) else {
            return true;
        };
        let mut ops = expr.0;
        while !ops.is_empty() {
            match Operation::parse(&mut ops, encoding) {
                Ok(Operation::Skip { target } | Operation::Bra { target }) if target < 0 => {
                    return true
                }
                Ok(_) => {}
                Err(_) => return true,
            }
        }
        false
    };
    let loops = |mut ins: gimli::CallFrameInstructionIter<'_, _>| -> bool {
        loop {
            match ins.next() {
                Ok(None) => return false,
                Err(_) => return true,
                Ok(Some(
                    I::DefCfaExpression { expression }
                    | I::Expression { expression, .. }
                    | I::ValExpression { expression, .. },
                )) => {
                    if expression_loops(&expression) {
                        return true;
                    }
                }
                Ok(Some(_)) => {}
            }
        }
    };
    let mut fdes = Vec::new();
    // CIEs checked, by offset: an FDE's CIE may be anywhere (even where the walk does not go).
    let mut cies = rustc_hash::FxHashSet::default();
    let mut entries = section.entries(&bases);
    loop {
        match entries.next() {
            Ok(None) => break,
            Err(_) => return None,
            Ok(Some(CieOrFde::Cie(cie))) => {
                if cies.insert(cie.offset()) && loops(cie.instructions(&section, &bases)) {
                    return None;
                }
            }
            Ok(Some(CieOrFde::Fde(partial))) => {
                let offset = partial.offset();
                let fde = partial.parse(|s, b, o| s.cie_from_offset(b, o)).ok()?;
                let cie = fde.cie();
                if cies.insert(cie.offset()) && loops(cie.instructions(&section, &bases)) {
                    return None;
                }
                if loops(fde.instructions(&section, &bases)) {
                    return None;
                }
                fdes.push(offset);
            }
        }
    }
    fdes.sort_unstable();
    Some(fdes)
}

/// Whether every entry of an `.eh_frame_hdr` search table points at one of `fdes` (offsets in
/// the `.eh_frame` at `eh_svma`).
pub(super) fn hdr_points_at(hdr: &[u8], hdr_svma: u64, eh_svma: u64, fdes: &[usize]) -> bool {
    let bases = gimli::BaseAddresses::default()
        .set_eh_frame_hdr(hdr_svma)
        .set_eh_frame(eh_svma);
    let Ok(parsed) = gimli::EhFrameHdr::new(hdr, gimli::LittleEndian).parse(&bases, 8) else {
        return false;
    };
    let Some(table) = parsed.table() else {
        // No table: framehop indexes the FDEs with the same walk as the scan.
        return true;
    };
    let mut rows = table.iter(&bases);
    loop {
        match rows.next() {
            Ok(None) => return true,
            Ok(Some((_, gimli::Pointer::Direct(addr)))) => {
                let ok = addr
                    .checked_sub(eh_svma)
                    .and_then(|o| usize::try_from(o).ok())
                    .is_some_and(|o| fdes.binary_search(&o).is_ok());
                if !ok {
                    return false;
                }
            }
            _ => return false,
        }
    }
}
