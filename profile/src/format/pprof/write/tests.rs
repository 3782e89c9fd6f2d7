//! Tests of the pprof writer.

use std::io::Read;

use flate2::read::GzDecoder;

use super::*;
use crate::format::fixture;

fn decode(bytes: &[u8]) -> PprofProfile {
    let mut raw = Vec::new();
    GzDecoder::new(bytes).read_to_end(&mut raw).unwrap();
    PprofProfile::decode(raw.as_slice()).unwrap()
}

fn string(p: &PprofProfile, i: i64) -> &str {
    &p.string_table[usize::try_from(i).unwrap()]
}

/// The function names of a sample's stack, leaf first; a location without a line reads
/// `@MAPPING+0xADDRESS`.
fn stack(p: &PprofProfile, sample: &Sample) -> Vec<String> {
    sample
        .location_id
        .iter()
        .map(|&id| {
            let loc = &p.location[usize::try_from(id - 1).unwrap()];
            assert_eq!(loc.id, id);
            let Some(line) = loc.line.first() else {
                let mapping = &p.mapping[usize::try_from(loc.mapping_id - 1).unwrap()];
                return format!("@{}+{:#x}", string(p, mapping.filename), loc.address);
            };
            let func = &p.function[usize::try_from(line.function_id - 1).unwrap()];
            string(p, func.name).to_string()
        })
        .collect()
}

#[test]
fn decodes_with_totals_and_leaf_first_locations() {
    let profile = fixture::profile();
    let p = decode(&render(&profile).unwrap());

    assert_eq!(p.string_table[0], "");
    assert_eq!(p.sample_type.len(), 2);
    assert_eq!(string(&p, p.sample_type[0].ty), "samples");
    assert_eq!(string(&p, p.sample_type[0].unit), "count");
    assert_eq!(string(&p, p.sample_type[1].ty), "cpu");
    assert_eq!(string(&p, p.sample_type[1].unit), "nanoseconds");
    let period_type = p.period_type.clone().unwrap();
    assert_eq!(string(&p, period_type.ty), "cpu");
    assert_eq!(string(&p, period_type.unit), "nanoseconds");
    assert_eq!(p.period, 10_000_000);
    assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
    assert_eq!(p.duration_nanos, 2_500_000_000);
    let comments: Vec<&str> = p.comment.iter().map(|&c| string(&p, c)).collect();
    assert_eq!(
        comments,
        [
            "target: pid 100 (app)",
            "lost samples: 4",
            "process: 100 (app)"
        ]
    );

    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 11);
    assert_eq!(p.sample.len(), 4);
    assert_eq!(stack(&p, &p.sample[0]), ["compute", "main"]);
    assert_eq!(
        stack(&p, &p.sample[2]),
        ["do_syscall_64", "compute", "main"]
    );
    assert_eq!(
        stack(&p, &p.sample[3]),
        ["@/usr/lib/libfoo.so+0x1234", "main"]
    );
    // The unknown frame is an address in its mapping, without a line or a made-up function.
    let unknown = &p.location[usize::try_from(p.sample[3].location_id[0] - 1).unwrap()];
    assert!(unknown.line.is_empty());
    assert_eq!(unknown.mapping_id, 3);
    assert!(!p
        .function
        .iter()
        .any(|f| string(&p, f.name).contains("unknown")));
    // Same frame, same location; same function at two addresses, two locations.
    assert_eq!(p.sample[0].location_id[1], p.sample[1].location_id[1]);
    assert_ne!(p.sample[0].location_id[0], p.sample[1].location_id[0]);
    assert_eq!(p.location.len(), 5);
    assert_eq!(p.function.len(), 3);
}

