//! Unit tests of the formats: what the writers write and the readers read back.

use std::path::Path;

use super::*;
use crate::profile::Memory;
use crate::wording::*;

#[test]
fn format_from_path() {
    let cases = [
        ("out.svg", Some(Format::Svg)),
        ("/tmp/OUT.SVG", Some(Format::Svg)),
        ("a.folded", Some(Format::Folded)),
        ("profile.pb.gz", Some(Format::Pprof)),
        ("profile.pprof", Some(Format::Pprof)),
        ("x.speedscope.json", Some(Format::Speedscope)),
        ("x.json", None),
        ("x.gz", None),
        ("svg", None),
        ("", None),
    ];
    for (path, want) in cases {
        assert_eq!(Format::from_path(Path::new(path)), want, "{path}");
    }
}

#[test]
fn format_names_round_trip() {
    for format in Format::ALL {
        assert_eq!(Format::from_name(format.name()), Some(format));
        assert_eq!(format.to_string(), format.name());
        let file = format!("out.{}", format.extension());
        assert_eq!(Format::from_path(Path::new(&file)), Some(format));
    }
    assert_eq!(Format::from_name("PPROF"), Some(Format::Pprof));
    assert_eq!(Format::from_name("json"), None);
}

#[test]
fn render_rejects_bad_indexes() {
    let mut profile = fixture::profile();
    profile.samples[1].frames.push(99);
    for format in Format::ALL {
        let err = render(&profile, format).unwrap_err();
        assert!(
            matches!(
                err,
                OutputError::FrameOutOfRange {
                    sample: 1,
                    frame: 99,
                    frames: 5
                }
            ),
            "{format}: {err}"
        );
    }
    let mut profile = fixture::profile();
    profile.samples[0].thread = 7;
    assert!(matches!(
        render(&profile, Format::Folded),
        Err(OutputError::ThreadOutOfRange { thread: 7, .. })
    ));
    let mut profile = fixture::with_spans();
    profile.samples[2].span = Some(3);
    for format in Format::ALL {
        let err = render(&profile, format).unwrap_err();
        assert!(
            matches!(
                err,
                OutputError::SpanOutOfRange {
                    sample: 2,
                    span: 3,
                    spans: 3
                }
            ),
            "{format}: {err}"
        );
    }
}

#[test]
fn osprofiler_links_are_derived_again_not_read_as_opentelemetry_ids() {
    let profile = fixture::with_spans();
    let link = profile.spans[1]
        .trace_link(true)
        .expect("an OSProfiler point links");
    assert_eq!(
        (link.trace_id, link.span_id, link.from_osprofiler),
        (fixture::BASE, [0x22; 8], true)
    );
    let own = profile.spans[2]
        .trace_link(true)
        .expect("an OpenTelemetry span links");
    assert!(!own.from_osprofiler && own.trace_id == fixture::TRACE);
    // Before a request's first point: in the parent it came with, or with none in no span.
    let mut before = profile.spans[1];
    before.osprofiler = Some(crate::profile::OsProfilerIds {
        base_id: fixture::BASE,
        trace_id: fixture::BASE,
        parent_id: Some(fixture::BASE),
    });
    assert_eq!(before.trace_link(true), None);
    // `--drop-label trace_id`, `span_id` or `span.ids_from`: nothing derived.
    let mut dropped = fixture::with_spans();
    for label in ["trace_id", "span_id", "span.ids_from"] {
        dropped.meta.dropped_labels = vec![label.to_string()];
        assert!(!dropped.meta.derives_links());
        assert_eq!(dropped.spans[1].trace_link(false), None);
        assert!(dropped.spans[1]
            .labels(false)
            .iter()
            .all(|(k, _)| { !matches!(*k, "trace_id" | "span_id" | "span.ids_from") }));
    }
    dropped.meta.dropped_labels = vec!["span.ids_from".to_string()];
    let bytes = render(&dropped, Format::Otlp).unwrap();
    let back = otlp::read::read_otlp(&bytes).unwrap();
    let point = back
        .spans
        .iter()
        .find(|s| s.osprofiler.is_some_and(|o| o.trace_id == [0x22; 16]))
        .expect("the OSProfiler point read back");
    assert_eq!((point.trace_id, point.span_id), (None, None));
    assert!(!before
        .labels(true)
        .iter()
        .any(|(k, _)| k.starts_with("trace_id")));
    for format in [Format::Pprof, Format::Otlp] {
        let bytes = render(&profile, format).unwrap();
        let back = match format {
            Format::Pprof => pprof::read_pprof(&bytes).unwrap(),
            _ => otlp::read::read_otlp(&bytes).unwrap(),
        };
        let mut spans = back.spans.clone();
        spans.sort();
        let mut expected = profile.spans.clone();
        expected.sort();
        assert_eq!(spans, expected, "{format:?}");
    }
}

