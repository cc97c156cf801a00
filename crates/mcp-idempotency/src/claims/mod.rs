//! Claims: the [`Deduplicator`] that takes them, the [`RunningClaim`] of an executed call, the
//! renewal of its lease, the completion that ends it, and the claims whose store answer was lost.

mod ambiguous;
mod completion;
mod deduplicator;
mod renewals;
mod running_claim;

pub use deduplicator::Deduplicator;
pub use running_claim::RunningClaim;
