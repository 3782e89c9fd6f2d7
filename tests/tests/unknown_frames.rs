//! Frames without symbols, end to end: `cpu_split_stripped` is cpu_split
//! built without `-g` and `strip -s`'d, so none of its functions has a name,
//! while frame pointers still let spanprof walk its stacks. Its frames must
//! read `[unknown] (cpu_split_stripped+0x…)` with offsets that really are in
//! the functions the stripped symbols said (`cpu_split_stripped.symbols`,
//! `nm -S` of the binary before stripping, written by `cargo xtask workloads`).

use serde_json::Value;
use spanprof_tests::{
    decode_pprof, folded_count, folded_summary, folded_total, profile_pid, profiling_lock,
    read_folded, require_profiling, workloads_dir, TempDir, Workload,
};

const MODULE: &str = "cpu_split_stripped";

/// The offset of a frame that is exactly `[unknown] (cpu_split_stripped+0xHEX)`.
fn unknown_offset(frame: &str) -> Option<u64> {
    let hex = frame
        .strip_prefix("[unknown] (cpu_split_stripped+0x")?
        .strip_suffix(')')?;
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Sized text symbols `(name, start, end)` of the binary before stripping.
fn text_symbols() -> Vec<(String, u64, u64)> {
    let path = workloads_dir().join("cpu_split_stripped.symbols");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        spanprof_tests::missing_prerequisite(
            &format!("{}: {e}", path.display()),
            "`cargo xtask workloads` (or `cargo xtask test`)",
        )
    });
    let symbols: Vec<(String, u64, u64)> = text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields[..] {
                [addr, size, "T" | "t", name] => {
                    let start = u64::from_str_radix(addr, 16).ok()?;
                    let size = u64::from_str_radix(size, 16).ok()?;
                    Some((name.to_owned(), start, start + size))
                }
                _ => None,
            }
        })
        .collect();
    for name in ["main", "dispatcher", "hot_alpha", "hot_beta"] {
        assert!(
            symbols.iter().any(|(n, _, _)| n == name),
            "no {name} in {}:\n{text}",
            path.display()
        );
    }
    symbols
}

/// The function of the unstripped binary that `offset` is in.
fn function_at(symbols: &[(String, u64, u64)], offset: u64) -> Option<&str> {
    symbols
        .iter()
        .find(|(_, start, end)| (*start..*end).contains(&offset))
        .map(|(name, _, _)| name.as_str())
}

