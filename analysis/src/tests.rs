use super::*;
use crate::format::fixture;

#[test]
fn shares_count_recursion_once() {
    let mut profile = fixture::profile();
    // main;compute;main;compute: a recursion; 3 samples.
    let mut s = profile.samples[0].clone();
    s.frames = vec![0, 1, 0, 1];
    s.count = 3;
    profile.samples.push(s);
    let f = Functions::of(&profile);
    assert_eq!(f.total, 14);
    let main = f.get("main").unwrap();
    assert_eq!((main.self_weight, main.total_weight), (0, 14));
    let compute = f.get("compute").unwrap();
    assert_eq!(compute.total_weight, 13);
    assert_eq!(f.rows[0].name, "compute");
    assert_eq!(f.unit, Unit::Samples);
    assert_eq!(f.events, 14.0);
}

#[test]
fn globs() {
    let p = Pattern::new("hot_*");
    assert!(p.matches("hot_alpha") && p.matches("hot_") && !p.matches("a_hot_alpha"));
    assert!(Pattern::new("*json*").matches("json_dumps") && Pattern::new("a?c").matches("abc"));
    assert!(!Pattern::new("a?c").matches("ac"));
    assert!(Pattern::new("handle").matches_function("handle (app.py)"));
    assert!(!Pattern::new("handle").matches_function("handler (app.py)"));
    assert!(Pattern::new("*a*a*a*b").matches(&format!("{}b", "a".repeat(40))));
    assert!(!Pattern::new("*a*a*a*b").matches(&"a".repeat(400)));
}

#[test]
fn glob_classes_ranges_negation_and_escapes() {
    let xy = Pattern::new("job_[xy]");
    assert!(xy.matches("job_x") && xy.matches("job_y"));
    assert!(!xy.matches("job_z") && !xy.matches("job_") && !xy.matches("job_xy"));
    let digits = Pattern::new("GET /v[0-9]/*");
    assert!(digits.matches("GET /v2/servers") && !digits.matches("GET /vx/servers"));
    for negated in ["job_[!xy]", "job_[^xy]"] {
        let p = Pattern::new(negated);
        assert!(p.matches("job_z") && !p.matches("job_x"), "{negated}");
    }
    // `]` first is a member; `-` last is itself.
    assert!(Pattern::new("[]a]").matches("]") && Pattern::new("[a-]").matches("-"));
    // Escapes and an unclosed `[` are themselves.
    assert!(Pattern::new("a\\*b").matches("a*b") && !Pattern::new("a\\*b").matches("axb"));
    assert!(Pattern::new("job_[x").matches("job_[x"));
    // A bracketed name copied from a report matches itself; a glob around it needs `\[`.
    let unknown = Pattern::new("[unknown] (libz.so.1)");
    assert!(unknown.matches_function("[unknown] (libz.so.1)"));
    assert!(!unknown.matches("u"));
    assert!(Pattern::new("\\[unknown\\] (libz*").matches("[unknown] (libz.so.1)"));
    assert_eq!(Pattern::new("job_[xy]*").to_string(), "job_[xy]*");
    assert!(Pattern::new("*_[xy]").matches("a_b_x") && !Pattern::new("*_[xy]").matches("a_x_b"));
}

#[test]
fn budgets_parse_and_measure() {
    assert!(Budget::parse("compute", ShareKind::Total).is_err());
    assert!(Budget::parse("=5%", ShareKind::Total).is_err());
    assert!(Budget::parse("x=150%", ShareKind::Total).is_err());
    assert!(Budget::parse("x=0", ShareKind::Total).is_err());
    let b = Budget::parse("comp*=50%", ShareKind::Total).unwrap();
    assert_eq!(b.max, 0.5);
    assert_eq!(b.option(), "--max 'comp*=50.0%'");
    let profile = fixture::profile();
    let f = Functions::of(&profile);
    // compute is in 10 of 11 samples; the kernel frame is the leaf of 2.
    let r = measure(&profile, &f, &b);
    assert!((r.share - 10.0 / 11.0).abs() < 1e-9, "{r:?}");
    assert!(r.crossed());
    assert_eq!(r.functions, ["compute"]);
    let s = measure(
        &profile,
        &f,
        &Budget::parse("compute=80%", ShareKind::Self_).unwrap(),
    );
    assert!((s.share - 8.0 / 11.0).abs() < 1e-9 && !s.crossed(), "{s:?}");
    let none = measure(
        &profile,
        &f,
        &Budget::parse("nothing=1%", ShareKind::Total).unwrap(),
    );
    assert_eq!((none.share, none.matched), (0.0, 0));
}

