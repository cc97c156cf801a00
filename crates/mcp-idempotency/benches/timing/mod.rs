//! The timed benches' statistics over their batches (shared by `fingerprint` and `key_sources`).

use std::time::Duration;

/// The fastest batch: the least disturbed by the rest of the machine.
pub(crate) fn fastest(samples: &[Duration]) -> Duration {
    samples.iter().copied().min().unwrap_or_default()
}

/// The median batch.
pub(crate) fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}
