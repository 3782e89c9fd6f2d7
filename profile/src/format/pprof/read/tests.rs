//! Round trips through the pprof reader and what it refuses.

use super::*;
use crate::format::{self, fixture, Format};

fn folded(profile: &Profile) -> String {
    String::from_utf8(format::render(profile, Format::Folded).unwrap()).unwrap()
}

fn round_trip(profile: &Profile) -> Profile {
    read_pprof(&format::render(profile, Format::Pprof).unwrap()).unwrap()
}

fn python_profile() -> Profile {
    let mut profile = fixture::with_spans();
    for (name, line) in [("handle", Some(12)), ("<module>", None)] {
        profile.frames.push(Frame {
            kind: FrameKind::Python,
            function: Some(name.to_string()),
            module: None,
            address: 0,
            file: Some("/srv/app.py".to_string()),
            line,
            unknown_reason: None,
            ids: None,
            start_line: None,
            interpreter: false,
        });
    }
    profile.frames.push(Frame {
        kind: FrameKind::Native,
        function: Some("[truncated]".to_string()),
        module: None,
        address: 0,
        file: None,
        line: None,
        unknown_reason: None,
        ids: None,
        start_line: None,
        interpreter: false,
    });
    profile.samples[0].frames.extend([6, 5]);
    profile.samples[1].frames.insert(0, 7);
    profile.samples[0].unwind = UnwindStatus::Complete;
    profile.samples[1].unwind = UnwindStatus::Truncated(symbolizer::unwind::TruncatedBy::StackCopy);
    profile
}

#[test]
fn run_facts_come_back() {
    let mut profile = fixture::profile();
    profile.meta.host = Some(crate::resource::HostInfo {
        name: "ci-runner-7".to_string(),
        id: Some("0123456789abcdef".to_string()),
    });
    profile.meta.build = crate::profile::Build::from_vars(|name| match name {
        "CI_COMMIT_SHA" => Some(" 9fceb02d0ae598e95dc970b74767f19372d61af8\n".to_string()),
        "GITHUB_REF_NAME" => Some(String::new()),
        "CI_COMMIT_REF_NAME" => Some("feature/faster".to_string()),
        _ => None,
    });
    assert_eq!(
        profile.meta.build.commit.as_deref(),
        Some("9fceb02d0ae598e95dc970b74767f19372d61af8")
    );
    let back = round_trip(&profile);
    assert_eq!(back.meta.build, profile.meta.build);
    // The machine id is not in the file.
    assert_eq!(
        back.meta.host,
        Some(crate::resource::HostInfo {
            name: "ci-runner-7".to_string(),
            id: None
        })
    );
    let long = crate::profile::Build::from_vars(|_| Some("é".repeat(150)));
    assert_eq!(long.commit.as_deref().map(str::len), Some(200));
}

#[test]
fn round_trip_gives_the_same_outputs() {
    let profile = python_profile();
    let back = round_trip(&profile);
    assert_eq!(folded(&back), folded(&profile));
    assert!(folded(&back).contains("main;compute;<module> (app.py);handle (app.py:12) 5"));
    for format in [Format::Pprof, Format::Speedscope, Format::Svg] {
        assert_eq!(
            format::render(&back, format).unwrap(),
            format::render(&profile, format).unwrap(),
            "{format}"
        );
    }
    assert_eq!(back.meta, profile.meta.clone());
    assert_eq!(back.threads, profile.threads);
    assert_eq!(back.processes, profile.processes);
    assert_eq!(back.spans, profile.spans);
    // The same stacks of the same frames (the frame table is in another order), but for why
    // an unknown frame is unknown, and the kernel's module, which pprof names its own way.
    let mut frames = profile.frames.clone();
    frames[2].unknown_reason = Some("no function name in the pprof file".to_string());
    frames[3].module = Some(KERNEL_MAPPING.to_string());
    type Stack = (Vec<Frame>, u32, u64, Option<u32>, UnwindStatus);
    let stacks = |p: &Profile, frames: &[Frame]| -> Vec<Stack> {
        p.samples
            .iter()
            .map(|s| {
                let stack = s.frames.iter().map(|&f| frames[f as usize].clone());
                (stack.collect(), s.thread, s.count, s.span, s.unwind)
            })
            .collect()
    };
    assert_eq!(stacks(&back, &back.frames), stacks(&profile, &frames));
    // Grouped, too.
    let grouped = profile.grouped(crate::profile::GroupBy::Span);
    assert_eq!(folded(&round_trip(&grouped)), folded(&grouped));
}

