//! `spanprof replay`: the count and assemble stages run from a recording
//! ([`crate::record`]) instead of a live session, without root or BPF.
//!
//! The recording's events go to a [`Counter`] in the order the live one got them, and its facts
//! to [`assemble`], so the profile (and every output written from it) is the one the session
//! made. A recording is untrusted input: it is read as a regular file of at most 1 GiB, its
//! gzip data up to [`MAX_UNCOMPRESSED`], and its facts are checked against its samples before
//! assembly.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use crate::assemble::{assemble, Facts};
use crate::count::Counter;
use crate::profile::Profile;
use crate::python::{split_token, FIRST_MARKER_FUNCTION};
use crate::record::codec::{bad, Error, Result};
use crate::record::read::{Event, Recorded};
use crate::record::{Header, Reader, MAX_UNCOMPRESSED};

/// Bytes of a recording file at most (compressed).
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// What a replay gives.
#[derive(Debug)]
pub struct Replayed {
    /// The profile, as the session built it.
    pub profile: Profile,
    /// The recording's header.
    pub header: Header,
    /// The kernel's error counters at the end of the session (empty when not recorded).
    pub errors: Vec<u64>,
    /// Samples counted.
    pub samples: u64,
}

/// Replays the decompressed recording `input`.
pub fn replay(input: impl BufRead) -> Result<Replayed> {
    let (mut reader, header) = Reader::new(input)?;
    let mut count = Counter::new(header.options);
    let mut errors = Vec::new();
    loop {
        match reader.next_event()? {
            Event::Sample(r) => {
                // A new process's description is the next event.
                count.count(&r);
                // New user stacks wait there to be normalized in a live session; a replay
                // normalizes nothing.
                if !count.pending.is_empty() {
                    count.pending.clear();
                }
            }
            Event::Exec(pid, time_ns) => {
                count.exec(pid, time_ns);
            }
            Event::Describe(pid, facts) => count.describe(pid, facts),
            Event::Live(live) => count.set_live(live),
            Event::Errors(e) => errors = e,
            Event::End => break,
        }
    }
    let (user_addrs, kernel_addrs) = count.addresses();
    let recorded = reader.facts((user_addrs.len(), kernel_addrs.len()))?;
    let samples = count.samples();
    let profile = assemble_checked(count, recorded)?;
    Ok(Replayed {
        profile,
        header,
        errors,
        samples,
    })
}

/// Assembles `count` with the facts of its recording, once they are checked to fit it: a
/// symbol for every address, a function for every Python frame.
fn assemble_checked(count: Counter, recorded: Recorded) -> Result<Profile> {
    let (user_addrs, kernel_addrs) = count.addresses();
    let fits = |what: &str, symbols: usize, addresses: usize| {
        if symbols == addresses {
            Ok(())
        } else {
            Err(bad(format!(
                "{symbols} {what} symbols for {addresses} {what} addresses"
            )))
        }
    };
    fits("user", recorded.user_symbols.len(), user_addrs.len())?;
    fits("kernel", recorded.kernel_symbols.len(), kernel_addrs.len())?;
    let functions = recorded.python.functions.len();
    for stack in count.python.ids.keys() {
        for &token in stack.iter() {
            let (func, _, _) = split_token(token);
            if func < FIRST_MARKER_FUNCTION && func as usize >= functions {
                return Err(bad(format!(
                    "Python function {func} of {functions} referred to"
                )));
            }
        }
    }
    let facts = Facts {
        meta: recorded.meta,
        user_symbols: recorded.user_symbols,
        kernel_symbols: recorded.kernel_symbols,
        python: recorded.python,
        unix_offset_ns: recorded.unix_offset_ns,
    };
    Ok(assemble(count, &user_addrs, &kernel_addrs, facts))
}

/// Replays the recording in the file at `path`: a regular file of at most
/// [`MAX_FILE_BYTES`], gzip-compressed. The error is one line and does not name the file.
pub fn replay_file(path: &Path) -> Result<Replayed> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let cannot = |e: std::io::Error| Error(format!("cannot read it: {e}"));
    // NB: without blocking: a FIFO or a device would hang the open or be read without end.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if !meta.is_file() {
        return Err(Error("cannot read it: not a regular file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(Error(format!("larger than {} MiB", MAX_FILE_BYTES >> 20)));
    }
    let mut input = BufReader::new(file.take(MAX_FILE_BYTES));
    if !input.fill_buf().map_err(cannot)?.starts_with(&[0x1f, 0x8b]) {
        return Err(Error(
            "not a spanprof recording (not gzip data; `spanprof profile --record FILE` writes one)"
                .into(),
        ));
    }
    replay_bytes_from(flate2::bufread::GzDecoder::new(input))
}

/// Replays a gzip-compressed recording held in memory.
pub fn replay_gzip(bytes: &[u8]) -> Result<Replayed> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Err(Error("not a spanprof recording (not gzip data)".into()));
    }
    replay_bytes_from(flate2::bufread::GzDecoder::new(bytes))
}

fn replay_bytes_from(gz: impl Read) -> Result<Replayed> {
    // One byte past the limit tells a recording too large from one that ends there.
    replay(BufReader::with_capacity(
        1 << 16,
        gz.take(MAX_UNCOMPRESSED + 1),
    ))
}
