//! Interactive SVG flame graph, drawn by inferno from the [folded stacks](super::folded).
//!
//! The width of a frame is its weight ([`Profile::weight`]). For an on-CPU profile that is its
//! number of samples (the count name is "samples"), the title names the target (`spanprof: pid
//! 1234 (cpu_split)`) and the subtitle gives the session's duration, frequency, total samples
//! and, when there were any, lost samples (`30.0 s at 99 Hz, 2970 samples (12 lost)`).
//!
//! When off-CPU time is in the profile, widths are nanoseconds and the title and the count name
//! say of what ([`super::measure`]): `spanprof: off-CPU time of pid 1234 (app)` and tooltips
//! such as `read (1,500,000 ns of off-CPU time, 12.5%)`; likewise `CPU + off-CPU time`
//! (`--event cpu,offcpu`) and `wall-clock time` (`--event wall`). The subtitle then gives the
//! on-CPU samples and time, and the off-CPU time: `30.0 s at 99 Hz, 2970 samples (30000.0 ms
//! on-CPU), 81234.5 ms off-CPU (12 lost)`.
//!
//! A memory profile (`--event alloc`, `heap`) is drawn in bytes ([`Profile::weight`]: the bytes
//! in use at the end when the heap is in it, else the bytes allocated). The title says which,
//! `spanprof: memory allocated by <target>` or `spanprof: memory in use at the end in <target>`,
//! tooltips read `compute (1,200,000,000 bytes allocated, 93.5%)` or `… bytes in use, …`, and
//! the subtitle gives the duration, the sampling rate and the estimated totals:
//! `30.0 s at 1 sample per 512 KiB, 1.2 GiB allocated in 34,567 allocations (estimated; 12
//! lost)` ([`super::memory_text`]; with `--event alloc,heap` both totals).
//!
//! Colors depend only on the frame name, so the same profile always gives the same bytes.

use inferno::differential;
use inferno::flamegraph::{
    self,
    color::{MultiPalette, Palette},
    Options,
};

use super::{folded, OutputError};
use crate::profile::{Meta, Profile};
use crate::wording::{measure, no_samples_text, shown, subtitle};

/// The flame graph's title: `spanprof: <target>`, or `spanprof: <what> of <target>` when the
/// widths are nanoseconds (`spanprof: off-CPU time of pid 1234 (app)`), `spanprof: memory
/// allocated by <target>` or `spanprof: memory in use at the end in <target>` when bytes.
pub fn title(meta: &Meta) -> String {
    format!("spanprof: {}", shown(meta))
}

/// The unit of a frame's width in tooltips: `samples`, e.g. `ns of off-CPU time`, or `bytes
/// in use` (`--event heap`, with or without `alloc`) and `bytes allocated` (`--event alloc`).
pub fn count_name(meta: &Meta) -> String {
    if meta.events.heap {
        return "bytes in use".to_string();
    }
    if meta.events.alloc {
        return "bytes allocated".to_string();
    }
    match measure(meta.events) {
        None => "samples".to_string(),
        Some(what) => format!("ns of {what}"),
    }
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
         <text x=\"600\" y=\"90\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"14\">{}</text>\n\
         </svg>\n",
        esc(&title(&profile.meta)),
        esc(&subtitle(profile)),
        no_samples_text(profile.meta.events),
    )
}

