//! The calls clients make, as the checks see them: groups of calls meant as one, and the
//! answers clients got.

use std::time::Duration;

use serde_json::Value;

/// Where a group's key comes from, as the client sends the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keying {
    /// `params.idempotencyKey` (tool `charge`, no policy).
    Sep,
    /// `params._meta.idempotencyKey` (tool `charge`).
    Meta,
    /// The business identifier `/order_id` (tool `refund`, `key-from`).
    KeyFrom,
    /// The business identifier, with the client's own SEP key beside it (a fresh one each time).
    KeyFromWithSep,
    /// The argument `request_id` (tool `transfer`, `key-argument`).
    Argument,
    /// A 30 s window (tool `notify`, `on-error = forget`).
    Window,
    /// A 30 s window that runs unprotected when the store is down (tool `audit`).
    WindowUnprotected,
    /// No key, a tool no policy covers (`charge` without a key).
    Unkeyed,
}

impl Keying {
    /// The tool a group of this keying calls.
    pub fn tool(self) -> &'static str {
        match self {
            Self::Sep | Self::Meta | Self::Unkeyed => "charge",
            Self::KeyFrom | Self::KeyFromWithSep => "refund",
            Self::Argument => "transfer",
            Self::Window => "notify",
            Self::WindowUnprotected => "audit",
        }
    }

    /// Whether the client sent the key itself (its replays are byte for byte).
    pub fn client_key(self) -> bool {
        matches!(self, Self::Sep | Self::Meta)
    }

    /// Whether a key protects the group's calls at all.
    pub fn keyed(self) -> bool {
        self != Self::Unkeyed
    }

    /// Whether the key is a window (a repeat after it ends runs again, as documented).
    pub fn windowed(self) -> bool {
        matches!(self, Self::Window | Self::WindowUnprotected)
    }
}

/// Calls a client means as one: the same key, the same arguments.
#[derive(Clone, Debug)]
pub struct Group {
    /// `g1`, `g2`, …
    pub name: String,
    /// Who sends them.
    pub principal: String,
    /// How they are keyed.
    pub keying: Keying,
    /// The key the client sends (SEP, `_meta` or argument), if any.
    pub key: Option<String>,
    /// The arguments, as sent.
    pub arguments: Value,
    /// The group whose client key this one reuses for another operation (a client's mistake the
    /// SEP answers with `idempotency_key_conflict`).
    pub reuses: Option<String>,
}

/// What a client got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A result, as its bytes were received.
    Result(String),
    /// A JSON-RPC error: its code and `data.type`.
    Error { code: i64, kind: String },
}

/// One answer a client got for a group.
#[derive(Clone, Debug)]
pub struct ClientAnswer {
    /// The group.
    pub group: String,
    /// When it arrived.
    pub at: Duration,
    /// What it was.
    pub reply: Reply,
    /// Whether it was the checks' final attempt, after the faults healed.
    pub final_attempt: bool,
}