#[test]
fn off_cpu_round_trips_in_every_shape() {
    for profile in [fixture::off_cpu(), fixture::off_cpu_only(), fixture::wall()] {
        let back = round_trip(&profile);
        let events = profile.meta.events;
        assert_eq!(back.meta, profile.meta, "{events:?}");
        for format in Format::ALL {
            assert_eq!(
                format::render(&back, format).unwrap(),
                format::render(&profile, format).unwrap(),
                "{format} {events:?}"
            );
        }
        type Values = (
            u32,
            u64,
            u64,
            Option<OffCpuReason>,
            Option<u32>,
            UnwindStatus,
        );
        let values = |p: &Profile| -> Vec<Values> {
            p.samples
                .iter()
                .map(|s| (s.thread, s.count, s.off_cpu_ns, s.off_cpu, s.span, s.unwind))
                .collect()
        };
        assert_eq!(values(&back), values(&profile), "{events:?}");
        assert_eq!(back.spans, profile.spans);
        assert_eq!(back.total_off_cpu_ns(), 295_500_000);
        // The pseudo-frame comes back as the placeholder it was.
        let root = &back.frames[back.samples.last().unwrap().frames[0] as usize];
        assert_eq!(root, &profile.frames[5]);
    }
}

#[test]
fn memory_round_trips_in_every_shape() {
    for profile in [
        fixture::memory(),
        fixture::alloc_only(),
        fixture::heap_only(),
    ] {
        let back = round_trip(&profile);
        let events = profile.meta.events;
        // Sampled by bytes: the rate comes back from the period, the frequency is not kept.
        assert_eq!(
            back.meta,
            Meta {
                frequency: 0,
                ..profile.meta.clone()
            },
            "{events:?}"
        );
        assert_eq!(back.meta.events.alloc_rate, 512 * 1024);
        for format in Format::ALL {
            assert_eq!(
                format::render(&back, format).unwrap(),
                format::render(&profile, format).unwrap(),
                "{format} {events:?}"
            );
        }
        type Values = (u32, u64, u64, Memory, Memory, Option<u32>, UnwindStatus);
        let values = |p: &Profile| -> Vec<Values> {
            p.samples
                .iter()
                .map(|s| {
                    let (alloc, inuse) = (s.alloc, s.inuse);
                    (
                        s.thread,
                        s.count,
                        s.off_cpu_ns,
                        alloc,
                        inuse,
                        s.span,
                        s.unwind,
                    )
                })
                .collect()
        };
        // What the file holds: a heap-only one neither what was allocated nor the stacks
        // whose allocations were all freed.
        let mut written = profile.clone();
        if !events.alloc {
            written.retain_samples(|_, s| !s.inuse.is_empty());
            for s in &mut written.samples {
                s.alloc = Memory::default();
            }
        }
        assert_eq!(values(&back), values(&written), "{events:?}");
        assert_eq!(back.spans, written.spans, "{events:?}");
        assert_eq!(back.threads, written.threads, "{events:?}");
    }
    // Every allocation recorded.
    let mut every = fixture::alloc_only();
    every.meta.events.alloc_rate = 1;
    assert_eq!(round_trip(&every).meta.events.alloc_rate, 1);
}

