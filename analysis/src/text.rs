//! Durations, percents and percentage points as the reports print them.

/// Nanoseconds as text: `31.2 ms`, `850 us`, `1.50 s`.
pub fn duration_text(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else {
        format!("{} us", ns / 1000)
    }
}

/// A share as text: `25.0` for 0.25 (one decimal, two below 1%).
pub fn percent_text(share: f64) -> String {
    hundredths(share, false)
}

/// `x` in percent or points: one decimal, two below 1, a sign if `signed`.
fn hundredths(x: f64, signed: bool) -> String {
    let v = x * 100.0;
    let decimals = if v != 0.0 && v.abs() < 1.0 { 2 } else { 1 };
    if signed {
        format!("{v:+.decimals$}")
    } else {
        format!("{v:.decimals$}")
    }
}

/// Points of a share change: `+15.0` for 0.15.
pub fn points_text(delta: f64) -> String {
    hundredths(delta, true)
}
