//! A thin wrapper over reqwest: builds URLs under the registry's base URL, resolves `Location`
//! headers, and turns every exchange into a buffered [`Response`] or a failed check.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, Url};

use crate::check::{fail, Problem};
use crate::parse::snippet;

/// The manifest media types the suite accepts when pulling.
pub(crate) const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";

/// HTTP access to one registry.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    base: Url,
    /// Follows no redirects: for everything whose status is itself under test.
    plain: reqwest::Client,
    /// Follows redirects: for blob reads, which registries may send to other storage.
    following: reqwest::Client,
}

/// A response read to the end.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    pub method: Method,
    pub url: Url,
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Response {
    /// A header's value as text; `None` if absent or not visible ASCII.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// All values of a header, in order.
    pub(crate) fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect()
    }

    /// `GET /v2/x -> 404 (body…)`, for failure messages.
    pub(crate) fn describe(&self) -> String {
        let path = match self.url.query() {
            Some(q) if q.chars().count() > 80 => {
                let head: String = q.chars().take(80).collect();
                format!("{}?{head}…", self.url.path())
            }
            Some(q) => format!("{}?{q}", self.url.path()),
            None => self.url.path().to_owned(),
        };
        let body = snippet(&self.body, 200);
        if body.is_empty() {
            format!("{} {} -> {}", self.method, path, self.status)
        } else {
            format!("{} {} -> {} ({})", self.method, path, self.status, body)
        }
    }

    pub(crate) fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

