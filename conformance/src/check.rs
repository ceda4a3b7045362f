//! The machinery every check shares: its return type, the recorder that runs it and files its
//! result, and the slots that carry state from one check to the checks that build on it.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use crate::report::{CheckResult, Outcome, EXCLUDED};

/// Why a check did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    Fail(String),
    Skip(String),
    /// A tolerated alternative to what the check requires.
    Warn(String),
}

/// What a check returns: `Ok(None)` for a plain pass, `Ok(Some(note))` for a pass worth a remark.
pub(crate) type Verdict = Result<Option<String>, Problem>;

/// A failed check, for `?`-style early returns.
pub(crate) fn fail<T>(reason: impl Into<String>) -> Result<T, Problem> {
    Err(Problem::Fail(reason.into()))
}

/// A skipped check, for `?`-style early returns.
pub(crate) fn skip<T>(reason: impl Into<String>) -> Result<T, Problem> {
    Err(Problem::Skip(reason.into()))
}

/// A tolerated alternative: reported as a warning, never as a pass.
pub(crate) fn warn(reason: impl Into<String>) -> Verdict {
    Err(Problem::Warn(reason.into()))
}

/// A plain pass.
pub(crate) fn pass() -> Verdict {
    Ok(None)
}

/// A pass with a remark.
pub(crate) fn pass_with(note: impl Into<String>) -> Verdict {
    Ok(Some(note.into()))
}

/// Fails the enclosing check with a formatted reason unless the condition holds.
macro_rules! require {
    ($cond:expr, $($reason:tt)+) => {
        if !$cond {
            return Err($crate::check::Problem::Fail(format!($($reason)+)));
        }
    };
}
pub(crate) use require;

/// Runs checks and collects their results, honouring the configured skip list.
#[derive(Debug)]
pub(crate) struct Recorder {
    skip: Vec<String>,
    results: Vec<CheckResult>,
}

impl Recorder {
    pub(crate) fn new(skip: &[String]) -> Self {
        Recorder {
            skip: skip.to_vec(),
            results: Vec::new(),
        }
    }

    /// Whether the configuration excludes this check: an entry equal to the id, equal to one of its
    /// dot-separated prefixes (`push` or `push.chunked`), or ending in `*` and prefixing the id.
    pub(crate) fn excluded(&self, id: &str) -> bool {
        self.skip.iter().any(|s| {
            let s = s.trim();
            if let Some(prefix) = s.strip_suffix('*') {
                return id.starts_with(prefix);
            }
            id == s
                || (!s.is_empty() && id.starts_with(s) && id.as_bytes().get(s.len()) == Some(&b'.'))
        })
    }

    /// Runs one check (unless excluded) and records what it concluded. A panic inside the check is
    /// recorded as a failure rather than unwinding into the caller.
    pub(crate) async fn run<F>(&mut self, id: &'static str, description: &'static str, check: F)
    where
        F: Future<Output = Verdict>,
    {
        if self.excluded(id) {
            self.results.push(CheckResult::new(
                id,
                description,
                Outcome::Skipped(EXCLUDED.into()),
            ));
            return;
        }
        let verdict = match AssertUnwindSafe(check).catch_unwind().await {
            Ok(v) => v,
            Err(_) => Err(Problem::Fail(
                "the check panicked (a bug in the suite)".into(),
            )),
        };
        self.record(id, description, verdict);
    }

    /// Files a verdict reached without [`Recorder::run`].
    pub(crate) fn record(&mut self, id: &'static str, description: &'static str, verdict: Verdict) {
        let (outcome, note) = match verdict {
            Ok(note) => (Outcome::Pass, note),
            Err(Problem::Fail(reason)) => (Outcome::Fail(reason), None),
            Err(Problem::Skip(reason)) => (Outcome::Skipped(reason), None),
            Err(Problem::Warn(reason)) => (Outcome::Warn(reason), None),
        };
        let mut result = CheckResult::new(id, description, outcome);
        result.note = note;
        self.results.push(result);
    }

    pub(crate) fn into_results(self) -> Vec<CheckResult> {
        self.results
    }
}