#[test]
fn diff_ranks_the_grown_function_first() {
    let base = fixture::profile();
    let mut new = fixture::profile();
    // The unknown frame's stack gets 10 times the samples.
    let unknown = new
        .samples
        .iter_mut()
        .find(|s| s.frames.len() == 2 && s.frames[1] == 2)
        .unwrap();
    unknown.count = 10;
    let d = Diff::of(&base, &new).unwrap();
    let first = &d.changes[0];
    // A module's unknown addresses are one function.
    assert_eq!(first.name, "[unknown] (libfoo.so)");
    assert!((first.base_self - 1.0 / 11.0).abs() < 1e-9);
    assert!((first.new_self - 10.0 / 20.0).abs() < 1e-9);
    assert_eq!(d.grew(5).count(), 1);
    assert_eq!(d.shrank(5).next().unwrap().name, "compute");
    // 41 points: over 5 points and over 3 standard errors of 11 and 20 samples? The error
    // is sqrt(.083/11 + .25/20) = 0.14, 3 of them 0.42: not significant.
    let r = d.regressions(0.05);
    assert_eq!(r[0].change.name, first.name);
    assert_eq!(r[0].which, Which::Self_);
    assert!(!r[0].significant);
    // Same profile: nothing grew.
    assert!(Diff::of(&base, &base)
        .unwrap()
        .regressions(0.0001)
        .is_empty());
    // Different units do not compare.
    assert!(Diff::of(&base, &fixture::off_cpu()).is_err());
}

#[test]
fn a_significant_total_share_counts_when_the_self_share_is_noise() {
    let c = Change {
        name: "f".into(),
        base_self: 0.10,
        new_self: 0.16,
        base_total: 0.30,
        new_total: 0.50,
        sigma_self: 0.0274,
        sigma_total: 0.039,
    };
    let mut d = Diff::of(&fixture::profile(), &fixture::profile()).unwrap();
    d.changes = vec![c];
    let r = d.regressions(0.05);
    assert_eq!(
        (r.len(), r[0].which, r[0].significant),
        (1, Which::Total, true)
    );
    let (text, failed) = verdict(&d, 0.05);
    assert!(
        failed && text.contains("f: total share 30.0% -> 50.0%"),
        "{text}"
    );
    // Both noise: reported by self share, and the build passes, saying why.
    d.changes[0].new_total = 0.36;
    let r = d.regressions(0.05);
    assert_eq!((r[0].which, r[0].significant), (Which::Self_, false));
    let (text, failed) = verdict(&d, 0.05);
    assert!(!failed, "{text}");
    assert!(
        text.contains("not counted, within sampling noise")
            && text.contains("no significant regression over 5.0 points (1 within sampling noise)"),
        "{text}"
    );
}

#[test]
fn diff_ranks_by_the_share_that_grew_most() {
    // `caller`'s self share barely moved, its total grew by 12 points: it fails a 5-point
    // check on its total, so it comes first in the grown list and among the regressions.
    let change = |name: &str, s: (f64, f64), t: (f64, f64)| Change {
        name: name.into(),
        base_self: s.0,
        new_self: s.1,
        base_total: t.0,
        new_total: t.1,
        sigma_self: 0.001,
        sigma_total: 0.001,
    };
    let mut d = Diff::of(&fixture::profile(), &fixture::profile()).unwrap();
    let mut changes = vec![
        change("leaf", (0.10, 0.16), (0.10, 0.16)),
        change("caller", (0.010, 0.015), (0.20, 0.32)),
        change("gone", (0.30, 0.29), (0.50, 0.30)),
        change("thinner", (0.20, 0.17), (0.20, 0.17)),
    ];
    changes.sort_by(|x, y| y.growth().1.total_cmp(&x.growth().1));
    d.changes = changes;
    let grew: Vec<&str> = d.grew(5).map(|c| c.name.as_str()).collect();
    assert_eq!(grew, ["caller", "leaf"]);
    assert_eq!(d.changes[0].growth().0, Which::Total);
    let shrank: Vec<&str> = d.shrank(5).map(|c| c.name.as_str()).collect();
    assert_eq!(shrank, ["gone", "thinner"], "by the share that shrank most");
    let r = d.regressions(0.05);
    let listed: Vec<(&str, Which)> = r
        .iter()
        .map(|r| (r.change.name.as_str(), r.which))
        .collect();
    assert_eq!(listed, [("caller", Which::Total), ("leaf", Which::Self_)]);
    let line = change_line(&d.changes[0], d.changes[0].growth());
    assert!(line.contains("+12.0 total  caller"), "{line}");
    // Both shares significant: listed by the one that grew more, as the grown list ranks it.
    d.changes = vec![change("both", (0.10, 0.16), (0.20, 0.32))];
    let r = d.regressions(0.05);
    assert_eq!((r[0].which, r[0].significant), (Which::Total, true));
    assert_eq!(d.changes[0].growth().0, Which::Total);
}

#[test]
fn diffs_need_samples_and_the_same_measure() {
    let mut empty = fixture::profile();
    empty.samples.clear();
    let e = Diff::of(&fixture::profile(), &empty).unwrap_err();
    assert!(e.contains("the new profile has no samples"), "{e}");
    assert!(Diff::of(&empty, &fixture::profile()).is_err());
    // Both in bytes, but allocated and in use are not the same thing.
    let e = Diff::of(&fixture::alloc_only(), &fixture::heap_only()).unwrap_err();
    assert!(e.contains("--event alloc, the new one --event heap"), "{e}");
    assert!(Diff::of(&fixture::off_cpu(), &fixture::wall()).is_err());
}

