//! Claims, from the decision that takes one to the write that ends it: the [`Deduplicator`] that
//! decides and claims, the [`RunningClaim`] of an executed call, the renewal of its lease, the
//! completion that ends it (sent again while the store is away), and the claims whose store
//! answer was lost.
//!
//! Imports go one way, down this list; nothing imports a file above it:
//!
//! | file | holds |
//! | --- | --- |
//! | `deduplicator.rs` | [`Deduplicator`]: decisions (the engine's steps against the store), the store's health, and a [`RunningClaim`] for each executed call |
//! | `running_claim.rs` | [`RunningClaim`]: an executed call's claim until it is finished, abandoned or released; the background retry of a completion the store failed |
//! | `renewals.rs` | `Renewals`: the leases of the running claims, renewed by one task |
//! | `writes.rs` | `StoreWrites`: every write to the store (claim, take-over, completion, renewal, release) with what follows from its answer; the release of claims whose answer was lost |
//! | `completion.rs` | `CompletionRetry`: when a failed completion is sent again (sans-IO) |
//! | `ambiguous.rs` | `AmbiguousClaims`: which lost claims to release, and when (sans-IO) |

mod ambiguous;
mod completion;
mod deduplicator;
mod renewals;
mod running_claim;
mod writes;

pub use deduplicator::Deduplicator;
pub(crate) use deduplicator::StopGate;
pub use running_claim::RunningClaim;
