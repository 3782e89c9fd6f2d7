//! Inlined functions through every format that keeps them.

use super::*;
use crate::profile::{Frame, FrameKind};

/// `fixture::profile` with a sample in `deflate` of libz at 0x4a26, into which
/// `fill_window` and then `read_buf` were inlined, and one at another address of it.
fn with_inlined() -> Profile {
    let mut profile = fixture::profile();
    let at = |kind, function: &str, address, line| Frame {
        kind,
        function: Some(function.to_string()),
        module: Some("/usr/lib/libz.so.1".to_string()),
        address,
        file: Some("/src/zlib/deflate.c".to_string()),
        line: Some(line),
        unknown_reason: None,
        ids: None,
        start_line: None,
        interpreter: false,
    };
    let first = profile.frames.len() as u32;
    profile.frames.extend([
        at(FrameKind::Native, "deflate", 0x4a26, 100),
        at(FrameKind::Inlined, "fill_window", 0x4a26, 50),
        at(FrameKind::Inlined, "read_buf", 0x4a26, 20),
        at(FrameKind::Native, "deflate", 0x4b00, 130),
    ]);
    let mut sample = profile.samples[0].clone();
    sample.frames = vec![0, first, first + 1, first + 2];
    profile.samples.push(sample);
    let mut sample = profile.samples[0].clone();
    sample.frames = vec![0, first + 3];
    sample.count = 1;
    profile.samples.push(sample);
    profile
}

fn folded(profile: &Profile) -> String {
    String::from_utf8(render(profile, Format::Folded).unwrap()).unwrap()
}

#[test]
fn inlined_functions_are_lines_of_one_location_and_frames_of_their_own() {
    let profile = with_inlined();
    let text = folded(&profile);
    assert!(
        text.contains(
            "main;deflate;fill_window (deflate.c:50, inlined);read_buf (deflate.c:20, inlined) 5"
        ),
        "{text}"
    );
    // pprof, decoded by the pprof crate's own types: one location, innermost line first.
    let bytes = render(&profile, Format::Pprof).unwrap();
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut raw).unwrap();
    let p = <::pprof::protos::Profile as ::pprof::protos::Message>::decode(&raw[..]).unwrap();
    let name = |id: u64| {
        let f = p.function.iter().find(|f| f.id == id).unwrap();
        p.string_table[f.name as usize].clone()
    };
    let loc = p.location.iter().find(|l| l.address == 0x4a26).unwrap();
    let lines: Vec<(String, i64)> = loc
        .line
        .iter()
        .map(|l| (name(l.function_id), l.line))
        .collect();
    assert_eq!(
        lines,
        [
            ("read_buf".to_string(), 20),
            ("fill_window".to_string(), 50),
            ("deflate".to_string(), 100)
        ]
    );
    assert_eq!(p.location.iter().filter(|l| l.address == 0x4b00).count(), 1);
    let libz = p.mapping.iter().find(|m| m.id == loc.mapping_id).unwrap();
    assert!(libz.has_inline_frames && libz.has_line_numbers);
    assert!(p
        .mapping
        .iter()
        .filter(|m| m.id != libz.id)
        .all(|m| !m.has_inline_frames));
    // Read back from pprof, OTLP and folded stacks, the same stacks.
    for format in [Format::Pprof, Format::Otlp, Format::Folded] {
        let bytes = render(&profile, format).unwrap();
        let back = match format {
            Format::Pprof => pprof::read_pprof(&bytes).unwrap(),
            Format::Otlp => otlp::read::read_otlp(&bytes).unwrap(),
            _ => folded::read_folded(&bytes).unwrap(),
        };
        assert_eq!(folded(&back), text, "{format:?}");
        let inlined: Vec<&Frame> = back
            .frames
            .iter()
            .filter(|f| f.kind == FrameKind::Inlined)
            .collect();
        assert_eq!(inlined.len(), 2, "{format:?}: {:?}", back.frames);
        assert!(inlined.iter().all(|f| f.line.is_some()), "{format:?}");
    }
}

#[test]
fn chains_that_share_their_ends_stay_apart_and_inlined_frames_need_a_native_one() {
    // Read from folded stacks, frames have no address: two chains of one function that
    // start and end alike are still two locations.
    let text =
        "main;deflate;fill_window (deflate.c:50, inlined);read_buf (deflate.c:20, inlined) 3\n\
                main;deflate;read_buf (deflate.c:20, inlined) 2\n\
                main;run (app.py:3);read_buf (deflate.c:20, inlined) 1\n";
    let profile = folded::read_folded(text.as_bytes()).unwrap();
    for format in [Format::Pprof, Format::Otlp] {
        let bytes = render(&profile, format).unwrap();
        let back = match format {
            Format::Pprof => pprof::read_pprof(&bytes).unwrap(),
            _ => otlp::read::read_otlp(&bytes).unwrap(),
        };
        let mut lines: Vec<String> = folded(&back).lines().map(str::to_string).collect();
        lines.sort();
        // An inlined frame after a Python one is a location of its own (read back as
        // native: nothing it was inlined into is known).
        assert_eq!(
            lines,
            [
                "main;deflate;fill_window (deflate.c:50, inlined);read_buf (deflate.c:20, inlined) 3",
                "main;deflate;read_buf (deflate.c:20, inlined) 2",
                "main;run (app.py:3);read_buf 1",
            ],
            "{format:?}"
        );
    }
}
