//! The stage that merges a Python stack into its native stack ([`merge`]): where each run of
//! Python frames goes among the native frames of the interpreter loop.

use crate::python::{split_token, MergeInfo, Unread, TOKEN_ENTRY, TRUNCATED_FUNCTION};

/// One frame of a merged stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// A native frame (lookup address).
    Native(u64),
    /// A Python frame (token).
    Python(u64),
    /// C code called into Python here, but the native stack does not show it.
    NativeCode,
    /// The interpreter loop ran Python code here, but its frames were not read.
    Unread(Unread),
}

/// The marker of frames left out of a deep Python stack (a `[truncated]` token inside a run).
fn is_gap(token: u64) -> bool {
    token & TOKEN_ENTRY == 0 && split_token(token).0 == TRUNCATED_FUNCTION
}

/// Merges a native user stack and a Python stack, both leaf first, into `out`, leaf first.
///
/// Python frames come in runs, one per call of the interpreter loop (a run ends with a frame
/// carrying [`TOKEN_ENTRY`]). When the interpreter keeps frame pointers (`info.native_trusted`),
/// each native frame inside the loop stands for the next run, leaf to root, and C frames between
/// Python frames stay where they are. Runs left over (the native stack was cut) follow the
/// native frames leafward of the outermost interpreter frame matched.
///
/// A Python stack deeper than a sample holds has a `[truncated]` token where frames were left
/// out; when the walk reached the outermost frame and the native stack has more interpreter
/// frames than there are runs, the runs after it are matched with the outermost interpreter
/// frames and the native frames of the calls left out are dropped with them.
///
/// Without frame pointers, a frame-pointer walk of the native stack goes astray at the first
/// interpreter frame, so only the interrupted instruction's own function is kept (when it is not
/// the loop itself), then every run. Either way, with `info.markers` (3.11+, where a run
/// boundary means C code called into Python) a [`Piece::NativeCode`] separates two runs that
/// no native frame separates.
///
/// A Python stack without frames (empty, or only an [`Unread`] marker token) of a Python
/// process (`info` known) whose native stack is in the interpreter loop gets the marker in
/// place of the outermost interpreter frame (without frame pointers: after the leaf native
/// function, as runs go); elsewhere the native stack stands alone.
pub fn merge(native: &[u64], python: &[u64], info: Option<MergeInfo<'_>>, out: &mut Vec<Piece>) {
    let unread = match python {
        [] => Some(Unread::NotFound),
        [token] => Unread::of_function(split_token(*token).0),
        _ => None,
    };
    if python.is_empty() || unread.is_some() {
        let eval = info.and_then(|info| {
            let outermost = native.iter().rposition(|&a| info.is_eval(a))?;
            Some((info, outermost))
        });
        match (unread, eval) {
            (Some(unread), Some((info, outermost))) if info.native_trusted => {
                out.extend(native[..outermost].iter().map(|&a| Piece::Native(a)));
                out.push(Piece::Unread(unread));
                out.extend(native[outermost + 1..].iter().map(|&a| Piece::Native(a)));
            }
            (Some(unread), Some((info, _))) => {
                if let Some(&leaf) = native.first().filter(|&&a| !info.is_eval(a)) {
                    out.push(Piece::Native(leaf));
                }
                out.push(Piece::Unread(unread));
            }
            _ => out.extend(native.iter().map(|&a| Piece::Native(a))),
        }
        return;
    }
    // Frames of a process whose interpreter is unknown here (gone before it was looked at):
    // nothing to match the runs with, so they follow the leaf native function.
    let info = info.unwrap_or(MergeInfo {
        eval_ranges: &[],
        markers: false,
        native_trusted: false,
    });
    let is_eval = |a: u64| info.is_eval(a);
    let mut runs = python.split_inclusive(|&t| t & TOKEN_ENTRY != 0).peekable();
    if info.native_trusted {
        // Frames left out of a deep stack (the gap marker, inside run `g` of `r`): when the
        // native stack has an interpreter frame for every run, the runs after the gap go with
        // the outermost ones, and the native frames between the gap run's two ends (the
        // interpreter calls whose frames were left out) go too.
        let mut skip_to = None;
        // Only when the walk reached the root: after a walk cut short, the frames after the
        // gap are from the middle of the stack, not its outermost.
        let reached_root = !python
            .last()
            .is_some_and(|&t| t & TOKEN_ENTRY != 0 && split_token(t).0 == TRUNCATED_FUNCTION);
        if let Some(at) = python
            .iter()
            .position(|&t| is_gap(t))
            .filter(|_| reached_root)
        {
            let g = python[..at]
                .iter()
                .filter(|&&t| t & TOKEN_ENTRY != 0)
                .count();
            let r = python.split_inclusive(|&t| t & TOKEN_ENTRY != 0).count();
            let e = native.iter().filter(|&&a| is_eval(a)).count();
            if e > r {
                skip_to = Some((g, e - (r - g)));
            }
        }
        let mut matched_to = None;
        let (mut evals, mut skipping) = (0, false);
        for &a in native {
            if is_eval(a) {
                let idx = evals;
                evals += 1;
                if skipping {
                    skipping = skip_to.is_some_and(|(_, x)| idx != x);
                    continue;
                }
                if let Some(run) = runs.next() {
                    out.extend(run.iter().map(|&t| Piece::Python(t)));
                    matched_to = Some(out.len());
                    skipping = skip_to.is_some_and(|(g, _)| idx == g);
                    continue;
                }
            }
            if !skipping {
                out.push(Piece::Native(a));
            }
        }
        if runs.peek().is_none() {
            return;
        }
        out.truncate(matched_to.unwrap_or(out.len()));
    } else if let Some(&leaf) = native.first().filter(|&&a| !is_eval(a)) {
        out.push(Piece::Native(leaf));
    }
    for run in runs {
        if info.markers && matches!(out.last(), Some(Piece::Python(_))) {
            out.push(Piece::NativeCode);
        }
        out.extend(run.iter().map(|&t| Piece::Python(t)));
    }
}
