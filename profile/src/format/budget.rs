//! How much memory reading a profile file may take, and the checks that keep a small file from
//! taking more: a gzip bomb, or protobuf whose few bytes decode into large tables (a packed
//! repeated field of one-byte varints becomes eight bytes an element) or into stacks that
//! expand (a sample of many references to a location of many inlined lines).
//!
//! The bound is [`FLOOR`] plus [`PER_FILE_BYTE`] bytes per byte of the file as read (gzip
//! included): spanprof's own pprof files, about 3:1 compressed, took about 70 bytes of memory
//! a byte to report. Each check runs before the allocation it guards:
//! 1. gzip data stops being decompressed past a quarter of the bound;
//! 2. [`message_cost`] bounds from the wire format what the protobuf decoder would allocate;
//! 3. the readers count the frames their samples expand to before making them.

use crate::format::ReadError;

/// What any profile file may take to read, whatever its size.
pub const FLOOR: u64 = 64 << 20;
/// What each byte of the file adds to the bound.
pub const PER_FILE_BYTE: u64 = 256;

/// Bytes a decoded message struct is counted for, at least (the largest of pprof's and OTLP's,
/// OTLP's `Profile`, is 176).
const STRUCT_BYTES: u64 = 192;
/// Nesting looked into, at most (prost's own recursion limit is 100).
const MAX_DEPTH: u32 = 32;

/// The memory reading one file may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadBudget {
    bytes: u64,
    file_bytes: u64,
}

impl ReadBudget {
    /// The bound for a file of `file_bytes` bytes.
    pub fn for_file(file_bytes: u64) -> Self {
        ReadBudget {
            bytes: FLOOR.saturating_add(file_bytes.saturating_mul(PER_FILE_BYTE)),
            file_bytes,
        }
    }

    /// The bound, in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The most a gzip member may decompress to: a quarter of the bound (the decoded tables
    /// come on top of the bytes).
    pub fn max_uncompressed(&self) -> u64 {
        self.bytes / 4
    }

    /// The error of a file that needs `need` bytes (at least) for `what`.
    pub fn exceeded(&self, what: &str, need: u64) -> ReadError {
        ReadError::TooBig(format!(
            "{what} would take {} MiB or more, over the {} MiB a file of {} KiB may take \
             ({} MiB plus {PER_FILE_BYTE} bytes per byte of the file)",
            need >> 20,
            self.bytes >> 20,
            self.file_bytes.div_ceil(1024),
            FLOOR >> 20
        ))
    }

    /// The error of gzip data that decompresses to more than [`ReadBudget::max_uncompressed`].
    pub fn decompressed_too_much(&self) -> ReadError {
        ReadError::TooBig(format!(
            "it decompresses to more than {} MiB, a quarter of the {} MiB a file of {} KiB may \
             take to read ({} MiB plus {PER_FILE_BYTE} bytes per byte of the file)",
            self.max_uncompressed() >> 20,
            self.bytes >> 20,
            self.file_bytes.div_ceil(1024),
            FLOOR >> 20
        ))
    }

    /// Checks that `need` bytes for `what` fit.
    pub fn check(&self, what: &str, need: u64) -> Result<(), ReadError> {
        if need > self.bytes {
            return Err(self.exceeded(what, need));
        }
        Ok(())
    }
}

/// An upper bound of the memory a protobuf decoder (prost) allocates for the message `bytes`,
/// whatever its schema, or `None` if `bytes` is not a protobuf message. Each field counts as the
/// most it could decode to: a scalar as 8 bytes (an element of a repeated field); a
/// length-delimited field of `n` bytes as the largest of a packed array (8 bytes an element, at
/// most `n` elements), a string (`n` bytes and its 24-byte header) and, when its bytes parse as
/// a message, that message ([`STRUCT_BYTES`] plus its own bound). An unknown group, which the
/// decoder skips, costs nothing, and what follows it is counted. The total is doubled for the
/// spare capacity of growing vectors (NB: a vector of one element has room for four, so a
/// chain of one-element repeated messages can take up to about twice this bound). Work is
/// linear in the bytes times the nesting looked into ([`MAX_DEPTH`]).
pub fn message_cost(bytes: &[u8]) -> Option<u64> {
    fields_cost(bytes, 0).map(|c| c.saturating_mul(2))
}

