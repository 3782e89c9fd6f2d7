//! Interactive SVG flame graph, drawn by inferno from the [folded](super::folded) stacks.
//!
//! The width of a frame is its number of samples (the count name is "samples"). The title names
//! the target (`spanprof: pid 1234 (cpu_split)`); the subtitle gives the session's duration,
//! frequency, total samples and, when there were any, lost samples
//! (`30.0 s at 99 Hz, 2970 samples (12 lost)`).
//!
//! Colors depend only on the frame name, so the same profile always gives the same bytes.

use inferno::flamegraph::{
    self,
    color::{MultiPalette, Palette},
    Options,
};

use super::{folded, OutputError};
use crate::profile::{Meta, Profile};

/// The flame graph's title: `spanprof: <target>`.
pub fn title(meta: &Meta) -> String {
    format!("spanprof: {}", meta.target)
}

/// The flame graph's subtitle, e.g. `30.0 s at 99 Hz, 2970 samples (12 lost)`.
pub fn subtitle(profile: &Profile) -> String {
    let meta = &profile.meta;
    let mut subtitle = format!(
        "{:.1} s at {} Hz, {} samples",
        meta.duration.as_secs_f64(),
        meta.frequency,
        profile.total_samples()
    );
    if meta.lost_samples > 0 {
        subtitle.push_str(&format!(" ({} lost)", meta.lost_samples));
    }
    subtitle
}

/// The picture of a profile without samples.
fn empty_svg(profile: &Profile) -> String {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"1200\" height=\"120\" xmlns=\"http://www.w3.org/2000/svg\">\n\
         <rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#eeeeee\"/>\n\
         <text x=\"600\" y=\"24\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{}</text>\n\
         <text x=\"600\" y=\"48\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"12\">{}</text>\n\
         <text x=\"600\" y=\"90\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"14\">no samples: the target did not run on a CPU while profiled</text>\n\
         </svg>\n",
        esc(&title(&profile.meta)),
        esc(&subtitle(profile)),
    )
}

/// Renders the profile as an SVG flame graph.
///
/// A profile with no samples gives a small SVG that says so, with the same title and subtitle,
/// rather than an error: an idle target is a result too.
pub fn render(profile: &Profile) -> Result<Vec<u8>, OutputError> {
    let lines: Vec<String> = folded::collapse(profile)?
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect();
    if lines.is_empty() {
        return Ok(empty_svg(profile).into_bytes());
    }

    let mut options = Options::default();
    options.title = title(&profile.meta);
    options.subtitle = Some(subtitle(profile));
    options.count_name = "samples".to_string();
    // NB: inferno's "perl" palette is the plain perf one: `_[k]` frames orange, names with `::`
    // (C++, Rust) yellow, everything else red. The java palette would color C functions that start
    // with a capital letter as Java.
    options.colors = Palette::Multi(MultiPalette::Perl);
    // Hash names with FNV instead of drawing random colors: same input, same bytes.
    options.deterministic = true;

    let mut out = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)
        .map_err(OutputError::Svg)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixture;

    #[test]
    fn svg_has_title_and_frames() {
        let profile = fixture::profile();
        let svg = String::from_utf8(render(&profile).unwrap()).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("spanprof: pid 100 (app)"));
        assert!(svg.contains("2.5 s at 100 Hz, 11 samples (4 lost)"));
        for name in [
            "main",
            "compute",
            "do_syscall_64",
            "[unknown] (libfoo.so+0x1234)",
        ] {
            assert!(svg.contains(name), "{name} missing");
        }
        assert!(svg.contains("<title>compute (10 samples, 90.91%)</title>"));
    }

    #[test]
    fn svg_is_deterministic() {
        let profile = fixture::profile();
        assert_eq!(render(&profile).unwrap(), render(&profile).unwrap());
    }

    #[test]
    fn subtitle_without_lost_samples() {
        let mut profile = fixture::profile();
        profile.meta.lost_samples = 0;
        assert_eq!(subtitle(&profile), "2.5 s at 100 Hz, 11 samples");
    }

    #[test]
    fn escapes_markup_in_names() {
        let mut profile = fixture::profile();
        profile.meta.target = "./bench <fast> & more".to_string();
        profile.frames[1].function = Some("Vec<T>::push".to_string());
        let svg = String::from_utf8(render(&profile).unwrap()).unwrap();
        assert!(svg.contains("Vec&lt;T&gt;::push"));
        assert!(!svg.contains("<fast>"));
    }
}