#[test]
fn mappings_functions_and_lines() {
    let p = build(&fixture::profile()).unwrap();
    let mappings: Vec<(u64, &str)> = p
        .mapping
        .iter()
        .map(|m| (m.id, string(&p, m.filename)))
        .collect();
    assert_eq!(
        mappings,
        [
            (1, "/usr/bin/app"),
            (2, KERNEL_MAPPING),
            (3, "/usr/lib/libfoo.so")
        ]
    );
    // libfoo.so's only frame is unknown, so it has no symbolized function.
    let has_functions: Vec<bool> = p.mapping.iter().map(|m| m.has_functions).collect();
    assert_eq!(has_functions, [true, true, false]);
    assert!(p.mapping[0].has_line_numbers && !p.mapping[1].has_line_numbers);

    let compute = p
        .function
        .iter()
        .find(|f| string(&p, f.name) == "compute")
        .unwrap();
    assert_eq!(string(&p, compute.filename), "src/app.c");
    let compute_lines: Vec<(u64, i64, u64)> = p
        .location
        .iter()
        .filter(|l| l.line.first().is_some_and(|l| l.function_id == compute.id))
        .map(|l| (l.address, l.line[0].line, l.mapping_id))
        .collect();
    assert_eq!(compute_lines, [(0x1200, 42, 1), (0x1210, 43, 1)]);

    let kernel = p.location.iter().find(|l| l.mapping_id == 2).unwrap();
    assert_eq!(kernel.address, 0xffff_ffff_8100_0000);
    assert_eq!(kernel.line[0].line, 0);
}

#[test]
fn thread_and_process_labels() {
    let p = build(&fixture::profile()).unwrap();
    let labels: Vec<(&str, i64, &str, i64)> = p.sample[1]
        .label
        .iter()
        .map(|l| (string(&p, l.key), l.num, string(&p, l.str), l.num_unit))
        .collect();
    assert_eq!(
        labels,
        [
            ("thread.id", 101, "", 0),
            ("thread.name", 0, "worker", 0),
            ("process.id", 100, "", 0),
            ("unwind", 0, "unchecked", 0)
        ]
    );
}

#[test]
fn strings_are_unique_and_output_deterministic() {
    let profile = fixture::profile();
    let p = build(&profile).unwrap();
    let mut sorted = p.string_table.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), p.string_table.len());
    assert_eq!(render(&profile).unwrap(), render(&profile).unwrap());
}

#[test]
fn no_lost_comment_when_nothing_lost() {
    let mut profile = fixture::profile();
    profile.meta.lost_samples = 0;
    let p = build(&profile).unwrap();
    assert_eq!(p.comment.len(), 2);
}

fn labels(p: &PprofProfile, sample: &Sample) -> Vec<(String, String)> {
    sample
        .label
        .iter()
        .map(|l| {
            let value = if l.str != 0 {
                string(p, l.str).to_string()
            } else {
                l.num.to_string()
            };
            (string(p, l.key).to_string(), value)
        })
        .collect()
}

#[test]
fn span_labels_follow_thread_labels() {
    let p = decode(&render(&fixture::with_spans()).unwrap());
    let thread = |tid: &str, name: &str| {
        vec![
            ("thread.id".to_string(), tid.to_string()),
            ("thread.name".to_string(), name.to_string()),
            ("process.id".to_string(), "100".to_string()),
            ("unwind".to_string(), "unchecked".to_string()),
        ]
    };
    let with = |mut base: Vec<(String, String)>, extra: &[(&str, &str)]| {
        base.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        base
    };
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let base = "11111111-1111-1111-1111-111111111111";
    let point = "22222222-2222-2222-2222-222222222222";
    let nested = "33333333-3333-3333-3333-333333333333";
    assert_eq!(
        labels(&p, &p.sample[0]),
        with(
            thread("100", "app"),
            &[
                ("trace_id", trace),
                ("span_id", "00f067aa0ba902b7"),
                ("span.name", fixture::SPAN_NAME)
            ]
        )
    );
    assert_eq!(
        labels(&p, &p.sample[1]),
        with(
            thread("101", "worker"),
            &[
                // No OpenTelemetry span: the ids OSProfiler's OTLP driver exports the point
                // under (the base id; the point id's low 64 bits), marked as derived.
                ("trace_id", "11111111111111111111111111111111"),
                ("span_id", "2222222222222222"),
                ("span.ids_from", "osprofiler"),
                ("osprofiler.base_id", base),
                ("osprofiler.trace_id", point),
                ("osprofiler.name", fixture::OSP_NAME)
            ]
        )
    );
    assert_eq!(
        labels(&p, &p.sample[2]),
        with(
            thread("100", "app"),
            &[
                ("trace_id", trace),
                ("span_id", "00f067aa0ba902b8"),
                ("osprofiler.base_id", base),
                ("osprofiler.trace_id", nested),
                ("osprofiler.parent_id", point),
                ("osprofiler.name", fixture::LONG_NAME),
            ]
        )
    );
    assert_eq!(labels(&p, &p.sample[3]), thread("101", "worker"));
}

/// A type's `(name, unit)`.
type Type<'a> = (&'a str, &'a str);

