//! What is slow to make and the same in every checkout, kept outside the checkout so that a
//! fresh clone (a CI run) takes a copy instead of making it again: the frame-pointer CPython
//! (~3 minutes), the Debian sid rootfs (~3 minutes, and the network), the workspace's cargo
//! target directory for `cargo xtask test` (its dependencies: ~14 minutes) and the fuzz
//! targets' and their lint's (~8 minutes with coverage instrumentation).
//!
//! The cache is `$SPANPROF_CACHE`, else `$HOME/.cache/spanprof`; `SPANPROF_CACHE=off` turns it
//! off. An entry is a directory with the same stamp file as the thing it holds: it is taken
//! only when its stamp is the recipe wanted now, copied into `target/` (the tests write into
//! their copy, never into the cache), and checked there as if it had just been made. A failure
//! to read or write the cache is a warning, never a failed build: the thing is then made.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::run::{step, Cmd};

/// The cache directory, or `None` when it is turned off or there is no home.
pub fn dir() -> Option<PathBuf> {
    match std::env::var_os("SPANPROF_CACHE") {
        Some(v) if v == "off" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/spanprof")),
    }
}

/// A cargo target directory in the cache for `name`, created; `fallback` when the cache is
/// off or cannot be made. Cargo keeps the builds of different checkouts apart by path, and
/// locks the directory while it builds; the binaries it copies up to `release/` are the last
/// checkout's, so a caller takes its own away under [`lock`].
pub fn target_dir(name: &str, fallback: PathBuf) -> PathBuf {
    let Some(cache) = dir() else {
        return fallback;
    };
    let dir = cache.join(name);
    match std::fs::create_dir_all(&dir) {
        Ok(()) => dir,
        Err(err) => {
            eprintln!(
                "xtask: warning: cache {}: {err}; building in {}",
                dir.display(),
                fallback.display()
            );
            fallback
        }
    }
}

/// The size at which the workspace's cached target directory is emptied: each checkout path
/// adds its own builds of the workspace's crates (~3 GiB: cargo keys them by path), the
/// dependencies are shared.
pub const WORKSPACE_TARGET_LIMIT: u64 = 20 << 30;

/// Empties the cached target directory `dir` (`name` in the cache) when it holds more than
/// `limit` bytes; nothing when it is not in the cache.
pub fn prune(name: &str, target: &Path, limit: u64) {
    let Some(cache) = dir() else {
        return;
    };
    if target != cache.join(name) {
        return;
    }
    let used = disk_usage(target);
    if used > limit {
        step(&format!(
            "emptying the cache's {} ({} GiB, more than {} GiB)",
            target.display(),
            used >> 30,
            limit >> 30
        ));
        if let Err(err) = remove(target).and_then(|()| {
            std::fs::create_dir_all(target)
                .with_context(|| format!("creating {}", target.display()))
        }) {
            eprintln!("xtask: warning: cache: {err:#}");
        }
    }
}

/// The bytes of the files under `dir` (links not followed; what cannot be read counts 0).
fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(entry.path()),
                Ok(t) if t.is_file() => total += entry.metadata().map_or(0, |m| m.len()),
                _ => {}
            }
        }
    }
    total
}

/// Holds the cache's lock `name` until the file returned is dropped (none when the cache
/// is off or the lock cannot be had: then nothing else uses the cache's directory either, or
/// the caller goes on unlocked with a warning).
pub fn lock(name: &str) -> Option<std::fs::File> {
    let path = dir()?.join(format!("{name}.lock"));
    let file = std::fs::create_dir_all(path.parent()?)
        .and_then(|()| std::fs::File::create(&path))
        .and_then(|f| {
            if f.try_lock().is_err() {
                step(&format!(
                    "waiting for {} (another run of this cache holds it)",
                    path.display()
                ));
            }
            f.lock().map(|()| f)
        });
    match file {
        Ok(f) => Some(f),
        Err(err) => {
            eprintln!("xtask: warning: cache lock {}: {err}", path.display());
            None
        }
    }
}

/// Copies the cached `name` to `dest` when the cache holds it with `stamp` (a path inside
/// it) reading `want`; `dest` is replaced. Returns whether it did.
pub fn restore(name: &str, dest: &Path, stamp: &str, want: &str) -> bool {
    let Some(cache) = dir() else {
        return false;
    };
    let entry = cache.join(name);
    if std::fs::read_to_string(entry.join(stamp)).map_or(true, |s| s != want) {
        return false;
    }
    step(&format!(
        "copying {} from the cache {}",
        dest.display(),
        entry.display()
    ));
    match copy_dir(&entry, dest) {
        Ok(()) => true,
        Err(err) => {
            eprintln!("xtask: warning: cache: {err:#}; making it instead");
            let _ = std::fs::remove_dir_all(dest);
            false
        }
    }
}

/// Keeps a copy of `src` (just made and checked) as the cached `name`.
pub fn store(name: &str, src: &Path) {
    let Some(cache) = dir() else {
        return;
    };
    let entry = cache.join(name);
    step(&format!(
        "keeping a copy of {} in the cache {}",
        src.display(),
        entry.display()
    ));
    let result = std::fs::create_dir_all(&cache)
        .with_context(|| format!("creating {}", cache.display()))
        .and_then(|()| copy_dir(src, &entry));
    if let Err(err) = result {
        eprintln!("xtask: warning: cache: {err:#}");
    }
}

/// Replaces `dest` by a copy of `src` (owners, modes, links and device nodes kept), made
/// beside it and renamed, so that an interrupted copy is never taken for a whole one.
fn copy_dir(src: &Path, dest: &Path) -> Result<()> {
    // NB: a name of this process's own: two checkouts may store one entry at once.
    let mut partial = dest.as_os_str().to_owned();
    partial.push(format!(".partial.{}", std::process::id()));
    let partial = PathBuf::from(partial);
    remove(&partial)?;
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    Cmd::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(src)
        .arg(&partial)
        .quiet()
        .run()
        .with_context(|| format!("copying {} to {}", src.display(), partial.display()))?;
    remove(dest)?;
    std::fs::rename(&partial, dest)
        .with_context(|| format!("renaming {} to {}", partial.display(), dest.display()))?;
    Ok(())
}

fn remove(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) if dir.is_file() || dir.is_symlink() => {
            std::fs::remove_file(dir).with_context(|| format!("removing {}: {err}", dir.display()))
        }
        Err(err) => bail!("removing {}: {err}", dir.display()),
    }
}
