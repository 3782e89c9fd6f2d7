//! The speedscope JSON file format (<https://www.speedscope.app/file-format-schema.json>).
//!
//! # Layout
//!
//! - `shared.frames`: one entry per distinct (display name, source file), so a function sampled
//!   at several addresses is one node, as in the flame graph. `name` is
//!   [`Frame::display_name`](crate::profile::Frame::display_name) (kernel frames end in `_[k]`),
//!   `file` the source file when known, and `line` only when every merged frame has the same line
//!   (speedscope shows it as the function's location, not a sample's).
//! - `profiles`: one `sampled` profile per group of threads that has samples, in thread-table
//!   order: the threads of a process whose names are one once their numbers are left out
//!   ([`thread_group`]: the 1,285 `Thread-N (process_request_thread)` of a thread-per-request
//!   server are one profile), named `comm (tid N)` for a thread alone, `process_request_thread
//!   (pid P, 1285 threads)` for several; [`Threads::PerThread`] (`--speedscope-per-thread`)
//!   makes one per thread. `samples` are arrays of frame indexes, root first (speedscope builds its call
//!   tree from the first element down); `weights` are nanoseconds: CPU time,
//!   `count * 1e9 / frequency`, plus off-CPU time (an off-CPU sample, under its `[off-cpu:
//!   REASON]` root frame, weighs the time its thread was blocked), with `unit` `nanoseconds`,
//!   `startValue` 0 and `endValue` the sum of the weights. When the session kept each event's
//!   time ([`Sample::times`](crate::profile::Sample::times): `spanprof profile` does for a
//!   speedscope output), a thread's samples are its events in time order, consecutive events
//!   of one stack merged, so the "time order" view is a timeline of the thread (its on-CPU
//!   time, and its blocked time with `offcpu`/`wall`; each event weighs its share of its
//!   stack's weight, so totals do not change); a group's are its threads' events in time
//!   order, which add up to more than the session when the threads ran at once; otherwise (a profile read back from pprof or
//!   folded) they are aggregated, one per distinct stack, in profile order. A memory profile (`--event alloc`,
//!   `heap`) has `unit` `bytes` and weighs each stack its [`Profile::weight`]: the bytes still in
//!   use at the end when the heap is in it, else the bytes allocated.
//! - `name` is the target (`off-CPU time of <target>`, `CPU + off-CPU time of …` or `wall-clock
//!   time of …` when off-CPU time is in the profile, `memory allocated by <target>` or `memory in
//!   use at the end in <target>` for a memory profile: [`super::shown`]), `exporter`
//!   `spanprof@<version>` (the spec's recommended form) and `activeProfileIndex` the thread with
//!   the most weight.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{validate, OutputError};
use crate::profile::Profile;
use crate::wording::shown;

/// The `$schema` value that identifies a speedscope file.
pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// A speedscope file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct File {
    /// Always [`SCHEMA`].
    #[serde(rename = "$schema")]
    pub schema: String,
    /// Frames shared by all profiles.
    pub shared: Shared,
    /// One profile per group of threads (or per thread).
    pub profiles: Vec<SampledProfile>,
    /// Name of the profile group: the target.
    pub name: String,
    /// Index into `profiles` shown first.
    pub active_profile_index: usize,
    /// `spanprof@<version>`.
    pub exporter: String,
}

/// Data shared between the profiles of a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shared {
    /// Frames that samples refer to by index.
    pub frames: Vec<SpeedscopeFrame>,
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeedscopeFrame {
    /// Display name.
    pub name: String,
    /// Source file, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Source line, when known and the same for every address merged into this frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// A `sampled` profile: weighted stacks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SampledProfile {
    /// Always `sampled`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `comm (tid N)`, or `GROUP (pid P, N threads)`.
    pub name: String,
    /// Unit of the weights: `nanoseconds`, or `bytes` for a memory profile.
    pub unit: String,
    /// Always 0.
    pub start_value: u64,
    /// Sum of `weights`.
    pub end_value: u64,
    /// Stacks as indexes into [`Shared::frames`], root first.
    pub samples: Vec<Vec<usize>>,
    /// Weight of each stack in nanoseconds (CPU time plus off-CPU time), or bytes.
    pub weights: Vec<u64>,
}

/// Which threads one speedscope profile holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Threads {
    /// The threads of a process with one name once its number is left out
    /// ([`thread_group`]): a pool's or a thread-per-request server's threads are one profile.
    #[default]
    ByName,
    /// Each thread its own profile.
    PerThread,
}

