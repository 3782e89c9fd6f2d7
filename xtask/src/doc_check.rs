//! `cargo xtask docs`, also a step of `cargo xtask test`: the documents say what the code does.
//!
//! Overview, one check per way documents drift:
//! - flag defaults: every table marked `<!-- flags: spanprof SUB -->` (a `| flag | default |
//!   meaning |` table) in README.md and docs/ is compared with `spanprof SUB --help`: each flag it
//!   names must exist, and a stated default must be the `[default: …]` the help prints (clap
//!   prints those it declares; the defaults applied in code are printed the same way). A value
//!   stated where the code declares no default is an error too. The daemon's configuration keys
//!   are checked by a unit test of the `spanprof` crate against the code's defaults
//!   (`daemon::config::tests::documented_defaults_are_the_code_s`, run with the other tests);
//! - links: every relative link of the documents leads to a file that exists, and a `#anchor`
//!   into a Markdown file to one of its headings;
//! - BENCHMARKS.md's headline table is what [`crate::bench_headline::render`] makes of the
//!   blocks below it (nobody edited a figure by hand, and no block changed without it);
//! - README.md stays under 25 KB.
//!
//! Design constraints: every problem is listed, not only the first, and each names the file and
//! what differs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::bench_headline;
use crate::run::step;

/// The largest README.md the documentation issue allows.
const README_MAX_BYTES: usize = 25_000;

/// Runs every check with the built binary `bin`.
pub fn run(root: &Path, bin: &Path) -> Result<()> {
    let docs = documents(root)?;
    let mut problems = Vec::new();
    let flags = flag_defaults(root, bin, &docs, &mut problems)?;
    let links = links(root, &docs, &mut problems)?;
    headline(root, &mut problems)?;
    let readme = std::fs::metadata(root.join("README.md"))?.len() as usize;
    if readme > README_MAX_BYTES {
        problems.push(format!(
            "README.md is {readme} bytes, over {README_MAX_BYTES}: move details into docs/"
        ));
    }
    if problems.is_empty() {
        step(&format!(
            "documents agree with the code: {flags} documented flags, {links} links, the \
             BENCHMARKS.md headline"
        ));
        Ok(())
    } else {
        for p in &problems {
            eprintln!("xtask: docs: {p}");
        }
        bail!("{} problems in the documents", problems.len())
    }
}

/// README.md, ARCHITECTURE.md, BENCHMARKS.md, docs/*.md and the other READMEs.
fn documents(root: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "dist/README.md",
        "examples/ci/README.md",
        "fuzz/README.md",
        "python/spanprof-context/README.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .filter(|p| p.is_file())
    .collect();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .context("failed to read docs/")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    Ok(files)
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// The options of `bin SUB --help`: long name → the default it prints, if any.
fn help_defaults(bin: &Path, sub: &str) -> Result<BTreeMap<String, Option<String>>> {
    let out = std::process::Command::new(bin)
        .args([sub, "--help"])
        .output()
        .with_context(|| format!("failed to run {} {sub} --help", bin.display()))?;
    if !out.status.success() {
        bail!("{} {sub} --help failed", bin.display());
    }
    Ok(parse_help(&String::from_utf8_lossy(&out.stdout)))
}

/// Parses clap's help: an option line (`  -F, --frequency <HZ>  text`) and the indented lines
/// after it, up to the next option or the end of the section, hold its text and `[default: X]`.
fn parse_help(help: &str) -> BTreeMap<String, Option<String>> {
    let mut options: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let t = line.trim_start();
        let indented = line.len() > t.len();
        // `--name …`, or `-x, --name …`.
        let long = t.strip_prefix("--").or_else(|| {
            t.strip_prefix('-')
                .and_then(|r| r.get(1..))
                .and_then(|r| r.strip_prefix(", --"))
        });
        if let Some(rest) = long.filter(|_| indented) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            options.insert(name.clone(), t.to_string());
            current = Some(name);
        } else if indented && !t.is_empty() {
            if let Some(text) = current.as_ref().and_then(|n| options.get_mut(n)) {
                text.push(' ');
                text.push_str(t);
            }
        } else {
            current = None;
        }
    }
    options
        .into_iter()
        .map(|(name, text)| {
            let default = text.find("[default: ").and_then(|at| {
                let rest = &text[at + "[default: ".len()..];
                rest.find(']').map(|end| rest[..end].to_string())
            });
            (name, default)
        })
        .collect()
}