/// Each sample type, the default sample type's name, the period type and the period.
fn types(p: &PprofProfile) -> (Vec<Type<'_>>, &str, Type<'_>, i64) {
    let period_type = p.period_type.as_ref().unwrap();
    (
        p.sample_type
            .iter()
            .map(|t| (string(p, t.ty), string(p, t.unit)))
            .collect(),
        string(p, p.default_sample_type),
        (string(p, period_type.ty), string(p, period_type.unit)),
        p.period,
    )
}

/// The `off_cpu.reason` label of each sample, if any.
fn reasons(p: &PprofProfile) -> Vec<Option<String>> {
    p.sample
        .iter()
        .map(|s| {
            let reasons: Vec<String> = labels(p, s)
                .into_iter()
                .filter(|(k, _)| k == OFF_CPU_REASON_LABEL)
                .map(|(_, v)| v)
                .collect();
            assert!(reasons.len() <= 1);
            reasons.into_iter().next()
        })
        .collect()
}

fn values(p: &PprofProfile) -> Vec<Vec<i64>> {
    p.sample.iter().map(|s| s.value.clone()).collect()
}

const PERIOD: (&str, &str) = ("cpu", "nanoseconds");

#[test]
fn on_cpu_shape() {
    let p = decode(&render(&fixture::with_spans()).unwrap());
    assert_eq!(
        types(&p),
        (
            vec![("samples", "count"), ("cpu", "nanoseconds")],
            "",
            PERIOD,
            10_000_000
        )
    );
    // Counts, and their CPU time at 100 Hz, as Go's CPU profiles give it.
    assert_eq!(
        values(&p),
        [
            [5, 50_000_000],
            [3, 30_000_000],
            [2, 20_000_000],
            [1, 10_000_000]
        ]
    );
    // Without a rate (folded stacks read back), only the counts.
    let mut no_rate = fixture::with_spans();
    no_rate.meta.frequency = 0;
    let p = decode(&render(&no_rate).unwrap());
    assert_eq!(types(&p).0, [("samples", "count")]);
    assert_eq!(values(&p), [[5], [3], [2], [1]]);
    assert_eq!(reasons(&p), [None, None, None, None]);
    // The strings of an on-CPU profile start as they always did.
    assert_eq!(
        p.string_table[..8],
        [
            "",
            "samples",
            "count",
            "cpu",
            "nanoseconds",
            "thread.id",
            "thread.name",
            "process.id"
        ]
    );
}

#[test]
fn cpu_and_off_cpu_shape() {
    let profile = fixture::off_cpu();
    let p = decode(&render(&profile).unwrap());
    assert_eq!(
        types(&p),
        (
            vec![
                ("samples", "count"),
                ("cpu", "nanoseconds"),
                ("off_cpu", "nanoseconds")
            ],
            "off_cpu",
            PERIOD,
            10_000_000
        )
    );
    assert_eq!(
        values(&p),
        [
            [5, 50_000_000, 0],
            [3, 30_000_000, 0],
            [2, 20_000_000, 0],
            [1, 10_000_000, 0],
            [0, 0, 30_000_000],
            [0, 0, 250_000_000],
            [0, 0, 15_500_000],
        ]
    );
    let lock = Some("lock".to_string());
    assert_eq!(
        reasons(&p),
        [
            None,
            None,
            None,
            None,
            lock.clone(),
            Some("sleep".to_string()),
            lock
        ]
    );
    // Root pseudo-frame last (pprof stacks are leaf first), without a mapping.
    assert_eq!(
        stack(&p, &p.sample[4]),
        ["do_syscall_64", "compute", "main", "[off-cpu: lock]"]
    );
    let root = &p.location[usize::try_from(p.sample[4].location_id[3] - 1).unwrap()];
    assert_eq!((root.mapping_id, root.address), (0, 0));
    // The reason follows the unwind labels, the span labels follow it.
    let keys: Vec<String> = labels(&p, &p.sample[4])
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        keys,
        [
            "thread.id",
            "thread.name",
            "process.id",
            "unwind",
            OFF_CPU_REASON_LABEL,
            "trace_id",
            "span_id",
            "span.name"
        ]
    );
    // Totals per type: samples, CPU time, off-CPU time.
    let total = |k: usize| p.sample.iter().map(|s| s.value[k]).sum::<i64>();
    assert_eq!(
        (total(0), total(1), total(2)),
        (11, 110_000_000, 295_500_000)
    );
}