#[test]
fn many_samples_make_a_change_significant() {
    let mut base = fixture::profile();
    let mut new = fixture::profile();
    for s in &mut base.samples {
        s.count *= 1000;
    }
    for s in &mut new.samples {
        s.count *= 1000;
        if s.frames.len() == 2 && s.frames[1] == 2 {
            s.count *= 2;
        }
    }
    let d = Diff::of(&base, &new).unwrap();
    let r = d.regressions(0.05);
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(r[0].significant);
}

#[test]
fn span_times_and_budgets() {
    let profile = fixture::with_spans();
    // A name per OpenTelemetry span: its first byte.
    let times = span_times(&profile, |c| {
        let id = c.span_id?;
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&id);
        Some((if id[0] % 2 == 0 { "even" } else { "odd" }, key))
    })
    .unwrap();
    assert!(!times.is_empty());
    let total: u64 = times.iter().map(|t| t.total_ns).sum();
    let in_spans: u64 = profile
        .samples
        .iter()
        .filter(|s| profile.span_of(s).is_some_and(|c| c.span_id.is_some()))
        .map(|s| s.count * profile.meta.period_ns())
        .sum();
    assert_eq!(total, in_spans);
    for t in &times {
        assert_eq!(t.mean_ns(), t.total_ns / t.spans);
    }
    let b = SpanBudget::parse("GET /servers*=30ms").unwrap();
    assert_eq!(b.max_ns, 30_000_000);
    assert!(b.pattern.matches("GET /servers/123"));
    assert!(SpanBudget::parse("GET /servers").is_err());
    assert!(SpanBudget::parse("x=fast").is_err());
    assert!(SpanBudget::parse("x=0ms").is_err());
    let fake = [
        SpanTime {
            name: "GET /servers".into(),
            spans: 4,
            total_ns: 240_000_000,
        },
        SpanTime {
            name: "GET /flavors".into(),
            spans: 10,
            total_ns: 100_000_000,
        },
    ];
    let m = SpanBudget::parse("GET /*=30ms").unwrap().measure(&fake);
    assert_eq!(m.len(), 2);
    assert!(m[0].1 && !m[1].1, "60 ms over, 10 ms within");
    assert!(span_times(&fixture::memory(), |_| None).is_err());
    let text = report_text(&profile, &Functions::of(&profile), &fake, 1);
    assert!(
        text.contains("      4    60.0 ms   240.0 ms  GET /servers"),
        "{text}"
    );
    assert!(text.contains("(1 more span names)"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&report_json(&profile, &Functions::of(&profile), &fake, 0)).unwrap();
    assert_eq!(json["spans"][0]["mean_ns"], 60_000_000);
    // 10 ms a span at 100 Hz: one sample each, no time.
    assert_eq!(json["spans"][1]["mean_ns"], serde_json::Value::Null);
    assert_eq!(json["spans"][1]["samples_per_span"], 1.0);
}

#[test]
fn percents() {
    assert_eq!(parse_percent("20%"), Some(0.2));
    assert_eq!(parse_percent(" 2.5 % "), Some(0.025));
    assert_eq!(parse_percent("0.05"), None, "a % is required");
    assert_eq!(parse_percent("-1%"), None);
    assert_eq!(parse_percent("abc"), None);
    assert_eq!(percent_text(0.25), "25.0");
    assert_eq!(percent_text(0.0025), "0.25");
    assert_eq!(points_text(0.15), "+15.0");
    assert_eq!(points_text(-0.004), "-0.40");
}

/// A mean of fewer than MIN_PERIODS_PER_SPAN periods is no time: `report` says n/a, and the
/// rate that would time spans of a budget is a round figure.
#[test]
fn short_spans_are_not_timed() {
    let period = 10_101_010; // 99 Hz
    let short = SpanTime {
        name: "GET /x".into(),
        spans: 100,
        total_ns: 100 * 11_000_000,
    };
    let long = SpanTime {
        name: "GET /y".into(),
        spans: 10,
        total_ns: 10 * 60_000_000,
    };
    assert!(!short.timed(period));
    assert!(long.timed(period));
    assert!((short.periods(period) - 1.089).abs() < 0.01);
    assert_eq!(rate_for(5_000_000), 1000);
    assert_eq!(rate_for(30_000_000), 200);
    assert_eq!(rate_for(1_000_000), 5000);
    let mut profile = fixture::profile();
    profile.meta.frequency = 99;
    let text = report_text(&profile, &Functions::of(&profile), &[short, long], 10);
    assert!(text.contains("n/a"), "{text}");
    assert!(text.contains("60.0 ms"), "{text}");
    assert!(
        text.contains("fewer than 5 samples a span at 99 Hz"),
        "{text}"
    );
}
