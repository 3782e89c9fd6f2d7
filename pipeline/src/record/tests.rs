//! A session recorded and replayed in memory; truncated, damaged and foreign recordings.

use std::borrow::Cow;
use std::io::Read;
use std::time::{Duration, SystemTime};

use profiler_common::{EVENT_ALLOC, EVENT_CPU, EVENT_OFFCPU, TASK_COMM_LEN};
use symbolizer::unwind::{FailedBy, UnwindStatus};
use symbolizer::Symbol;

use super::*;
use crate::assemble::{assemble, Facts, MergeFacts, PythonFacts};
use crate::count::Counter;
use crate::profile::{Build, Events, Meta, OsProfilerIds, Profile, SpanContext, SpanName};
use crate::python::{PyFunction, TOKEN_ENTRY, TRUNCATED_FUNCTION};
use crate::replay::{replay, replay_gzip};
use crate::resolve::{ProcessFacts, Resolved, PY_FLAG_TRUNCATED, PY_WITH_FRAMES};
use crate::resource::{HostInfo, ProcessInfo};

fn comm(name: &str) -> [u8; TASK_COMM_LEN] {
    let mut c = [0u8; TASK_COMM_LEN];
    c[..name.len()].copy_from_slice(name.as_bytes());
    c
}

fn resolved<'a>(pid: u32, tid: u32, kernel: &'a [u64], user: &'a [u64]) -> Resolved<'a> {
    Resolved {
        pid,
        tid,
        comm: comm("worker"),
        event: EVENT_CPU,
        time_ns: 1_000_000,
        weight: 0,
        alloc_id: 0,
        off_cpu: 0,
        kernel,
        user,
        unwind: UnwindStatus::Complete,
        python: &[],
        python_flags: 0,
        span: SpanContext::default(),
        thread_name: None,
    }
}

fn symbol(function: Option<&str>, module: &str, address: u64) -> Symbol {
    Symbol {
        function: function.map(str::to_string),
        module: Some(module.to_string()),
        address,
        file: function.map(|_| "/src/app.c".to_string()),
        line: function.map(|_| 42),
        unknown_reason: function.is_none().then(|| "no symbol".to_string()),
        // Some modules have ids (format version 3): both, or a hash alone.
        ids: match address % 3 {
            0 => None,
            1 => Some(std::sync::Arc::new(symbolizer::build_id::ModuleIds {
                gnu: Some(format!("{:040x}", module.len()).into()),
                htlhash: Some("00112233445566778899aabbccddeeff".into()),
            })),
            _ => Some(std::sync::Arc::new(symbolizer::build_id::ModuleIds {
                gnu: None,
                htlhash: Some("ffeeddccbbaa99887766554433221100".into()),
            })),
        },
        // Some addresses hold two inlined functions (format version 2).
        inlined: match function {
            Some(_) if address.is_multiple_of(2) => vec![
                symbolizer::Inlined {
                    function: Some("step".to_string()),
                    file: Some("/src/step.h".to_string()),
                    line: Some(7),
                },
                symbolizer::Inlined {
                    function: Some("mix".to_string()),
                    file: None,
                    line: None,
                },
            ],
            _ => Vec::new(),
        },
    }
}