/// Renders the profile as speedscope JSON, one profile per group of threads of a name.
pub fn render(profile: &Profile) -> Result<Vec<u8>, OutputError> {
    render_threads(profile, Threads::ByName)
}

/// Renders the profile as speedscope JSON, its threads grouped as `threads` says.
pub fn render_threads(profile: &Profile, threads: Threads) -> Result<Vec<u8>, OutputError> {
    serde_json::to_vec(&build_threads(profile, threads)?).map_err(OutputError::Json)
}

/// What threads of one name are called once their number is left out, as a user thinks of
/// them: `Thread-12 (process_request_thread)` (Python 3.10+'s name of a thread running
/// `process_request_thread`) is `process_request_thread`, `ThreadPoolExecutor-0_3` and
/// `worker-7` are `ThreadPoolExecutor` and `worker` (a number is left out when a separator,
/// `-`, `_`, `:`, `#` or a space, comes before it: `python3.11` stays whole).
pub fn thread_group(name: &str) -> &str {
    if let Some(target) = name
        .strip_prefix("Thread-")
        .and_then(|rest| rest.split_once(" ("))
        .filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|(_, t)| t.strip_suffix(')'))
        .filter(|t| !t.is_empty())
    {
        return target;
    }
    // Numbers at the end, each after a separator: `ThreadPoolExecutor-0_3`, not the version
    // of `python3.11`.
    let mut rest = name;
    loop {
        let digits = rest.len() - rest.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let head = &rest[..rest.len() - digits];
        match head.strip_suffix(['-', '_', ':', '#', ' ']) {
            Some(h) if digits > 0 && !h.is_empty() => rest = h,
            _ => return rest,
        }
    }
}

/// Builds the speedscope file for the profile, one profile per group of threads of a name.
pub fn build(profile: &Profile) -> Result<File, OutputError> {
    build_threads(profile, Threads::ByName)
}

