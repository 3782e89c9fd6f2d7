//! Native stacks unwound with .eh_frame: the `--stats` JSON, the summary's `native stacks:`
//! line, and the workloads built without frame pointers (`cargo xtask workloads`:
//! `cpu_split_nofp`, `qsort_callback`, `dlopen_late`, the `spanprof_cext` module of
//! `py_cext.py`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{
    is_kernel_frame, missing_prerequisite, run_with_timeout, system_python, workloads_dir,
    FoldedStack,
};

/// What `spanprof profile --stats PATH` says of one process's native stacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUnwindStats {
    pub pid: u32,
    pub name: String,
    pub samples: u64,
    /// Stacks unwound to their root.
    pub complete: u64,
    /// Stacks cut short (stack copy too small, too many frames, …).
    pub truncated: u64,
    /// Stacks the unwinder gave up on.
    pub failed: u64,
    /// Stacks whose completeness cannot be known (`--unwind fp`).
    pub unchecked: u64,
    /// Why stacks were truncated or failed, and how many.
    pub reasons: std::collections::BTreeMap<String, u64>,
}

impl ProcessUnwindStats {
    /// `complete` in percent of `samples` (0 without samples).
    pub fn complete_share(&self) -> f64 {
        100.0 * self.complete as f64 / self.samples.max(1) as f64
    }

    /// The four kinds of stacks together (each sample's stack is one of them).
    pub fn classified(&self) -> u64 {
        self.complete + self.truncated + self.failed + self.unchecked
    }
}

/// The `--stats` JSON: `{"unwind": "dwarf"|"fp", "processes": [{"pid", "name", "samples",
/// "stacks": {"complete", "truncated", "failed", "unchecked", "reasons": {REASON: N}}}]}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnwindStats {
    pub unwind: String,
    pub processes: Vec<ProcessUnwindStats>,
}

impl UnwindStats {
    /// The process `pid`, if the stats have it.
    pub fn process(&self, pid: u32) -> Option<&ProcessUnwindStats> {
        self.processes.iter().find(|p| p.pid == pid)
    }
}

/// Parses the `--stats` JSON; `Err` says which field is missing or malformed. Fields other
/// than those of [`UnwindStats`] are ignored; a missing `reasons` is an empty one.
pub fn parse_unwind_stats(text: &str) -> Result<UnwindStats, String> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let unwind = json["unwind"]
        .as_str()
        .ok_or("no string `unwind`")?
        .to_owned();
    let mut processes = Vec::new();
    for (i, p) in json["processes"]
        .as_array()
        .ok_or("no array `processes`")?
        .iter()
        .enumerate()
    {
        let number = |v: &serde_json::Value, what: &str| -> Result<u64, String> {
            v.as_u64()
                .ok_or_else(|| format!("processes[{i}]: `{what}` is not a non-negative integer"))
        };
        let stacks = &p["stacks"];
        if !stacks.is_object() {
            return Err(format!("processes[{i}]: no object `stacks`"));
        }
        let mut reasons = std::collections::BTreeMap::new();
        match &stacks["reasons"] {
            serde_json::Value::Null => {}
            serde_json::Value::Object(map) => {
                for (reason, n) in map {
                    reasons.insert(reason.clone(), number(n, &format!("reasons.{reason}"))?);
                }
            }
            _ => return Err(format!("processes[{i}]: `stacks.reasons` is not an object")),
        }
        let pid = number(&p["pid"], "pid")?;
        processes.push(ProcessUnwindStats {
            pid: u32::try_from(pid).map_err(|_| format!("processes[{i}]: pid {pid} too large"))?,
            name: p["name"]
                .as_str()
                .ok_or_else(|| format!("processes[{i}]: no string `name`"))?
                .to_owned(),
            samples: number(&p["samples"], "samples")?,
            complete: number(&stacks["complete"], "stacks.complete")?,
            truncated: number(&stacks["truncated"], "stacks.truncated")?,
            failed: number(&stacks["failed"], "stacks.failed")?,
            unchecked: number(&stacks["unchecked"], "stacks.unchecked")?,
            reasons,
        });
    }
    Ok(UnwindStats { unwind, processes })
}

/// Reads and parses a `--stats` file, panicking with its text when malformed.
#[track_caller]
pub fn read_unwind_stats(path: &Path) -> UnwindStats {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the stats file {}: {e}", path.display()));
    parse_unwind_stats(&text)
        .unwrap_or_else(|e| panic!("malformed stats file {}: {e}\n{text}", path.display()))
}