/// Feeds `samples` to a counter and a recorder as the aggregator does; returns the profile
/// assembled and the recording.
fn session(opts: Options, samples: &[Resolved<'_>], build: bool) -> (Option<Profile>, Vec<u8>) {
    let mut count = Counter::new(opts);
    let mut rec = Recorder::new(&opts);
    for (i, r) in samples.iter().enumerate() {
        let new = count.count(r);
        rec.sample(r);
        if new {
            let facts = ProcessFacts {
                name: Some(format!("proc{}", r.pid)),
                info: opts.timestamps.then(|| ProcessInfo {
                    exe_path: Some("/usr/bin/app".into()),
                    command_line: Some("app --serve".into()),
                    env_attributes: vec![("deployment.environment".into(), "test".into())],
                    ..ProcessInfo::default()
                }),
            };
            rec.describe(r.pid, &facts);
            count.describe(r.pid, facts);
        }
        if i == 2 && count.exec(r.pid, r.time_ns) {
            let facts = ProcessFacts {
                name: None,
                info: Some(ProcessInfo::default()),
            };
            rec.exec(r.pid, r.time_ns);
            rec.describe(r.pid, &facts);
            count.describe(r.pid, facts);
        }
    }
    let live = [(7u64, 4096u64), (8, 100)];
    rec.live(&live);
    count.set_live(live);
    rec.errors(&[1, 0, 3]);
    let (user_addrs, kernel_addrs) = count.addresses();
    let user_symbols = user_addrs
        .iter()
        .map(|&(_, a)| symbol((a % 3 != 0).then_some("handle"), "/usr/bin/app", a))
        .collect();
    let kernel_symbols = kernel_addrs
        .iter()
        .map(|&a| symbol(Some("do_syscall_64"), "[kernel]", a))
        .collect();
    let facts = Facts {
        meta: Meta {
            target: "app --serve".into(),
            start: SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123),
            duration: Duration::from_millis(2500),
            frequency: 99,
            events: Events {
                off_cpu: true,
                ..Events::default()
            },
            lost_samples: 4,
            python: Default::default(),
            host: Some(HostInfo {
                name: "host".into(),
                id: Some("abc".into()),
            }),
            build: Build {
                commit: Some("0123abc".into()),
                branch: None,
            },
            dropped_labels: Vec::new(),
        },
        user_symbols,
        kernel_symbols,
        python: PythonFacts {
            functions: Cow::Owned(vec![
                PyFunction {
                    name: "[unknown python code]".into(),
                    file: None,
                    start_line: None,
                },
                PyFunction {
                    name: "main".into(),
                    file: Some("app.py".into()),
                    start_line: Some(3),
                },
            ]),
            merge: [(
                10,
                MergeFacts {
                    eval_ranges: vec![(0x5000, 0x6000)],
                    markers: true,
                    native_trusted: false,
                    interpreter: Some("/usr/lib/libpython3.12.so.1.0".into()),
                },
            )]
            .into(),
            versions: [(10, "3.12.1".to_string())].into(),
            found: 1,
            notes: vec!["a note".into()],
            spans_enabled: true,
            with_spans: 1,
        },
        unix_offset_ns: 1_700_000_000_000_000_000,
    };
    let bytes = rec.finish(&facts).unwrap();
    let profile = build.then(|| assemble(count, &user_addrs, &kernel_addrs, facts));
    (profile, bytes)
}

/// A session of every kind of sample: on-CPU, off-CPU, allocations, Python stacks, spans, two
/// processes, a renamed thread.
fn recorded() -> (Profile, Vec<u8>) {
    let python = [1 | 5 << 32, 1 | 9 << 32 | TOKEN_ENTRY];
    let truncated = [1 | 5 << 32, u64::from(TRUNCATED_FUNCTION) | TOKEN_ENTRY];
    let span = SpanContext {
        trace_id: Some([7; 16]),
        span_id: Some([8; 8]),
        osprofiler: Some(OsProfilerIds {
            base_id: [1; 16],
            trace_id: [2; 16],
            parent_id: Some([3; 16]),
        }),
        span_name: SpanName::from_ascii(b"GET /"),
        osprofiler_name: None,
    };
    let k = [0xffff_ffff_8100_0010, 0xffff_ffff_8100_2000];
    let u1 = [0x1000, 0x5010, 0x2fff];
    let u2 = [0x1000, 0x3000];
    let mut s = vec![
        resolved(10, 10, &k, &u1),
        resolved(10, 10, &k, &u1),
        resolved(10, 11, &[], &u2),
        resolved(20, 21, &[], &u2),
    ];
    s[1].time_ns = 500;
    s[2].comm = comm("renamed");
    s[2].python = &python;
    s[2].python_flags = PY_WITH_FRAMES;
    s[2].thread_name = Some("MainThread");
    s[2].span = span;
    s[3].event = EVENT_OFFCPU;
    s[3].weight = 5_000_000;
    s[3].off_cpu = 1 | 2 | (1 + 1) << 16;
    s[3].unwind = UnwindStatus::Failed(FailedBy::NoUnwindInfo);
    let mut alloc = resolved(10, 10, &k, &u2);
    alloc.event = EVENT_ALLOC;
    alloc.weight = 4096;
    alloc.alloc_id = 7;
    s.push(alloc);
    let mut cut = resolved(10, 11, &[], &u2);
    cut.python = &truncated;
    cut.python_flags = PY_WITH_FRAMES | PY_FLAG_TRUNCATED;
    cut.span = span;
    cut.thread_name = Some("MainThread");
    s.push(cut);
    let opts = Options {
        timestamps: true,
        heap: true,
        record: true,
        ..Options::default()
    };
    let (profile, bytes) = session(opts, &s, true);
    (profile.unwrap(), bytes)
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut raw)
        .unwrap();
    raw
}

