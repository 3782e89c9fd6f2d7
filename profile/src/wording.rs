//! Wording shared by every output, the summary and the reports, in one place: what a profile
//! shows and how it was sampled (titles and subtitles), amounts in words (milliseconds, bytes,
//! thousands, memory totals), what an empty profile means, and the name of a frame (as flame
//! graphs and folded stacks show it) and of a function (as reports, diffs and budgets know it).
//!
//! Nothing here formats a file: the formats (`format/`), the summary and the analyses take
//! their words from here, so the same fact is said the same way everywhere.

use std::borrow::Cow;

use crate::profile::{Events, Frame, FrameKind, Memory, Meta, Profile};

/// What the weights of a profile with these events measure, for titles and units: `None` for a
/// plain on-CPU profile (sample counts), else `off-CPU time`, `CPU + off-CPU time` or
/// `wall-clock time` (nanoseconds).
pub fn measure(events: Events) -> Option<&'static str> {
    if events.wall {
        Some("wall-clock time")
    } else if events.off_cpu && events.cpu {
        Some("CPU + off-CPU time")
    } else if events.off_cpu {
        Some("off-CPU time")
    } else {
        None
    }
}

/// Nanoseconds as milliseconds with one decimal: `1234.5 ms`.
pub fn millis(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

/// What a profile shows, for titles: the target for a plain on-CPU profile, `off-CPU time of
/// <target>` and the like ([`measure`]) for a time profile, and for a memory profile `memory in
/// use at the end in <target>` (`--event heap`, with or without `alloc`: the weights are the
/// bytes in use) or `memory allocated by <target>` (`--event alloc`).
pub fn shown(meta: &Meta) -> String {
    let (events, target) = (meta.events, &meta.target);
    if events.heap {
        format!("memory in use at the end in {target}")
    } else if events.alloc {
        format!("memory allocated by {target}")
    } else {
        match measure(events) {
            None => target.clone(),
            Some(what) => format!("{what} of {target}"),
        }
    }
}

/// Bytes in binary units with one decimal: `512 B`, `1.5 KiB`, `812.0 MiB`, `1.2 GiB`, `3.0 TiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A number with `,` between thousands: `34,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// How a profile was sampled, after its duration: `at 99 Hz` for a time profile; for a memory
/// profile `at 1 sample per 512 KiB` (exact units when the rate is a whole number of them), or
/// `recording every allocation` with `--alloc-rate 1`.
pub fn sampling(meta: &Meta) -> String {
    let events = meta.events;
    if !events.in_bytes() {
        return format!("at {} Hz", meta.frequency);
    }
    let rate = events.alloc_rate;
    if rate <= 1 {
        return "recording every allocation".to_string();
    }
    // NB: a whole number of the largest unit that divides the rate, else one decimal.
    let exact = ["KiB", "MiB", "GiB", "TiB"]
        .iter()
        .zip(1u32..5)
        .rev()
        .find_map(|(unit, k)| {
            let scale = 1u64 << (10 * k);
            rate.is_multiple_of(scale)
                .then(|| format!("{} {unit}", rate / scale))
        });
    format!("at 1 sample per {}", exact.unwrap_or_else(|| size(rate)))
}

/// Whether a memory profile's amounts are estimates (scaled from sampled allocations), not
/// counts of every allocation (`--alloc-rate 1`).
pub fn estimated(events: Events) -> bool {
    events.alloc_rate > 1
}

/// The allocations made and those still in use at the end, summed over the samples.
pub fn memory_totals(profile: &Profile) -> (Memory, Memory) {
    let add = |a: Memory, b: Memory| Memory {
        objects: a.objects.saturating_add(b.objects),
        bytes: a.bytes.saturating_add(b.bytes),
    };
    profile
        .samples
        .iter()
        .fold((Memory::default(), Memory::default()), |(a, i), s| {
            (add(a, s.alloc), add(i, s.inuse))
        })
}

/// A memory profile's totals in words, those of its events: `1.2 GiB allocated in 34,567
/// allocations` (`alloc`), `812.0 MiB in use at the end in 1,234 allocations` (`heap`), or
/// `1.2 GiB allocated in 34,567 allocations, 812.0 MiB in use at the end in 1,234` (both).
pub fn memory_text(profile: &Profile) -> String {
    let events = profile.meta.events;
    let (alloc, inuse) = memory_totals(profile);
    let allocations = |n: u64| {
        format!(
            "{} allocation{}",
            thousands(n),
            if n == 1 { "" } else { "s" }
        )
    };
    let allocated = format!(
        "{} allocated in {}",
        size(alloc.bytes),
        allocations(alloc.objects)
    );
    let in_use = |objects: String| format!("{} in use at the end in {objects}", size(inuse.bytes));
    match (events.alloc, events.heap) {
        (true, true) => format!("{allocated}, {}", in_use(thousands(inuse.objects))),
        (false, true) => in_use(allocations(inuse.objects)),
        _ => allocated,
    }
}

/// The sum of [`Profile::weight`]: samples, nanoseconds when off-CPU time is in the profile, or
/// bytes for a memory profile.
pub fn total_weight(profile: &Profile) -> u64 {
    profile
        .samples
        .iter()
        .fold(0u64, |t, s| t.saturating_add(profile.weight(s)))
}

/// A weight as the summary writes it: `11` (samples) for an on-CPU profile, `405.5 ms` with
/// off-CPU time, `812.0 MiB` for a memory profile.
pub fn amount(profile: &Profile, weight: u64) -> String {
    let events = profile.meta.events;
    if events.in_bytes() {
        size(weight)
    } else if events.in_nanoseconds() {
        millis(weight)
    } else {
        weight.to_string()
    }
}

/// What follows an [`amount`] to say what it counts: ` samples` for an on-CPU profile (whose
/// amounts are bare numbers), nothing when the amount has its unit (`405.5 ms`, `812.0 MiB`).
pub fn unit_suffix(profile: &Profile) -> &'static str {
    let events = profile.meta.events;
    if events.in_bytes() || events.in_nanoseconds() {
        ""
    } else {
        " samples"
    }
}

