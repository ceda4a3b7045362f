//! Requests the S3 client sends, counted by HTTP method (every attempt, retries too), for
//! `/metrics`: what an object store bills for, and how the benchmark checks PUTs per GiB.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_s3::error::BoxError;

const METHODS: [&str; 5] = ["GET", "HEAD", "PUT", "POST", "DELETE"];

/// Counters shared between the client's interceptor and the store's metrics.
#[derive(Debug, Default)]
pub struct RequestCounts {
    by_method: [AtomicU64; 5],
    other: AtomicU64,
}

impl RequestCounts {
    fn count(&self, method: &str) {
        match METHODS.iter().position(|m| *m == method) {
            Some(i) => self.by_method[i].fetch_add(1, Ordering::Relaxed),
            None => self.other.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// `vial_s3_requests_total{method="PUT"} n`, one line per method.
    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP vial_s3_requests_total Requests sent to the object store, by HTTP method (retries included).\n");
        out.push_str("# TYPE vial_s3_requests_total counter\n");
        for (method, n) in METHODS.iter().zip(&self.by_method) {
            out.push_str(&format!(
                "vial_s3_requests_total{{method=\"{method}\"}} {}\n",
                n.load(Ordering::Relaxed)
            ));
        }
        out.push_str(&format!(
            "vial_s3_requests_total{{method=\"other\"}} {}\n",
            self.other.load(Ordering::Relaxed)
        ));
    }
}

/// The interceptor that feeds [`RequestCounts`].
#[derive(Debug)]
pub struct CountRequests(pub Arc<RequestCounts>);

impl Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "vial-count-requests"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.count(context.request().method());
        Ok(())
    }
}
