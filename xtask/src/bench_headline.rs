//! The headline table at the top of BENCHMARKS.md: spanprof against perf, py-spy and memray.
//!
//! Overview: the table is made from the blocks of figures the bench parts write
//! (`<!-- NAME:begin -->` … `<!-- NAME:end -->`), never typed by hand: [`render`] takes chosen
//! rows of those blocks' tables, by the start of their first cell, and links each to its block.
//! `cargo xtask bench` writes it into the `headline` block after every block it updates, and
//! `cargo xtask docs` fails when the block in the file is not what [`render`] makes of the file.
//!
//! Design constraints: a part that was not run, or a row a part no longer prints, gives "not
//! measured" in the table rather than a stale figure.

/// The name of the block in BENCHMARKS.md.
pub const BLOCK: &str = "headline";

/// One row of the headline: a row of a block's table, chosen by the start of its first cell
/// (bold markers removed), and the columns to show (0 is the figure's name).
struct Row {
    what: &'static str,
    block: &'static str,
    figure: &'static str,
    /// spanprof's columns; with several, each is shown as `header: value`.
    spanprof: &'static [usize],
    /// The other profiler's column, shown as `header: value`.
    other: Option<usize>,
    goal: Option<usize>,
}

const ROWS: &[Row] = &[
    Row {
        what: "C target (`fixed_work`, 99 Hz, `--unwind fp`): CPU time, profiled / alone",
        block: "bench",
        figure: "target CPU time, profiled / alone",
        spanprof: &[1],
        other: Some(2),
        goal: Some(3),
    },
    Row {
        what: "C target: profiler's own CPU per sample, whole process",
        block: "bench",
        figure: "profiler's own CPU per sample, whole process",
        spanprof: &[1],
        other: Some(2),
        goal: Some(3),
    },
    Row {
        what: "Python target (50 frames, 99 Hz): CPU time, profiled / alone",
        block: "bench-python",
        figure: "target CPU time, profiled / alone",
        spanprof: &[1],
        other: Some(2),
        goal: Some(3),
    },
    Row {
        what: "Python target: profiler's own CPU per sample, whole process",
        block: "bench-python",
        figure: "profiler's own CPU per sample, whole process",
        spanprof: &[1],
        other: Some(2),
        goal: Some(3),
    },
    Row {
        what: "Python target: in-kernel time per sample (BPF statistics)",
        block: "bench-python",
        figure: "in-kernel time per target sample, net",
        spanprof: &[1],
        other: None,
        goal: Some(3),
    },
    Row {
        what: "Python target: profiler's peak RSS",
        block: "bench-python",
        figure: "profiler's peak RSS",
        spanprof: &[1],
        other: Some(2),
        goal: Some(3),
    },
    Row {
        what: "No frame pointers (`cpu_split_nofp`, 499 Hz, `--unwind dwarf`): samples with the whole path",
        block: "unwind",
        figure: "samples of the work with the whole path",
        spanprof: &[1],
        other: Some(3),
        goal: None,
    },
    Row {
        what: "No frame pointers: CPU per sample, all told (perf: record + script)",
        block: "unwind",
        figure: "CPU per sample, all told",
        spanprof: &[1],
        other: Some(3),
        goal: None,
    },
    Row {
        what: "Off-CPU (`offcpu_pingpong`): wall time, profiled / alone",
        block: "bench-offcpu",
        figure: "loop wall time, profiled / alone",
        spanprof: &[1],
        other: Some(2),
        goal: Some(3),
    },
    Row {
        what: "Off-CPU: in-kernel time per context switch (`on_switch`)",
        block: "bench-offcpu",
        figure: "in-kernel time per `on_switch` run",
        spanprof: &[1],
        other: None,
        goal: Some(3),
    },
    Row {
        what: "Allocations (CPython loop, `--event alloc`): wall time, profiled / alone",
        block: "bench-alloc",
        figure: "loop wall time, profiled / alone",
        spanprof: &[1],
        other: Some(4),
        goal: Some(5),
    },
    Row {
        what: "Span reading (OpenTelemetry and OSProfiler): in-kernel time added per sample",
        block: "bench-spans",
        figure: "span reading per sample",
        spanprof: &[1, 2],
        other: None,
        goal: Some(3),
    },
    Row {
        what: "Daemon (host-wide, 19 Hz): own CPU, % of one core",
        block: "bench-daemon",
        figure: "own CPU, % of one core",
        spanprof: &[1],
        other: Some(2),
        goal: Some(3),
    },
    Row {
        what: "Daemon: peak RSS",
        block: "bench-daemon",
        figure: "peak RSS (",
        spanprof: &[1],
        other: Some(2),
        goal: Some(3),
    },
    Row {
        what: "Session (2-frame Python stack, 99 Hz): fixed CPU of a session",
        block: "bench-session",
        figure: "fixed CPU of a session",
        spanprof: &[1],
        other: Some(2),
        goal: Some(4),
    },
    Row {
        what: "Session: own CPU per sample in steady state",
        block: "bench-session",
        figure: "own CPU per sample in steady state",
        spanprof: &[1],
        other: Some(2),
        goal: Some(4),
    },
    Row {
        what: "Session: in-kernel time per sample, shallow Python stack",
        block: "bench-session",
        figure: "in-kernel time per target sample, shallow",
        spanprof: &[1],
        other: None,
        goal: Some(4),
    },
];

