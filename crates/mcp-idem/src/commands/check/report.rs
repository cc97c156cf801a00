//! The outcome of each check, and the report: one line per check, evidence for failures, a
//! summary; as text for people or JSON for machines.

use std::fmt::Write as _;

use serde_json::{json, Value};

/// How binding the rule a check tests is, in the SEP's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Must,
    Should,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Self::Must => "MUST",
            Self::Should => "SHOULD",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Pass,
    Fail,
    /// The check could not run; `detail` says why. Never counts as passed.
    Skip,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::Skip => "skip",
        }
    }
}

/// One piece of evidence: a labelled text (a request, a response, timings, a note).
#[derive(Clone, Debug)]
pub(crate) struct Evidence {
    pub(crate) label: String,
    pub(crate) text: String,
}

/// The result of one check.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    /// Stable name, such as `replay.result`.
    pub(crate) name: &'static str,
    pub(crate) level: Level,
    pub(crate) status: Status,
    /// One sentence: what was seen, or why the check was skipped.
    pub(crate) detail: String,
    pub(crate) evidence: Vec<Evidence>,
}

impl Outcome {
    pub(crate) fn new(name: &'static str, level: Level, status: Status, detail: String) -> Self {
        Self {
            name,
            level,
            status,
            detail,
            evidence: Vec::new(),
        }
    }

    pub(crate) fn with(mut self, evidence: Vec<Evidence>) -> Self {
        self.evidence = evidence;
        self
    }
}

/// Everything a run found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// What was checked: the command line or URL.
    pub(crate) target: String,
    /// The protocol era the calls used, and how it was found.
    pub(crate) era: String,
    /// The witness tool and its arguments.
    pub(crate) witness: String,
    /// What the reader needs to read the outcomes right (the witness tool has a key policy).
    pub(crate) notes: Vec<String>,
    pub(crate) outcomes: Vec<Outcome>,
}

/// Counts over a report.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) passed: usize,
    pub(crate) failed_must: usize,
    pub(crate) failed_should: usize,
    pub(crate) skipped: usize,
}

impl Report {
    pub(crate) fn summary(&self) -> Summary {
        let mut summary = Summary::default();
        for outcome in &self.outcomes {
            match (outcome.status, outcome.level) {
                (Status::Pass, _) => summary.passed += 1,
                (Status::Skip, _) => summary.skipped += 1,
                (Status::Fail, Level::Must) => summary.failed_must += 1,
                (Status::Fail, Level::Should) => summary.failed_should += 1,
            }
        }
        summary
    }

    /// The report for people: one line per check, evidence under failures (under every check if
    /// `verbose`), then the summary.
    pub(crate) fn to_text(&self, verbose: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "mcp-idem check: SEP-3182 conformance");
        let _ = writeln!(out, "target:  {}", self.target);
        let _ = writeln!(out, "era:     {}", self.era);
        let _ = writeln!(out, "witness: {}", self.witness);
        for note in &self.notes {
            let _ = writeln!(out, "note:    {note}");
        }
        let _ = writeln!(out);
        let width = self
            .outcomes
            .iter()
            .map(|o| o.name.len())
            .max()
            .unwrap_or(0);
        for outcome in &self.outcomes {
            let status = match outcome.status {
                Status::Pass => "PASS",
                Status::Fail => "FAIL",
                Status::Skip => "SKIP",
            };
            let _ = writeln!(
                out,
                "{status}  {:<6}  {:<width$}  {}",
                outcome.level.as_str(),
                outcome.name,
                outcome.detail
            );
            if verbose || outcome.status == Status::Fail {
                for evidence in &outcome.evidence {
                    let _ = writeln!(out, "        {}: {}", evidence.label, evidence.text);
                }
            }
        }
        let s = self.summary();
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{} checks: {} passed, {} failed ({} MUST, {} SHOULD), {} skipped",
            self.outcomes.len(),
            s.passed,
            s.failed_must + s.failed_should,
            s.failed_must,
            s.failed_should,
            s.skipped
        );
        let verdict = if s.failed_must > 0 {
            "NOT CONFORMANT: a MUST check failed"
        } else if s.failed_should > 0 {
            "conformant to every MUST tested; a SHOULD check failed"
        } else if s.skipped > 0 {
            "conformant to every rule tested; skipped checks were not tested"
        } else {
            "conformant to every rule tested"
        };
        let _ = writeln!(out, "{verdict}");
        out
    }

    /// The report for machines.
    pub(crate) fn to_json(&self) -> Value {
        let s = self.summary();
        let checks: Vec<Value> = self
            .outcomes
            .iter()
            .map(|o| {
                json!({
                    "name": o.name,
                    "level": o.level.as_str(),
                    "status": o.status.as_str(),
                    "detail": o.detail,
                    "evidence": o.evidence.iter()
                        .map(|e| json!({"label": e.label, "text": e.text}))
                        .collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "target": self.target,
            "era": self.era,
            "witness": self.witness,
            "notes": self.notes,
            "checks": checks,
            "summary": {
                "total": self.outcomes.len(),
                "passed": s.passed,
                "failed": s.failed_must + s.failed_should,
                "failedMust": s.failed_must,
                "failedShould": s.failed_should,
                "skipped": s.skipped,
            },
            "conformant": s.failed_must == 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(name: &'static str, level: Level, status: Status) -> Outcome {
        Outcome::new(name, level, status, format!("{name} detail")).with(vec![Evidence {
            label: "response".into(),
            text: "{}".into(),
        }])
    }

    #[test]
    fn summary_counts_and_text_show_evidence_for_failures_only() {
        let report = Report {
            target: "t".into(),
            era: "e".into(),
            witness: "w".into(),
            notes: vec!["n".into()],
            outcomes: vec![
                outcome("a.pass", Level::Must, Status::Pass),
                outcome("b.fail", Level::Should, Status::Fail),
                outcome("c.skip", Level::Must, Status::Skip),
            ],
        };
        assert_eq!(
            report.summary(),
            Summary {
                passed: 1,
                failed_must: 0,
                failed_should: 1,
                skipped: 1
            }
        );
        let text = report.to_text(false);
        assert!(
            text.contains("PASS  MUST    a.pass  a.pass detail"),
            "{text}"
        );
        assert!(text.contains("FAIL  SHOULD  b.fail"), "{text}");
        assert_eq!(text.matches("response: {}").count(), 1, "{text}");
        assert!(text.contains("\nnote:    n\n"), "{text}");
        assert!(text.contains("3 checks: 1 passed, 1 failed (0 MUST, 1 SHOULD), 1 skipped"));
        let json = report.to_json();
        assert_eq!(json["conformant"], true);
        assert_eq!(json["checks"][1]["status"], "fail");
        assert_eq!(json["summary"]["failedShould"], 1);
        assert_eq!(json["notes"], json!(["n"]));
    }
}
