//! The model store: what the real stores promise, kept in memory, with the faults of a real one.