#[test]
fn a_replay_assembles_the_profile_the_session_did() {
    let (profile, bytes) = recorded();
    let replayed = replay_gzip(&bytes).unwrap();
    assert_eq!(replayed.profile, profile);
    assert_eq!(replayed.samples, 6);
    assert_eq!(replayed.errors, [1, 0, 3]);
    assert_eq!(replayed.header.spanprof, env!("CARGO_PKG_VERSION"));
    assert!(replayed.header.options.heap && replayed.header.options.timestamps);
    // What the profile got from the recording's events and facts.
    assert_eq!(profile.processes[0].name, "proc10");
    assert_eq!(
        profile.processes[1].info.command_line.as_deref(),
        Some("app --serve")
    );
    assert!(profile.samples.iter().any(|s| s.inuse.bytes > 0));
    assert!(profile.samples.iter().any(|s| s.off_cpu.is_some()));
    assert_eq!(profile.spans.len(), 1);
    assert!(profile.threads.iter().any(|t| t.name == "MainThread"));
    // The functions inlined at an address follow its function, outermost first.
    let names: Vec<String> = profile
        .samples
        .iter()
        .flat_map(|s| {
            s.frames
                .iter()
                .map(|&f| profile.frames[f as usize].display_name())
        })
        .collect();
    let at = names
        .iter()
        .position(|n| n == "step (step.h:7, inlined)")
        .expect("an inlined frame");
    assert_eq!(names[at - 1], "handle");
    assert_eq!(names[at + 1], "mix (inlined)");
}

#[test]
fn every_truncation_is_an_error() {
    let (_, bytes) = recorded();
    let raw = gunzip(&bytes);
    for n in 0..raw.len() {
        let err = replay(&raw[..n]).expect_err("a truncated recording replayed");
        assert!(
            err.0.starts_with("truncated") || err.0.starts_with("not a spanprof recording"),
            "{n}: {err}"
        );
    }
    // The compressed file cut short.
    for n in [0, 1, 10, bytes.len() / 2, bytes.len() - 1] {
        assert!(replay_gzip(&bytes[..n]).is_err(), "{n}");
    }
}

#[test]
fn damaged_recordings_never_panic() {
    let (_, bytes) = recorded();
    let raw = gunzip(&bytes);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..raw.len() {
        for flip in [0x01, 0x80, 0xff] {
            let mut bad = raw.clone();
            bad[i] ^= flip;
            let _ = replay(&bad[..]);
        }
    }
    // Random bytes after a valid header, and everywhere.
    let header_len = MAGIC.len() + 20;
    for _ in 0..2000 {
        let mut bad = raw[..header_len].to_vec();
        let n = (next() % 200) as usize;
        bad.extend((0..n).map(|_| next() as u8));
        let _ = replay(&bad[..]);
        let garbage: Vec<u8> = (0..n).map(|_| next() as u8).collect();
        assert!(replay(&garbage[..]).is_err());
    }
    // Bytes after the end.
    let mut longer = raw.clone();
    longer.push(0);
    assert!(replay(&longer[..]).unwrap_err().0.contains("after its end"));
}

#[test]
fn other_files_and_versions_are_refused_with_what_was_expected() {
    let err = replay(&b"GIF89a"[..]).unwrap_err();
    assert_eq!(err.0, "not a spanprof recording (too short)");
    let err = replay_gzip(b"# a folded file\n").unwrap_err();
    assert!(err.0.starts_with("not a spanprof recording"), "{err}");
    let mut other = MAGIC.to_vec();
    other.extend([7, 5]);
    other.extend(b"9.9.9");
    let err = replay(&other[..]).unwrap_err();
    assert_eq!(
        err.0,
        format!(
            "a recording of format version 7 (written by spanprof 9.9.9); this spanprof ({}) \
             reads versions 1 to 4: replay it with the spanprof that recorded it",
            env!("CARGO_PKG_VERSION")
        )
    );
}

#[test]
fn facts_that_do_not_fit_the_samples_are_refused() {
    // A sample naming Python function 5 of a table of 2.
    let tokens = [5 | TOKEN_ENTRY];
    let mut r = resolved(10, 10, &[], &[0x1000]);
    r.python = &tokens;
    let opts = Options {
        record: true,
        ..Options::default()
    };
    let (_, bytes) = session(opts, &[r], false);
    let err = replay_gzip(&bytes).unwrap_err();
    assert!(err.0.contains("Python function 5 of 2"), "{err}");
}
