//! Folded output (`frame;frame;… COUNT`): parsed and checked, counted, and held against the
//! known shape of `cpu_split`.

use std::path::Path;

/// One line of folded output: frames root first, and a count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoldedStack {
    pub frames: Vec<String>,
    pub count: u64,
}

impl FoldedStack {
    /// True when `seq` appears as consecutive frames (root first).
    pub fn contains_seq(&self, seq: &[&str]) -> bool {
        contains_seq(&self.frames, seq)
    }

    pub fn contains(&self, frame: &str) -> bool {
        self.frames.iter().any(|f| f == frame)
    }

    /// The frame right after (called by) the first `frame`, if any.
    pub fn callee_of(&self, frame: &str) -> Option<&str> {
        let i = self.frames.iter().position(|f| f == frame)?;
        self.frames.get(i + 1).map(String::as_str)
    }
}

/// True when `seq` appears as consecutive elements of `frames`.
pub fn contains_seq<S: AsRef<str>>(frames: &[S], seq: &[&str]) -> bool {
    seq.is_empty()
        || frames
            .windows(seq.len())
            .any(|w| w.iter().zip(seq).all(|(a, b)| a.as_ref() == *b))
}

/// True for a kernel frame in folded output (`name_[k]`).
pub fn is_kernel_frame(frame: &str) -> bool {
    frame.ends_with("_[k]")
}

/// Checks one frame's spelling; `Err` says what is wrong.
fn check_frame(frame: &str) -> Result<(), String> {
    if frame.is_empty() {
        return Err("empty frame".into());
    }
    if frame.trim() != frame {
        return Err(format!("frame {frame:?} has surrounding whitespace"));
    }
    if frame.contains(['\n', '\r', '\t']) {
        return Err(format!("frame {frame:?} has a control character"));
    }
    if let Some(rest) = frame.strip_prefix("[unknown]") {
        // `[unknown]`, or `[unknown] (module+0xHEX)`.
        if rest.is_empty() {
            return Ok(());
        }
        let inner = rest
            .strip_prefix(" (")
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(|| format!("unknown frame {frame:?} is not `[unknown] (module+0x…)`"))?;
        let (module, offset) = inner
            .rsplit_once("+0x")
            .ok_or_else(|| format!("unknown frame {frame:?} has no `+0x` offset"))?;
        if module.is_empty() || offset.is_empty() || !offset.chars().all(|c| c.is_ascii_hexdigit())
        {
            return Err(format!(
                "unknown frame {frame:?} is not `[unknown] (module+0x…)`"
            ));
        }
    }
    Ok(())
}

/// Parses and checks folded output: every line is `frame(;frame)* COUNT`,
/// frames non-empty, count a positive decimal.
pub fn parse_folded(text: &str) -> Result<Vec<FoldedStack>, String> {
    let mut stacks = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.is_empty() {
            return Err(format!("line {n} is empty"));
        }
        let (stack, count) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("line {n} has no count: {line:?}"))?;
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "line {n}: count {count:?} is not a number: {line:?}"
            ));
        }
        let count: u64 = count
            .parse()
            .map_err(|e| format!("line {n}: count {count:?}: {e}"))?;
        if count == 0 {
            return Err(format!("line {n} has count 0: {line:?}"));
        }
        let frames: Vec<String> = stack.split(';').map(str::to_owned).collect();
        for frame in &frames {
            check_frame(frame).map_err(|e| format!("line {n}: {e}: {line:?}"))?;
        }
        stacks.push(FoldedStack { frames, count });
    }
    Ok(stacks)
}

/// Reads and parses a folded file, panicking with the reason when malformed.
#[track_caller]
pub fn read_folded(path: &Path) -> Vec<FoldedStack> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    parse_folded(&text).unwrap_or_else(|e| panic!("malformed folded file {}: {e}", path.display()))
}

/// The sum of the counts.
pub fn folded_total(stacks: &[FoldedStack]) -> u64 {
    stacks.iter().map(|s| s.count).sum()
}