#[test]
fn sizes_counts_and_rates() {
    let cases = [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (823_500_000, "785.4 MiB"),
        (1_283_500_000, "1.2 GiB"),
        (3 << 40, "3.0 TiB"),
        (u64::MAX, "16384.0 PiB"),
    ];
    for (bytes, text) in cases {
        assert_eq!(size(bytes), text, "{bytes}");
    }
    for (n, text) in [(0, "0"), (999, "999"), (1000, "1,000"), (34_567, "34,567")] {
        assert_eq!(thousands(n), text);
    }
    assert_eq!(thousands(u64::MAX), "18,446,744,073,709,551,615");
    let mut meta = fixture::memory().meta;
    assert_eq!(sampling(&meta), "at 1 sample per 512 KiB");
    for (rate, text) in [
        (1, "recording every allocation"),
        (0, "recording every allocation"),
        (100, "at 1 sample per 100 B"),
        (3 << 20, "at 1 sample per 3 MiB"),
        (1_000_000, "at 1 sample per 976.6 KiB"),
    ] {
        meta.events.alloc_rate = rate;
        assert_eq!(sampling(&meta), text, "{rate}");
        assert_eq!(estimated(meta.events), rate > 1);
    }
    assert_eq!(sampling(&fixture::profile().meta), "at 100 Hz");
}

#[test]
fn memory_words() {
    let both = fixture::memory();
    assert_eq!(
        memory_text(&both),
        "1.2 GiB allocated in 34,567 allocations, 785.4 MiB in use at the end in 1,037"
    );
    assert_eq!(
        memory_text(&fixture::alloc_only()),
        "1.2 GiB allocated in 34,567 allocations"
    );
    let mut heap = fixture::heap_only();
    assert_eq!(
        memory_text(&heap),
        "785.4 MiB in use at the end in 1,037 allocations"
    );
    heap.retain_samples(|_, s| s.thread == 1);
    heap.samples.pop();
    heap.samples[0].inuse = Memory {
        objects: 1,
        bytes: 100,
    };
    assert_eq!(
        memory_text(&heap),
        "100 B in use at the end in 1 allocation"
    );
    assert_eq!(
        shown(&both.meta),
        "memory in use at the end in pid 100 (app)"
    );
    assert_eq!(
        shown(&fixture::alloc_only().meta),
        "memory allocated by pid 100 (app)"
    );
    assert_eq!(shown(&fixture::profile().meta), "pid 100 (app)");
    assert_eq!(
        shown(&fixture::off_cpu().meta),
        "CPU + off-CPU time of pid 100 (app)"
    );
    assert_eq!(
        memory_totals(&both),
        (
            Memory {
                objects: 34_567,
                bytes: 1_283_500_000
            },
            Memory {
                objects: 1_037,
                bytes: 823_500_000
            }
        )
    );
}

#[test]
fn empty_profile() {
    let mut profile = fixture::profile();
    profile.samples.clear();
    assert!(render(&profile, Format::Folded).unwrap().is_empty());
    let svg = String::from_utf8(render(&profile, Format::Svg).unwrap()).unwrap();
    assert!(
        svg.contains("no samples") && svg.contains("</svg>"),
        "{svg}"
    );
    assert!(!render(&profile, Format::Pprof).unwrap().is_empty());
    assert!(!render(&profile, Format::Speedscope).unwrap().is_empty());

    for (mut profile, text) in [
        (
            fixture::alloc_only(),
            "no samples: no allocation of the target was sampled while profiled",
        ),
        (
            fixture::heap_only(),
            "no samples: no sampled allocation of the target was still in use at the end",
        ),
    ] {
        profile.samples.clear();
        assert_eq!(no_samples_text(profile.meta.events), text);
        let svg = String::from_utf8(render(&profile, Format::Svg).unwrap()).unwrap();
        assert!(svg.contains(text), "{svg}");
        assert!(render(&profile, Format::Folded).unwrap().is_empty());
    }
}

