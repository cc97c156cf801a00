//! No code: see this crate's `Cargo.toml`. The release artifacts depend on it so that the
//! dependencies they share are built with the same features, once.
