//! Reading another process's memory, generic over where the bytes come from.
//!
//! Everything that follows pointers in a CPython process goes through [`ProcessMemory`], so the
//! same walker reads a live process ([`LiveMemory`]) or a hand-built or recorded fixture
//! ([`FixtureMemory`]). Reads are bounded by the caller's buffer and either fill it entirely or
//! fail: a half-read value is never returned.

use std::collections::BTreeMap;

/// Largest single read accepted. Anything larger is a corrupted length, not a real object.
pub const MAX_READ: usize = 1 << 20;

/// Why a read failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// The address is null or in the first page, i.e. a null pointer plus an offset.
    #[error("null pointer read at {0:#x}")]
    Null(u64),
    /// The range is not mapped (or only partly mapped) in the target.
    #[error("unreadable memory at {addr:#x} ({len} bytes)")]
    Unreadable { addr: u64, len: usize },
    /// The read is larger than [`MAX_READ`] or wraps the address space.
    #[error("read of {len} bytes at {addr:#x} is out of bounds")]
    OutOfBounds { addr: u64, len: usize },
    /// The target process no longer exists.
    #[error("process {0} is gone")]
    ProcessGone(u32),
    /// Any other OS error from the read.
    #[error("reading process {pid} failed: errno {errno}")]
    Os { pid: u32, errno: i32 },
}

/// Read access to a process's address space.
pub trait ProcessMemory {
    /// Fills `buf` with the bytes at `addr`, entirely, or fails.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError>;

    /// A little-endian `u64` at `addr`.
    fn read_u64(&self, addr: u64) -> Result<u64, MemError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// A little-endian `u32` at `addr`.
    fn read_u32(&self, addr: u64) -> Result<u32, MemError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// A little-endian `i32` at `addr`.
    fn read_i32(&self, addr: u64) -> Result<i32, MemError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(i32::from_le_bytes(b))
    }

    /// A byte at `addr`.
    fn read_u8(&self, addr: u64) -> Result<u8, MemError> {
        let mut b = [0u8; 1];
        self.read(addr, &mut b)?;
        Ok(b[0])
    }

    /// A pointer (x86_64: 8 bytes) at `addr`. Null is returned as 0, not as an error: callers
    /// decide whether null ends a list or is a fault.
    fn read_ptr(&self, addr: u64) -> Result<u64, MemError> {
        self.read_u64(addr)
    }
}

/// Checks a read's range before it is attempted.
fn check_range(addr: u64, len: usize) -> Result<(), MemError> {
    // NB: the first page is never mapped on Linux (vm.mmap_min_addr), so anything there is a null
    // pointer plus a field offset.
    if addr < 4096 {
        return Err(MemError::Null(addr));
    }
    if len > MAX_READ || addr.checked_add(len as u64).is_none() {
        return Err(MemError::OutOfBounds { addr, len });
    }
    Ok(())
}

/// A live process, read with `process_vm_readv(2)`.
///
/// Needs the same permission as ptrace attach (same user and `ptrace_scope` allowing it, or
/// `CAP_SYS_PTRACE`). The target is not stopped: values read may be torn if the target is
/// running; callers validate what they read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveMemory {
    pid: u32,
}

impl LiveMemory {
    /// Memory of process `pid`.
    pub fn new(pid: u32) -> Self {
        Self { pid }
    }

    /// The process read.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl ProcessMemory for LiveMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        check_range(addr, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes exactly `buf`, which is valid for writes of its length for
        // the duration of the call; `remote` is only interpreted by the kernel in the target's
        // address space.
        let n =
            unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(match errno {
                libc::ESRCH => MemError::ProcessGone(self.pid),
                libc::EFAULT | libc::EIO => MemError::Unreadable {
                    addr,
                    len: buf.len(),
                },
                _ => MemError::Os {
                    pid: self.pid,
                    errno,
                },
            });
        }
        if n as usize != buf.len() {
            // A partial read means the range runs into an unmapped page.
            return Err(MemError::Unreadable {
                addr,
                len: buf.len(),
            });
        }
        Ok(())
    }
}

/// An address space made of byte regions, for tests and replay.
///
/// A read succeeds only when it lies entirely within one region.
#[derive(Debug, Clone, Default)]
pub struct FixtureMemory {
    regions: BTreeMap<u64, Vec<u8>>,
}

impl FixtureMemory {
    /// An empty address space.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `bytes` at `addr`. Regions must not overlap; a later region at the same address
    /// replaces the earlier one.
    pub fn insert(&mut self, addr: u64, bytes: Vec<u8>) -> &mut Self {
        self.regions.insert(addr, bytes);
        self
    }

    /// Writes `bytes` at `addr` inside an existing region. Panics if it does not fit: fixtures
    /// are built by tests.
    pub fn write(&mut self, addr: u64, bytes: &[u8]) -> &mut Self {
        let (start, region) = self
            .regions
            .range_mut(..=addr)
            .next_back()
            .expect("fixture write outside any region");
        let off = (addr - *start) as usize;
        region[off..off + bytes.len()].copy_from_slice(bytes);
        self
    }

    /// Writes a little-endian `u64` at `addr` inside an existing region.
    pub fn write_u64(&mut self, addr: u64, value: u64) -> &mut Self {
        self.write(addr, &value.to_le_bytes())
    }
}

impl ProcessMemory for FixtureMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        check_range(addr, buf.len())?;
        let unreadable = MemError::Unreadable {
            addr,
            len: buf.len(),
        };
        let (start, region) = self
            .regions
            .range(..=addr)
            .next_back()
            .ok_or(unreadable.clone())?;
        let off = (addr - start) as usize;
        let src = off
            .checked_add(buf.len())
            .and_then(|end| region.get(off..end))
            .ok_or(unreadable)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture_reads_within_one_region_only() {
        let mut m = FixtureMemory::new();
        m.insert(0x10000, vec![0; 16])
            .write_u64(0x10008, 0xdead_beef);
        assert_eq!(m.read_u64(0x10008), Ok(0xdead_beef));
        assert_eq!(m.read_u32(0x10008), Ok(0xdead_beef));
        assert!(matches!(
            m.read_u64(0x1000c),
            Err(MemError::Unreadable { .. })
        ));
        assert!(matches!(
            m.read_u64(0xffff),
            Err(MemError::Unreadable { .. })
        ));
        assert_eq!(m.read_u64(8), Err(MemError::Null(8)));
        assert!(matches!(
            m.read_u64(u64::MAX - 3),
            Err(MemError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn live_reads_own_memory_and_rejects_garbage() {
        let value: u64 = 0x0123_4567_89ab_cdef;
        let mem = LiveMemory::new(std::process::id());
        assert_eq!(mem.read_u64(&value as *const u64 as u64), Ok(value));
        // Non-canonical address: never mapped.
        assert!(mem.read_u64(0x8000_0000_0000_0000).is_err());
        assert_eq!(mem.read_u64(0), Err(MemError::Null(0)));
        let mut big = vec![0u8; MAX_READ + 1];
        assert!(matches!(
            mem.read(0x10000, &mut big),
            Err(MemError::OutOfBounds { .. })
        ));
    }
}
