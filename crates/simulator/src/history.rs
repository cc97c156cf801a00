//! The history of one seed: every store operation, execution, answer and fault, one readable line
//! each, stamped with the simulation's time. Two runs of a seed give the same history, byte for
//! byte.

use std::fmt::{self, Write as _};
use std::sync::{Mutex, PoisonError};

use tokio::time::Instant;

/// The lines of one seed's history.
#[derive(Debug)]
pub struct History {
    start: Instant,
    lines: Mutex<Vec<String>>,
}

impl History {
    /// An empty history whose time starts at `start`.
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            lines: Mutex::new(Vec::new()),
        }
    }

    /// Adds a line: `who` did or saw `what`.
    pub fn note(&self, who: impl fmt::Display, what: impl fmt::Display) {
        let elapsed = self.start.elapsed();
        let line = format!(
            "{:>5}.{:03}s {who:<10} {what}",
            elapsed.as_secs(),
            elapsed.subsec_millis()
        );
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    /// How many lines there are.
    pub fn len(&self) -> usize {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether there is no line yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole history, one line each.
    pub fn render(&self) -> String {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::with_capacity(lines.len() * 80);
        for line in lines.iter() {
            let _ = writeln!(out, "{line}");
        }
        out
    }
}
