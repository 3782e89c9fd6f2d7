// Rust built without frame pointers (rustc -O, x86-64's default): string formatting, sorting
// and a BTreeMap, so %rbp, free for the compiler, holds pointers to heap data. A frame-pointer
// walk (`--unwind fp`) reads those bytes as frames: the unwinding tests check that no such
// garbage frame is shown.
//
// Usage: nofp_rust [SECONDS] (default 5); prints its pid on the first line of stdout.
use std::collections::BTreeMap;
use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

#[inline(never)]
fn make_words(mut seed: u32, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            seed = seed.wrapping_mul(1103515245).wrapping_add(12345);
            format!("SPAN_SI{}_word_of_text", seed % 100000)
        })
        .collect()
}

#[inline(never)]
fn count_words(words: &[String]) -> usize {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for w in words {
        *counts.entry(&w[..12]).or_default() += 1;
    }
    counts.iter().map(|(k, v)| k.len() * v).sum()
}

#[inline(never)]
fn sort_words(mut words: Vec<String>) -> usize {
    words.sort_unstable_by(|a, b| a[7..].cmp(&b[7..]));
    words[0].len() + words[words.len() - 1].len()
}

fn main() {
    let seconds: f64 = match std::env::args().nth(1).map(|s| s.parse()) {
        None => 5.0,
        Some(Ok(s)) if (0.0..=3600.0).contains(&s) => s,
        Some(_) => {
            eprintln!("usage: nofp_rust [SECONDS]  (0 to 3600)");
            std::process::exit(2);
        }
    };
    let mut out = std::io::stdout();
    writeln!(out, "{}", std::process::id()).unwrap();
    out.flush().unwrap();
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut seed = 1;
    let mut total = 0usize;
    while Instant::now() < end {
        let words = make_words(seed, 4000);
        seed += 1;
        total = total.wrapping_add(count_words(&words));
        total = total.wrapping_add(sort_words(words));
    }
    black_box(total);
}
