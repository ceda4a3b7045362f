//! What the API and the cache tier share of HTTP: the request as a handler sees it (query,
//! headers, byte range), small bodies read whole, JSON answers, headers we set, and the limits
//! of vial's bulk endpoints. Nothing here knows a store or the registry's state.

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::error::{ApiError, ErrorCode};
use crate::storage::{ByteRange, Presence};

/// The largest pack one request may carry.
pub const MAX_PACK_BYTES: u64 = 1 << 30;
/// The most chunks in one pack or one bulk read.
pub const MAX_PACK_CHUNKS: usize = 8192;

/// Everything a handler needs from the request, besides the endpoint.
#[derive(Debug)]
pub(crate) struct Request {
    pub method: Method,
    pub query: Query,
    pub headers: HeaderMap,
    /// Who is asking, once authorized (`None` with authentication off).
    pub subject: Option<String>,
    /// What a presence check may do for this caller, decided with its rights (see
    /// `v2::authorize`).
    pub presence: Presence,
    /// The path and query as sent, for a cache passing the request on.
    pub path_and_query: String,
}

/// Decoded query parameters, keeping repeated keys (`?tag=a&tag=b`).
#[derive(Debug, Default)]
pub(crate) struct Query(pub(crate) Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(raw: Option<&str>) -> Self {
        Query(
            raw.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
                .unwrap_or_default(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The declared body length, if the client sent a valid `Content-Length`.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")
            .and_then(|v| v.trim().parse().ok())
    }

    /// The byte range the `Range` header asks of a blob of `size` bytes: `None` for the whole
    /// blob, a 416 (with the blob's size in `Content-Range`) for a range beyond its end.
    pub fn range(&self, size: u64) -> Result<Option<ByteRange>, ApiError> {
        let Some(h) = self.header("range") else {
            return Ok(None);
        };
        parse_range(h, size).map_err(|()| {
            ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                ErrorCode::RangeInvalid,
                format!("range {h:?} is not satisfiable for a blob of {size} bytes"),
            )
            .with_header("content-range", format!("bytes */{size}"))
        })
    }
}

/// Parses a `Range` header against a blob of `size` bytes.
///
/// `Ok(None)` means "serve the whole blob": RFC 9110 lets a server ignore a range it does not
/// understand or support (multiple ranges, other units). `Err` means the range is well formed but
/// unsatisfiable, which is a 416.
fn parse_range(header: &str, size: u64) -> Result<Option<ByteRange>, ()> {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let (first, last) = (first.trim(), last.trim());
    let range = if first.is_empty() {
        // Suffix range: the last N bytes.
        let Ok(n) = last.parse::<u64>() else {
            return Ok(None);
        };
        if n == 0 || size == 0 {
            return Err(());
        }
        ByteRange {
            start: size.saturating_sub(n),
            end: size,
        }
    } else {
        let Ok(start) = first.parse::<u64>() else {
            return Ok(None);
        };
        let end = if last.is_empty() {
            size
        } else {
            let Ok(last) = last.parse::<u64>() else {
                return Ok(None);
            };
            if last < start {
                return Ok(None);
            }
            last.saturating_add(1).min(size)
        };
        if start >= size {
            return Err(());
        }
        ByteRange { start, end }
    };
    Ok(Some(range))
}

/// Reads a request body of at most `limit` bytes.
pub(crate) async fn read_small_body(
    body: axum::body::Body,
    limit: usize,
    what: &str,
) -> Result<Vec<u8>, ApiError> {
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(ErrorCode::Unsupported, format!("request body failed: {e}"))
        })?;
        if bytes.len() + chunk.len() > limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::SizeInvalid,
                format!("{what} body is too large (at most {limit} bytes)"),
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// A JSON answer.
pub(crate) fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut r = (status, body).into_response();
    set_header(&mut r, "content-type", "application/json");
    r
}

/// A listing (tags, catalog, referrers, vial's listings) as JSON of `content_type`: gzipped by
/// the front door for clients that accept it.
pub(crate) fn json_listing(value: &impl serde::Serialize, content_type: &str) -> Response {
    let mut r = json(StatusCode::OK, value);
    set_header(&mut r, "content-type", content_type);
    r.extensions_mut().insert(crate::front::Listing);
    r
}

/// Adds a header whose value we built ourselves; values that are not valid header text are skipped
/// rather than failing the response.
pub(crate) fn set_header(response: &mut Response, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, v);
    }
}

pub(crate) fn append_header(response: &mut Response, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        response.headers_mut().append(name, v);
    }
}

/// `host[:port]` with a DNS name, an IPv4 address or a bracketed IPv6 address: nothing that could
/// end a quoted string or start another parameter.
pub(crate) fn is_plain_authority(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 261
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> Result<Option<ByteRange>, ()> {
        Ok(Some(ByteRange { start, end }))
    }

    #[test]
    fn byte_ranges_of_every_form() {
        assert_eq!(parse_range("bytes=0-9", 100), r(0, 10));
        assert_eq!(parse_range("bytes=90-200", 100), r(90, 100));
        assert_eq!(parse_range("bytes=95-", 100), r(95, 100));
        assert_eq!(parse_range("bytes=-10", 100), r(90, 100));
        assert_eq!(parse_range("bytes=-1000", 100), r(0, 100));
    }

    #[test]
    fn unsatisfiable_ranges_are_errors() {
        assert_eq!(parse_range("bytes=100-", 100), Err(()));
        assert_eq!(parse_range("bytes=200-300", 100), Err(()));
        assert_eq!(parse_range("bytes=-0", 100), Err(()));
        assert_eq!(parse_range("bytes=0-0", 0), Err(()));
    }

    #[test]
    fn unsupported_range_forms_serve_the_whole_blob() {
        assert_eq!(parse_range("items=0-1", 100), Ok(None));
        assert_eq!(parse_range("bytes=0-1,5-6", 100), Ok(None));
        assert_eq!(parse_range("bytes=5-1", 100), Ok(None));
        assert_eq!(parse_range("bytes=x-1", 100), Ok(None));
    }
}