/// The `native stacks: …` line of spanprof's end-of-session summary, if any.
pub fn native_stacks_line(stderr: &str) -> Option<&str> {
    stderr.lines().find(|l| l.starts_with("native stacks:"))
}

impl FoldedStack {
    /// The frames without the kernel frames at the leaf end (an interrupt or a system call
    /// taken in the user code): the user stack, root first.
    pub fn user_frames(&self) -> &[String] {
        let kernel = self
            .frames
            .iter()
            .rev()
            .take_while(|f| is_kernel_frame(f))
            .count();
        &self.frames[..self.frames.len() - kernel]
    }

    /// The innermost frame that is not a kernel frame.
    pub fn user_leaf(&self) -> Option<&str> {
        self.user_frames().last().map(String::as_str)
    }
}

/// Debian's interpreter the C extension workload is built for.
pub const SYSTEM_PYTHON_3_11: &str = "/usr/bin/python3.11";

/// The directory of the `spanprof_cext` module (`<workloads>/cext`), checked by importing it
/// with Debian's `/usr/bin/python3.11`.
#[track_caller]
pub fn cext_dir() -> PathBuf {
    let python = system_python(SYSTEM_PYTHON_3_11, "python3.11-dev");
    let dir = workloads_dir().join("cext");
    let mut cmd = Command::new(&python);
    cmd.args([
        "-c",
        "import sys; sys.path.insert(0, sys.argv[1]); import spanprof_cext",
    ])
    .arg(&dir)
    .env("PYTHONNOUSERSITE", "1");
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    if !out.status.success() {
        missing_prerequisite(
            &format!(
                "the C extension module spanprof_cext in {}, importable by {}:\n{out}",
                dir.display(),
                python.display()
            ),
            "`cargo xtask workloads` (builds it with Debian's python3.11-dev, which \
             `cargo xtask deps` installs)",
        );
    }
    dir
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_folded;

    #[test]
    fn parses_unwind_stats() {
        let text = r#"{"unwind":"dwarf","processes":[{"pid":123,"name":"cpu_split_nofp",
            "samples":1500,"stacks":{"complete":1490,"truncated":5,"failed":5,"unchecked":0,
            "reasons":{"stack copy too small":5,"no unwind info":5}}}]}"#;
        let stats = parse_unwind_stats(text).unwrap();
        assert_eq!(stats.unwind, "dwarf");
        let p = stats.process(123).unwrap();
        assert_eq!(
            (p.samples, p.complete, p.truncated, p.failed, p.unchecked),
            (1500, 1490, 5, 5, 0)
        );
        assert_eq!(p.classified(), 1500);
        assert_eq!(p.reasons["stack copy too small"], 5);
        assert!((p.complete_share() - 99.33).abs() < 0.01);
        assert!(stats.process(7).is_none());

        let fp = r#"{"unwind":"fp","processes":[{"pid":9,"name":"x","samples":3,
            "stacks":{"complete":0,"truncated":0,"failed":0,"unchecked":3}}]}"#;
        assert!(parse_unwind_stats(fp).unwrap().processes[0]
            .reasons
            .is_empty());
        for bad in [
            "",
            r#"{"processes":[]}"#,
            r#"{"unwind":"dwarf"}"#,
            r#"{"unwind":"dwarf","processes":[{"pid":1,"name":"x","samples":1}]}"#,
            r#"{"unwind":"dwarf","processes":[{"pid":1,"name":"x","samples":-1,
                "stacks":{"complete":0,"truncated":0,"failed":0,"unchecked":0}}]}"#,
            r#"{"unwind":"dwarf","processes":[{"pid":1,"name":"x","samples":1,
                "stacks":{"complete":1,"truncated":0,"failed":0}}]}"#,
        ] {
            assert!(parse_unwind_stats(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn user_frames_drop_the_kernel_leaf() {
        let stacks = parse_folded(
            "main;hot;asm_sysvec_apic_timer_interrupt_[k];handle_softirqs_[k] 2\n\
             main;hot 1\n\
             ret_from_fork_[k] 1\n",
        )
        .unwrap();
        assert_eq!(stacks[0].user_leaf(), Some("hot"));
        assert_eq!(stacks[0].user_frames(), &stacks[1].frames[..]);
        assert_eq!(stacks[2].user_leaf(), None);
        let line = "spanprof: 3 samples\nnative stacks: 3 complete\n";
        assert_eq!(native_stacks_line(line), Some("native stacks: 3 complete"));
    }
}
