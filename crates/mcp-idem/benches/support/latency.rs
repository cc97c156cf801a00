//! Summaries of latency samples (nanoseconds per call), shared by the latency benches.

use crate::support::percentile_us;

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