/// The fixture with module ids: libfoo.so has a GNU build id and a hash, the app a hash alone,
/// and a second libfoo.so of the same path (another file: a container's) a sample of its own.
fn with_module_ids() -> crate::profile::Profile {
    use std::sync::Arc;
    use symbolizer::build_id::ModuleIds;
    let mut p = fixture::profile();
    let ids = |gnu: Option<&str>, htl: &str| {
        Some(Arc::new(ModuleIds {
            gnu: gnu.map(Into::into),
            htlhash: Some(htl.into()),
        }))
    };
    for f in &mut p.frames {
        match f.module.as_deref() {
            Some("/usr/lib/libfoo.so") => {
                f.ids = ids(Some("aabbccdd00112233"), "0123456789abcdef0123456789abcdef")
            }
            Some("/usr/bin/app") => f.ids = ids(None, "fedcba9876543210fedcba9876543210"),
            _ => {}
        }
    }
    let mut other = p.frames[2].clone();
    other.ids = ids(Some("99887766"), "00000000000000000000000000000001");
    p.frames.push(other);
    let mut sample = p.samples[3].clone();
    sample.frames = vec![0, p.frames.len() as u32 - 1];
    p.samples.push(sample);
    p
}

#[test]
fn build_ids_go_on_native_mappings_and_come_back() {
    let profile = with_module_ids();
    let p = pprof::build(&profile).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    let mappings: Vec<(&str, &str)> = p
        .mapping
        .iter()
        .map(|m| (s(m.filename), s(m.build_id)))
        .collect();
    // The app has no GNU build id (pprof would refuse its own file under a hash); the two
    // libfoo.so files are two mappings.
    assert_eq!(
        mappings,
        [
            ("/usr/bin/app", ""),
            (pprof::KERNEL_MAPPING, ""),
            ("/usr/lib/libfoo.so", "aabbccdd00112233"),
            ("/usr/lib/libfoo.so", "99887766"),
        ]
    );
    let back = pprof::read_pprof(&pprof::render(&profile).unwrap()).unwrap();
    let gnu_of = |p: &crate::profile::Profile, id: &str| {
        p.frames
            .iter()
            .filter(|f| f.ids.as_ref().and_then(|i| i.gnu.as_deref()) == Some(id))
            .count()
    };
    assert_eq!(gnu_of(&back, "aabbccdd00112233"), 1);
    assert_eq!(gnu_of(&back, "99887766"), 1);
    // Unknown frames came back unknown, with their address.
    let unknown: Vec<String> = back
        .frames
        .iter()
        .filter(|f| f.function.is_none())
        .map(|f| f.display_name())
        .collect();
    assert_eq!(unknown, ["[unknown] (libfoo.so+0x1234)"; 2]);

    // OTLP: both ids, as mapping attributes, and back.
    let back = otlp::read_otlp(&otlp::render(&profile)).unwrap();
    let mut ids: Vec<(String, Option<String>, Option<String>)> = back
        .frames
        .iter()
        .filter_map(|f| {
            let i = f.ids.as_deref()?;
            Some((
                f.display_name(),
                i.gnu.as_deref().map(str::to_string),
                i.htlhash.as_deref().map(str::to_string),
            ))
        })
        .collect();
    ids.sort();
    ids.dedup_by(|a, b| a.1 == b.1 && a.2 == b.2);
    assert_eq!(
        ids,
        [
            (
                "[unknown] (libfoo.so+0x1234)".to_string(),
                Some("99887766".to_string()),
                Some("00000000000000000000000000000001".to_string())
            ),
            (
                "[unknown] (libfoo.so+0x1234)".to_string(),
                Some("aabbccdd00112233".to_string()),
                Some("0123456789abcdef0123456789abcdef".to_string())
            ),
            (
                "compute".to_string(),
                None,
                Some("fedcba9876543210fedcba9876543210".to_string())
            ),
        ]
    );
}

#[test]
fn start_lines_are_written_and_read_back() {
    let mut profile = fixture::profile();
    profile.frames[0].start_line = Some(7);
    let p = pprof::build(&profile).unwrap();
    let main = p
        .function
        .iter()
        .find(|f| p.string_table[f.name as usize] == "main")
        .unwrap();
    assert_eq!(main.start_line, 7);
    let main_start = |p: &crate::profile::Profile| {
        p.frames
            .iter()
            .find(|f| f.function.as_deref() == Some("main"))
            .unwrap()
            .start_line
    };
    let back = pprof::read_pprof(&pprof::render(&profile).unwrap()).unwrap();
    assert_eq!(main_start(&back), Some(7));
    let back = otlp::read_otlp(&otlp::render(&profile)).unwrap();
    assert_eq!(main_start(&back), Some(7));
    // Unknown elsewhere.
    assert!(back
        .frames
        .iter()
        .filter(|f| f.function.as_deref() != Some("main"))
        .all(|f| f.start_line.is_none()));
}
