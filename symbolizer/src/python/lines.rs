//! Line numbers from a code object's line table and a frame's instruction offset.
//!
//! Three formats exist across 3.8–3.15; each decoder below follows the CPython function that
//! answers the same question (`PyCode_Addr2Line` of that version, Objects/codeobject.c), and
//! takes the instruction offset in bytes, as [`super::walk::Frame::instr_offset`] gives it:
//!
//! - 3.8–3.9, `co_lnotab` ([`LineTableFormat::Lnotab`]): byte pairs (address increment,
//!   line increment), the line increment a signed byte since 3.8; addresses in bytes.
//! - 3.10, `co_linetable` ([`LineTableFormat::Pep626`], Objects/lnotab_notes.txt of 3.10):
//!   byte pairs (unsigned address delta in bytes, signed line delta), a line delta of -128
//!   meaning "no line"; entries of zero width only carry line deltas.
//! - 3.11–3.15, `co_linetable` ([`LineTableFormat::Locations`], Objects/locations.md): entries
//!   whose first byte has bit 7 set, the kind in bits 3–6 and (length − 1) in code units in
//!   bits 0–2, followed by varints. Only the line delta is decoded; columns are skipped.
//!
//! Every decoder makes progress on each step and stops at the end of the table, so a corrupted
//! table gives a wrong line or `None`, never a panic or a hang.

/// Longest line table read from a process. Real tables are far smaller (a few bytes per
/// line); a longer one is read up to this size (see [`line_for_prefix`]).
pub const MAX_LINE_TABLE: usize = 64 * 1024;

/// How a version encodes its line table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineTableFormat {
    /// 3.8–3.9 `co_lnotab`.
    Lnotab,
    /// 3.10 `co_linetable` (PEP 626 pairs).
    Pep626,
    /// 3.11+ `co_linetable` (location table).
    Locations,
}

impl LineTableFormat {
    /// The format of CPython 3.`minor`, for the supported 3.8–3.15.
    pub fn for_minor(minor: u8) -> Option<Self> {
        match minor {
            8 | 9 => Some(Self::Lnotab),
            10 => Some(Self::Pep626),
            // NB: InternalDocs/code_objects.md of 3.14 and 3.15 describe the 3.11 format.
            11..=15 => Some(Self::Locations),
            _ => None,
        }
    }
}

/// The line of the instruction at `instr_offset` (bytes) in a code object whose
/// `co_firstlineno` is `first_line` and whose line table is `table`; `None` when the
/// instruction is outside the table (3.10+) or the version is unsupported.
///
/// An instruction the table gives no line (3.10+) is on `first_line`, the `def` line, only
/// when no entry with a line precedes it in the table: a closure's prologue (`COPY_FREE_VARS`
/// and `MAKE_CELL` before its `RESUME`, 3.11–3.13), where the frame is in that function before
/// its first line, as a plain function's `RESUME` is. A no-line range after a located one
/// (compiler-made exception or `with` cleanup code) has no known line: `None`, never the
/// `def` line.
pub fn line_for(
    version_minor: u8,
    first_line: u32,
    table: &[u8],
    instr_offset: u32,
) -> Option<u32> {
    let format = LineTableFormat::for_minor(version_minor)?;
    line_for_format(format, first_line, table, instr_offset)
}

/// [`line_for`] with the format given directly.
pub fn line_for_format(
    format: LineTableFormat,
    first_line: u32,
    table: &[u8],
    instr_offset: u32,
) -> Option<u32> {
    let first = i64::from(first_line);
    let offset = i64::from(instr_offset);
    let line = match format {
        LineTableFormat::Lnotab => lnotab(first, table, offset),
        LineTableFormat::Pep626 => pep626(first, table, offset)?.line(first)?,
        LineTableFormat::Locations => locations(first, table, offset)?.line(first)?,
    };
    u32::try_from(line).ok()
}