/// `16 MiB`, `512 KiB`, `16384` as bytes.
fn bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    for (unit, mult) in [("KiB", 1u64 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)] {
        if let Some(n) = s.strip_suffix(unit) {
            return n.trim().parse::<u64>().ok().map(|n| n * mult);
        }
    }
    s.parse().ok()
}

/// Whether a documented default matches the one the help prints.
fn same_default(documented: &str, code: &str) -> bool {
    documented == code || bytes(documented).is_some_and(|d| Some(d) == bytes(code))
}

/// A default cell that states a value (`99`, `` `dwarf` ``, `16 MiB`) rather than prose (`until
/// the targets exit or Ctrl-C`, `off`).
fn states_value(cell: &str) -> bool {
    !cell.is_empty()
        && !matches!(cell, "off" | "none" | "on")
        && (bytes(cell).is_some()
            || cell
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
}

/// The long flags a flag cell names: `` `-F, --frequency` ``, `` `--redact-paths[=MODE]` ``.
fn flags_in(cell: &str) -> Vec<String> {
    let mut flags = Vec::new();
    let mut rest = cell;
    while let Some(at) = rest.find("--") {
        let name: String = rest[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name.starts_with(|c: char| c.is_ascii_lowercase()) {
            flags.push(name.clone());
        }
        rest = &rest[at + 2 + name.len()..];
    }
    flags
}

fn flag_defaults(
    root: &Path,
    bin: &Path,
    docs: &[PathBuf],
    problems: &mut Vec<String>,
) -> Result<usize> {
    const MARKER: &str = "<!-- flags: spanprof ";
    let mut helps: BTreeMap<String, BTreeMap<String, Option<String>>> = BTreeMap::new();
    let mut checked = 0;
    for doc in docs {
        let text = std::fs::read_to_string(doc)?;
        let name = rel(root, doc);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(sub) = line
                .strip_prefix(MARKER)
                .and_then(|l| l.strip_suffix("-->"))
                .map(str::trim)
            else {
                continue;
            };
            if !helps.contains_key(sub) {
                helps.insert(sub.to_string(), help_defaults(bin, sub)?);
            }
            let help = &helps[sub];
            let mut rows = lines[i + 1..].iter().take_while(|l| l.starts_with('|'));
            let header: Vec<String> = rows.next().map(|h| cells(h)).unwrap_or_default();
            let Some(col) = header.iter().position(|h| h == "default") else {
                problems.push(format!(
                    "{name}:{}: the table after `{MARKER}{sub} -->` has no `default` column",
                    i + 1
                ));
                continue;
            };
            for (n, row) in rows.skip(1).enumerate() {
                let row_cells = cells(row);
                let at = format!("{name}:{}", i + 4 + n);
                let documented = row_cells
                    .get(col)
                    .map(|c| c.replace('`', "").trim().to_string())
                    .unwrap_or_default();
                for flag in flags_in(&row_cells[0]) {
                    checked += 1;
                    match help.get(&flag) {
                        None => problems.push(format!(
                            "{at}: --{flag} is documented but `spanprof {sub} --help` has no such flag"
                        )),
                        Some(Some(code)) if !documented.is_empty() && !same_default(&documented, code) => {
                            problems.push(format!(
                                "{at}: --{flag}: documented default `{documented}`, the code's is `{code}` (`spanprof {sub} --help`)"
                            ))
                        }
                        Some(None) if states_value(&documented) => problems.push(format!(
                            "{at}: --{flag}: documented default `{documented}`, but `spanprof {sub} --help` states none"
                        )),
                        Some(_) => {}
                    }
                }
            }
        }
    }
    if checked == 0 {
        problems.push(format!(
            "no `{MARKER}SUB -->` flag tables found in the documents"
        ));
    }
    Ok(checked)
}

fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_string())
        .collect()
}