/// What an empty profile means, for the summary and the empty flame graph.
pub fn no_samples_text(events: Events) -> &'static str {
    if events.heap {
        return "no samples: no sampled allocation of the target was still in use at the end";
    }
    if events.alloc {
        return "no samples: no allocation of the target was sampled while profiled";
    }
    match (events.cpu || events.wall, events.off_cpu || events.wall) {
        (_, false) => "no samples: the target did not run on a CPU while profiled",
        (false, true) => "no samples: the target did not block while profiled",
        (true, true) => "no samples: the target neither ran on a CPU nor blocked while profiled",
    }
}

/// The frame name used for a sample that has no frames at all.
pub const NO_STACK: &str = "[no stack]";

/// Makes a frame name safe for a folded line.
///
/// `;` becomes `:` (C++ `operator;`-like names stay readable), newlines and other control
/// characters become a space, and an empty name becomes `[unknown]`. Spaces are kept: the count
/// is the last space-separated field, so names like `[unknown] (libfoo.so+0x1234)` are fine.
pub fn sanitize_name(name: &str) -> Cow<'_, str> {
    if name.is_empty() {
        return Cow::Borrowed("[unknown]");
    }
    if !name.chars().any(|c| c == ';' || c.is_control()) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(
        name.chars()
            .map(|c| match c {
                ';' => ':',
                c if c.is_control() => ' ',
                c => c,
            })
            .collect(),
    )
}

/// The folded name of one frame: its sanitized display name.
pub fn frame_name(frame: &Frame) -> String {
    let name = frame.display_name();
    match sanitize_name(&name) {
        Cow::Borrowed(_) => name,
        Cow::Owned(safe) => safe,
    }
}

/// The name a frame is drawn with in a flame graph: its folded name ([`frame_name`]), except
/// that a native or kernel frame without a function is its module's, `[unknown] (libz.so.1)`
/// (`[unknown] (?)` outside any module): the addresses of a stripped library are one frame, not
/// one per address. Folded stacks, pprof and OTLP keep the address.
pub fn flame_name(frame: &Frame) -> String {
    if frame.function.is_some() || frame.kind == FrameKind::Python {
        return frame_name(frame);
    }
    let module = frame.module.as_deref().unwrap_or("?");
    let module = module.rsplit('/').next().unwrap_or(module);
    let name = match frame.kind {
        FrameKind::Kernel => format!("[unknown] ({module})_[k]"),
        _ => format!("[unknown] ({module})"),
    };
    match sanitize_name(&name) {
        Cow::Borrowed(_) => name,
        Cow::Owned(safe) => safe,
    }
}

/// The name a function is known by in reports, diffs and budgets: its flame graph name
/// ([`flame_name`]: the unknown addresses of a module are one function), without the line for a
/// Python function (`handle (app.py)`) or an inlined one (`inflate_fast (inlined)`).
pub fn function_name(frame: &Frame) -> String {
    if matches!(frame.kind, FrameKind::Python | FrameKind::Inlined) && frame.line.is_some() {
        let mut f = frame.clone();
        f.line = None;
        return frame_name(&f);
    }
    flame_name(frame)
}

/// The flame graph's subtitle, e.g. `30.0 s at 99 Hz, 2970 samples (12 lost)`, or with off-CPU
/// time `30.0 s at 99 Hz, 2970 samples (30000.0 ms on-CPU), 81234.5 ms off-CPU (12 lost)`, or
/// for a memory profile `30.0 s at 1 sample per 512 KiB, 1.2 GiB allocated in 34,567
/// allocations (estimated; 12 lost)`.
pub fn subtitle(profile: &Profile) -> String {
    let meta = &profile.meta;
    let events = meta.events;
    if events.in_bytes() {
        let mut notes = Vec::new();
        if estimated(events) {
            notes.push("estimated".to_string());
        }
        if meta.lost_samples > 0 {
            notes.push(format!("{} lost", meta.lost_samples));
        }
        let mut subtitle = format!(
            "{:.1} s {}, {}",
            meta.duration.as_secs_f64(),
            sampling(meta),
            memory_text(profile)
        );
        if !notes.is_empty() {
            subtitle.push_str(&format!(" ({})", notes.join("; ")));
        }
        return subtitle;
    }
    let mut subtitle = format!(
        "{:.1} s at {} Hz",
        meta.duration.as_secs_f64(),
        meta.frequency,
    );
    if !events.in_nanoseconds() {
        subtitle.push_str(&format!(", {} samples", profile.total_samples()));
    } else {
        if events.cpu || events.wall {
            let samples = profile.total_samples();
            subtitle.push_str(&format!(
                ", {samples} samples ({} on-CPU)",
                millis(samples.saturating_mul(meta.period_ns()))
            ));
        }
        subtitle.push_str(&format!(", {} off-CPU", millis(profile.total_off_cpu_ns())));
    }
    if meta.lost_samples > 0 {
        subtitle.push_str(&format!(" ({} lost)", meta.lost_samples));
    }
    subtitle
}
