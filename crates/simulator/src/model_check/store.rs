//! The abstract store: one record slot per key, each request applied atomically, as the `Store`
//! trait (`mcp_idempotency::store::Store`) defines its operations ([`MemoryStore`] is the
//! reference this follows, rule for rule). A [`StoreFlaw`] breaks one rule on purpose.
//!
//! [`MemoryStore`]: mcp_idempotency::store::MemoryStore

use mcp_idempotency::store::{ClaimRequest, CompleteRequest, Fenced, TakeOverRequest};
use mcp_idempotency::{FencingToken, Timestamp};

use super::state::{Slot, SlotState};
use super::StoreFlaw;

/// A live record of `slot` at `now` (expired ones count as absent).
fn live(slot: &Option<Slot>, now: Timestamp) -> Option<&Slot> {
    slot.as_ref().filter(|record| record.expires_at > now)
}

/// `Store::claim`: the existing live record, or a new in-progress one owned by `req.owner`. The
/// claimant's own live claim (sent again) answers `Claimed` and changes nothing.
pub(crate) fn claim(slot: &mut Option<Slot>, req: &ClaimRequest) -> Result<(), Slot> {
    if let Some(record) = live(slot, req.now) {
        return match record.state {
            SlotState::InProgress {
                owner,
                lease_expires_at,
            } if owner == req.owner
                && record.fingerprint == req.fingerprint
                && lease_expires_at > req.now =>
            {
                Ok(())
            }
            _ => Err(record.clone()),
        };
    }
    *slot = Some(Slot {
        fingerprint: req.fingerprint,
        state: SlotState::InProgress {
            owner: req.owner,
            lease_expires_at: req.lease_expires_at,
        },
        created_at: req.now,
        expires_at: req.expires_at,
    });
    Ok(())
}

/// `Store::complete`: records run `run` (arguments `args`) if `req.owner` owns the in-progress
/// record; the same completion sent again answers `Applied` and changes nothing.
pub(crate) fn complete(
    slot: &mut Option<Slot>,
    req: &CompleteRequest,
    run: u8,
    args: u8,
    flaw: Option<StoreFlaw>,
) -> Fenced {
    let Some(record) = slot.as_mut() else {
        return Fenced::NotOwner;
    };
    let completed = SlotState::Completed {
        run,
        args,
        completed_at: req.completed_at,
    };
    if record.state == completed && record.expires_at == req.expires_at {
        return Fenced::Applied;
    }
    let owned = matches!(record.state, SlotState::InProgress { owner, .. } if owner == req.owner);
    if owned || flaw == Some(StoreFlaw::UnfencedCompletion) {
        record.state = completed;
        record.expires_at = req.expires_at;
        return Fenced::Applied;
    }
    Fenced::NotOwner
}

/// `Store::take_over`: moves a live in-progress record of `req.previous_owner` whose lease ran out
/// by `req.now` to `req.new_owner`; the same take-over sent again answers `Applied`.
pub(crate) fn take_over(
    slot: &mut Option<Slot>,
    req: &TakeOverRequest,
    flaw: Option<StoreFlaw>,
) -> Fenced {
    let Some(record) = slot.as_mut().filter(|record| record.expires_at > req.now) else {
        return Fenced::NotOwner;
    };
    match record.state {
        SlotState::InProgress { owner, .. } if owner == req.new_owner => Fenced::Applied,
        SlotState::InProgress {
            owner,
            lease_expires_at,
        } if owner == req.previous_owner
            && (lease_expires_at <= req.now || flaw == Some(StoreFlaw::TakeOverLiveLease)) =>
        {
            record.state = SlotState::InProgress {
                owner: req.new_owner,
                lease_expires_at: req.lease_expires_at,
            };
            record.expires_at = req.expires_at;
            Fenced::Applied
        }
        _ => Fenced::NotOwner,
    }
}

/// `Store::renew`: extends the lease of an in-progress record of `owner`, and its retention to
/// at least the new deadline.
pub(crate) fn renew(slot: &mut Option<Slot>, owner: FencingToken, deadline: Timestamp) -> Fenced {
    match slot.as_mut() {
        Some(record) if matches!(record.state, SlotState::InProgress { owner: current, .. } if current == owner) =>
        {
            record.state = SlotState::InProgress {
                owner,
                lease_expires_at: deadline,
            };
            record.expires_at = record.expires_at.max(deadline);
            Fenced::Applied
        }
        _ => Fenced::NotOwner,
    }
}

/// `Store::release`: deletes an in-progress record of `owner`.
pub(crate) fn release(slot: &mut Option<Slot>, owner: FencingToken) -> Fenced {
    match slot {
        Some(Slot {
            state: SlotState::InProgress { owner: current, .. },
            ..
        }) if *current == owner => {
            *slot = None;
            Fenced::Applied
        }
        _ => Fenced::NotOwner,
    }
}