/// The sum of the counts of the stacks for which `pred` holds.
pub fn folded_count(stacks: &[FoldedStack], pred: impl Fn(&FoldedStack) -> bool) -> u64 {
    stacks.iter().filter(|s| pred(s)).map(|s| s.count).sum()
}

/// The heaviest stacks, for failure messages.
/// Checks the truth of `cpu_split` (main → dispatcher → hot_alpha 75% / hot_beta 25%) on its
/// folded stacks: at least `min_dispatcher` samples under dispatcher, ≥ 95% of all samples
/// with the whole path main;dispatcher;hot_*, and hot_alpha's share 75 ± 5 points. `context` goes into the failure messages. Returns (hot_alpha, hot_beta).
#[track_caller]
pub fn assert_cpu_split_truth(
    stacks: &[FoldedStack],
    min_dispatcher: u64,
    label: &str,
    context: &str,
) -> (u64, u64) {
    let total = folded_total(stacks);
    let dispatcher = folded_count(stacks, |s| s.contains("dispatcher"));
    let alpha = folded_count(stacks, |s| {
        s.contains_seq(&["main", "dispatcher", "hot_alpha"])
    });
    let beta = folded_count(stacks, |s| {
        s.contains_seq(&["main", "dispatcher", "hot_beta"])
    });
    assert!(
        dispatcher >= min_dispatcher,
        "{label}: only {dispatcher} of {total} samples are under dispatcher\n{context}"
    );
    // The process does little but dispatch: at least 95% of all its samples are in one of
    // the two hot functions, reached through main -> dispatcher (the full path).
    assert!(
        (alpha + beta) as f64 >= 0.95 * total as f64,
        "{label}: {alpha} + {beta} of {total} samples ({dispatcher} under dispatcher) have the \
         full path main;dispatcher;hot_*\n{context}"
    );
    let alpha_share = 100.0 * alpha as f64 / (alpha + beta).max(1) as f64;
    assert!(
        (alpha_share - 75.0).abs() <= 5.0,
        "{label}: hot_alpha has {alpha_share:.1}% of the hot samples ({alpha} vs hot_beta \
         {beta}), expected 75 ± 5\n{context}"
    );
    (alpha, beta)
}

pub fn folded_summary(stacks: &[FoldedStack], n: usize) -> String {
    let mut sorted: Vec<&FoldedStack> = stacks.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.count));
    sorted
        .iter()
        .take(n)
        .map(|s| format!("  {} {}", s.frames.join(";"), s.count))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_well_formed_folded() {
        let text = "_start;main;dispatcher;hot_alpha 30\n\
                    _start;main;dispatcher;hot_beta 10\n\
                    main;do_syscalls;entry_SYSCALL_64_[k];read_zero_[k] 7\n\
                    [unknown] (libc.so.6+0x2a1b0);main 2\n\
                    [unknown] 1\n";
        let stacks = parse_folded(text).unwrap();
        assert_eq!(stacks.len(), 5);
        assert_eq!(folded_total(&stacks), 50);
        assert!(stacks[0].contains_seq(&["main", "dispatcher", "hot_alpha"]));
        assert!(!stacks[0].contains_seq(&["main", "hot_alpha"]));
        assert_eq!(stacks[1].callee_of("dispatcher"), Some("hot_beta"));
        assert!(is_kernel_frame(&stacks[2].frames[3]));
        assert_eq!(
            folded_count(&stacks, |s| s.contains("dispatcher")),
            40,
            "dispatcher samples"
        );
    }

    #[test]
    fn rejects_malformed_folded() {
        for bad in [
            "main;hot 0\n",
            "main;hot\n",
            "main;;hot 3\n",
            "main;hot -3\n",
            "main;hot 3x\n",
            "\n",
            "main; hot 3\n",
            "[unknown] (libc.so.6) 1\n",
            "[unknown] (libc.so.6+0xzz) 1\n",
        ] {
            assert!(parse_folded(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn subsequence() {
        let frames = ["a", "b", "c"];
        assert!(contains_seq(&frames, &["b", "c"]));
        assert!(contains_seq(&frames, &[]));
        assert!(!contains_seq(&frames, &["a", "c"]));
    }
}