#[test]
fn off_cpu_and_wall_shapes() {
    let p = decode(&render(&fixture::off_cpu_only()).unwrap());
    assert_eq!(
        types(&p),
        (vec![("off_cpu", "nanoseconds")], "", PERIOD, 10_000_000)
    );
    assert_eq!(values(&p), [[30_000_000], [250_000_000], [15_500_000]]);
    assert_eq!(
        reasons(&p),
        ["lock", "sleep", "lock"].map(|r| Some(r.to_string()))
    );

    let p = decode(&render(&fixture::wall()).unwrap());
    assert_eq!(
        types(&p),
        (vec![("wall", "nanoseconds")], "", PERIOD, 10_000_000)
    );
    // On-CPU samples weigh count * period.
    assert_eq!(
        values(&p),
        [
            [50_000_000],
            [30_000_000],
            [20_000_000],
            [10_000_000],
            [30_000_000],
            [250_000_000],
            [15_500_000]
        ]
    );
    assert_eq!(reasons(&p)[3..5], [None, Some("lock".to_string())]);
}

#[test]
fn shapes_by_events() {
    use crate::profile::Events;
    let events = |cpu, off_cpu, wall| Events {
        cpu,
        off_cpu,
        wall,
        ..Events::default()
    };
    assert_eq!(Shape::of(Events::default()), Shape::Cpu);
    assert_eq!(Shape::of(events(false, true, false)), Shape::OffCpu);
    assert_eq!(Shape::of(events(true, true, false)), Shape::CpuAndOffCpu);
    assert_eq!(Shape::of(events(true, true, true)), Shape::Wall);
    assert_eq!(Shape::of(events(false, false, true)), Shape::Wall);
    for shape in Shape::ALL {
        assert_eq!(Shape::of(shape.events()), shape);
        assert_eq!(Shape::from_sample_types(shape.sample_types()), Some(shape));
    }
    assert_eq!(
        Shape::from_sample_types(&[OFF_CPU_TYPE, SAMPLES_TYPE, CPU_TYPE]),
        Some(Shape::CpuAndOffCpu)
    );
    let memory = |alloc, heap| Events {
        cpu: false,
        alloc,
        heap,
        ..Events::default()
    };
    assert_eq!(Shape::of(memory(true, false)), Shape::Alloc);
    assert_eq!(Shape::of(memory(false, true)), Shape::Heap);
    assert_eq!(Shape::of(memory(true, true)), Shape::AllocAndHeap);
    // Memory wins, as in `Profile::weight` (the CLI never combines them).
    assert_eq!(
        Shape::of(Events {
            heap: true,
            ..Events::default()
        }),
        Shape::Heap
    );
    for shape in Shape::ALL {
        assert_eq!(shape.is_memory(), shape.events().in_bytes());
        let (_, unit) = shape.period_type();
        assert_eq!(unit == "bytes", shape.is_memory());
        // The default type is the last one, which clients ignoring the field show.
        if let Some(default) = shape.default_sample_type() {
            assert_eq!(shape.sample_types().last().unwrap().0, default);
        }
    }
    assert_eq!(
        Shape::from_sample_types(&[INUSE_SPACE_TYPE, INUSE_OBJECTS_TYPE]),
        Some(Shape::Heap)
    );
    assert_eq!(
        Shape::from_sample_types(&[ALLOC_SPACE_TYPE, INUSE_SPACE_TYPE]),
        None
    );
    assert_eq!(
        Shape::from_sample_types(&[CPU_TYPE, SAMPLES_TYPE]),
        Some(Shape::Cpu)
    );
    assert_eq!(
        Shape::from_sample_types(&[SAMPLES_TYPE]),
        Some(Shape::Cpu),
        "as spanprof wrote it before"
    );
    assert_eq!(Shape::from_sample_types(&[CPU_TYPE]), None);
    assert_eq!(Shape::from_sample_types(&[("cpu", "count")]), None);
    assert_eq!(Shape::from_sample_types(&[]), None);
}

const SPACE: (&str, &str) = ("space", "bytes");

