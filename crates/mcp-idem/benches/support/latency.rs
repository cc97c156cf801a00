//! Summaries of latency samples (nanoseconds per call), shared by the latency benches.

/// Nearest-rank percentile of sorted samples, in microseconds.
pub(crate) fn percentile_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

/// The figures a latency row prints, in microseconds.
pub(crate) struct Stats {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) mean: f64,
    pub(crate) min: f64,
}

/// Sorts `samples` and summarizes them.
pub(crate) fn stats(samples: &mut [u64]) -> Stats {
    samples.sort_unstable();
    let mean = samples.iter().map(|&ns| ns as f64).sum::<f64>() / samples.len().max(1) as f64;
    Stats {
        p50: percentile_us(samples, 50.0),
        p99: percentile_us(samples, 99.0),
        mean: mean / 1000.0,
        min: samples.first().map_or(f64::NAN, |&ns| ns as f64 / 1000.0),
    }
}
