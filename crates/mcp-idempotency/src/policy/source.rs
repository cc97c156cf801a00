//! Where the key that decides a call comes from ([`KeySource`]), and what each source's keys are:
//! what they are made of, how a store holds them, how errors name them. Every other module reads
//! these properties, never the variants, so a new source is added here and in
//! [`select`](super::select) alone.

use std::fmt;

/// The first character of every stored key that is not a SEP key: U+001F, the unit separator, a
/// character a client's key can never hold (control characters are refused).
pub(crate) const DERIVED: char = '\u{1F}';

/// Where the key that decides a call came from, in the order they are tried: a business
/// identifier (`key-from`), the SEP's `params.idempotencyKey`, a `_meta` carrier, a tool argument
/// (`key-argument`), a duplicate window. Label of the metrics and of `inspect`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum KeySource {
    /// The tool's business identifier: JSON Pointers into the arguments (`key-from`).
    KeyFrom,
    /// The SEP's `params.idempotencyKey`.
    #[default]
    Sep,
    /// A `_meta` carrier: `params._meta.idempotencyKey` or another configured name.
    Meta,
    /// A tool argument that carries a key (`key-argument`).
    Argument,
    /// A duplicate window: the tool's name and arguments are the key (`window`).
    Window,
    /// A source that exists only in this crate's tests, to show that a new source is added in
    /// `policy/` alone (`policy/tests.rs`): a key carried in the argument `__test_key`.
    #[cfg(test)]
    Test,
}

/// What the keys of a source are made of, as the engine reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyMaterial {
    /// A string the client sent as a key, checked as the SEP checks `idempotencyKey`.
    ClientString,
    /// A digest the policy computed (a business identifier's): taken as it is.
    Digest,
    /// None: the call's own fingerprint (its tool and arguments) is the key.
    Fingerprint,
}

/// Each source's properties, in one table.
struct Traits {
    name: &'static str,
    material: KeyMaterial,
    /// Whether the client sent the key as a key (its replays stay byte for byte, its error
    /// outcomes are always replayed, a duplicate of its running call is answered at once).
    client_key: bool,
    /// Whether the stored key holds the tool's name (a key that only means something for one tool).
    per_tool: bool,
    /// How a conflict names one key of the source to a person.
    noun: &'static str,
}

impl KeySource {
    /// Every source, in the order they are tried.
    pub const ALL: &'static [Self] = &[
        Self::KeyFrom,
        Self::Sep,
        Self::Meta,
        Self::Argument,
        Self::Window,
        #[cfg(test)]
        Self::Test,
    ];

    const fn traits(self) -> Traits {
        const fn row(
            name: &'static str,
            material: KeyMaterial,
            client_key: bool,
            per_tool: bool,
        ) -> Traits {
            Traits {
                name,
                material,
                client_key,
                per_tool,
                noun: "key",
            }
        }
        match self {
            Self::KeyFrom => Traits {
                noun: "identifier",
                ..row("key-from", KeyMaterial::Digest, false, true)
            },
            Self::Sep => row("sep", KeyMaterial::ClientString, true, false),
            Self::Meta => row("meta", KeyMaterial::ClientString, true, false),
            Self::Argument => row("argument", KeyMaterial::ClientString, false, true),
            Self::Window => row("window", KeyMaterial::Fingerprint, false, true),
            #[cfg(test)]
            Self::Test => row("test", KeyMaterial::ClientString, false, true),
        }
    }

    /// `key-from`, `sep`, `meta`, `argument` or `window`.
    pub fn as_str(self) -> &'static str {
        self.traits().name
    }

    /// Whether the client sent this key as a key (SEP, `_meta`): its replays stay byte for byte,
    /// and its error outcomes are always replayed, as the SEP says.
    pub fn is_client_key(self) -> bool {
        self.traits().client_key
    }

    /// What the keys of this source are made of.
    pub(crate) fn material(self) -> KeyMaterial {
        self.traits().material
    }

    /// Whether a stored key of this source holds the tool's name before its value.
    pub(crate) fn per_tool(self) -> bool {
        self.traits().per_tool
    }

    /// How a conflict names one key of this source: `identifier` or `key`.
    pub(crate) fn noun(self) -> &'static str {
        self.traits().noun
    }

    /// The key as a store holds it for a key of this source that reads `shown` without its
    /// prefix (as [`IdempotencyKey::for_tool`](crate::IdempotencyKey::for_tool) shows it):
    /// `shown` itself for a SEP key, else U+001F, the source's name, `:` and `shown`. How
    /// `inspect` finds the record of a key a person typed as it was shown.
    pub fn stored_key(self, shown: &str) -> String {
        let mut key = self.stored_prefix();
        key.push_str(shown);
        key
    }

    /// How every stored key of this source begins: U+001F, the source's name and `:`; empty for
    /// the SEP, whose keys are the client's (and never begin with U+001F).
    pub(crate) fn stored_prefix(self) -> String {
        match self {
            Self::Sep => String::new(),
            other => format!("{DERIVED}{}:", other.as_str()),
        }
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for KeySource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|source| source.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|source| source.as_str()).collect();
                let (last, rest) = names.split_last().unwrap_or((&"", &[]));
                format!(
                    "unknown key source {s:?}; expected {} or {last}",
                    rest.join(", ")
                )
            })
    }
}