#[test]
fn memory_shapes() {
    let keys = |p: &PprofProfile, k: usize| -> Vec<String> {
        labels(p, &p.sample[k])
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    // alloc,heap: Go's heap profile order, opening on the bytes in use.
    let p = decode(&render(&fixture::memory()).unwrap());
    assert_eq!(
        types(&p),
        (
            vec![
                ("alloc_objects", "count"),
                ("alloc_space", "bytes"),
                ("inuse_objects", "count"),
                ("inuse_space", "bytes")
            ],
            "inuse_space",
            SPACE,
            524_288
        )
    );
    assert_eq!(
        values(&p),
        [
            [34_000, 1_200_000_000, 1_000, 800_000_000],
            [500, 50_000_000, 0, 0],
            [60, 30_000_000, 30, 20_000_000],
            [7, 3_500_000, 7, 3_500_000],
        ]
    );
    assert_eq!(reasons(&p), [None, None, None, None]);
    assert_eq!(
        keys(&p, 0),
        [
            "thread.id",
            "thread.name",
            "process.id",
            "unwind",
            "trace_id",
            "span_id",
            "span.name"
        ]
    );
    assert_eq!(
        stack(&p, &p.sample[2]),
        ["do_syscall_64", "compute", "main"]
    );
    assert_eq!(
        p.string_table[..8],
        [
            "",
            "alloc_objects",
            "count",
            "alloc_space",
            "bytes",
            "inuse_objects",
            "inuse_space",
            "space"
        ]
    );

    let p = decode(&render(&fixture::alloc_only()).unwrap());
    assert_eq!(
        types(&p),
        (
            vec![("alloc_objects", "count"), ("alloc_space", "bytes")],
            "alloc_space",
            SPACE,
            524_288
        )
    );
    assert_eq!(
        values(&p),
        [
            [34_000, 1_200_000_000],
            [500, 50_000_000],
            [60, 30_000_000],
            [7, 3_500_000]
        ]
    );

    // heap: the stack whose allocations were all freed is not written, nor its frame 4.
    let p = decode(&render(&fixture::heap_only()).unwrap());
    assert_eq!(
        types(&p),
        (
            vec![("inuse_objects", "count"), ("inuse_space", "bytes")],
            "inuse_space",
            SPACE,
            524_288
        )
    );
    assert_eq!(
        values(&p),
        [[1_000, 800_000_000], [30, 20_000_000], [7, 3_500_000]]
    );
    assert_eq!(p.location.len(), 4);
    let threads: Vec<String> = (0..3)
        .map(|k| labels(&p, &p.sample[k])[0].1.clone())
        .collect();
    assert_eq!(threads, ["100", "100", "101"]);

    // Every allocation recorded: period 1.
    let mut every = fixture::alloc_only();
    every.meta.events.alloc_rate = 1;
    assert_eq!(build(&every).unwrap().period, 1);
    every.meta.events.alloc_rate = 0;
    assert_eq!(build(&every).unwrap().period, 1);
}

#[test]
fn python_frames_have_their_own_mapping() {
    let mut profile = fixture::profile();
    profile.frames.push(Frame {
        kind: FrameKind::Python,
        function: Some("handle".to_string()),
        module: None,
        address: 0,
        file: Some("/srv/app.py".to_string()),
        line: Some(12),
        unknown_reason: None,
        ids: None,
        start_line: None,
        interpreter: false,
    });
    profile.samples[0].frames.push(5);
    let p = build(&profile).unwrap();
    let python = p
        .mapping
        .iter()
        .find(|m| string(&p, m.filename) == PYTHON_MAPPING)
        .unwrap();
    assert!(python.has_functions && python.has_filenames && python.has_line_numbers);
    let leaf = &p.location[usize::try_from(p.sample[0].location_id[0] - 1).unwrap()];
    assert_eq!(leaf.mapping_id, python.id);
    assert_eq!(leaf.line[0].line, 12);
}

#[test]
fn the_executable_is_the_first_mapping() {
    // The first sample's leaf is in libfoo.so, so its mapping would come first.
    let mut profile = fixture::profile();
    let libfoo = profile
        .samples
        .iter()
        .position(|s| s.frames == [0, 2])
        .unwrap();
    profile.samples.swap(0, libfoo);
    let first = |profile: &Profile| {
        let p = build(profile).unwrap();
        string(&p, p.mapping[0].filename).to_string()
    };
    assert_eq!(first(&profile), "/usr/lib/libfoo.so");
    profile.processes[0].info.exe_path = Some("/usr/bin/app".to_string());
    assert_eq!(first(&profile), "/usr/bin/app");
    // An executable without frames in the profile is not made up.
    profile.processes[0].info.exe_path = Some("/usr/bin/other".to_string());
    assert_eq!(first(&profile), "/usr/lib/libfoo.so");
}