/// Builds the speedscope file for the profile, its threads grouped as `threads` says.
pub fn build_threads(profile: &Profile, threads: Threads) -> Result<File, OutputError> {
    validate(profile)?;
    // The group of each thread, and each group's threads, in thread-table order.
    let mut group_of: Vec<usize> = Vec::with_capacity(profile.threads.len());
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_ids: HashMap<(u32, &str), usize> = HashMap::new();
    for (i, t) in profile.threads.iter().enumerate() {
        let g = match threads {
            Threads::PerThread => groups.len(),
            Threads::ByName => *group_ids
                .entry((t.pid, thread_group(&t.name)))
                .or_insert(groups.len()),
        };
        if g == groups.len() {
            groups.push(Vec::new());
        }
        groups[g].push(i);
        group_of.push(g);
    }
    let period = profile.meta.period_ns();
    let in_bytes = profile.meta.events.in_bytes();

    // Map our frames to speedscope frames, merging addresses of the same function, and only
    // for frames that samples use.
    let mut frames: Vec<SpeedscopeFrame> = Vec::new();
    let mut frame_ids: HashMap<(String, Option<&str>), usize> = HashMap::new();
    // `None` while unassigned; the line is cleared on the first disagreement.
    let mut index_of: Vec<Option<usize>> = vec![None; profile.frames.len()];
    let mut line_conflict: Vec<bool> = Vec::new();

    // Samples per thread, in thread-table order; with event times (time-weighted profiles
    // of a session that kept them), each thread's events in time order.
    let mut per_group: Vec<(Vec<Vec<usize>>, Vec<u64>)> =
        vec![(Vec::new(), Vec::new()); groups.len()];
    let mut timed: Vec<Vec<(u64, usize, u64)>> = vec![Vec::new(); groups.len()];
    let mut untimed = vec![in_bytes; groups.len()];
    for sample in &profile.samples {
        // NB: the same as `Profile::weight` when off-CPU time or memory is in the profile; an
        // on-CPU profile's weights are nanoseconds here too (its off_cpu_ns are 0).
        let weight = if in_bytes {
            profile.weight(sample)
        } else {
            sample
                .count
                .saturating_mul(period)
                .saturating_add(sample.off_cpu_ns)
        };
        if weight == 0 {
            // NB: speedscope ignores zero weights; leave them out rather than send noise.
            continue;
        }
        let stack = sample
            .frames
            .iter()
            .map(|&f| {
                *index_of[f as usize].get_or_insert_with(|| {
                    let frame = &profile.frames[f as usize];
                    let key = (frame.display_name(), frame.file.as_deref());
                    let id = *frame_ids.entry(key).or_insert_with(|| {
                        frames.push(SpeedscopeFrame {
                            name: frame.display_name(),
                            file: frame.file.clone(),
                            line: frame.line,
                        });
                        line_conflict.push(false);
                        frames.len() - 1
                    });
                    if frames[id].line != frame.line {
                        line_conflict[id] = true;
                    }
                    id
                })
            })
            .collect();
        let thread = group_of[sample.thread as usize];
        let (samples, weights) = &mut per_group[thread];
        if sample.times.is_empty() {
            untimed[thread] = true;
        } else if !untimed[thread] {
            // The sample's weight shared among its events by their values, so the thread's
            // total stays the same (an off-CPU estimate is not the sum of the sampled
            // intervals).
            // NB: u128: values come from files (a recording) and may be anything.
            let values: u128 = sample
                .times
                .iter()
                .map(|t| u128::from(t.value.max(1)))
                .sum();
            let mut left = weight;
            for (i, t) in sample.times.iter().enumerate() {
                let share = if i + 1 == sample.times.len() {
                    left
                } else {
                    let share = (u128::from(weight) * u128::from(t.value.max(1)) / values) as u64;
                    share.min(left)
                };
                left -= share;
                timed[thread].push((t.unix_ns, samples.len(), share));
            }
        }
        samples.push(stack);
        weights.push(weight);
    }
    // A thread whose every sample has its times is written as a timeline: its events in time
    // order, runs of one stack merged.
    for (thread, events) in timed.iter_mut().enumerate() {
        if untimed[thread] || events.is_empty() {
            continue;
        }
        events.sort_unstable();
        let (stacks, _) = &per_group[thread];
        let mut samples: Vec<Vec<usize>> = Vec::new();
        let mut weights: Vec<u64> = Vec::new();
        let mut last = None;
        for &(_, stack, weight) in events.iter() {
            if weight == 0 {
                continue;
            }
            match (last, weights.last_mut()) {
                (Some(prev), Some(w)) if stacks[prev] == stacks[stack] => {
                    *w = w.saturating_add(weight)
                }
                _ => {
                    samples.push(stacks[stack].clone());
                    weights.push(weight);
                }
            }
            last = Some(stack);
        }
        per_group[thread] = (samples, weights);
    }
    for (frame, conflict) in frames.iter_mut().zip(line_conflict) {
        if conflict {
            frame.line = None;
        }
    }

    let mut profiles = Vec::new();
    let mut active_profile_index = 0;
    let mut heaviest = 0;
    for (members, (samples, weights)) in groups.iter().zip(per_group) {
        if samples.is_empty() {
            continue;
        }
        let end_value = weights.iter().fold(0u64, |sum, &w| sum.saturating_add(w));
        if end_value > heaviest {
            heaviest = end_value;
            active_profile_index = profiles.len();
        }
        profiles.push(SampledProfile {
            kind: "sampled".to_string(),
            name: match members.as_slice() {
                [one] => {
                    let t = &profile.threads[*one];
                    format!("{} (tid {})", t.name, t.tid)
                }
                _ => {
                    let t = &profile.threads[members[0]];
                    format!(
                        "{} (pid {}, {} threads)",
                        thread_group(&t.name),
                        t.pid,
                        members.len()
                    )
                }
            },
            unit: if in_bytes { "bytes" } else { "nanoseconds" }.to_string(),
            start_value: 0,
            end_value,
            samples,
            weights,
        });
    }

    Ok(File {
        schema: SCHEMA.to_string(),
        shared: Shared { frames },
        profiles,
        name: shown(&profile.meta),
        active_profile_index,
        exporter: concat!("spanprof@", env!("CARGO_PKG_VERSION")).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::format::fixture;

    fn names(file: &File, stack: &[usize]) -> Vec<String> {
        stack
            .iter()
            .map(|&i| file.shared.frames[i].name.clone())
            .collect()
    }

    #[test]
    fn json_shape() {
        let bytes = render(&fixture::profile()).unwrap();
        let json: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(json["$schema"], SCHEMA);
        assert_eq!(json["name"], "pid 100 (app)");
        assert_eq!(
            json["exporter"],
            concat!("spanprof@", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(json["activeProfileIndex"], 0);
        let profile = &json["profiles"][0];
        assert_eq!(profile["type"], "sampled");
        assert_eq!(profile["name"], "app (tid 100)");
        assert_eq!(profile["unit"], "nanoseconds");
        assert_eq!(profile["startValue"], 0);
        assert_eq!(profile["endValue"], 70_000_000);
        assert_eq!(json["profiles"][1]["name"], "worker (tid 101)");
        // Unknown frames have neither file nor line.
        let unknown = json["shared"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "[unknown] (libfoo.so+0x1234)")
            .unwrap();
        assert_eq!(unknown.as_object().unwrap().len(), 1);
    }

    #[test]
    fn stacks_are_root_first_with_nanosecond_weights() {
        let file: File = serde_json::from_slice(&render(&fixture::profile()).unwrap()).unwrap();
        assert_eq!(file.profiles.len(), 2);

        let app = &file.profiles[0];
        assert_eq!(names(&file, &app.samples[0]), ["main", "compute"]);
        assert_eq!(
            names(&file, &app.samples[1]),
            ["main", "compute", "do_syscall_64_[k]"]
        );
        assert_eq!(app.weights, [50_000_000, 20_000_000]);

        let worker = &file.profiles[1];
        assert_eq!(names(&file, &worker.samples[0]), ["main", "compute"]);
        assert_eq!(
            names(&file, &worker.samples[1]),
            ["main", "[unknown] (libfoo.so+0x1234)"]
        );
        assert_eq!(worker.weights, [30_000_000, 10_000_000]);
        assert_eq!(worker.end_value, 40_000_000);
        for p in &file.profiles {
            assert_eq!(p.samples.len(), p.weights.len());
        }
    }

    #[test]
    fn a_thread_with_event_times_is_a_timeline() {
        use crate::profile::Timed;
        let mut profile = fixture::profile();
        let at = |ts: &[u64]| -> Vec<Timed> {
            ts.iter()
                .map(|&unix_ns| Timed { unix_ns, value: 1 })
                .collect()
        };
        // Thread 0: `compute` 5 times, the syscall twice in the middle of them.
        for s in profile.samples.iter_mut().filter(|s| s.thread == 0) {
            s.times = match (s.frames.len(), s.count) {
                (2, 5) => at(&[10, 20, 50, 60, 70]),
                (3, 2) => at(&[30, 40]),
                other => panic!("unexpected fixture sample {other:?}"),
            };
        }
        let file = build(&profile).unwrap();
        let app = &file.profiles[0];
        let stacks: Vec<Vec<String>> = app.samples.iter().map(|s| names(&file, s)).collect();
        assert_eq!(
            stacks,
            [
                vec!["main", "compute"],
                vec!["main", "compute", "do_syscall_64_[k]"],
                vec!["main", "compute"],
            ]
        );
        assert_eq!(app.weights, [20_000_000, 20_000_000, 30_000_000]);
        assert_eq!(app.end_value, 70_000_000);
        // Thread 1 has no times: aggregated as before.
        assert_eq!(file.profiles[1].weights, [30_000_000, 10_000_000]);

        // Values from a file may be anything: no overflow, the weight still shared whole.
        for s in profile.samples.iter_mut().filter(|s| s.thread == 0) {
            for t in &mut s.times {
                t.value = u64::MAX;
            }
        }
        let file = build(&profile).unwrap();
        assert_eq!(file.profiles[0].end_value, 70_000_000);
    }

    #[test]
    fn frames_merge_by_function_and_keep_unambiguous_lines() {
        let file = build(&fixture::profile()).unwrap();
        // `compute` at two addresses is one frame; main, compute, kernel, unknown.
        assert_eq!(file.shared.frames.len(), 4);
        let compute = &file.shared.frames[1];
        assert_eq!(compute.name, "compute");
        assert_eq!(compute.file.as_deref(), Some("src/app.c"));
        // Lines 42 and 43 disagree, so no line.
        assert_eq!(compute.line, None);
        let main = &file.shared.frames[0];
        assert_eq!((main.name.as_str(), main.line), ("main", Some(10)));
    }

    #[test]
    fn heaviest_thread_is_active() {
        let mut profile = fixture::profile();
        profile.samples[1].count = 100;
        let file = build(&profile).unwrap();
        assert_eq!(file.active_profile_index, 1);
    }

    #[test]
    fn memory_samples_weigh_their_bytes() {
        let file = build(&fixture::memory()).unwrap();
        assert_eq!(file.name, "memory in use at the end in pid 100 (app)");
        // In use at the end; the stack whose allocations were all freed is left out.
        let app = &file.profiles[0];
        assert_eq!(app.unit, "bytes");
        assert_eq!(app.weights, [800_000_000, 20_000_000]);
        assert_eq!(app.end_value, 820_000_000);
        let worker = &file.profiles[1];
        assert_eq!(worker.unit, "bytes");
        assert_eq!(
            names(&file, &worker.samples[0]),
            ["main", "[unknown] (libfoo.so+0x1234)"]
        );
        assert_eq!(worker.weights, [3_500_000]);
        assert_eq!(file.active_profile_index, 0);
        assert_eq!(build(&fixture::heap_only()).unwrap(), file);

        let alloc = build(&fixture::alloc_only()).unwrap();
        assert_eq!(alloc.name, "memory allocated by pid 100 (app)");
        assert_eq!(alloc.profiles[0].weights, [1_200_000_000, 30_000_000]);
        assert_eq!(alloc.profiles[1].weights, [50_000_000, 3_500_000]);
        let json: Value = serde_json::from_slice(&render(&fixture::alloc_only()).unwrap()).unwrap();
        assert_eq!(json["profiles"][1]["unit"], "bytes");
        assert_eq!(json["profiles"][1]["endValue"], 53_500_000);
    }

    #[test]
    fn off_cpu_samples_weigh_their_blocked_time() {
        let file = build(&fixture::off_cpu()).unwrap();
        assert_eq!(file.name, "CPU + off-CPU time of pid 100 (app)");
        let app = &file.profiles[0];
        assert_eq!(
            names(&file, &app.samples[2]),
            ["[off-cpu: lock]", "main", "compute", "do_syscall_64_[k]"]
        );
        assert_eq!(app.weights, [50_000_000, 20_000_000, fixture::LOCK_NS]);
        let worker = &file.profiles[1];
        assert_eq!(
            names(&file, &worker.samples[2]),
            ["[off-cpu: sleep]", "main"]
        );
        assert_eq!(
            worker.weights,
            [30_000_000, 10_000_000, fixture::SLEEP_NS, fixture::LOCK2_NS]
        );
        assert_eq!(worker.end_value, 40_000_000 + 265_500_000);
        // The sleeper weighs most.
        assert_eq!(file.active_profile_index, 1);

        let only = build(&fixture::off_cpu_only()).unwrap();
        assert_eq!(only.name, "off-CPU time of pid 100 (app)");
        assert_eq!(only.profiles[0].weights, [fixture::LOCK_NS]);
        assert_eq!(
            only.profiles[1].weights,
            [fixture::SLEEP_NS, fixture::LOCK2_NS]
        );
        let wall = build(&fixture::wall()).unwrap();
        assert_eq!(wall.name, "wall-clock time of pid 100 (app)");
        assert_eq!(wall.profiles, file.profiles);
    }

    #[test]
    fn thread_groups_are_names_without_their_numbers() {
        for (name, group) in [
            (
                "Thread-12 (process_request_thread)",
                "process_request_thread",
            ),
            ("Thread-3", "Thread"),
            ("ThreadPoolExecutor-0_3", "ThreadPoolExecutor"),
            ("worker-7", "worker"),
            ("MainThread", "MainThread"),
            ("python3.11", "python3.11"),
            ("pool-1-thread-2", "pool-1-thread"),
            ("1234", "1234"),
            ("Thread-x (run)", "Thread-x (run)"),
        ] {
            assert_eq!(thread_group(name), group, "{name}");
        }
    }

    /// Threads of one name apart from their numbers are one profile; `PerThread` keeps each.
    #[test]
    fn threads_of_one_name_are_one_profile() {
        let mut p = fixture::profile();
        p.threads[0].name = "Thread-1 (handle)".into();
        p.threads[1].name = "Thread-2 (handle)".into();
        let file = build(&p).unwrap();
        assert_eq!(file.profiles.len(), 1);
        assert_eq!(file.profiles[0].name, "handle (pid 100, 2 threads)");
        // Every sample's weight is there: 11 samples of 10 ms.
        assert_eq!(file.profiles[0].end_value, 110_000_000);
        let apart = build_threads(&p, Threads::PerThread).unwrap();
        assert_eq!(apart.profiles.len(), 2);
        assert_eq!(apart.profiles[1].name, "Thread-2 (handle) (tid 101)");
        // Another process's threads of that name are another profile.
        p.threads[1].pid = 200;
        assert_eq!(build(&p).unwrap().profiles.len(), 2);
    }
}
