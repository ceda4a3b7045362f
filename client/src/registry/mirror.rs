//! Reads through a cache (`vial serve --upstream`): a registry configured with a mirror sends its
//! reads there first and to itself when the mirror does not answer, passing the mirror over for a
//! while after a failure so a dead cache costs one failed request, not one per read.

use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};

use super::Registry;
use crate::error::ClientError;

/// A cache that serves reads of `origin` (`host[:port]`) at `url` (`http://host:port`,
/// `https://host`, or a bare `host[:port]` spoken to over HTTPS unless it is a loopback address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    pub origin: String,
    pub url: String,
}

impl std::str::FromStr for Mirror {
    type Err = String;

    /// `ORIGIN=URL`.
    fn from_str(s: &str) -> Result<Mirror, String> {
        let (origin, url) = s
            .split_once('=')
            .filter(|(o, u)| !o.is_empty() && !u.is_empty())
            .ok_or_else(|| format!("expected ORIGIN=URL (e.g. registry.example.com=http://vial-cache:5000), got {s:?}"))?;
        Ok(Mirror {
            origin: origin.trim_end_matches('/').to_owned(),
            url: url.trim_end_matches('/').to_owned(),
        })
    }
}

/// How long a mirror that failed is passed over before it is tried again.
const MIRROR_PAUSE: Duration = Duration::from_secs(30);

/// How many times a busy mirror is asked for one read before it is passed over.
const MIRROR_ATTEMPTS: u32 = 4;

/// An answer that says "not now" rather than "no".
fn busy(status: StatusCode) -> bool {
    status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS
}

impl Registry {
    /// Sends a read that `origin` was asked for to this mirror instead. `None` when it is not a
    /// read, or the mirror failed it (then it is passed over for a while).
    pub(super) async fn read_as_mirror(
        &self,
        origin: &Registry,
        scope: &str,
        build: &impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Option<Response> {
        let paused = self
            .inner
            .paused_until
            .lock()
            .ok()
            .and_then(|p| *p)
            .is_some_and(|until| std::time::Instant::now() < until);
        if paused {
            return None;
        }
        let probe = build(&self.inner.http).build().ok()?;
        let read = matches!(*probe.method(), Method::GET | Method::HEAD)
            || (*probe.method() == Method::POST && probe.url().path().ends_with("/_vial/chunks"));
        if !read {
            return None;
        }
        let origin_base = &origin.inner.base;
        let rewrite = |c: &reqwest::Client| {
            let (client, request) = build(c).build_split();
            match request {
                Ok(mut request) => {
                    let url = request.url().as_str();
                    if let Some(rest) = url.strip_prefix(origin_base.as_str()) {
                        if let Ok(moved) =
                            reqwest::Url::parse(&format!("{}{rest}", self.inner.base))
                        {
                            *request.url_mut() = moved;
                        }
                    }
                    RequestBuilder::from_parts(client, request)
                }
                Err(_) => build(c),
            }
        };
        // A mirror that answers but is busy (429, or a 5xx while its own upstream was briefly
        // unavailable) is asked again before it is passed over: reading from the origin instead
        // costs the origin what the mirror is there to spare it. One that cannot be reached twice
        // in a row is passed over at once.
        let mut delay = Duration::from_millis(200);
        let mut attempt = 1;
        let why = loop {
            match self.send_once(scope, &rewrite).await {
                Ok(r) if !busy(r.status()) => return Some(r),
                Ok(r) if attempt < MIRROR_ATTEMPTS => {
                    tracing::debug!(mirror = %self.inner.host, status = %r.status(), attempt, "the mirror is busy; asking it again");
                }
                Ok(r) => break format!("it answered {} {attempt} times", r.status()),
                // A pooled connection the mirror had just closed (reset under the request) says
                // nothing of the mirror: one more try, on a new connection, before passing it over.
                Err(e) if attempt == 1 && e.is_transient() => {
                    tracing::debug!(mirror = %self.inner.host, error = %vial_core::error_chain(&e), "a request to the mirror failed in transit; trying once more");
                    attempt += 1;
                    continue;
                }
                Err(e) => break vial_core::error_chain(&e),
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
            attempt += 1;
        };
        self.pause(&why, origin);
        None
    }

    /// Runs a read again, once, if it failed in transit: a body that broke off after its headers
    /// came (a mirror killed while answering, a connection reset) fails after `send` has returned,
    /// beyond its retries. The mirror is passed over for the second try.
    pub(super) async fn again_if_cut_off<T, F, Fut>(&self, read: F) -> Result<T, ClientError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        match read().await {
            Err(e) if e.is_transient() => {
                if let Some(mirror) = &self.inner.mirror {
                    mirror.pause(&vial_core::error_chain(&e), self);
                }
                tracing::debug!(error = %vial_core::error_chain(&e), "a read failed in transit; trying again");
                read().await
            }
            other => other,
        }
    }

    /// Passes this mirror over for a while: it failed a read of `origin`'s.
    pub(super) fn pause(&self, why: &str, origin: &Registry) {
        if let Ok(mut p) = self.inner.paused_until.lock() {
            *p = Some(std::time::Instant::now() + MIRROR_PAUSE);
        }
        tracing::warn!(mirror = %self.inner.host, origin = %origin.inner.host, %why, "the mirror did not answer; reading from the origin for the next 30 s");
    }
}