#[test]
fn refuses_contradictory_memory_values() {
    let err = read_edited(&fixture::memory(), |p| p.sample[0].value[2] = 0).unwrap_err();
    assert_eq!(
        err,
        "damaged spanprof profile: sample 0: its inuse_space/bytes has bytes but its \
         inuse_objects/count no allocations"
    );
    let err = read_edited(&fixture::alloc_only(), |p| p.sample[1].value[1] = -5).unwrap_err();
    assert_eq!(
        err,
        "damaged spanprof profile: sample 1 has a negative value"
    );
    let err = read_edited(&fixture::heap_only(), |p| {
        let key = intern(p, OFF_CPU_REASON_LABEL);
        let str = intern(p, "lock");
        p.sample[0].label.push(::pprof::protos::Label {
            key,
            str,
            ..Default::default()
        });
    })
    .unwrap_err();
    assert_eq!(
        err,
        "damaged spanprof profile: sample 0 has an off_cpu.reason label in a memory profile"
    );
    // A memory profile's period is in bytes, a time profile's in nanoseconds.
    let err = read_edited(&fixture::memory(), |p| {
        let (ty, unit) = (intern(p, "cpu"), intern(p, "nanoseconds"));
        p.period_type = Some(::pprof::protos::ValueType { ty, unit });
    })
    .unwrap_err();
    assert_eq!(
        err,
        "not a spanprof profile: its period is not in space/bytes"
    );
    let err = read_edited(&fixture::profile(), |p| {
        let (ty, unit) = (intern(p, "space"), intern(p, "bytes"));
        p.period_type = Some(::pprof::protos::ValueType { ty, unit });
    })
    .unwrap_err();
    assert_eq!(
        err,
        "not a spanprof profile: its period is not in cpu/nanoseconds"
    );
    // An allocation of 0 bytes is an allocation; Go's order or another, the same profile.
    let back = read_edited(&fixture::memory(), |p| {
        p.sample[3].value[1] = 0;
        p.sample_type.reverse();
        for s in &mut p.sample {
            s.value.reverse();
        }
    })
    .unwrap();
    assert_eq!(
        back.samples[3].alloc,
        Memory {
            objects: 7,
            bytes: 0
        }
    );
    assert_eq!(back.samples[0].inuse, fixture::memory().samples[0].inuse);
}

/// `profile`'s pprof message, changed by `edit`, read back.
fn read_edited(profile: &Profile, edit: impl FnOnce(&mut PprofProfile)) -> Result<Profile, String> {
    let mut message = format::pprof::build(profile).unwrap();
    edit(&mut message);
    read_pprof(&message.encode_to_vec()).map_err(|e| format!("{:#}", anyhow::Error::from(e)))
}

/// The string table index of `s`, added when missing.
fn intern(p: &mut PprofProfile, s: &str) -> i64 {
    match p.string_table.iter().position(|t| t == s) {
        Some(i) => i as i64,
        None => {
            p.string_table.push(s.to_string());
            p.string_table.len() as i64 - 1
        }
    }
}

#[test]
fn unknown_reasons_read_as_other() {
    let back = read_edited(&fixture::off_cpu(), |p| {
        let newer = intern(p, "page-fault");
        let key = intern(p, OFF_CPU_REASON_LABEL);
        for l in p.sample[5].label.iter_mut().filter(|l| l.key == key) {
            l.str = newer;
        }
    })
    .unwrap();
    assert_eq!(back.samples[5].off_cpu, Some(OffCpuReason::Other));
    assert_eq!(back.samples[5].off_cpu_ns, fixture::SLEEP_NS);
    // Its frame still says what the file said.
    assert_eq!(folded(&back), folded(&fixture::off_cpu()));
}

#[test]
fn sample_types_in_another_order() {
    let back = read_edited(&fixture::off_cpu(), |p| {
        p.sample_type.swap(0, 2);
        for s in &mut p.sample {
            s.value.swap(0, 2);
        }
    })
    .unwrap();
    assert_eq!(folded(&back), folded(&fixture::off_cpu()));
}

