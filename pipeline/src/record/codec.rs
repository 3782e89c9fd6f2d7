//! The primitives of the recording format: LEB128 varints, zigzag signed numbers, strings with
//! a length, and a table of strings written once and referred to after.
//!
//! The reader bounds everything: a length is checked against a limit before anything is
//! allocated for it, and every read past the end of the input is an error, never a panic.

use std::io::BufRead;

use rustc_hash::FxHashMap;

/// Longest string a recording holds (a command line is read up to 256 KiB).
pub const MAX_STRING: usize = 1 << 20;

/// Bytes of a recording being written.
#[derive(Debug, Default)]
pub struct Enc {
    /// What was encoded so far.
    pub buf: Vec<u8>,
}

impl Enc {
    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    /// An unsigned LEB128 varint.
    pub fn var(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    /// A signed number, zigzag-encoded.
    pub fn signed(&mut self, v: i64) {
        self.var(((v << 1) ^ (v >> 63)) as u64);
    }

    /// A boolean.
    pub fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    /// Bytes with their length.
    pub fn bytes(&mut self, v: &[u8]) {
        self.var(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    /// A string with its length (cut to [`MAX_STRING`] bytes at a character boundary).
    pub fn str(&mut self, v: &str) {
        let mut end = v.len().min(MAX_STRING);
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes(&v.as_bytes()[..end]);
    }

    /// An optional string with its length.
    pub fn opt_str(&mut self, v: Option<&str>) {
        match v {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }

    /// A leaf-first stack of addresses: its length, then each address as the difference from
    /// the one before (the first from 0), zigzag-encoded.
    pub fn addrs(&mut self, stack: &[u64]) {
        self.var(stack.len() as u64);
        let mut prev = 0u64;
        for &a in stack {
            self.signed(a.wrapping_sub(prev) as i64);
            prev = a;
        }
    }
}

/// Strings written once and referred to by index after (`0`: none; `1`: a new string follows;
/// `n + 2`: the string of index `n`).
#[derive(Debug, Default)]
pub struct StrTable {
    ids: FxHashMap<String, u32>,
}

impl StrTable {
    /// Writes `v`, or a reference to it if it was written before.
    pub fn put(&mut self, enc: &mut Enc, v: Option<&str>) {
        let Some(s) = v else {
            enc.var(0);
            return;
        };
        if let Some(&id) = self.ids.get(s) {
            enc.var(u64::from(id) + 2);
            return;
        }
        enc.var(1);
        enc.str(s);
        let id = self.ids.len() as u32;
        self.ids.insert(s.to_string(), id);
    }
}

/// Why a recording could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// A result of reading a recording.
pub type Result<T> = std::result::Result<T, Error>;

/// An error of the recording's contents.
pub fn bad(what: impl std::fmt::Display) -> Error {
    Error(format!("damaged recording: {what}"))
}

fn truncated(pos: u64) -> Error {
    Error(format!(
        "truncated: the recording ends after {pos} bytes (uncompressed), inside a record"
    ))
}

/// An error of the (gzip) input at `pos`.
fn io_error(pos: u64, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        truncated(pos)
    } else {
        Error(format!("bad gzip data: {e}"))
    }
}

/// Reads the primitives of [`Enc`] from decompressed bytes, counting them.
#[derive(Debug)]
pub struct Dec<R> {
    input: R,
    /// Bytes read so far.
    pub pos: u64,
    /// Bytes read at most (the uncompressed size limit).
    limit: u64,
}

impl<R: BufRead> Dec<R> {
    /// A reader of at most `limit` bytes of `input`.
    pub fn new(input: R, limit: u64) -> Dec<R> {
        Dec {
            input,
            pos: 0,
            limit,
        }
    }

    fn truncated(&self) -> Error {
        truncated(self.pos)
    }

    fn advance(&mut self, n: usize) -> Result<()> {
        self.pos += n as u64;
        if self.pos > self.limit {
            return Err(Error(format!(
                "more than {} MiB uncompressed",
                self.limit >> 20
            )));
        }
        Ok(())
    }

    /// Whether the input has no byte left.
    pub fn at_end(&mut self) -> Result<bool> {
        let pos = self.pos;
        let buf = self.input.fill_buf().map_err(|e| io_error(pos, e))?;
        Ok(buf.is_empty())
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8> {
        let pos = self.pos;
        let buf = self.input.fill_buf().map_err(|e| io_error(pos, e))?;
        let Some(&b) = buf.first() else {
            return Err(self.truncated());
        };
        self.input.consume(1);
        self.advance(1)?;
        Ok(b)
    }

    /// An unsigned LEB128 varint of at most 10 bytes.
    pub fn var(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                if shift == 63 && b > 1 {
                    break;
                }
                return Ok(v);
            }
        }
        Err(bad("a number of more than 64 bits"))
    }

    /// A varint that fits in a `u32`.
    pub fn u32(&mut self, what: &str) -> Result<u32> {
        let v = self.var()?;
        u32::try_from(v).map_err(|_| bad(format!("{what} {v} out of range")))
    }

    /// A count of at most `max` items.
    pub fn len(&mut self, max: usize, what: &str) -> Result<usize> {
        let v = self.var()?;
        if v > max as u64 {
            return Err(bad(format!(
                "{v} {what}, more than the {max} a recording holds"
            )));
        }
        Ok(v as usize)
    }

    /// A zigzag-encoded signed number.
    pub fn signed(&mut self) -> Result<i64> {
        let v = self.var()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// A boolean (0 or 1).
    pub fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(bad(format!("a boolean of {b}"))),
        }
    }

    /// Bytes with their length, at most `max` of them, into `out` (cleared first).
    pub fn bytes_into(&mut self, max: usize, out: &mut Vec<u8>) -> Result<()> {
        let n = self.len(max, "bytes")?;
        out.clear();
        while out.len() < n {
            let pos = self.pos;
            let buf = self.input.fill_buf().map_err(|e| io_error(pos, e))?;
            if buf.is_empty() {
                return Err(self.truncated());
            }
            let take = buf.len().min(n - out.len());
            out.extend_from_slice(&buf[..take]);
            self.input.consume(take);
            self.advance(take)?;
        }
        Ok(())
    }

    /// A string with its length.
    pub fn str(&mut self) -> Result<String> {
        let mut bytes = Vec::new();
        self.bytes_into(MAX_STRING, &mut bytes)?;
        String::from_utf8(bytes).map_err(|_| bad("a string that is not UTF-8"))
    }

    /// An optional string.
    pub fn opt_str(&mut self) -> Result<Option<String>> {
        Ok(if self.bool()? {
            Some(self.str()?)
        } else {
            None
        })
    }

    /// A stack of [`Enc::addrs`], of at most `max` addresses, into `out` (cleared first).
    pub fn addrs_into(&mut self, max: usize, out: &mut Vec<u64>) -> Result<()> {
        let n = self.len(max, "frames in a stack")?;
        out.clear();
        let mut prev = 0u64;
        for _ in 0..n {
            let a = prev.wrapping_add(self.signed()? as u64);
            out.push(a);
            prev = a;
        }
        Ok(())
    }
}

/// The reading side of [`StrTable`].
#[derive(Debug, Default)]
pub struct StrList {
    strings: Vec<String>,
    bytes: usize,
    /// Bytes of every string handed out, copies of earlier ones included.
    given: usize,
}

/// Bytes of distinct strings a recording holds at most.
const MAX_STRING_BYTES: usize = 1 << 28;
/// Bytes of strings handed out at most, copies included: a reference of two bytes to a string
/// of a megabyte must not make a small file into terabytes.
const MAX_GIVEN_BYTES: usize = 1 << 30;

impl StrList {
    /// Reads a string written by [`StrTable::put`].
    pub fn get<R: BufRead>(&mut self, dec: &mut Dec<R>) -> Result<Option<String>> {
        match dec.var()? {
            0 => Ok(None),
            1 => {
                let s = dec.str()?;
                self.bytes += s.len() + 1;
                if self.bytes > MAX_STRING_BYTES {
                    return Err(bad("more text than a recording holds"));
                }
                self.strings.push(s.clone());
                Ok(Some(s))
            }
            n => {
                let s = self.strings.get((n - 2) as usize).ok_or_else(|| {
                    bad(format!(
                        "string {} of {} referred to",
                        n - 2,
                        self.strings.len()
                    ))
                })?;
                self.given += s.len() + 1;
                if self.given > MAX_GIVEN_BYTES {
                    return Err(bad("more text than a recording holds"));
                }
                Ok(Some(s.clone()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_strings_and_stacks_round_trip() {
        let mut e = Enc::default();
        for v in [0, 1, 127, 128, 300, u64::MAX] {
            e.var(v);
        }
        for v in [0, -1, 1, i64::MIN, i64::MAX] {
            e.signed(v);
        }
        e.str("héllo");
        e.opt_str(None);
        e.addrs(&[0xffff_ffff_8100_0000, 0x10, 0xffff_ffff_8100_0010]);
        let mut t = StrTable::default();
        t.put(&mut e, Some("a"));
        t.put(&mut e, None);
        t.put(&mut e, Some("a"));
        let mut d = Dec::new(&e.buf[..], 1 << 20);
        for v in [0, 1, 127, 128, 300, u64::MAX] {
            assert_eq!(d.var().unwrap(), v);
        }
        for v in [0, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(d.signed().unwrap(), v);
        }
        assert_eq!(d.str().unwrap(), "héllo");
        assert_eq!(d.opt_str().unwrap(), None);
        let mut stack = Vec::new();
        d.addrs_into(8, &mut stack).unwrap();
        assert_eq!(stack, [0xffff_ffff_8100_0000, 0x10, 0xffff_ffff_8100_0010]);
        let mut l = StrList::default();
        assert_eq!(l.get(&mut d).unwrap().as_deref(), Some("a"));
        assert_eq!(l.get(&mut d).unwrap(), None);
        assert_eq!(l.get(&mut d).unwrap().as_deref(), Some("a"));
        assert!(d.at_end().unwrap());
        assert!(d.u8().unwrap_err().0.starts_with("truncated"));
    }

    #[test]
    fn bounds_are_checked_before_anything_is_allocated() {
        let mut e = Enc::default();
        e.var(u64::MAX);
        let mut d = Dec::new(&e.buf[..], 1 << 20);
        assert!(d.len(10, "things").is_err());
        // An 11-byte varint.
        let mut d = Dec::new(&[0xff; 11][..], 1 << 20);
        assert!(d.var().is_err());
        // A string longer than the input: truncated, not a huge buffer.
        let mut e = Enc::default();
        e.var(1000);
        e.buf.extend_from_slice(b"abc");
        let mut d = Dec::new(&e.buf[..], 1 << 20);
        assert!(d.str().unwrap_err().0.starts_with("truncated"));
        // The uncompressed limit.
        let mut d = Dec::new(&[0u8; 100][..], 10);
        let err = (0..100).map(|_| d.u8()).find_map(Result::err).unwrap();
        assert!(err.0.contains("uncompressed"), "{err}");
        // A reference to a string not read.
        let mut d = Dec::new(&[5u8][..], 10);
        assert!(StrList::default().get(&mut d).is_err());
    }

    #[test]
    fn copies_of_a_long_string_count_against_the_text_budget() {
        // One string of MAX_STRING bytes, then more references to it than the budget allows:
        // a small input must not hand out more than MAX_GIVEN_BYTES of copies.
        let long = "x".repeat(MAX_STRING);
        let refs = MAX_GIVEN_BYTES / (MAX_STRING + 1) + 2;
        let mut e = Enc::default();
        let mut t = StrTable::default();
        for _ in 0..refs {
            t.put(&mut e, Some(&long));
        }
        assert!(e.buf.len() < MAX_STRING + 4 * refs);
        let mut d = Dec::new(&e.buf[..], 1 << 30);
        let mut l = StrList::default();
        let err = (0..refs).find_map(|_| l.get(&mut d).err());
        let err = err.expect("the budget was not enforced");
        assert!(err.0.contains("more text"), "{err}");
    }
}
