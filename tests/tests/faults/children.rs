//! Faults: children (see main.rs). `profile -- CMD` whose command starts 200 children of 20 ms
//! each, one at a time: the children exit long before the 50 ms tick of the sampling loop, so
//! what names their addresses (their memory map, module files and unwind tables) must be read
//! while they live (at their first sample, which wakes the loop) and kept after they exit until
//! their samples are drained. Before, 27% of such children's samples lost their stacks.
//!
//! Two kinds of children: forked ones that stay the forker (`short_children`'s own
//! `short_child_work`), and children that exec one of 200 copies of it, each with its own build
//! id and inode (distinct binaries, whose modules nobody else maps).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use spanprof_tests::{
    decode_pprof, profiling_lock, require_root, run_with_timeout, sample_str_labels, spanprof_bin,
    spanprof_command, workload_path, TempDir,
};

/// Children started, one after another.
const CHILDREN: usize = 200;
/// How long each child is busy.
const CHILD_MS: u32 = 20;
/// Share of the children's samples that must be named from root to leaf.
const NAMED_SHARE: f64 = 0.95;

/// Writes `n` copies of the ELF file `src` into `dir` as `{prefix}0` … `{prefix}{n-1}`, each with
/// another GNU build id (the note's descriptor bytes patched), mode 0755. Returns the path
/// prefix.
pub(crate) fn distinct_copies(src: &Path, dir: &Path, prefix: &str, n: usize) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bytes = std::fs::read(src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    // The note header: namesz 4, descsz, type NT_GNU_BUILD_ID (3), "GNU\0".
    let at = bytes
        .windows(16)
        .position(|w| w[0..4] == [4, 0, 0, 0] && w[8..12] == [3, 0, 0, 0] && &w[12..16] == b"GNU\0")
        .unwrap_or_else(|| panic!("{} has no GNU build id note", src.display()));
    let descsz = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
    assert!(descsz >= 8, "build id of {descsz} bytes");
    let id = at + 16;
    for i in 0..n {
        let mut copy = bytes.clone();
        copy[id..id + 8].copy_from_slice(&(0x5eed_0000_0000_0000u64 | i as u64).to_le_bytes());
        let path = dir.join(format!("{prefix}{i}"));
        std::fs::write(&path, &copy).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir.join(prefix)
}

/// The pid label of a decoded pprof sample.
fn sample_pid(sample: &Value) -> Option<u64> {
    sample["labels"]
        .as_array()?
        .iter()
        .find(|l| l["key"] == "process.id")?["num"]
        .as_u64()
}

/// A frame name that is no function's (`[unknown] (…)`, `[no stack]`, …).
fn unnamed(frame: &str) -> bool {
    frame.is_empty() || frame.starts_with('[')
}

/// Profiles `short_children start 200 20 1 MODE` at 999 Hz; checks that the children's samples
/// are named and in `short_child_work` under `main`, in `module` (a path prefix) when given.
fn children_are_named(mode: &str, dir: &TempDir, module: Option<&str>) {
    let out_path = dir.join("children.pb.gz");
    let mut cmd = spanprof_command(["profile", "-F", "999", "--no-kernel", "-o"]);
    cmd.arg(&out_path)
        .arg("--")
        .arg(workload_path("short_children"))
        .args([
            "start",
            &CHILDREN.to_string(),
            &CHILD_MS.to_string(),
            "1",
            mode,
        ]);
    let out = run_with_timeout(cmd, Duration::from_secs(180));
    out.assert_success();
    let parent: u64 = out
        .stdout
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid line: {out}"));
    let json = decode_pprof(&out_path);
    let mut total = 0i64;
    let mut exited = 0i64;
    let mut named = 0i64;
    let mut in_work = 0i64;
    let mut pids = std::collections::BTreeSet::new();
    let mut lost: std::collections::BTreeMap<String, i64> = Default::default();
    for sample in json["samples"].as_array().unwrap() {
        let Some(pid) = sample_pid(sample) else {
            panic!("a sample without process.id: {sample}");
        };
        if pid == parent {
            continue;
        }
        // A child that exited before its samples were drained is not unwound, and its samples
        // say so (`unwind.reason`): not a wrong name but the known limit, bounded below.
        if sample_str_labels(sample)
            .get("unwind.reason")
            .map(String::as_str)
            == Some("process exited before unwinding")
        {
            pids.insert(pid);
            exited += sample["values"][0].as_i64().unwrap();
            continue;
        }
        pids.insert(pid);
        let weight = sample["values"][0].as_i64().unwrap();
        total += weight;
        let frames: Vec<&str> = sample["stack_root_first"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap_or(""))
            .collect();
        if !frames.is_empty() && !frames.iter().any(|f| unnamed(f)) {
            named += weight;
        } else {
            *lost.entry(frames.join(";")).or_default() += weight;
        }
        let main = frames.iter().position(|f| *f == "main");
        let work = frames.iter().position(|f| *f == "short_child_work");
        if main.zip(work).is_some_and(|(m, w)| m < w) {
            in_work += weight;
        }
    }
    if let Some(module) = module {
        // The children's frames are in their own binaries.
        let modules: std::collections::BTreeSet<&str> = json["mappings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["filename"].as_str())
            .filter(|f| f.starts_with(module))
            .collect();
        eprintln!("{} distinct child binaries in the mappings", modules.len());
        assert!(
            modules.len() as f64 >= 0.75 * CHILDREN as f64,
            "only {} of the {CHILDREN} child binaries are in the profile's mappings",
            modules.len()
        );
    }
    let mut lost: Vec<(i64, String)> = lost.into_iter().map(|(s, w)| (w, s)).collect();
    lost.sort_unstable_by(|a, b| b.cmp(a));
    eprintln!(
        "children with samples: {} of {CHILDREN}; their samples: {total} unwound, named {named} \
         ({:.1}%), in main;…;short_child_work {in_work}; {exited} not unwound (exited first); \
         not named, most first: {:?}",
        pids.len(),
        100.0 * named as f64 / total.max(1) as f64,
        &lost[..lost.len().min(5)]
    );
    // Each child is busy 20 ms: about 20 samples at 999 Hz, fewer on a loaded machine.
    assert!(
        pids.len() as f64 >= 0.75 * CHILDREN as f64,
        "only {} of {CHILDREN} children have samples\n{out}",
        pids.len()
    );
    assert!(total >= 1000, "only {total} samples of the children\n{out}");
    assert!(
        exited as f64 <= 0.1 * (total + exited) as f64,
        "{exited} of {} samples of the children not unwound: their process exited first\n{out}",
        total + exited
    );
    assert!(
        named as f64 >= NAMED_SHARE * total as f64,
        "{named} of {total} samples of the children named from root to leaf; not named, most \
         first: {:?}\n{out}",
        &lost[..lost.len().min(10)]
    );
    assert!(
        in_work as f64 >= 0.8 * total as f64,
        "{in_work} of {total} samples of the children in main;…;short_child_work\n{out}"
    );
}

/// Children that exec distinct binaries (copies of the forker with their own build ids): each
/// binary is mapped by one short-lived process only.
#[test]
fn short_lived_children_that_exec_distinct_binaries_are_named() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let dir = TempDir::new("faults-children-exec");
    let prefix = distinct_copies(
        &workload_path("short_children"),
        dir.path(),
        "child_",
        CHILDREN,
    );
    let prefix = prefix.to_str().unwrap();
    children_are_named(prefix, &dir, Some(prefix));
}

/// Forked children that stay the forker: the same module as their parent, another process.
#[test]
fn short_lived_forked_children_are_named() {
    require_root();
    spanprof_bin();
    let _lock = profiling_lock();
    let dir = TempDir::new("faults-children-fork");
    children_are_named("fork", &dir, None);
}
