//! How complete the native stacks of a profile are, per process: the summary's `native stacks:`
//! lines and the `--stats` JSON file.
//!
//! Every sample carries how its user stack was unwound ([`UnwindStatus`]): complete (the root
//! was reached), truncated (the stack copy or the frame limit cut it), failed (with the reason),
//! or unchecked (`--unwind fp`, where the kernel's frame-pointer walk cannot tell).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use symbolizer::unwind::UnwindStatus;

use crate::profile::Profile;

/// The unwinding outcome of one process's samples.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StackCounts {
    /// Samples whose stack reached its root.
    pub complete: u64,
    /// Samples cut short by a limit.
    pub truncated: u64,
    /// Samples whose unwinding failed.
    pub failed: u64,
    /// Samples unwound by frame pointers in the kernel (`--unwind fp`).
    pub unchecked: u64,
    /// Samples per reason, for truncated and failed ones.
    pub reasons: BTreeMap<&'static str, u64>,
}

impl StackCounts {
    fn add(&mut self, status: UnwindStatus, n: u64) {
        match status {
            UnwindStatus::Complete => self.complete += n,
            UnwindStatus::Truncated(_) => self.truncated += n,
            UnwindStatus::Failed(_) => self.failed += n,
            UnwindStatus::Unchecked => self.unchecked += n,
        }
        if let Some(reason) = status.reason() {
            *self.reasons.entry(reason).or_default() += n;
        }
    }

    fn total(&self) -> u64 {
        self.complete + self.truncated + self.failed + self.unchecked
    }

    /// `99.1% complete, 0.6% truncated (stack copy too small: 9), 0.3% failed (…)`.
    fn describe(&self) -> String {
        let total = self.total().max(1) as f64;
        let pct = |n: u64| 100.0 * n as f64 / total;
        let mut s = String::new();
        if self.unchecked > 0 {
            let _ = write!(
                s,
                "{:.1}% not checked (frame pointers; --unwind dwarf checks)",
                pct(self.unchecked)
            );
            if self.unchecked == self.total() {
                return s;
            }
            s.push_str(", ");
        }
        let _ = write!(
            s,
            "{:.1}% complete, {:.1}% truncated, {:.1}% failed",
            pct(self.complete),
            pct(self.truncated),
            pct(self.failed)
        );
        if !self.reasons.is_empty() {
            let reasons: Vec<String> = self
                .reasons
                .iter()
                .map(|(r, n)| format!("{r}: {n}"))
                .collect();
            let _ = write!(s, " ({})", reasons.join(", "));
        }
        s
    }
}

/// One process's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessStats {
    /// Process id.
    pub pid: u32,
    /// Process name.
    pub name: String,
    /// Samples of the process.
    pub samples: u64,
    /// How its native stacks were unwound.
    pub stacks: StackCounts,
}

/// The `--stats` file.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// `dwarf` or `fp`.
    pub unwind: &'static str,
    /// Bytes of stack copied per sample (0 with frame pointers).
    pub stack_copy_bytes: u32,
    /// Every process, by pid.
    pub processes: Vec<ProcessStats>,
}

/// The figures of every process of `profile`, by pid: on-CPU samples count as many times as
/// they were taken; an off-CPU or allocation stack (whose weight is time or bytes) counts once.
pub fn per_process(profile: &Profile) -> Vec<ProcessStats> {
    let mut by_pid: BTreeMap<u32, StackCounts> = BTreeMap::new();
    for s in &profile.samples {
        let pid = profile.threads[s.thread as usize].pid;
        by_pid.entry(pid).or_default().add(s.unwind, s.count.max(1));
    }
    by_pid
        .into_iter()
        .map(|(pid, stacks)| ProcessStats {
            pid,
            name: profile
                .processes
                .iter()
                .find(|p| p.pid == pid)
                .map(|p| p.name.clone())
                .unwrap_or_default(),
            samples: stacks.total(),
            stacks,
        })
        .collect()
}