/// [`line_for_format`] on a table of which only a prefix could be read (`complete` false):
/// an offset past what the prefix covers has no known line. (3.10+ decoders already answer
/// `None` there; `co_lnotab` would answer the last line seen.)
pub fn line_for_prefix(
    format: LineTableFormat,
    first_line: u32,
    table: &[u8],
    complete: bool,
    instr_offset: u32,
) -> Option<u32> {
    if !complete && format == LineTableFormat::Lnotab {
        let covered: u64 = table.chunks_exact(2).map(|p| u64::from(p[0])).sum();
        if u64::from(instr_offset) >= covered {
            return None;
        }
    }
    line_for_format(format, first_line, table, instr_offset)
}

/// What a 3.10+ table says of the range holding an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Located {
    /// The range's line.
    Line(i64),
    /// A range without a line that no entry with a line precedes: the prologue.
    Prologue,
    /// A range without a line after a located one (cleanup code).
    NoLine,
}

impl Located {
    /// The line: `first_line` in the prologue, `None` for other no-line ranges.
    fn line(self, first_line: i64) -> Option<i64> {
        match self {
            Self::Line(line) => Some(line),
            Self::Prologue => Some(first_line),
            Self::NoLine => None,
        }
    }
}

/// 3.8–3.9 `PyCode_Addr2Line`: add line increments while the running address stays at or
/// below the instruction's.
fn lnotab(first_line: i64, table: &[u8], offset: i64) -> i64 {
    let mut line = first_line;
    let mut addr = 0i64;
    for pair in table.chunks_exact(2) {
        addr += i64::from(pair[0]);
        if addr > offset {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    line
}

/// 3.10 `_PyCode_CheckLineNumber` scanning forward from the start: the range
/// `[start, end)` holding the offset gives its line; -128 marks a range without one
/// ([`Located::Prologue`] or [`Located::NoLine`]); `None` when no range holds it.
fn pep626(first_line: i64, table: &[u8], offset: i64) -> Option<Located> {
    let mut computed = first_line;
    let mut end = 0i64;
    let mut located_before = false;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += i64::from(pair[0]);
        let delta = pair[1] as i8;
        let line = if delta == -128 {
            None
        } else {
            computed += i64::from(delta);
            Some(computed)
        };
        // Zero-width entries only move `computed` (long line jumps are split that way).
        if start <= offset && offset < end {
            return Some(located(line, located_before));
        }
        located_before |= line.is_some();
    }
    None
}

/// 3.11+ `_PyCode_CheckLineNumber` over the location table, scanning forward: as
/// [`pep626`], an entry of kind NONE (15) having no line.
fn locations(first_line: i64, table: &[u8], offset: i64) -> Option<Located> {
    let mut computed = first_line;
    let mut end = 0i64;
    let mut located_before = false;
    let mut i = 0usize;
    while i < table.len() {
        let head = table[i];
        if head & 0x80 == 0 {
            // Not an entry start: corrupted, or the reader lost its place. CPython asserts
            // here; skip to the next entry start as its `advance` does.
            i += 1;
            continue;
        }
        let kind = (head >> 3) & 15;
        let start = end;
        end += (i64::from(head & 7) + 1) * 2;
        let line_delta = match kind {
            // PY_CODE_LOCATION_INFO_NO_COLUMNS, PY_CODE_LOCATION_INFO_LONG: a signed varint.
            13 | 14 => svarint(&table[i + 1..]),
            // PY_CODE_LOCATION_INFO_ONE_LINE1, _ONE_LINE2.
            11 => 1,
            12 => 2,
            // Short forms 0–9, ONE_LINE0, and NONE (15) keep the line.
            _ => 0,
        };
        computed += line_delta;
        let line = (kind != 15).then_some(computed);
        if start <= offset && offset < end {
            return Some(located(line, located_before));
        }
        located_before |= line.is_some();
        // The next entry starts at the next byte with bit 7 set.
        i += 1;
        while i < table.len() && table[i] & 0x80 == 0 {
            i += 1;
        }
    }
    None
}

/// A range's line, or which kind of no-line range it is.
fn located(line: Option<i64>, located_before: bool) -> Located {
    match line {
        Some(line) => Located::Line(line),
        None if located_before => Located::NoLine,
        None => Located::Prologue,
    }
}

/// A location-table varint: 6 bits per byte, least significant first, bit 6 set when more
/// bytes follow. Stops at the end of `bytes` and ignores bits past 32.
fn varint(bytes: &[u8]) -> u32 {
    let mut val = 0u32;
    let mut shift = 0u32;
    for &b in bytes {
        if shift < 32 {
            val |= u32::from(b & 63) << shift;
        }
        if b & 64 == 0 {
            break;
        }
        shift = shift.saturating_add(6);
    }
    val
}

/// A location-table signed varint: the varint's bit 0 is the sign, the rest the magnitude.
fn svarint(bytes: &[u8]) -> i64 {
    let u = varint(bytes);
    let magnitude = i64::from(u >> 1);
    if u & 1 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A location-table entry head byte.
    fn head(kind: u8, units: u8) -> u8 {
        assert!((1..=8).contains(&units));
        0x80 | (kind << 3) | (units - 1)
    }

    /// Encodes a signed varint the way CPython's compiler does.
    fn sv(v: i32) -> Vec<u8> {
        let mut u = if v < 0 {
            ((-v as u32) << 1) | 1
        } else {
            (v as u32) << 1
        };
        let mut out = Vec::new();
        while u >= 64 {
            out.push(64 | (u & 63) as u8);
            u >>= 6;
        }
        out.push(u as u8);
        out
    }

    #[test]
    fn formats_per_version() {
        assert_eq!(LineTableFormat::for_minor(7), None);
        assert_eq!(LineTableFormat::for_minor(8), Some(LineTableFormat::Lnotab));
        assert_eq!(LineTableFormat::for_minor(9), Some(LineTableFormat::Lnotab));
        assert_eq!(
            LineTableFormat::for_minor(10),
            Some(LineTableFormat::Pep626)
        );
        for minor in 11..=15 {
            assert_eq!(
                LineTableFormat::for_minor(minor),
                Some(LineTableFormat::Locations)
            );
        }
        assert_eq!(LineTableFormat::for_minor(16), None);
        assert_eq!(line_for(16, 1, &[], 0), None);
    }

    #[test]
    fn lnotab_pairs() {
        // first line 10: bytes [0,6) → 10, [6,10) → 12, [10,14) → 11 (a negative increment),
        // then at 14 a jump of 300 split as 0 + 127 + 127 (zero address increments) + 46.
        let table = [6, 2, 4, 0xff, 4, 0, 0, 127, 0, 127, 4, 46];
        let at = |o| line_for(8, 10, &table, o);
        assert_eq!(at(0), Some(10));
        assert_eq!(at(4), Some(10));
        assert_eq!(at(6), Some(12));
        assert_eq!(at(8), Some(12));
        assert_eq!(at(10), Some(11));
        assert_eq!(at(12), Some(11));
        // The zero-increment pairs already apply at their address: 11 + 127 + 127.
        assert_eq!(at(14), Some(265));
        assert_eq!(line_for(9, 10, &table, 16), Some(265));
        assert_eq!(at(18), Some(311));
        // Past the table: the last line (CPython does the same).
        assert_eq!(at(1000), Some(311));
        // An empty table: every instruction is on the first line.
        assert_eq!(line_for(9, 7, &[], 40), Some(7));
        // Complete tables answer as line_for; a cut one does not guess past its end.
        let f = LineTableFormat::Lnotab;
        assert_eq!(line_for_prefix(f, 10, &table, true, 1000), Some(311));
        assert_eq!(line_for_prefix(f, 10, &table, false, 1000), None);
        assert_eq!(line_for_prefix(f, 10, &table, false, 18), None);
        assert_eq!(line_for_prefix(f, 10, &table, false, 12), Some(11));
    }

    #[test]
    fn pep626_pairs() {
        // first line 20: [0,4) → 21, [4,8) no line (after a located range: none), [8,12) → 19,
        // then a zero-width +127 and [12,16) → 19 + 127 + 100 = 246.
        let table = [4, 1, 4, 0x80, 4, 0xfe, 0, 127, 4, 100];
        let at = |o| line_for(10, 20, &table, o);
        assert_eq!(at(0), Some(21));
        assert_eq!(at(2), Some(21));
        assert_eq!(at(4), None);
        assert_eq!(at(6), None);
        assert_eq!(at(8), Some(19));
        assert_eq!(at(10), Some(19));
        assert_eq!(at(12), Some(246));
        assert_eq!(at(14), Some(246));
        // Past the table: no line, as `_PyCode_CheckLineNumber` answers -1.
        assert_eq!(at(16), None);
        assert_eq!(line_for(10, 5, &[], 0), None);
        // A "no line" entry does not change the running line.
        let table = [2, 3, 2, 0x80, 2, 0];
        assert_eq!(line_for(10, 1, &table, 4), Some(4));
    }

    #[test]
    fn location_entries() {
        let mut t = Vec::new();
        // [0,2) short form 0 (one column byte): first line 100.
        t.extend([head(0, 1), 0x05]);
        // [2,6) one-line form +1 (two column bytes): 101.
        t.extend([head(11, 2), 3, 9]);
        // [6,8) one-line form +2: 103.
        t.extend([head(12, 1), 0, 4]);
        // [8,10) no location, after located entries (cleanup code): no line.
        t.push(head(15, 1));
        // [10,16) no columns, -5: 98.
        t.push(head(13, 3));
        t.extend(sv(-5));
        // [16,18) long form +300 (a two-byte varint), end line delta, columns: 398.
        t.push(head(14, 1));
        t.extend(sv(300));
        t.extend([sv(0)[0], 1, 2]);
        // [18,20) one-line form 0 with column bytes that have bit 6 set: still 398.
        t.extend([head(10, 1), 0x7f, 0x7f]);
        // [20,52): two entries of eight code units each, short forms: 398.
        t.extend([head(9, 8), 0x40, head(3, 8), 0x01]);
        let at = |o| line_for(11, 100, &t, o);
        assert_eq!(at(0), Some(100));
        assert_eq!(at(2), Some(101));
        assert_eq!(at(4), Some(101));
        assert_eq!(at(6), Some(103));
        assert_eq!(at(8), None);
        assert_eq!(at(10), Some(98));
        assert_eq!(at(14), Some(98));
        assert_eq!(at(16), Some(398));
        assert_eq!(at(18), Some(398));
        assert_eq!(at(20), Some(398));
        assert_eq!(at(35), Some(398));
        assert_eq!(at(36), Some(398));
        assert_eq!(at(50), Some(398));
        assert_eq!(at(52), None);
        for minor in [12, 13] {
            assert_eq!(line_for(minor, 100, &t, 10), Some(98));
        }
        assert_eq!(line_for(13, 1, &[], 0), None);
    }

    /// A closure's table as CPython 3.11–3.13 compile `def pred(x):` on line 19 with a cell
    /// and a free variable: COPY_FREE_VARS and MAKE_CELL without a location, RESUME on the
    /// `def` line, the body from line 20. A frame not yet past its prologue (3.11/3.12 point
    /// before the first instruction: offset 0) is on the `def` line, never on none.
    #[test]
    fn closure_prologue_without_location_is_on_the_def_line() {
        let mut t = Vec::new();
        // [0,4) COPY_FREE_VARS, MAKE_CELL: kind NONE, two code units.
        t.push(head(15, 2));
        // [4,6) RESUME: ONE_LINE0 with two column bytes, line 19.
        t.extend([head(10, 1), 0, 0]);
        // [6,10) line 20: ONE_LINE1.
        t.extend([head(11, 2), 15, 16]);
        for minor in [11, 12, 13] {
            let at = |o| line_for(minor, 19, &t, o);
            assert_eq!(at(0), Some(19), "3.{minor}");
            assert_eq!(at(2), Some(19), "3.{minor}");
            assert_eq!(at(4), Some(19), "3.{minor}");
            assert_eq!(at(6), Some(20), "3.{minor}");
            assert_eq!(at(10), None, "3.{minor}: past the table");
        }
        // 3.10 closures: a no-line pair first.
        let t = [4, 0x80, 2, 0, 4, 1];
        assert_eq!(line_for(10, 19, &t, 0), Some(19));
        assert_eq!(line_for(10, 19, &t, 4), Some(19));
        assert_eq!(line_for(10, 19, &t, 6), Some(20));
    }

    /// A no-line range after a located one (compiler-made exception or `with` cleanup code)
    /// has no known line: never the `def` line, also in a closure whose prologue is on it.
    #[test]
    fn no_line_range_after_a_located_one_has_no_line() {
        let mut t = Vec::new();
        // [0,4) a closure's prologue: kind NONE.
        t.push(head(15, 2));
        // [4,6) RESUME, line 19; [6,10) line 20.
        t.extend([head(10, 1), 0, 0]);
        t.extend([head(11, 2), 15, 16]);
        // [10,16) cleanup code: kind NONE, three code units.
        t.push(head(15, 3));
        // [16,18) line 22 again after it.
        t.extend([head(12, 1), 0, 4]);
        for minor in 11..=15 {
            let at = |o| line_for(minor, 19, &t, o);
            assert_eq!(at(0), Some(19), "3.{minor}: the prologue");
            assert_eq!(at(6), Some(20), "3.{minor}");
            assert_eq!(at(10), None, "3.{minor}: cleanup code");
            assert_eq!(at(14), None, "3.{minor}: cleanup code");
            assert_eq!(at(16), Some(22), "3.{minor}");
        }
        // A plain function: RESUME on the def line, then a body line, then cleanup code.
        let t = [head(10, 1), 0, 0, head(11, 1), 4, 8, head(15, 2)];
        assert_eq!(line_for(12, 7, &t, 4), None);
        // 3.10: [0,4) → 31, [4,8) no line, [8,10) → 32.
        let t = [4, 1, 4, 0x80, 2, 1];
        assert_eq!(line_for(10, 30, &t, 0), Some(31));
        assert_eq!(line_for(10, 30, &t, 4), None);
        assert_eq!(line_for(10, 30, &t, 6), None);
        assert_eq!(line_for(10, 30, &t, 8), Some(32));
        // A located zero-width entry before the no-line range counts as a line.
        let t = [0, 1, 4, 0x80, 2, 1];
        assert_eq!(line_for(10, 30, &t, 0), None);
    }

    #[test]
    fn varints() {
        for v in [0, 1, -1, 31, -31, 32, -32, 1000, -1000, 1 << 20, -(1 << 20)] {
            assert_eq!(svarint(&sv(v)), i64::from(v), "{v}");
        }
        // A run of continuation bytes neither overflows nor reads past the slice.
        assert_eq!(varint(&[0x7f; 40]), u32::MAX);
        assert_eq!(svarint(&[]), 0);
    }

    #[test]
    fn garbage_tables_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..300usize {
            let table: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            for minor in 8..=13 {
                for offset in [0, 1, 2, 7, 100, 1000, u32::MAX] {
                    for first in [0, 1, u32::MAX] {
                        let _ = line_for(minor, first, &table, offset);
                    }
                }
            }
        }
        // Tables of all-ones or all-zeros, at the largest size read.
        for fill in [0u8, 0x80, 0xff, 0x7f] {
            let table = vec![fill; MAX_LINE_TABLE];
            for minor in 8..=13 {
                let _ = line_for(minor, u32::MAX, &table, u32::MAX);
                let _ = line_for(minor, 1, &table, 1 << 20);
            }
        }
        // Lines that would go negative or above u32 are not lines.
        assert_eq!(line_for(8, 0, &[2, 0xff], 4), None);
        assert_eq!(line_for(8, u32::MAX, &[2, 1], 4), None);
    }
}