/// State one check produces for later checks, or the reason it is not there.
///
/// A slot starts out "not run": checks that read it then skip. A check that fills a slot first
/// [`poison`](Slot::poison)s it, so if it fails part-way its dependents fail with a pointer to it.
#[derive(Debug)]
pub(crate) struct Slot<T> {
    value: Result<T, Problem>,
}

impl<T> Slot<T> {
    /// An empty slot to be filled by the check `producer`.
    pub(crate) fn new(producer: &'static str) -> Self {
        Slot {
            value: Err(Problem::Skip(format!(
                "depends on {producer}, which did not run"
            ))),
        }
    }

    /// A slot filled by setup work that is not itself a check.
    pub(crate) fn from_setup(what: &str, value: Result<T, Problem>) -> Self {
        Slot {
            value: value.map_err(|p| match p {
                Problem::Fail(r) => Problem::Fail(format!("setup ({what}) failed: {r}")),
                Problem::Skip(r) => Problem::Skip(format!("setup ({what}) skipped: {r}")),
                // Setup that only met a tolerated alternative cannot be built on as if it passed.
                Problem::Warn(r) => Problem::Fail(format!("setup ({what}): {r}")),
            }),
        }
    }

    /// Marks the slot as being produced by `by`: until [`Slot::put`], readers fail naming `by`.
    pub(crate) fn poison(&mut self, by: &'static str) {
        self.value = Err(Problem::Fail(format!(
            "not reached: depends on {by}, which failed"
        )));
    }

    pub(crate) fn put(&mut self, value: T) {
        self.value = Ok(value);
    }

    /// Takes the value out for a check that will advance it, leaving the slot poisoned by `by`
    /// until the value is [`put`](Slot::put) back.
    pub(crate) fn take(&mut self, by: &'static str) -> Result<T, Problem> {
        let poisoned = Err(Problem::Fail(format!(
            "not reached: depends on {by}, which failed"
        )));
        match std::mem::replace(&mut self.value, poisoned) {
            Ok(v) => Ok(v),
            Err(p) => {
                self.value = Err(p.clone());
                Err(p)
            }
        }
    }

    pub(crate) fn get(&self) -> Result<&T, Problem> {
        self.value.as_ref().map_err(Clone::clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_list_matches_ids_prefixes_and_globs() {
        let rec = Recorder::new(&[
            "push.chunked".into(),
            "discovery.ref*".into(),
            "base.v2".into(),
        ]);
        assert!(rec.excluded("push.chunked.first-patch"));
        assert!(!rec.excluded("push.chunkedness"));
        assert!(rec.excluded("discovery.referrers.list"));
        assert!(rec.excluded("base.v2"));
        assert!(!rec.excluded("base.v2x"));
        assert!(!rec.excluded("pull.blob.get"));
    }

    #[test]
    fn slots_report_their_producer() {
        let mut slot: Slot<u32> = Slot::new("a.produce");
        assert!(matches!(slot.get(), Err(Problem::Skip(r)) if r.contains("a.produce")));
        slot.poison("a.produce");
        assert!(matches!(slot.get(), Err(Problem::Fail(r)) if r.contains("a.produce")));
        slot.put(7);
        assert_eq!(slot.take("a.advance"), Ok(7));
        assert!(matches!(slot.get(), Err(Problem::Fail(r)) if r.contains("a.advance")));
        slot.put(8);
        assert_eq!(slot.get(), Ok(&8));
    }

    #[tokio::test]
    async fn recorder_turns_panics_into_failures() {
        let mut rec = Recorder::new(&["skipped.one".into()]);
        rec.run("ok.one", "passes", async { pass() }).await;
        rec.run("bad.one", "panics", async {
            let v: Vec<u8> = Vec::new();
            #[allow(clippy::indexing_slicing)]
            let _ = v[3];
            pass()
        })
        .await;
        rec.run("skipped.one", "never runs", async { fail("ran") })
            .await;
        rec.run("alt.one", "a tolerated alternative", async {
            warn("404, not 400")
        })
        .await;
        let results = rec.into_results();
        assert!(results[0].outcome.is_pass());
        assert!(results[1].outcome.is_fail());
        assert!(results[2].outcome.is_skipped());
        assert!(results[3].outcome.is_warning() && !results[3].outcome.is_pass());
        assert!(results[3].to_string().starts_with("WARN  alt.one"));
    }
}