#[test]
fn refuses_contradictory_values() {
    let key = |p: &mut PprofProfile| intern(p, OFF_CPU_REASON_LABEL);
    let err = read_edited(&fixture::off_cpu(), |p| p.sample[0].value[1] += 1).unwrap_err();
    assert_eq!(
        err,
        "damaged spanprof profile: sample 0: its cpu/nanoseconds is not its count times the \
         period"
    );
    let err = read_edited(&fixture::off_cpu(), |p| {
        let key = key(p);
        p.sample[4].label.retain(|l| l.key != key);
    })
    .unwrap_err();
    assert_eq!(
        err,
        "damaged spanprof profile: sample 4 has off-CPU time but no off_cpu.reason label"
    );
    let err = read_edited(&fixture::off_cpu(), |p| {
        p.sample[4].value[..2].copy_from_slice(&[1, 10_000_000]);
    })
    .unwrap_err();
    assert_eq!(
        err,
        "damaged spanprof profile: sample 4 has an off_cpu.reason label and on-CPU samples"
    );
    let err = read_edited(&fixture::wall(), |p| p.sample[0].value[0] += 1).unwrap_err();
    assert_eq!(
        err,
        "damaged spanprof profile: sample 0: 50000001 ns on CPU is not a whole number of \
         periods (10000000 ns)"
    );
    let err = read_edited(&fixture::off_cpu(), |p| {
        p.sample[0].value.pop();
    })
    .unwrap_err();
    assert_eq!(
        err,
        "damaged spanprof profile: sample 0 has 2 values for 3 sample types"
    );
    let err = read_edited(&fixture::off_cpu(), |p| {
        p.sample_type.remove(0);
        for s in &mut p.sample {
            s.value.remove(0);
        }
    })
    .unwrap_err();
    assert!(
        err.starts_with(
            "not a spanprof profile: its sample types are [(\"cpu\", \"nanoseconds\"), \
             (\"off_cpu\", \"nanoseconds\")], not one of: samples/count, cpu/nanoseconds; \
             off_cpu/nanoseconds; samples/count, cpu/nanoseconds, off_cpu/nanoseconds; \
             wall/nanoseconds"
        ),
        "{err}"
    );
    // An on-CPU profile's time is its count times the period.
    let err = read_edited(&fixture::profile(), |p| p.sample[0].value[1] += 1).unwrap_err();
    assert_eq!(
        err,
        "damaged spanprof profile: sample 0: its cpu/nanoseconds is not its count times the period"
    );
}

#[test]
fn counts_alone_read_as_an_on_cpu_profile() {
    // As spanprof wrote on-CPU profiles before their cpu/nanoseconds value.
    let full = read_edited(&fixture::profile(), |_| ()).unwrap();
    let counts_only = read_edited(&fixture::profile(), |p| {
        p.sample_type.pop();
        for s in &mut p.sample {
            s.value.pop();
        }
    })
    .unwrap();
    assert_eq!(counts_only.meta.events, full.meta.events);
    let counts = |p: &Profile| p.samples.iter().map(|s| s.count).collect::<Vec<_>>();
    assert_eq!(counts(&counts_only), counts(&full));
}

#[test]
fn reads_plain_protobuf_and_every_frequency() {
    let mut profile = fixture::profile();
    for hz in [1, 7, 99, 997, 9999, 10_000] {
        profile.meta.frequency = hz;
        let message = format::pprof::build(&profile).unwrap().encode_to_vec();
        assert_eq!(read_pprof(&message).unwrap().meta.frequency, hz);
    }
}

#[test]
fn refuses_other_files() {
    let err = |bytes: &[u8]| format!("{:#}", anyhow::Error::from(read_pprof(bytes).unwrap_err()));
    assert!(
        err(b"").starts_with("not a spanprof profile"),
        "{}",
        err(b"")
    );
    assert!(err(b"\x1f\x8bnot gzip").starts_with("not a pprof profile: bad gzip data"));
    assert!(err(b"hello, world\n").starts_with("not a pprof profile"));
    let mut foreign = format::pprof::build(&fixture::profile()).unwrap();
    foreign.comment.clear();
    assert_eq!(
        err(&foreign.encode_to_vec()),
        "not a spanprof profile: no `target:` comment"
    );
}

#[test]
fn names_of_other_writers_are_cut_like_ours() {
    let mut profile = fixture::with_spans();
    let long = format!("{}-and-more", fixture::LONG_NAME);
    // Written as is (not through SpanName): what another writer could put in a label.
    let mut raw = Vec::new();
    GzDecoder::new(format::render(&profile, Format::Pprof).unwrap().as_slice())
        .read_to_end(&mut raw)
        .unwrap();
    let mut decoded = PprofProfile::decode(raw.as_slice()).unwrap();
    let i = decoded
        .string_table
        .iter()
        .position(|s| s == fixture::LONG_NAME)
        .unwrap();
    decoded.string_table[i] = long.clone();
    let bytes = decoded.encode_to_vec();
    let back = read_pprof(&bytes).unwrap();
    assert_eq!(
        back.spans[2].osprofiler_name.unwrap().as_str(),
        &long[..crate::profile::SPAN_NAME_MAX]
    );
    profile.spans[2].osprofiler_name = SpanName::new(&long);
    assert_eq!(back.spans, profile.spans);
}