/// The text between a block's markers, and the heading above its begin marker.
fn block<'a>(md: &'a str, name: &str) -> Option<(&'a str, &'a str)> {
    let begin = format!("<!-- {name}:begin -->");
    let end = format!("<!-- {name}:end -->");
    let b = md.find(&begin)?;
    let e = md[b..].find(&end)? + b;
    let heading = md[..b]
        .lines()
        .rev()
        .find(|l| l.starts_with('#'))
        .unwrap_or("");
    Some((&md[b + begin.len()..e], heading))
}

fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().replace("**", ""))
        .collect()
}

/// GitHub's anchor of a heading line: lower case, punctuation dropped, spaces as hyphens.
pub fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The headline table, from the blocks of `md` (the text of BENCHMARKS.md).
pub fn render(md: &str) -> String {
    let mut out = String::from(
        "Written by `cargo xtask bench` from the blocks of figures below, each row from the block \
         it links to; `cargo xtask docs` checks that it matches them. Goals are those of the blocks.\n\n\
         | figure | spanprof | compared with | goal |\n|---|---|---|---|\n",
    );
    for row in ROWS {
        let found = block(md, row.block).and_then(|(text, heading)| {
            let mut lines = text.lines().filter(|l| l.starts_with('|'));
            let header = cells(lines.next()?);
            let line = lines.map(cells).find(|c| c[0].starts_with(row.figure))?;
            Some((header, line, anchor(heading)))
        });
        let Some((header, line, anchor)) = found else {
            out.push_str(&format!(
                "| {} | not measured (no `{}` row in block `{}`) | | |\n",
                row.what, row.figure, row.block
            ));
            continue;
        };
        let get = |i: usize| line.get(i).map(String::as_str).unwrap_or("");
        let labelled = |i: usize| format!("{}: {}", header.get(i).map_or("", |h| h), get(i));
        let spanprof = if row.spanprof.len() == 1 {
            get(row.spanprof[0]).to_string()
        } else {
            row.spanprof
                .iter()
                .map(|&i| labelled(i))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let other = row.other.map(labelled).unwrap_or_default();
        let goal = row.goal.map(get).unwrap_or("");
        out.push_str(&format!(
            "| [{}](#{anchor}) | {spanprof} | {other} | {goal} |\n",
            row.what
        ));
    }
    out
}

/// The headline block as it stands in `md`, if it has one.
pub fn current(md: &str) -> Option<&str> {
    block(md, BLOCK).map(|(text, _)| text.strip_prefix('\n').unwrap_or(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_come_from_their_blocks() {
        let md = "# B\n\n<!-- headline:begin -->\nold\n<!-- headline:end -->\n\n\
                  ### Native target: fixed_work\n\n<!-- bench:begin -->\nRun of …\n\n\
                  | figure | spanprof --unwind fp | perf record -g | goal |\n|---|---|---|---|\n\
                  | target CPU time, profiled / alone (median) | 1.0015 | 1.0041 | ≤ 1.005 |\n\
                  <!-- bench:end -->\n";
        let table = render(md);
        assert!(
            table.contains(
                "| [C target (`fixed_work`, 99 Hz, `--unwind fp`): CPU time, profiled / alone]\
                 (#native-target-fixed_work) | 1.0015 | perf record -g: 1.0041 | ≤ 1.005 |"
            ),
            "{table}"
        );
        assert!(table
            .contains("not measured (no `span reading per sample` row in block `bench-spans`)"));
        assert_eq!(current(md), Some("old\n"));
    }

    #[test]
    fn anchors_are_github_s() {
        assert_eq!(
            anchor("### Python target: bench_py_stack.py, 50 frames deep"),
            "python-target-bench_py_stackpy-50-frames-deep"
        );
    }
}
