//! Small profile files that would decode into gigabytes (issue 42, item 8): a gzip bomb of
//! packed zeros, a packed array that decodes to eight bytes an element, and a few bytes of
//! location ids that name a location of 64 inlined lines millions of times. Each is written
//! here byte by byte (protobuf wire format, not spanprof's encoder); `report`, `check` and
//! `diff` refuse each with one line, exit status 1, within 256 MiB of address space and under a
//! 1 GiB one (`ulimit -v`: an allocation past it would abort, not print a line).

use std::io::Write;
use std::path::Path;

use spanprof_tests::{spanprof_bin, RunOutput, TempDir};

fn varint(mut n: u64, out: &mut Vec<u8>) {
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// A length-delimited field.
fn ld(field: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(field << 3 | 2, &mut out);
    varint(payload.len() as u64, &mut out);
    out.extend_from_slice(payload);
    out
}

/// A varint field.
fn vf(field: u64, value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    varint(field << 3, &mut out);
    varint(value, &mut out);
    out
}

/// A pprof profile as spanprof writes one (samples/count, cpu/nanoseconds, a target comment),
/// with one function, one location of `lines` lines of it, and one sample whose packed
/// location ids are `ids` and whose values are `values` (packed, raw bytes).
fn pprof(lines: usize, ids: &[u8], values: &[u8]) -> Vec<u8> {
    let strings = [
        "",
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "target: crafted",
        "f",
        "thread.id",
        "thread.name",
        "process.id",
        "crafted",
    ];
    let mut p = Vec::new();
    p.extend(ld(1, &[vf(1, 1), vf(2, 2)].concat()));
    p.extend(ld(11, &[vf(1, 3), vf(2, 4)].concat()));
    p.extend(vf(12, 10_000_000));
    p.extend(vf(13, 5));
    for s in strings {
        p.extend(ld(6, s.as_bytes()));
    }
    p.extend(ld(5, &[vf(1, 1), vf(2, 6)].concat()));
    let mut loc = vf(1, 1);
    for _ in 0..lines {
        loc.extend(ld(4, &[vf(1, 1), vf(2, 7)].concat()));
    }
    p.extend(ld(4, &loc));
    let labels = [
        ld(3, &[vf(1, 7), vf(3, 42)].concat()),
        ld(3, &[vf(1, 8), vf(2, 10)].concat()),
        ld(3, &[vf(1, 9), vf(3, 42)].concat()),
    ]
    .concat();
    p.extend(ld(2, &[ld(1, ids), ld(2, values), labels].concat()));
    p
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// `spanprof ARGS` under `ulimit -v KIB`.
fn run_limited(kib: u64, args: &[&str]) -> RunOutput {
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(spanprof_bin())
        .args(args);
    spanprof_tests::run_with_timeout(cmd, std::time::Duration::from_secs(120))
}

#[test]
fn small_files_that_decode_big_are_refused_within_bounded_memory() {
    let tmp = TempDir::new("decode-big");
    let write = |name: &str, bytes: &[u8]| {
        let path = tmp.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    // Sanity: the crafted profile reads, with a short stack.
    let ok = write("ok.pb.gz", &gzip(&pprof(2, &[1, 1], &[3])));
    let out = run_limited(
        256 << 10,
        &["report", ok.to_str().unwrap(), "--format", "json"],
    );
    out.assert_success();
    assert!(out.stdout.contains("\"f\""), "{out}");

    // 500 MiB of zeros packed as values: half a MiB of gzip.
    let bomb = write("bomb.pb.gz", &gzip(&pprof(1, &[1], &vec![0u8; 500 << 20])));
    // 12 MiB of zeros, under the file's decompression bound (a quarter of 64 MiB and 256 bytes
    // a byte of its 12 KiB) but 8 bytes an element decoded.
    let wide = write("wide.pb.gz", &gzip(&pprof(1, &[1], &vec![0u8; 12 << 20])));
    // 3 Mi references to a location of 64 lines: decoded within the bound, but 768 MiB of
    // stack frames.
    let deep = write("deep.pb.gz", &gzip(&pprof(64, &vec![1u8; 3 << 20], &[1])));
    // The same as OTLP's name would say: read as OTLP, not a valid request, still bounded.
    let otlp = write("bomb.otlp.pb.gz", &std::fs::read(&bomb).unwrap());
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert!(size(&bomb) < 600 << 10, "the bomb is {} bytes", size(&bomb));
    for (path, says) in [
        (&bomb, "decompresses to more than"),
        (&wide, "decoding it would take"),
        (&deep, "its samples' stacks would take"),
        (&otlp, "decompresses to more than"),
    ] {
        let p = path.to_str().unwrap();
        for (kib, args) in [
            (256 << 10, vec!["report", p]),
            (1 << 20, vec!["report", p]),
            (256 << 10, vec!["check", p, "--max", "f=50%"]),
            (256 << 10, vec!["diff", ok.to_str().unwrap(), p]),
        ] {
            let out = run_limited(kib, &args);
            assert_eq!(out.code(), 1, "{args:?} under {kib} KiB: {out}");
            let lines: Vec<&str> = out.stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{args:?}: one line: {out}");
            assert!(
                lines[0].contains(p) && lines[0].contains(says),
                "{args:?}: {out}"
            );
        }
    }
}
