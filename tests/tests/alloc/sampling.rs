//! Sampling theory: the probability that an allocation is sampled, and the σ of the estimates.

/// The probability that an allocation of `size` bytes is sampled at `rate`.
pub(super) fn p_sampled(size: f64, rate: u64) -> f64 {
    if rate <= 1 {
        1.0
    } else {
        1.0 - (-size / rate as f64).exp()
    }
}

/// Allocations of one size: `(size in bytes, how many)`.
type Allocs = [(f64, f64)];

/// σ of the estimate of the bytes of `allocs` sampled at `rate`.
pub(super) fn sigma_bytes(allocs: &Allocs, rate: u64) -> f64 {
    allocs
        .iter()
        .map(|&(s, n)| {
            let p = p_sampled(s, rate);
            n * s * s * (1.0 - p) / p
        })
        .sum::<f64>()
        .sqrt()
}

/// σ of the estimate of the number of `allocs` sampled at `rate`.
pub(super) fn sigma_count(allocs: &Allocs, rate: u64) -> f64 {
    allocs
        .iter()
        .map(|&(s, n)| {
            let p = p_sampled(s, rate);
            n * (1.0 - p) / p
        })
        .sum::<f64>()
        .sqrt()
}

/// The expected number of samples of `allocs` at `rate`.
pub(super) fn expected_samples(allocs: &Allocs, rate: u64) -> f64 {
    allocs.iter().map(|&(s, n)| n * p_sampled(s, rate)).sum()
}