/// Renders the profile as an SVG flame graph, frames named by
/// [`flame_name`](crate::wording::flame_name) (a stripped module's addresses are one frame).
///
/// A profile with no samples gives a small SVG that says so, with the same title and subtitle,
/// rather than an error: an idle target is a result too.
pub fn render(profile: &Profile) -> Result<Vec<u8>, OutputError> {
    let lines: Vec<String> = folded::collapse_by(profile, crate::wording::flame_name)?
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect();
    if lines.is_empty() {
        return Ok(empty_svg(profile).into_bytes());
    }

    let mut options = Options::default();
    options.title = title(&profile.meta);
    options.subtitle = Some(subtitle(profile));
    options.count_name = count_name(&profile.meta);
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

/// Renders a differential flame graph of `new` against `base` (inferno's, as Brendan Gregg
/// drew them): the frames are `new`'s, and a frame is red where it has more weight than in
/// `base`, blue where less, the deeper the color the larger the change. `base` is first scaled
/// to `new`'s total (each stack's weight rounded), so the colors show shares that changed, not
/// a longer run; tooltips give the change in points of the total, e.g. `render_output (1,234
/// samples, 40.00%; +15.00%)`. Frames are functions as `spanprof diff` names them
/// ([`crate::wording::function_name`]: a Python or inlined function without its line, so an
/// edit that moves lines changes nothing). Functions only in `base` have no width in `new` and are not
/// drawn (the text diff of `spanprof diff` lists them).
///
/// The profiles must be in the same unit; `base_name` and `new_name` are named in the
/// subtitle. Deterministic, like [`render`].
pub fn render_diff(
    base: &Profile,
    new: &Profile,
    base_name: &str,
    new_name: &str,
) -> Result<Vec<u8>, OutputError> {
    let name = crate::wording::function_name;
    let (before, after) = (
        folded::collapse_by(base, name)?,
        folded::collapse_by(new, name)?,
    );
    if after.is_empty() {
        return Ok(empty_svg(new).into_bytes());
    }
    let total = |stacks: &[(String, u64)]| stacks.iter().map(|(_, w)| *w as f64).sum::<f64>();
    let scale = total(&after) / total(&before).max(1.0);
    let lines = |stacks: &[(String, u64)], scale: f64| -> String {
        stacks
            .iter()
            .map(|(stack, w)| format!("{stack} {}\n", (*w as f64 * scale).round() as u64))
            .collect()
    };
    let mut merged = Vec::new();
    differential::from_readers(
        differential::Options {
            normalize: false,
            strip_hex: false,
        },
        lines(&before, scale).as_bytes(),
        lines(&after, 1.0).as_bytes(),
        &mut merged,
    )
    .map_err(OutputError::Svg)?;
    // NB: inferno writes the merged stacks in hash order; sorted, the same input gives the
    // same bytes.
    let merged = String::from_utf8_lossy(&merged).into_owned();
    let mut lines: Vec<&str> = merged.lines().collect();
    lines.sort_unstable();
    let mut options = Options::default();
    options.title = format!("spanprof diff: {}", shown(&new.meta));
    options.subtitle = Some(format!(
        "{new_name} against {base_name} (scaled to the same total): red grew, blue shrank"
    ));
    options.count_name = count_name(&new.meta);
    options.deterministic = true;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().copied(), &mut out)
        .map_err(OutputError::Svg)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fixture;

    #[test]
    fn svg_has_title_and_frames() {
        let profile = fixture::profile();
        let svg = String::from_utf8(render(&profile).unwrap()).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("spanprof: pid 100 (app)"));
        assert!(svg.contains("2.5 s at 100 Hz, 11 samples (4 lost)"));
        for name in ["main", "compute", "do_syscall_64", "[unknown] (libfoo.so)"] {
            assert!(svg.contains(name), "{name} missing");
        }
        assert!(svg.contains("<title>compute (10 samples, 90.91%)</title>"));
    }

    #[test]
    fn unknown_addresses_of_one_module_are_one_frame() {
        let mut profile = fixture::profile();
        let i = profile
            .frames
            .iter()
            .position(|f| f.function.is_none() && f.kind == crate::profile::FrameKind::Native)
            .expect("the fixture has an unknown native frame");
        // Another address of the same module, in a stack of its own.
        let mut other = profile.frames[i].clone();
        other.address += 0x40;
        profile.frames.push(other);
        let j = profile.frames.len() as u32 - 1;
        let mut sample = profile
            .samples
            .iter()
            .find(|s| s.frames.contains(&(i as u32)))
            .unwrap()
            .clone();
        for f in &mut sample.frames {
            if *f == i as u32 {
                *f = j;
            }
        }
        profile.samples.push(sample);
        let svg = String::from_utf8(render(&profile).unwrap()).unwrap();
        assert!(!svg.contains("+0x"), "an address is drawn");
        let titles = svg.matches("<title>[unknown] (libfoo.so) (").count();
        assert_eq!(titles, 1, "one frame for the module's addresses");
        // The folded output keeps them apart.
        let folded = folded::collapse(&profile).unwrap();
        assert!(folded
            .iter()
            .any(|(s, _)| s.contains("[unknown] (libfoo.so+0x1274)")));
    }

    #[test]
    fn differential_svg_colors_the_grown_frame() {
        let base = fixture::profile();
        let mut new = fixture::profile();
        // `main;[unknown] (libfoo…)` goes from 1 of 11 samples to 10 of 20.
        for s in &mut new.samples {
            if s.frames.len() == 2 && s.frames[1] == 2 {
                s.count = 10;
            }
        }
        let svg =
            String::from_utf8(render_diff(&base, &new, "a.pb.gz", "b.pb.gz").unwrap()).unwrap();
        assert!(svg.contains("spanprof diff: pid 100 (app)"));
        assert!(svg.contains("b.pb.gz against a.pb.gz"));
        // Base scaled to 20 samples: 1 -> 1.8, rounded to 2, so +8 of 20.
        assert!(
            svg.contains("<title>[unknown] (libfoo.so) (10 samples, 50.00%; +40.00%)</title>"),
            "{svg}"
        );
        assert_eq!(
            render_diff(&base, &new, "a", "b").unwrap(),
            render_diff(&base, &new, "a", "b").unwrap()
        );
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

    #[test]
    fn memory_titles_and_units() {
        let alloc = fixture::alloc_only();
        assert_eq!(
            title(&alloc.meta),
            "spanprof: memory allocated by pid 100 (app)"
        );
        assert_eq!(count_name(&alloc.meta), "bytes allocated");
        assert_eq!(
            subtitle(&alloc),
            "2.5 s at 1 sample per 512 KiB, 1.2 GiB allocated in 34,567 allocations \
             (estimated; 4 lost)"
        );
        let svg = String::from_utf8(render(&alloc).unwrap()).unwrap();
        assert!(svg.contains("spanprof: memory allocated by pid 100 (app)"));
        assert!(svg.contains("<title>all (1,283,500,000 bytes allocated, 100%)</title>"));
        assert!(svg.contains("<title>compute (1,280,000,000 bytes allocated, 99.73%)</title>"));

        let heap = fixture::heap_only();
        assert_eq!(
            title(&heap.meta),
            "spanprof: memory in use at the end in pid 100 (app)"
        );
        assert_eq!(count_name(&heap.meta), "bytes in use");
        assert_eq!(
            subtitle(&heap),
            "2.5 s at 1 sample per 512 KiB, 785.4 MiB in use at the end in 1,037 allocations \
             (estimated; 4 lost)"
        );
        let svg = String::from_utf8(render(&heap).unwrap()).unwrap();
        assert!(svg.contains("<title>all (823,500,000 bytes in use, 100%)</title>"));

        // Both: drawn in bytes in use, both totals in the subtitle.
        let mut both = fixture::memory();
        assert_eq!(title(&both.meta), title(&heap.meta));
        assert_eq!(count_name(&both.meta), "bytes in use");
        let svg = String::from_utf8(render(&both).unwrap()).unwrap();
        assert!(svg.contains("<title>all (823,500,000 bytes in use, 100%)</title>"));
        both.meta.lost_samples = 0;
        both.meta.events.alloc_rate = 1;
        assert_eq!(
            subtitle(&both),
            "2.5 s recording every allocation, 1.2 GiB allocated in 34,567 allocations, \
             785.4 MiB in use at the end in 1,037"
        );
    }

    #[test]
    fn off_cpu_titles_and_units() {
        let svg = String::from_utf8(render(&fixture::off_cpu()).unwrap()).unwrap();
        assert!(svg.contains("spanprof: CPU + off-CPU time of pid 100 (app)"));
        assert!(svg
            .contains("2.5 s at 100 Hz, 11 samples (110.0 ms on-CPU), 295.5 ms off-CPU (4 lost)"));
        // Of 405.5 ms: 10 on-CPU samples in `compute` (100 ms), 45.5 ms in it blocked on locks.
        assert!(
            svg.contains("<title>compute (100,000,000 ns of CPU + off-CPU time, 24.66%)</title>")
        );
        assert!(
            svg.contains("<title>compute (45,500,000 ns of CPU + off-CPU time, 11.22%)</title>")
        );
        assert!(svg.contains("[off-cpu: sleep] (250,000,000 ns of CPU + off-CPU time"));

        let wall = fixture::wall();
        assert_eq!(
            title(&wall.meta),
            "spanprof: wall-clock time of pid 100 (app)"
        );
        assert_eq!(count_name(&wall.meta), "ns of wall-clock time");
        assert_eq!(subtitle(&wall), subtitle(&fixture::off_cpu()));

        let mut only = fixture::off_cpu_only();
        assert_eq!(title(&only.meta), "spanprof: off-CPU time of pid 100 (app)");
        assert_eq!(count_name(&only.meta), "ns of off-CPU time");
        assert_eq!(
            subtitle(&only),
            "2.5 s at 100 Hz, 295.5 ms off-CPU (4 lost)"
        );
        let svg = String::from_utf8(render(&only).unwrap()).unwrap();
        assert!(svg.contains("<title>all (295,500,000 ns of off-CPU time, 100%)</title>"));
        only.samples.clear();
        let svg = String::from_utf8(render(&only).unwrap()).unwrap();
        assert!(svg.contains("no samples: the target did not block while profiled"));
    }
}
