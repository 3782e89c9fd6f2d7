//! The blocks of figures in BENCHMARKS.md, between `<!-- NAME:begin -->` and
//! `<!-- NAME:end -->` markers.

use std::path::Path;

use anyhow::Result;

use crate::run::step;

/// `md` with the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` replaced by
/// `table`. Without those markers: `None`, or with a `heading`, `md` with a new `### heading`
/// section holding the markers and `table` after the last block of figures (the last line with
/// an `:end -->` marker; the end of `md` if there is none).
pub(crate) fn replace_block(
    md: &str,
    name: &str,
    table: &str,
    heading: Option<&str>,
) -> Option<String> {
    let (begin, end) = (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    );
    match (md.find(&begin), md.find(&end)) {
        (Some(b), Some(e)) if b < e => Some(format!("{}{begin}\n{table}{}", &md[..b], &md[e..])),
        _ => {
            let heading = heading?;
            let at = md
                .rfind(":end -->")
                .map(|i| md[i..].find('\n').map_or(md.len(), |nl| i + nl + 1))
                .unwrap_or(md.len());
            let (head, tail) = md.split_at(at);
            let sep = if head.is_empty() || head.ends_with('\n') {
                ""
            } else {
                "\n"
            };
            Some(format!(
                "{head}{sep}\n### {heading}\n\n{begin}\n{table}{end}\n{tail}"
            ))
        }
    }
}

/// Replaces the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in BENCHMARKS.md;
/// without those markers, adds them in a new `### heading` section if a heading is given (see
/// [`replace_block`]). The headline table at the top is made again from the new figures
/// ([`crate::bench_headline`]).
pub(super) fn write_block(
    root: &Path,
    name: &str,
    table: &str,
    heading: Option<&str>,
) -> Result<()> {
    let md_path = root.join("BENCHMARKS.md");
    let md = std::fs::read_to_string(&md_path).unwrap_or_default();
    match replace_block(&md, name, table, heading) {
        Some(new) => {
            let headline = crate::bench_headline::render(&new);
            let new =
                replace_block(&new, crate::bench_headline::BLOCK, &headline, None).unwrap_or(new);
            std::fs::write(&md_path, new)?;
            step(&format!(
                "updated the {name} figures in {}",
                md_path.display()
            ));
        }
        None => step(&format!(
            "BENCHMARKS.md has no {name} markers; figures printed only"
        )),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_replaced_or_added() {
        let md = "# B\n\n<!-- a:begin -->\nold\n<!-- a:end -->\n\n### Later\n\ntext\n";
        assert_eq!(
            replace_block(md, "a", "new\n", None).unwrap(),
            "# B\n\n<!-- a:begin -->\nnew\n<!-- a:end -->\n\n### Later\n\ntext\n"
        );
        assert!(replace_block(md, "u", "t\n", None).is_none());
        assert_eq!(
            replace_block(md, "u", "t\n", Some("U")).unwrap(),
            "# B\n\n<!-- a:begin -->\nold\n<!-- a:end -->\n\n### U\n\n<!-- u:begin -->\nt\n\
             <!-- u:end -->\n\n### Later\n\ntext\n"
        );
        // Once added, the block is replaced in place.
        let added = replace_block(md, "u", "t\n", Some("U")).unwrap();
        assert_eq!(
            replace_block(&added, "u", "t2\n", Some("U")).unwrap(),
            added.replace("\nt\n", "\nt2\n")
        );
        assert_eq!(
            replace_block("# B", "u", "t\n", Some("U")).unwrap(),
            "# B\n\n### U\n\n<!-- u:begin -->\nt\n<!-- u:end -->\n"
        );
    }
}
