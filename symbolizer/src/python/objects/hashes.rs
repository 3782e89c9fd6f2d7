//! The hashes span reading needs of the target's objects: a str's as CPython computes it (for
//! a str that has not cached one yet) and a ContextVar's as the HAMT folds it.

use super::{ObjectError, Objects, ProcessMemory, Result};

/// CPython's hash of bytes (`_Py_HashBytes`, the hash of a str of kind 1): SipHash-1-3 (3.11 and
/// later) or SipHash-2-4 (3.4–3.10, `sip13` false) keyed by `_Py_HashSecret`'s first 16 bytes; 0
/// for no bytes, and never -1.
pub fn py_hash_bytes(sip13: bool, key: [u64; 2], bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    if bytes.is_empty() {
        return 0;
    }
    let h = if sip13 {
        let mut h = siphasher::sip::SipHasher13::new_with_keys(key[0], key[1]);
        h.write(bytes);
        h.finish()
    } else {
        let mut h = siphasher::sip::SipHasher24::new_with_keys(key[0], key[1]);
        h.write(bytes);
        h.finish()
    };
    if h as i64 == -1 {
        -2i64 as u64
    } else {
        h
    }
}

/// The hash CPython will give the ASCII str `obj` when it first hashes it, for a str that has
/// not cached one yet (OpenTelemetry's span key, until the first span is set): computed with
/// the process's `_Py_HashSecret` (at `secret`), by whichever of the two algorithms gives
/// `known` (an ASCII str whose hash is cached, such as a dict key) its hash. An error when the
/// str is not ASCII or neither algorithm agrees (a build with another hash function).
pub fn computed_str_hash<M: ProcessMemory>(
    o: &Objects<'_, M>,
    secret: u64,
    obj: u64,
    known: u64,
) -> Result<u64> {
    let (text, known_text) = (o.str(obj)?, o.str(known)?);
    if !text.is_ascii() || !known_text.is_ascii() {
        return Err(ObjectError::Invalid("str hash of a str that is not ASCII"));
    }
    let known_hash = o.str_hash(known)?;
    let key = [
        o.mem.read_u64(secret)?,
        o.mem.read_u64(secret.wrapping_add(8))?,
    ];
    [true, false]
        .into_iter()
        .find(|&sip13| py_hash_bytes(sip13, key, known_text.as_bytes()) == known_hash)
        .map(|sip13| py_hash_bytes(sip13, key, text.as_bytes()))
        .ok_or(ObjectError::Invalid("str hash function unknown"))
}

/// The HAMT hash of a ContextVar (Python/hamt.c `hamt_hash`): its 64-bit hash folded to 32.
pub fn hamt_hash(hash: u64) -> u32 {
    let folded = (hash as u32 as i32) ^ ((hash >> 32) as u32 as i32);
    (if folded == -1 { -2 } else { folded }) as u32
}
