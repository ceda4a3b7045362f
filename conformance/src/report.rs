//! The results of a run: one [`CheckResult`] per requirement, collected into a [`Report`].

use std::fmt;

use serde::Serialize;

/// What a single check concluded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "reason", rename_all = "lowercase")]
pub enum Outcome {
    /// The registry met the requirement.
    Pass,
    /// The registry did not meet the requirement (or could not be reached); the string says why.
    Fail(String),
    /// The registry answered with an alternative the suite tolerates but the check does not name
    /// (a 404 where 400 `NAME_INVALID` is due, another error code): not a failure, not a pass.
    Warn(String),
    /// The requirement was not tested: it was excluded by configuration, depends on an optional
    /// feature the registry declined in a way the specification allows, or depends on a check
    /// that did not run.
    Skipped(String),
}

impl Outcome {
    pub fn is_pass(&self) -> bool {
        matches!(self, Outcome::Pass)
    }

    pub fn is_fail(&self) -> bool {
        matches!(self, Outcome::Fail(_))
    }

    pub fn is_skipped(&self) -> bool {
        matches!(self, Outcome::Skipped(_))
    }

    pub fn is_warning(&self) -> bool {
        matches!(self, Outcome::Warn(_))
    }
}

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// Stable identifier such as `push.chunked.out-of-order-416`; the part before the first dot is
    /// the category.
    pub id: &'static str,
    /// The workflow area: `base`, `push`, `manifest`, `pull`, `discovery`, `management` or `errors`.
    pub category: &'static str,
    /// One line saying what is required.
    pub description: &'static str,
    pub outcome: Outcome,
    /// For a pass, which of several answers the specification allows the registry gave, or
    /// anything else worth recording.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl CheckResult {
    pub fn new(id: &'static str, description: &'static str, outcome: Outcome) -> Self {
        CheckResult {
            id,
            category: category_of(id),
            description,
            outcome,
            note: None,
        }
    }
}

impl fmt::Display for CheckResult {
    /// `PASS  id  description`, `FAIL  id  description: reason` or `SKIP  id  description: reason`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Outcome::Pass => {
                write!(f, "PASS  {}  {}", self.id, self.description)?;
                if let Some(note) = &self.note {
                    write!(f, " [note: {note}]")?;
                }
                Ok(())
            }
            Outcome::Fail(reason) => write!(f, "FAIL  {}  {}: {reason}", self.id, self.description),
            Outcome::Warn(reason) => write!(f, "WARN  {}  {}: {reason}", self.id, self.description),
            Outcome::Skipped(reason) => {
                write!(f, "SKIP  {}  {}: {reason}", self.id, self.description)
            }
        }
    }
}

/// The category of a check: its id up to the first dot.
pub fn category_of(id: &'static str) -> &'static str {
    id.split('.').next().unwrap_or(id)
}

/// Every check's result, in the order the checks ran.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub results: Vec<CheckResult>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.outcome.is_pass()).count()
    }

    pub fn failed(&self) -> usize {
        self.results.iter().filter(|r| r.outcome.is_fail()).count()
    }

    pub fn warnings(&self) -> usize {
        self.results
            .iter()
            .filter(|r| r.outcome.is_warning())
            .count()
    }

    pub fn skipped(&self) -> usize {
        self.results
            .iter()
            .filter(|r| r.outcome.is_skipped())
            .count()
    }

    /// The result of the check with this id, if it ran.
    pub fn get(&self, id: &str) -> Option<&CheckResult> {
        self.results.iter().find(|r| r.id == id)
    }

    /// `N passed, M failed`, followed by `, W warnings` and `, K skipped` when there are any.
    pub fn summary(&self) -> String {
        let mut line = format!("{} passed, {} failed", self.passed(), self.failed());
        let warnings = self.warnings();
        if warnings > 0 {
            line.push_str(&format!(", {warnings} warnings"));
        }
        let skipped = self.skipped();
        if skipped > 0 {
            line.push_str(&format!(", {skipped} skipped"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_summary() {
        let mut pass = CheckResult::new("push.a", "does a", Outcome::Pass);
        assert_eq!(pass.to_string(), "PASS  push.a  does a");
        pass.note = Some("202 fallback".into());
        assert_eq!(
            pass.to_string(),
            "PASS  push.a  does a [note: 202 fallback]"
        );
        let fail = CheckResult::new("pull.b", "does b", Outcome::Fail("got 500".into()));
        assert_eq!(fail.category, "pull");
        assert_eq!(fail.to_string(), "FAIL  pull.b  does b: got 500");
        let report = Report {
            results: vec![pass, fail],
        };
        assert_eq!(report.summary(), "1 passed, 1 failed");
        let mut report = report;
        report.results.push(CheckResult::new(
            "x.c",
            "does c",
            Outcome::Skipped("off".into()),
        ));
        assert_eq!(report.summary(), "1 passed, 1 failed, 1 skipped");
        assert_eq!(report.get("x.c").map(|r| r.category), Some("x"));
    }

    #[test]
    fn outcome_serialises_with_status_and_reason() {
        let json = serde_json::to_value(Outcome::Fail("nope".into())).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({"status": "fail", "reason": "nope"})
        );
        let json = serde_json::to_value(Outcome::Pass).unwrap_or_default();
        assert_eq!(json, serde_json::json!({"status": "pass"}));
    }
}
