//! Folded (collapsed) stacks, the input format of `flamegraph.pl` and inferno.
//!
//! One line per distinct stack: frame names root first, separated by `;`, then a space and the
//! stack's weight ([`Profile::weight`]), e.g. `main;compute;do_syscall_64_[k] 2`: the number of
//! samples for an on-CPU profile, nanoseconds as soon as off-CPU time is in it (an on-CPU sample
//! then weighs `count * period`, an off-CPU one its blocked time, under its `[off-cpu: REASON]`
//! root frame), bytes for a memory profile (those still in use at the end with `--event heap`,
//! with or without `alloc`; those allocated with `--event alloc`: estimates, scaled from the
//! sampled allocations). Samples with the same stack on different threads are merged, stacks
//! whose total is zero are left out (in a `heap` profile, stacks whose allocations were all
//! freed), and lines are sorted by stack in byte order so the output is deterministic.
//!
//! Frame names are [`Frame::display_name`]. Because `;` separates frames and a newline ends the
//! line, those characters (and other control characters) are replaced in names; see
//! [`sanitize_name`]. A sample without frames is shown as the single frame [`NO_STACK`] rather
//! than dropped.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, UNIX_EPOCH};

use symbolizer::unwind::UnwindStatus;

use super::pprof::{KERNEL_MAPPING, PYTHON_MAPPING};
use super::{validate, OutputError, ReadError};
use crate::profile::{
    Frame, FrameKind, Memory, Meta, Profile, PythonStats, Sample, Thread, INLINED,
};
use crate::wording::{frame_name, NO_STACK};

/// Merges the profile's samples by stack.
///
/// Returns `(stack, weight)` pairs sorted by stack, where `stack` is the `;`-joined frame names,
/// root first, and `weight` the sum of [`Profile::weight`]. Stacks with a zero total are omitted.
pub fn collapse(profile: &Profile) -> Result<Vec<(String, u64)>, OutputError> {
    collapse_by(profile, frame_name)
}

/// [`collapse`] with frames named by `name` (which must give names safe for a folded line).
pub fn collapse_by(
    profile: &Profile,
    name: impl Fn(&Frame) -> String,
) -> Result<Vec<(String, u64)>, OutputError> {
    validate(profile)?;
    // Name each frame once; samples share frames heavily.
    let names: Vec<String> = profile.frames.iter().map(name).collect();
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    let mut stack = String::new();
    for sample in &profile.samples {
        stack.clear();
        if sample.frames.is_empty() {
            stack.push_str(NO_STACK);
        }
        for (i, &frame) in sample.frames.iter().enumerate() {
            if i > 0 {
                stack.push(';');
            }
            stack.push_str(&names[frame as usize]);
        }
        let weight = profile.weight(sample);
        match stacks.get_mut(stack.as_str()) {
            Some(total) => *total = total.saturating_add(weight),
            None => {
                stacks.insert(stack.clone(), weight);
            }
        }
    }
    Ok(stacks.into_iter().filter(|&(_, count)| count > 0).collect())
}

/// Renders the profile as folded stacks, one `\n`-terminated line per stack.
pub fn render(profile: &Profile) -> Result<Vec<u8>, OutputError> {
    let mut out = String::new();
    for (stack, count) in collapse(profile)? {
        out.push_str(&stack);
        out.push(' ');
        out.push_str(&count.to_string());
        out.push('\n');
    }
    Ok(out.into_bytes())
}

/// Most lines read from a folded file (a distinct stack each, as written).
const MAX_FOLDED_LINES: usize = 1 << 22;