fn fields_cost(bytes: &[u8], depth: u32) -> Option<u64> {
    let (cost, rest) = fields_until(bytes, depth, None)?;
    rest.is_empty().then_some(cost)
}

/// The cost of the fields of `bytes` up to the end-group key of field `group` (when in a
/// group; the end of `bytes` otherwise), and what follows that key. prost skips an unknown
/// group (proto3 has none), allocating nothing for it, but decodes what comes after it: a
/// group is looked through, not counted as the end of the message.
fn fields_until(mut bytes: &[u8], depth: u32, group: Option<u64>) -> Option<(u64, &[u8])> {
    let mut total: u64 = 0;
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        if key >> 3 == 0 {
            return None;
        }
        let cost = match key & 7 {
            3 => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                let (_, rest) = fields_until(bytes, depth + 1, Some(key >> 3))?;
                bytes = rest;
                0
            }
            4 => {
                return (group == Some(key >> 3)).then_some((total, bytes));
            }
            0 => {
                varint(&mut bytes)?;
                8
            }
            1 => {
                bytes = bytes.get(8..)?;
                8
            }
            5 => {
                bytes = bytes.get(4..)?;
                8
            }
            2 => {
                let len = usize::try_from(varint(&mut bytes)?).ok()?;
                let payload = bytes.get(..len)?;
                bytes = &bytes[len..];
                let n = len as u64;
                let flat = (8 * n).max(n + 24);
                let nested = if depth < MAX_DEPTH {
                    fields_cost(payload, depth + 1).map(|c| c + STRUCT_BYTES)
                } else {
                    None
                };
                // A message too deep to look into counts as one of the most a byte can make.
                let deep = if depth >= MAX_DEPTH {
                    STRUCT_BYTES * n.max(1)
                } else {
                    0
                };
                flat.max(nested.unwrap_or(0)).max(deep)
            }
            _ => return None,
        };
        total = total.saturating_add(cost);
    }
    // A group must end before its message does.
    group.is_none().then_some((total, bytes))
}

/// Reads a base-128 varint (at most 10 bytes).
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let b = *bytes.get(i)?;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ld(field: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![(field << 3) | 2];
        let mut n = payload.len();
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn packed_zeros_count_eight_bytes_each_and_garbage_is_no_message() {
        let zeros = vec![0u8; 1 << 20];
        let sample = ld(2, &zeros);
        let profile = ld(2, &sample);
        let cost = message_cost(&profile).unwrap();
        assert!(cost >= 2 * 8 * (1 << 20), "{cost}");
        assert!(cost < 2 * 8 * (1 << 20) + 4096, "{cost}");
        // A field number 0, an unended group, a length past the end: not messages.
        assert_eq!(message_cost(&[0x00, 0x01]), None);
        assert_eq!(message_cost(&[0x0b]), None);
        // A group (field 1: start 0x0b, end 0x0c) is looked through: what follows it counts.
        let mut grouped = vec![0x0b, 0x08, 0x01, 0x0c];
        grouped.extend(ld(2, &zeros));
        let after = message_cost(&grouped).unwrap();
        assert!(after >= 2 * 8 * (1 << 20), "{after}");
        // An end-group key of another field, or none, is no message.
        assert_eq!(message_cost(&[0x0b, 0x14]), None);
        assert_eq!(message_cost(&[0x0c]), None);
        assert_eq!(message_cost(&[0x12, 0x05, 0x01]), None);
        assert_eq!(message_cost(&[]), Some(0));
    }

    #[test]
    fn every_nesting_counts_its_struct_and_depth_stays_bounded() {
        let mut m = vec![0x08, 0x01];
        for _ in 0..200 {
            m = ld(1, &m);
        }
        let cost = message_cost(&m).unwrap();
        assert!(cost >= 2 * STRUCT_BYTES * u64::from(MAX_DEPTH), "{cost}");
        let budget = ReadBudget::for_file(1000);
        assert_eq!(budget.bytes(), FLOOR + 256_000);
        assert!(budget.check("it", budget.bytes()).is_ok());
        let err = budget.check("decoding it", budget.bytes() + 1).unwrap_err();
        assert!(err.to_string().contains("a file of 1 KiB"), "{err}");
    }
}