/// The `--stats` JSON.
pub fn to_json(profile: &Profile, stack_copy_bytes: u32) -> String {
    let stats = Stats {
        unwind: if stack_copy_bytes == 0 { "fp" } else { "dwarf" },
        stack_copy_bytes,
        processes: per_process(profile),
    };
    let mut json = serde_json::to_string_pretty(&stats).expect("plain data serializes");
    json.push('\n');
    json
}

/// Processes listed one by one in the summary; the rest are in `--stats`.
const SUMMARY_PROCESSES: usize = 10;

/// The summary's lines: `native stacks: …` for the whole profile, then one per process when
/// there are several.
pub fn summary_lines(profile: &Profile) -> Vec<String> {
    let procs = per_process(profile);
    if procs.is_empty() {
        return Vec::new();
    }
    let mut all = StackCounts::default();
    for p in &procs {
        all.complete += p.stacks.complete;
        all.truncated += p.stacks.truncated;
        all.failed += p.stacks.failed;
        all.unchecked += p.stacks.unchecked;
        for (r, n) in &p.stacks.reasons {
            *all.reasons.entry(r).or_default() += n;
        }
    }
    let mut lines = vec![format!("native stacks: {}", all.describe())];
    if procs.len() > 1 {
        let mut by_samples: Vec<&ProcessStats> = procs.iter().collect();
        by_samples.sort_by_key(|p| std::cmp::Reverse(p.samples));
        for p in by_samples.iter().take(SUMMARY_PROCESSES) {
            lines.push(format!(
                "  {} ({}), {} samples: {}",
                p.pid,
                p.name,
                p.samples,
                p.stacks.describe()
            ));
        }
        if procs.len() > SUMMARY_PROCESSES {
            lines.push(format!(
                "  … and {} more processes (--stats FILE lists them all)",
                procs.len() - SUMMARY_PROCESSES
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use symbolizer::unwind::{FailedBy, TruncatedBy};

    #[test]
    fn several_processes_get_a_line_each_and_the_json_all() {
        let mut profile = crate::format::fixture::profile();
        profile.threads[1].pid = 200;
        profile.processes.push(crate::profile::Process {
            pid: 200,
            name: "other".to_string(),
            info: Default::default(),
        });
        for s in &mut profile.samples {
            s.unwind = if s.thread == 0 {
                UnwindStatus::Complete
            } else {
                UnwindStatus::Truncated(TruncatedBy::StackCopy)
            };
        }
        // Thread 0 (pid 100): 5 + 2 samples; thread 1 (pid 200): 3 + 1.
        assert_eq!(
            summary_lines(&profile),
            [
                "native stacks: 63.6% complete, 36.4% truncated, 0.0% failed \
                 (stack copy too small: 4)",
                "  100 (app), 7 samples: 100.0% complete, 0.0% truncated, 0.0% failed",
                "  200 (other), 4 samples: 0.0% complete, 100.0% truncated, 0.0% failed \
                 (stack copy too small: 4)",
            ]
        );
        let json: serde_json::Value = serde_json::from_str(&to_json(&profile, 16384)).unwrap();
        assert_eq!(json["unwind"], "dwarf");
        assert_eq!(json["processes"][1]["pid"], 200);
        assert_eq!(json["processes"][1]["stacks"]["truncated"], 4);
        assert_eq!(
            json["processes"][1]["stacks"]["reasons"]["stack copy too small"],
            4
        );
    }

    #[test]
    fn counts_describe_shares_and_reasons() {
        let mut c = StackCounts::default();
        c.add(UnwindStatus::Complete, 97);
        c.add(UnwindStatus::Truncated(TruncatedBy::StackCopy), 2);
        c.add(UnwindStatus::Failed(FailedBy::OutsideStack), 1);
        assert_eq!(
            c.describe(),
            "97.0% complete, 2.0% truncated, 1.0% failed \
             (frame outside the stack: 1, stack copy too small: 2)"
        );
        let mut fp = StackCounts::default();
        fp.add(UnwindStatus::Unchecked, 5);
        assert_eq!(
            fp.describe(),
            "100.0% not checked (frame pointers; --unwind dwarf checks)"
        );
    }
}
