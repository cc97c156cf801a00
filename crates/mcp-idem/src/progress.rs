//! A one-line step counter on stderr for long commands, drawn only when stderr is a terminal: a
//! pipe, a file or a CI log gets nothing, so machine-read output and logs stay clean.

use std::io::{IsTerminal, Write};

/// `LABEL: DONE/TOTAL WHAT`, redrawn in place on each step and erased when dropped.
#[derive(Debug)]
pub(crate) struct Progress {
    label: &'static str,
    total: usize,
    done: usize,
    visible: bool,
}

impl Progress {
    /// A counter of `total` steps, visible if stderr is a terminal.
    pub(crate) fn new(label: &'static str, total: usize) -> Self {
        Self {
            label,
            total,
            done: 0,
            visible: std::io::stderr().is_terminal(),
        }
    }

    /// One more step is done; `what` names it.
    pub(crate) fn step(&mut self, what: &str) {
        self.done += 1;
        if self.visible {
            let total = self.total.max(self.done);
            // Carriage return, then erase the line: the next draw replaces this one.
            let mut stderr = std::io::stderr().lock();
            let _ = write!(
                stderr,
                "\r\x1b[2K{}: {}/{total} {what}",
                self.label, self.done
            );
            let _ = stderr.flush();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.visible && self.done > 0 {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
        }
    }
}
