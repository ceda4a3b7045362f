//! vial-conformance: an OCI Distribution Specification v1.1 conformance suite.
//!
//! The suite talks HTTP to any registry base URL and checks one requirement at a time: pushing blobs
//! (monolithic, single POST, chunked, mounted, non-sha256), pushing and pulling manifests, pulling
//! blobs and byte ranges, listing tags and referrers, deleting content, and the error bodies that
//! go with each refusal. Every check gets a stable id (`push.chunked.out-of-order-416`) and ends as
//! a pass, a failure with a reason, a warning with a reason (an alternative the suite tolerates
//! but the check does not name), or a skip with a reason; a check never panics.
//!
//! Where the specification lets a registry choose (a `202` instead of single-POST support,
//! disabled deletion, no `Link` header), the suite accepts each sanctioned answer: an unsupported
//! optional feature is reported as skipped, a permitted alternative as a pass with a note.
//!
//! ```no_run
//! # async fn demo() {
//! let config = vial_conformance::Config::new("http://127.0.0.1:5000");
//! let report = vial_conformance::run(&config).await;
//! assert_eq!(report.failed(), 0, "{}", report.summary());
//! # }
//! ```

mod check;
mod client;
mod config;
mod discovery;
mod errors;
mod expect;
mod fixtures;
mod management;
mod manifests;
pub mod parse;
mod pull;
mod push;
mod report;
mod runner;

pub use config::{default_namespace, Config};
pub use report::{category_of, CheckResult, Outcome, Report, StrictFailures};
pub use runner::run;