/// Reads folded stacks (`root;…;leaf COUNT` per line, as spanprof, inferno, py-spy and
/// `stackcollapse-perf.pl` write them) into an on-CPU [`Profile`] of one unnamed thread, each
/// line's count its samples. Frame names are parsed as spanprof writes them: `name_[k]` is a
/// kernel frame, `qualname (file.py:LINE)` a Python one, `name (file.c:LINE, inlined)` or `name
/// (inlined)` a function inlined into the native frame before it, anything else native. The file says
/// nothing of the sampling rate: the profile's frequency is 0 (shares compare, times do not).
/// A line without frames (py-spy's ` 10`, spanprof's [`NO_STACK`]) is a sample without frames.
pub fn read_folded(bytes: &[u8]) -> Result<Profile, ReadError> {
    let bad = |msg: String| ReadError::Folded(msg);
    let text = std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8 text ({e})")))?;
    let mut frames: Vec<Frame> = Vec::new();
    let mut ids: HashMap<Frame, u32> = HashMap::new();
    let mut samples: Vec<Sample> = Vec::new();
    let mut total = 0u64;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        if samples.len() >= MAX_FOLDED_LINES {
            return Err(bad(format!("more than {MAX_FOLDED_LINES} stacks")));
        }
        let (stack, count) = line
            .rsplit_once(' ')
            .ok_or_else(|| bad(format!("line {}: no count after the stack", n + 1)))?;
        let count: u64 = count
            .trim()
            .parse()
            .map_err(|_| bad(format!("line {}: {count:?} is not a count", n + 1)))?;
        total = total
            .checked_add(count)
            .ok_or_else(|| bad(format!("line {}: the counts add up past 2^64", n + 1)))?;
        let mut of_line = Vec::new();
        // No stack: py-spy writes ` 10` for samples it found no frame for, spanprof
        // `[no stack] 10`; either is a sample without frames, which is how it is written back.
        let frameless = stack.trim().is_empty() || stack == NO_STACK;
        for name in stack.split(';').filter(|_| !frameless) {
            let frame = folded_frame(name);
            let index = *ids.entry(frame).or_insert_with_key(|f| {
                frames.push(f.clone());
                frames.len() as u32 - 1
            });
            of_line.push(index);
        }
        samples.push(Sample {
            frames: of_line,
            thread: 0,
            count,
            off_cpu_ns: 0,
            off_cpu: None,
            alloc: Memory::default(),
            inuse: Memory::default(),
            span: None,
            unwind: UnwindStatus::Unchecked,
            times: Vec::new(),
            inuse_times: Vec::new(),
        });
    }
    Ok(Profile {
        meta: Meta {
            target: "folded stacks".to_string(),
            start: UNIX_EPOCH,
            duration: Duration::ZERO,
            frequency: 0,
            events: crate::profile::Events::default(),
            lost_samples: 0,
            python: PythonStats::default(),
            host: None,
            build: crate::profile::Build::default(),
            dropped_labels: Vec::new(),
        },
        frames,
        threads: vec![Thread {
            pid: 0,
            tid: 0,
            name: String::new(),
        }],
        processes: Vec::new(),
        samples,
        spans: Vec::new(),
    })
}