impl Client {
    /// A client for the registry at `base_url` (e.g. `http://127.0.0.1:5000`).
    pub(crate) fn new(base_url: &str) -> Result<Self, String> {
        let trimmed = base_url.trim().trim_end_matches('/');
        let base = Url::parse(&format!("{trimmed}/"))
            .map_err(|e| format!("invalid base URL {base_url:?}: {e}"))?;
        if base.scheme() != "http" && base.scheme() != "https" {
            return Err(format!("base URL {base_url:?} is not http or https"));
        }
        let build = |policy: reqwest::redirect::Policy| {
            reqwest::Client::builder()
                .redirect(policy)
                .connect_timeout(Duration::from_secs(10))
                .timeout(Duration::from_secs(120))
                .user_agent(concat!("vial-conformance/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| format!("cannot build HTTP client: {e}"))
        };
        Ok(Client {
            base,
            plain: build(reqwest::redirect::Policy::none())?,
            following: build(reqwest::redirect::Policy::limited(10))?,
        })
    }

    /// The URL of `path` (which starts with `/v2/`) under the base URL, keeping any path prefix the
    /// base URL has.
    pub(crate) fn url(&self, path: &str) -> Result<Url, Problem> {
        let base = self.base.as_str().trim_end_matches('/');
        Url::parse(&format!("{base}{path}"))
            .or_else(|e| fail(format!("cannot form a URL from {path:?}: {e}")))
    }

    /// The URL of `path` with query parameters appended (and percent-encoded).
    pub(crate) fn url_with(&self, path: &str, query: &[(&str, &str)]) -> Result<Url, Problem> {
        let mut url = self.url(path)?;
        add_query(&mut url, query);
        Ok(url)
    }

    /// Resolves a `Location` header, which may be absolute or relative, against the base URL.
    pub(crate) fn resolve(&self, location: &str) -> Result<Url, Problem> {
        self.base
            .join(location)
            .or_else(|e| fail(format!("cannot resolve Location {location:?}: {e}")))
    }

    /// A request that does not follow redirects.
    pub(crate) fn request(&self, method: Method, url: Url) -> RequestBuilder {
        self.plain.request(method, url)
    }

    /// A request that follows redirects (blob reads).
    pub(crate) fn request_following(&self, method: Method, url: Url) -> RequestBuilder {
        self.following.request(method, url)
    }

    /// Sends a request (through whichever client built it) and reads the whole response. A
    /// transport error fails the check.
    pub(crate) async fn send(&self, request: RequestBuilder) -> Result<Response, Problem> {
        let (response, body_error) = self.send_lenient(request).await?;
        match body_error {
            None => Ok(response),
            Some(e) => fail(format!(
                "{} {} -> {}: reading the body failed: {e}",
                response.method,
                response.url.path(),
                response.status
            )),
        }
    }

    /// Like [`Client::send`] for a check that only needs the status and headers: a body that
    /// cannot be read (for instance one shorter than its `Content-Length`) is returned as the
    /// second value, with an empty body, instead of failing the check.
    pub(crate) async fn send_lenient(
        &self,
        request: RequestBuilder,
    ) -> Result<(Response, Option<String>), Problem> {
        let (client, request) = request.build_split();
        let request = request.or_else(|e| fail(format!("cannot build request: {e}")))?;
        let method = request.method().clone();
        let url = request.url().clone();
        let response = match client.execute(request).await {
            Ok(r) => r,
            Err(e) => {
                return fail(format!(
                    "{method} {} failed: {}",
                    url.path(),
                    error_chain(&e.without_url())
                ))
            }
        };
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let (body, body_error) = match response.bytes().await {
            Ok(b) => (b, None),
            Err(e) => (Bytes::new(), Some(error_chain(&e.without_url()))),
        };
        Ok((
            Response {
                method,
                url,
                status,
                headers,
                body,
            },
            body_error,
        ))
    }

    // ---- conveniences -------------------------------------------------------------------------

    pub(crate) async fn get(&self, path: &str) -> Result<Response, Problem> {
        self.send(self.request(Method::GET, self.url(path)?)).await
    }

    pub(crate) async fn get_url(&self, url: Url) -> Result<Response, Problem> {
        self.send(self.request(Method::GET, url)).await
    }

    pub(crate) async fn delete(&self, path: &str) -> Result<Response, Problem> {
        self.send(self.request(Method::DELETE, self.url(path)?))
            .await
    }

    /// `GET` or `HEAD` of a blob, following redirects, with an optional `Range` header.
    pub(crate) async fn blob(
        &self,
        method: Method,
        repo: &str,
        digest: &str,
        range: Option<&str>,
    ) -> Result<Response, Problem> {
        self.send(self.blob_request(method, repo, digest, range)?)
            .await
    }

    /// The request [`Client::blob`] sends.
    pub(crate) fn blob_request(
        &self,
        method: Method,
        repo: &str,
        digest: &str,
        range: Option<&str>,
    ) -> Result<RequestBuilder, Problem> {
        let url = self.url(&format!("/v2/{repo}/blobs/{digest}"))?;
        let mut request = self.request_following(method, url);
        if let Some(range) = range {
            request = request.header("Range", range);
        }
        Ok(request)
    }

    /// `GET` or `HEAD` of a manifest with an `Accept` header listing the common manifest types.
    pub(crate) async fn manifest(
        &self,
        method: Method,
        repo: &str,
        reference: &str,
    ) -> Result<Response, Problem> {
        let url = self.url(&format!("/v2/{repo}/manifests/{reference}"))?;
        self.send(self.request(method, url).header(ACCEPT, MANIFEST_ACCEPT))
            .await
    }

    /// `PUT` of a manifest body with the given `Content-Type`, and optional query parameters.
    pub(crate) async fn put_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        body: Vec<u8>,
        query: &[(&str, &str)],
    ) -> Result<Response, Problem> {
        let url = self.url_with(&format!("/v2/{repo}/manifests/{reference}"), query)?;
        self.send(
            self.request(Method::PUT, url)
                .header(CONTENT_TYPE, media_type)
                .body(body),
        )
        .await
    }

    /// `POST /v2/<repo>/blobs/uploads/` with an empty body and the given query parameters.
    pub(crate) async fn post_upload(
        &self,
        repo: &str,
        query: &[(&str, &str)],
    ) -> Result<Response, Problem> {
        let url = self.url_with(&format!("/v2/{repo}/blobs/uploads/"), query)?;
        self.send(
            self.request(Method::POST, url)
                .header(CONTENT_LENGTH, "0")
                .body(Vec::new()),
        )
        .await
    }
}

/// Appends query parameters to a URL, percent-encoding them, keeping those it already has.
pub(crate) fn add_query(url: &mut Url, query: &[(&str, &str)]) {
    if query.is_empty() {
        return;
    }
    let mut pairs = url.query_pairs_mut();
    for (k, v) in query {
        pairs.append_pair(k, v);
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(base: &str) -> Client {
        Client::new(base).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn urls_keep_the_base_path_prefix() {
        let c = client("http://127.0.0.1:5000");
        assert_eq!(
            c.url("/v2/a/b/tags/list").map(|u| u.to_string()),
            Ok("http://127.0.0.1:5000/v2/a/b/tags/list".to_owned())
        );
        let c = client("https://example.test/registry/");
        assert_eq!(
            c.url("/v2/").map(|u| u.to_string()),
            Ok("https://example.test/registry/v2/".to_owned())
        );
    }

    #[test]
    fn locations_resolve_whether_relative_or_absolute() {
        let c = client("http://127.0.0.1:5000");
        assert_eq!(
            c.resolve("/v2/a/blobs/uploads/123?_state=x")
                .map(|u| u.to_string()),
            Ok("http://127.0.0.1:5000/v2/a/blobs/uploads/123?_state=x".to_owned())
        );
        assert_eq!(
            c.resolve("https://storage.test/up/9")
                .map(|u| u.to_string()),
            Ok("https://storage.test/up/9".to_owned())
        );
    }

    #[test]
    fn query_parameters_are_appended_and_encoded() {
        let mut url = Url::parse("http://h/v2/a/blobs/uploads/1?_state=abc")
            .unwrap_or_else(|e| panic!("{e}"));
        add_query(
            &mut url,
            &[
                ("digest", "sha256:00"),
                ("artifactType", "application/x+json"),
            ],
        );
        assert_eq!(
            url.as_str(),
            "http://h/v2/a/blobs/uploads/1?_state=abc&digest=sha256%3A00&artifactType=application%2Fx%2Bjson"
        );
    }

    #[test]
    fn bad_base_urls_are_refused() {
        assert!(Client::new("not a url").is_err());
        assert!(Client::new("ftp://h/").is_err());
    }
}