/// The anchors of a Markdown file's headings (GitHub's: `-1`, `-2` for repeats).
fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let a = bench_headline::anchor(line);
        let n = seen.entry(a.clone()).or_insert(0);
        out.push(if *n == 0 {
            a.clone()
        } else {
            format!("{a}-{n}")
        });
        *n += 1;
    }
    out
}

/// The `](target)` links of a Markdown text, outside code blocks and code spans.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Code spans hold examples, not links.
        let plain: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            out.push((n + 1, tail[..end].to_string()));
            rest = &tail[end..];
        }
    }
    out
}

fn links(root: &Path, docs: &[PathBuf], problems: &mut Vec<String>) -> Result<usize> {
    let mut checked = 0;
    for doc in docs {
        let text = std::fs::read_to_string(doc)?;
        let dir = doc.parent().unwrap_or(root);
        for (line, target) in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let at = format!("{}:{line}", rel(root, doc));
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else {
                dir.join(path)
            };
            if !file.exists() {
                problems.push(format!("{at}: link to {target}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor.filter(|_| file.extension().is_some_and(|x| x == "md")) {
                let target_text = std::fs::read_to_string(&file)?;
                if !anchors(&target_text).iter().any(|a| a == anchor) {
                    problems.push(format!(
                        "{at}: link to {target}: {} has no heading with that anchor",
                        rel(root, &file)
                    ));
                }
            }
        }
    }
    Ok(checked)
}

fn headline(root: &Path, problems: &mut Vec<String>) -> Result<()> {
    let md = std::fs::read_to_string(root.join("BENCHMARKS.md"))?;
    match bench_headline::current(&md) {
        None => problems.push(format!(
            "BENCHMARKS.md has no <!-- {0}:begin --> … <!-- {0}:end --> block",
            bench_headline::BLOCK
        )),
        Some(text) if text != bench_headline::render(&md) => problems.push(
            "BENCHMARKS.md: the headline table differs from the blocks below it (edited by hand, \
             or a block changed): `cargo xtask docs --write-headline` writes it again"
                .to_string(),
        ),
        Some(_) => {}
    }
    Ok(())
}

/// Writes BENCHMARKS.md's headline block from its blocks (`cargo xtask docs --write-headline`).
pub fn write_headline(root: &Path) -> Result<()> {
    let path = root.join("BENCHMARKS.md");
    let md = std::fs::read_to_string(&path)?;
    let table = bench_headline::render(&md);
    let new = crate::bench::replace_block(&md, bench_headline::BLOCK, &table, None)
        .context("BENCHMARKS.md has no headline markers")?;
    std::fs::write(&path, new)?;
    step("wrote the headline table of BENCHMARKS.md from its blocks");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_defaults_are_read() {
        let help = "Options:\n  -F, --frequency <HZ>  Samples per second [default: 99]\n      \
                    --offcpu-min <DURATION>\n          With offcpu or wall: blocked\n          \
                    intervals [default: 5us]\n      --quiet  No progress bar\n\nExamples:\n  \
                    spanprof profile --pid 1\n";
        let d = parse_help(help);
        assert_eq!(d["frequency"].as_deref(), Some("99"));
        assert_eq!(d["offcpu-min"].as_deref(), Some("5us"));
        assert_eq!(d["quiet"], None);
        assert!(!d.contains_key("pid"));
    }

    #[test]
    fn defaults_compare() {
        assert!(same_default("16 MiB", "16777216"));
        assert!(same_default("dwarf", "dwarf"));
        assert!(!same_default("4 MiB", "16777216"));
        assert!(states_value("5us") && states_value("16 MiB"));
        assert!(!states_value("until the targets exit or Ctrl-C") && !states_value("off"));
        assert_eq!(
            flags_in("`-o FILE.otlp`, `--format otlp`, `--redact-paths[=MODE]`, `-- CMD`"),
            ["format", "redact-paths"]
        );
    }

    #[test]
    fn anchors_number_repeats() {
        assert_eq!(anchors("# A b\n## A b\n```\n# no\n```\n"), ["a-b", "a-b-1"]);
    }
}
