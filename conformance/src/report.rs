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

/// The reason a check excluded with `--skip` is skipped: the one skip a strict run accepts.
pub(crate) const EXCLUDED: &str = "excluded by configuration";

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

    /// What fails a strict run besides the failures: every warning, since a tolerated
    /// alternative is still not what the check requires, and every skip but those the
    /// configuration asked for, since a strict run treats optional features as required.
    pub fn strict_failures(&self) -> StrictFailures {
        let mut strict = StrictFailures::default();
        for r in &self.results {
            match &r.outcome {
                Outcome::Warn(_) => strict.warnings.push(r.id),
                Outcome::Skipped(why) if why != EXCLUDED => strict.skips.push(r.id),
                _ => {}
            }
        }
        strict
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

/// The checks that fail a strict run although they did not fail, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StrictFailures {
    /// Checks that ended in a warning.
    pub warnings: Vec<&'static str>,
    /// Checks skipped for a reason other than `--skip`.
    pub skips: Vec<&'static str>,
}

impl StrictFailures {
    pub fn is_empty(&self) -> bool {
        self.warnings.is_empty() && self.skips.is_empty()
    }
}

impl fmt::Display for StrictFailures {
    /// `strict: 1 warning (errors.name-invalid) and 2 skips (a, b) count as failures`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |ids: &[&str], one: &str, many: &str| {
            let noun = if ids.len() == 1 { one } else { many };
            format!("{} {noun} ({})", ids.len(), ids.join(", "))
        };
        let mut parts = Vec::new();
        if !self.warnings.is_empty() {
            parts.push(part(&self.warnings, "warning", "warnings"));
        }
        if !self.skips.is_empty() {
            parts.push(part(&self.skips, "skip", "skips"));
        }
        if parts.is_empty() {
            return write!(f, "strict: nothing but passes and failures");
        }
        write!(f, "strict: {} count as failures", parts.join(" and "))
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

    #[test]
    fn a_strict_run_fails_on_warnings_and_on_skips_it_did_not_ask_for() {
        let mut report = Report {
            results: vec![
                CheckResult::new("push.a", "does a", Outcome::Pass),
                CheckResult::new("pull.b", "does b", Outcome::Skipped(EXCLUDED.into())),
            ],
        };
        assert!(
            report.strict_failures().is_empty(),
            "passes and --skip exclusions are fine under --strict"
        );
        report.results.push(CheckResult::new(
            "errors.c",
            "does c",
            Outcome::Warn("answered 404".into()),
        ));
        let strict = report.strict_failures();
        assert_eq!(strict.warnings, ["errors.c"]);
        assert!(strict.skips.is_empty());
        assert_eq!(
            strict.to_string(),
            "strict: 1 warning (errors.c) count as failures"
        );
        report.results.push(CheckResult::new(
            "pull.d",
            "does d",
            Outcome::Skipped("Range unsupported".into()),
        ));
        report.results.push(CheckResult::new(
            "errors.e",
            "does e",
            Outcome::Warn("another code".into()),
        ));
        let strict = report.strict_failures();
        assert_eq!(strict.warnings, ["errors.c", "errors.e"]);
        assert_eq!(strict.skips, ["pull.d"]);
        assert_eq!(
            strict.to_string(),
            "strict: 2 warnings (errors.c, errors.e) and 1 skip (pull.d) count as failures"
        );
    }
}