/// One folded frame name as a [`Frame`] (see [`read_folded`]).
fn folded_frame(name: &str) -> Frame {
    let frame = |kind, function: &str| Frame {
        kind,
        function: Some(function.to_string()),
        module: None,
        address: 0,
        file: None,
        line: None,
        unknown_reason: None,
        ids: None,
        start_line: None,
        interpreter: false,
    };
    if let Some(kernel) = name.strip_suffix("_[k]") {
        return Frame {
            module: Some(KERNEL_MAPPING.to_string()),
            ..frame(FrameKind::Kernel, kernel)
        };
    }
    // `[unknown] (module+0xOFFSET)`: an address without a function, as the writer names it.
    if let Some((module, offset)) = name
        .strip_prefix("[unknown] (")
        .and_then(|n| n.strip_suffix(')'))
        .and_then(|n| n.rsplit_once("+0x"))
    {
        if let Ok(address) = u64::from_str_radix(offset, 16) {
            return Frame {
                function: None,
                module: (module != "?").then(|| module.to_string()),
                address,
                unknown_reason: Some("no function name in the folded file".to_string()),
                ..frame(FrameKind::Native, name)
            };
        }
    }
    // `name (file.c:LINE, inlined)` or `name (inlined)`: a function inlined into its caller.
    if let Some((function, rest)) = name.strip_suffix(')').and_then(|n| n.rsplit_once(" (")) {
        let place = match rest.strip_suffix(INLINED) {
            Some("") => Some((None, None)),
            Some(place) => place.strip_suffix(", ").and_then(|p| {
                let (file, line) = p.rsplit_once(':')?;
                Some((Some(file.to_string()), Some(line.parse::<u32>().ok()?)))
            }),
            None => None,
        };
        if let (Some((file, line)), false) = (place, function.is_empty()) {
            return Frame {
                file,
                line,
                ..frame(FrameKind::Inlined, function)
            };
        }
    }
    // `qualname (file.py:LINE)` or `qualname (file.py)`.
    if let Some((qualname, rest)) = name.strip_suffix(')').and_then(|n| n.rsplit_once(" (")) {
        let (file, line) = match rest.rsplit_once(':') {
            Some((file, line)) => match line.parse::<u32>() {
                Ok(line) => (file, Some(line)),
                Err(_) => (rest, None),
            },
            None => (rest, None),
        };
        if file.ends_with(".py") && !qualname.is_empty() {
            return Frame {
                file: Some(file.to_string()),
                line,
                module: Some(PYTHON_MAPPING.to_string()),
                ..frame(FrameKind::Python, qualname)
            };
        }
    }
    frame(FrameKind::Native, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_frames_read_back_as_addresses_of_their_module() {
        let text = b"main;[unknown] (libz.so.1+0x4a26) 1\nmain;[unknown] (libz.so.1+0x4b00) 2\n";
        let profile = read_folded(text).unwrap();
        let unknown: Vec<&Frame> = profile
            .frames
            .iter()
            .filter(|f| f.function.is_none())
            .collect();
        assert_eq!(unknown.len(), 2);
        assert_eq!(unknown[0].module.as_deref(), Some("libz.so.1"));
        assert_eq!(unknown[0].address, 0x4a26);
        // Written back as read; counted as one function of the module.
        assert_eq!(frame_name(unknown[1]), "[unknown] (libz.so.1+0x4b00)");
        let names: Vec<String> = unknown
            .iter()
            .map(|f| crate::wording::function_name(f))
            .collect();
        assert_eq!(names, ["[unknown] (libz.so.1)", "[unknown] (libz.so.1)"]);
    }
    use crate::format::fixture;
    use crate::profile::{FrameKind, Sample};
    use crate::wording::sanitize_name;
    use std::borrow::Cow;

    #[test]
    fn folded_text() {
        let out = String::from_utf8(render(&fixture::profile()).unwrap()).unwrap();
        assert_eq!(
            out,
            "main;[unknown] (libfoo.so+0x1234) 1\n\
             main;compute 8\n\
             main;compute;do_syscall_64_[k] 2\n"
        );
    }

    #[test]
    fn sanitizes_separators() {
        assert_eq!(sanitize_name("a;b\nc\r\td"), "a:b c  d");
        assert_eq!(sanitize_name("Vec<T>::push (x)"), "Vec<T>::push (x)");
        assert!(matches!(sanitize_name("plain"), Cow::Borrowed("plain")));
        assert_eq!(sanitize_name(""), "[unknown]");

        let mut profile = fixture::profile();
        profile.frames[1].function = Some("evil;name\nhere".to_string());
        profile.frames[3].kind = FrameKind::Kernel;
        let out = String::from_utf8(render(&profile).unwrap()).unwrap();
        assert!(out.contains("main;evil:name here 5\n"), "{out}");
        for line in out.lines() {
            let (stack, count) = line.rsplit_once(' ').unwrap();
            count.parse::<u64>().unwrap();
            assert!(!stack.is_empty());
        }
    }

    #[test]
    fn empty_stacks_and_zero_counts() {
        let mut profile = fixture::profile();
        profile.samples = vec![
            Sample {
                frames: vec![],
                thread: 0,
                count: 3,
                off_cpu_ns: 0,
                off_cpu: None,
                alloc: Default::default(),
                inuse: Default::default(),
                span: None,
                unwind: symbolizer::unwind::UnwindStatus::Unchecked,
                times: Vec::new(),
                inuse_times: Vec::new(),
            },
            Sample {
                frames: vec![0],
                thread: 1,
                count: 0,
                off_cpu_ns: 0,
                off_cpu: None,
                alloc: Default::default(),
                inuse: Default::default(),
                span: None,
                unwind: symbolizer::unwind::UnwindStatus::Unchecked,
                times: Vec::new(),
                inuse_times: Vec::new(),
            },
        ];
        let out = String::from_utf8(render(&profile).unwrap()).unwrap();
        assert_eq!(out, "[no stack] 3\n");
    }

    #[test]
    fn lines_without_frames_are_samples_without_frames() {
        // py-spy's raw output has ` 10` for samples with no stack; spanprof's `[no stack] 3`
        // reads back the same way, and both are written back as `[no stack]`.
        let text = b"<module> (x.py:3);f (x.py:9) 5\n 10\n[no stack] 3\n";
        let profile = read_folded(text).unwrap();
        let counts: Vec<(usize, u64)> = profile
            .samples
            .iter()
            .map(|s| (s.frames.len(), s.count))
            .collect();
        assert_eq!(counts, [(2, 5), (0, 10), (0, 3)]);
        assert_eq!(profile.frames.len(), 2, "no frame named `[no stack]` or ``");
        let out = String::from_utf8(render(&profile).unwrap()).unwrap();
        assert_eq!(out, "<module> (x.py:3);f (x.py:9) 5\n[no stack] 13\n");
        assert!(
            read_folded(b"main 1\n 1x\n").is_err(),
            "a bad count is still refused"
        );
    }

    #[test]
    fn memory_weights_are_bytes() {
        // With the heap in the profile, bytes in use at the end; the stack whose allocations
        // were all freed (`main;compute` of thread 1) adds nothing.
        let in_use = "main;[unknown] (libfoo.so+0x1234) 3500000\n\
                      main;compute 800000000\n\
                      main;compute;do_syscall_64_[k] 20000000\n";
        let out = String::from_utf8(render(&fixture::memory()).unwrap()).unwrap();
        assert_eq!(out, in_use);
        assert_eq!(render(&fixture::heap_only()).unwrap(), in_use.as_bytes());
        // Allocations alone: bytes allocated, both threads' `main;compute` merged.
        let out = String::from_utf8(render(&fixture::alloc_only()).unwrap()).unwrap();
        assert_eq!(
            out,
            "main;[unknown] (libfoo.so+0x1234) 3500000\n\
             main;compute 1250000000\n\
             main;compute;do_syscall_64_[k] 30000000\n"
        );
    }

    #[test]
    fn off_cpu_weights_are_nanoseconds() {
        // 100 Hz: an on-CPU sample weighs 10 ms; off-CPU ones their time, under their reason.
        let out = String::from_utf8(render(&fixture::off_cpu()).unwrap()).unwrap();
        assert_eq!(
            out,
            "[off-cpu: lock];main;compute 15500000\n\
             [off-cpu: lock];main;compute;do_syscall_64_[k] 30000000\n\
             [off-cpu: sleep];main 250000000\n\
             main;[unknown] (libfoo.so+0x1234) 10000000\n\
             main;compute 80000000\n\
             main;compute;do_syscall_64_[k] 20000000\n"
        );
        // Wall: the same weights.
        assert_eq!(render(&fixture::wall()).unwrap(), out.as_bytes());
        let only = String::from_utf8(render(&fixture::off_cpu_only()).unwrap()).unwrap();
        assert_eq!(
            only,
            "[off-cpu: lock];main;compute 15500000\n\
             [off-cpu: lock];main;compute;do_syscall_64_[k] 30000000\n\
             [off-cpu: sleep];main 250000000\n"
        );
    }
}