#[test]
fn stripped_binary_frames_are_unknown_with_the_module_and_true_offsets() {
    require_profiling();
    let symbols = text_symbols();
    let _lock = profiling_lock();
    let tmp = TempDir::new("stripped");
    let folded = tmp.join("out.folded");
    let pprof = tmp.join("out.pb.gz");
    let svg = tmp.join("out.svg");
    let workload = Workload::start(MODULE, 10.0);
    let out = profile_pid(workload.pid(), "2s", 499, &[&folded, &pprof, &svg], &[]);
    drop(workload);
    out.assert_success();
    let stacks = read_folded(&folded);
    let total = folded_total(&stacks);
    let top = folded_summary(&stacks, 10);
    assert!(total >= 300, "only {total} samples:\n{top}\n{out}");

    // No name is invented for the stripped functions.
    for stack in &stacks {
        for name in ["main", "dispatcher", "hot_alpha", "hot_beta"] {
            assert!(
                !stack.contains(name),
                "{name} named in a stripped binary: {stack:?}"
            );
        }
    }
    // Most samples are in cpu_split_stripped's own code, as unknown frames.
    let unknown_leaf = folded_count(&stacks, |s| {
        s.frames.last().and_then(|f| unknown_offset(f)).is_some()
    });
    assert!(
        unknown_leaf as f64 >= 0.9 * total as f64,
        "only {unknown_leaf} of {total} samples end in [unknown] ({MODULE}+0x…):\n{top}\n{out}"
    );
    // The offsets are where the functions were: the unknown frames spell
    // main -> dispatcher -> hot_alpha/hot_beta.
    // NB: nm gives ELF addresses; in this PIE the executable segment has the
    // same file offset and address (ld's default layout), so they also are
    // the file offsets.
    let path_of = |s: &spanprof_tests::FoldedStack| -> Vec<String> {
        s.frames
            .iter()
            .filter_map(|f| unknown_offset(f))
            .map(|offset| {
                function_at(&symbols, offset)
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("<outside any function: {offset:#x}>"))
            })
            .collect()
    };
    // With the default .eh_frame unwinding the stack also reaches `_start` (libc's frames
    // between it and main are named, not unknown).
    let path_is = |s: &spanprof_tests::FoldedStack, want: &[&str]| {
        let path = path_of(s);
        let path = path.strip_prefix(&["_start".to_string()]).unwrap_or(&path);
        path == want
    };
    let alpha = folded_count(&stacks, |s| {
        path_is(s, &["main", "dispatcher", "hot_alpha"])
    });
    let beta = folded_count(&stacks, |s| path_is(s, &["main", "dispatcher", "hot_beta"]));
    let mapped: Vec<String> = stacks
        .iter()
        .map(|s| format!("  {} {}", path_of(s).join(";"), s.count))
        .collect();
    assert!(
        (alpha + beta) as f64 >= 0.9 * total as f64,
        "{alpha} + {beta} of {total} samples map to main;dispatcher;hot_*:\n{}\n{top}",
        mapped.join("\n")
    );
    let alpha_share = 100.0 * alpha as f64 / (alpha + beta) as f64;
    assert!(
        (alpha_share - 75.0).abs() <= 10.0,
        "hot_alpha's offsets have {alpha_share:.1}% of the hot samples, expected 75 ± 10:\n{top}"
    );

    // The pprof names the binary in a mapping, and its locations are the same
    // addresses, left unnamed (no line: pprof's convention for a tool to
    // symbolize later), at the offsets the folded output printed.
    let prof = decode_pprof(&pprof);
    let mappings = prof["mappings"].as_array().expect("mappings");
    assert!(
        mappings.iter().any(|m| m["filename"]
            .as_str()
            .is_some_and(|f| f.ends_with("/cpu_split_stripped"))),
        "no mapping of {MODULE}: {mappings:?}"
    );
    let frames: Vec<&Value> = prof["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .flat_map(|s| s["stack"].as_array().expect("stack"))
        .filter(|f| f["mapping"].as_str().is_some_and(|m| m.ends_with(MODULE)))
        .collect();
    assert!(!frames.is_empty(), "no pprof frame in {MODULE}");
    let folded_offsets: std::collections::BTreeSet<u64> = stacks
        .iter()
        .flat_map(|s| s.frames.iter().filter_map(|f| unknown_offset(f)))
        .collect();
    for frame in frames {
        assert!(
            frame["function"].is_null() && frame["file"].is_null() && frame["line"].is_null(),
            "pprof frame in {MODULE} has a line: {frame}"
        );
        let address = frame["address"].as_u64().expect("address");
        assert!(
            folded_offsets.contains(&address),
            "pprof address {address:#x} in {MODULE} is no offset of the folded output"
        );
    }
    assert_eq!(
        prof["totals"]["samples"].as_u64(),
        Some(total),
        "pprof vs folded total"
    );

    // The flamegraph draws the module's unknown addresses as one frame per place in the
    // stacks (the folded output above had them apart, with their offsets).
    let offsets: std::collections::BTreeSet<u64> = stacks
        .iter()
        .flat_map(|s| s.frames.iter().filter_map(|f| unknown_offset(f)))
        .collect();
    assert!(
        offsets.len() >= 3,
        "only {} distinct offsets",
        offsets.len()
    );
    let svg = std::fs::read_to_string(&svg).expect("svg");
    assert!(
        !svg.contains(&format!("[unknown] ({MODULE}+0x")),
        "the SVG draws an address of {MODULE}"
    );
    assert!(
        svg.contains(&format!("<title>[unknown] ({MODULE}) (")),
        "no [unknown] ({MODULE}) frame in the SVG"
    );
}
