//! The running kernel's core text symbols, kept for the boot in the cache directory.
//!
//! Naming kernel frames from `/proc/kallsyms` costs about 60 ms of CPU per session on these
//! machines, most of it the kernel printing the file's 120,000 lines. The symbols of the core
//! kernel's text (between `_stext` and `_etext`) do not change until the next boot, so the
//! first session of a boot writes them to `kallsyms-BOOT_ID` in the cache directory and the
//! next ones read that file instead. Frames in modules, BPF programs or anything else outside
//! that range are named from `/proc/kallsyms` as before: modules and programs come and go.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The core kernel text's symbols, in a file in the kallsyms format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CoreText {
    pub(crate) path: PathBuf,
    /// `_stext`'s address.
    pub(crate) start: u64,
    /// `_etext`'s address: the text ends there.
    pub(crate) end: u64,
}

impl CoreText {
    /// Whether every address is in the core kernel's text.
    pub(crate) fn holds(&self, addrs: &[u64]) -> bool {
        addrs.iter().all(|&a| a >= self.start && a < self.end)
    }
}

/// The cache directory of kernel symbols: `$CACHE_DIRECTORY/kernel` under systemd, else
/// `$XDG_CACHE_HOME/spanprof/kernel` (`$HOME/.cache/…` without it), as the debuginfod cache.
pub(crate) fn default_dir() -> Option<PathBuf> {
    crate::debuginfod::default_cache().and_then(|d| Some(d.parent()?.join("kernel")))
}

/// This boot's core text symbols: the file kept in `dir`, or one made now from
/// `/proc/kallsyms`; `None` when neither can be (no such directory, addresses hidden by
/// `kptr_restrict`).
pub(crate) fn core_text(dir: &Path) -> Option<CoreText> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let boot = boot.trim();
    if boot.is_empty() || !boot.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return None;
    }
    let path = dir.join(format!("kallsyms-{boot}"));
    if let Some(kept) = read_kept(&path) {
        return Some(kept);
    }
    let all = std::fs::read_to_string("/proc/kallsyms").ok()?;
    let text = core_lines(&all)?;
    write_private(dir, &path, text.lines.as_bytes()).ok()?;
    Some(CoreText {
        path,
        start: text.start,
        end: text.end,
    })
}

/// The core text's lines of a kallsyms text, by address, from `_stext`'s to `_etext`, last.
struct Lines {
    lines: String,
    start: u64,
    end: u64,
}

fn parse_line(line: &str) -> Option<(u64, &str)> {
    let mut parts = line.split_ascii_whitespace();
    let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
    let _kind = parts.next()?;
    Some((addr, parts.next()?))
}

fn core_lines(all: &str) -> Option<Lines> {
    let find = |name: &str| {
        all.lines()
            .filter_map(parse_line)
            .find(|&(_, n)| n == name)
            .map(|(a, _)| a)
    };
    let (start, end) = (find("_stext")?, find("_etext")?);
    // Hidden addresses (kptr_restrict) are all 0.
    if start == 0 || end <= start {
        return None;
    }
    let mut lines = String::new();
    let mut rest: Vec<(u64, &str)> = all
        .lines()
        .filter_map(|l| Some((parse_line(l)?.0, l)))
        .filter(|&(a, l)| a >= start && a < end && !l.contains('['))
        .collect();
    // Stable: names at one address stay in the kernel's order, as blazesym sees them in
    // /proc/kallsyms.
    rest.sort_by_key(|&(a, _)| a);
    for (_, l) in rest {
        lines.push_str(l);
        lines.push('\n');
    }
    lines.push_str(&format!("{end:016x} T _etext\n"));
    Some(Lines { lines, start, end })
}

/// The file kept, if it is whole: `_etext` on its last line (written last); the text starts
/// at its first line's address.
fn read_kept(path: &Path) -> Option<CoreText> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut head = [0u8; 256];
    let n = file.read(&mut head).ok()?;
    let first = std::str::from_utf8(&head[..n]).ok()?.lines().next()?;
    let (start, _) = parse_line(first)?;
    let len = file.seek(SeekFrom::End(0)).ok()?;
    let back = len.min(64);
    file.seek(SeekFrom::Start(len - back)).ok()?;
    let mut tail = Vec::with_capacity(back as usize);
    file.read_to_end(&mut tail).ok()?;
    let last = std::str::from_utf8(&tail).ok()?.lines().last()?;
    let (end, name) = parse_line(last)?;
    (name == "_etext" && end > start).then(|| CoreText {
        path: path.to_path_buf(),
        start,
        end,
    })
}

/// Writes `bytes` to `path` (mode 0600) through a temporary name in `dir` and a rename, so a
/// reader never sees half a file.
fn write_private(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".kallsyms.{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    drop(file);
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T startup_64
ffffffff81000000 T _stext
ffffffff81001000 T do_one
ffffffff81000800 t early_thing
ffffffff82000000 T _etext
ffffffff82000010 D some_data
ffffffffc0001000 t mod_func\t[some_module]
ffffffff81002000 t bpf_prog_abc_x\t[bpf]
";

    #[test]
    fn core_lines_keep_the_text_in_order_and_no_module() {
        let l = core_lines(KALLSYMS).unwrap();
        assert_eq!((l.start, l.end), (0xffffffff81000000, 0xffffffff82000000));
        assert_eq!(
            l.lines,
            "ffffffff81000000 T startup_64\n\
             ffffffff81000000 T _stext\n\
             ffffffff81000800 t early_thing\n\
             ffffffff81001000 T do_one\n\
             ffffffff82000000 T _etext\n"
        );
        // Hidden addresses: nothing to keep.
        let hidden: String = KALLSYMS
            .lines()
            .map(|l| format!("0000000000000000{}\n", &l[16..]))
            .collect();
        assert!(core_lines(&hidden).is_none());
    }

    #[test]
    fn a_kept_file_is_read_back_and_a_broken_one_is_not() {
        let dir = std::env::temp_dir().join(format!("spanprof-ktext-{}", std::process::id()));
        let path = dir.join("kallsyms-x");
        let l = core_lines(KALLSYMS).unwrap();
        write_private(&dir, &path, l.lines.as_bytes()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let kept = read_kept(&path).unwrap();
        assert_eq!((kept.start, kept.end), (l.start, l.end));
        assert!(kept.holds(&[0xffffffff81001234]));
        assert!(!kept.holds(&[0xffffffff81001234, 0xffffffffc0001000]));
        // Cut short (a writer that died): not used.
        std::fs::write(&path, &l.lines.as_bytes()[..40]).unwrap();
        assert!(read_kept(&path).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_boot_s_core_text_is_made_then_read() {
        let dir = std::env::temp_dir().join(format!("spanprof-kboot-{}", std::process::id()));
        let Some(made) = core_text(&dir) else {
            // Without root, kallsyms hides its addresses: nothing is kept, nothing written. CI
            // runs as root, where it must work.
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "no core text");
            assert!(!dir.exists());
            return;
        };
        let again = core_text(&dir).unwrap();
        assert_eq!(made, again);
        assert!(made.end > made.start);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
