//! Assertions over responses shared by every check: status codes, headers, digests, and the error
//! body that every 4xx answer must carry.

use serde::Deserialize;
use vial_core::Digest;

use crate::check::{fail, Problem};
use crate::client::Response;
use crate::parse::{is_error_code, snippet};

/// Requires the response to have exactly this status.
pub(crate) fn status(resp: &Response, expected: u16) -> Result<(), Problem> {
    if resp.status == expected {
        Ok(())
    } else {
        fail(format!("expected {expected}, got {}", resp.describe()))
    }
}

/// Requires a header and returns its value.
pub(crate) fn header<'a>(resp: &'a Response, name: &str) -> Result<&'a str, Problem> {
    match resp.header(name) {
        Some(v) => Ok(v),
        None => fail(format!("{} has no {name} header", resp.describe())),
    }
}

/// Requires a `Location` header and returns it.
pub(crate) fn location(resp: &Response) -> Result<&str, Problem> {
    match resp.header("Location") {
        Some(v) if !v.trim().is_empty() => Ok(v.trim()),
        _ => fail(format!("{} has no Location header", resp.describe())),
    }
}

/// Requires `Docker-Content-Digest` to name exactly `expected`.
pub(crate) fn digest_header(resp: &Response, expected: &Digest) -> Result<(), Problem> {
    let value = header(resp, "Docker-Content-Digest")?;
    if value.trim() == expected.as_str() {
        Ok(())
    } else {
        fail(format!(
            "Docker-Content-Digest is {value:?}, expected {expected} ({} {})",
            resp.method,
            resp.url.path()
        ))
    }
}

/// Requires `Content-Length` to equal `expected`.
pub(crate) fn content_length(resp: &Response, expected: usize) -> Result<(), Problem> {
    let value = header(resp, "Content-Length")?;
    match value.trim().parse::<usize>() {
        Ok(n) if n == expected => Ok(()),
        _ => fail(format!(
            "Content-Length is {value:?}, expected {expected} ({} {})",
            resp.method,
            resp.url.path()
        )),
    }
}

/// Requires the body to be exactly `expected`.
pub(crate) fn body(resp: &Response, expected: &[u8]) -> Result<(), Problem> {
    if resp.body.as_ref() == expected {
        Ok(())
    } else {
        fail(format!(
            "{} {} returned {} bytes that differ from the {} bytes expected",
            resp.method,
            resp.url.path(),
            resp.body.len(),
            expected.len()
        ))
    }
}

/// Requires `Content-Type` (ignoring parameters) to be `expected`.
pub(crate) fn content_type(resp: &Response, expected: &str) -> Result<(), Problem> {
    let value = header(resp, "Content-Type")?;
    let bare = value.split(';').next().unwrap_or("").trim();
    if bare.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        fail(format!(
            "Content-Type is {value:?}, expected {expected:?} ({} {})",
            resp.method,
            resp.url.path()
        ))
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    errors: Vec<ErrorEntry>,
}

#[derive(Deserialize)]
struct ErrorEntry {
    code: serde_json::Value,
    #[serde(default)]
    message: Option<serde_json::Value>,
}

/// Checks that a body is the specification's error envelope,
/// `{"errors":[{"code":"...","message":"..."}]}`, and returns its codes.
pub(crate) fn error_codes(body: &[u8]) -> Result<Vec<String>, String> {
    let parsed: ErrorBody = serde_json::from_slice(body).map_err(|e| {
        format!(
            "body is not an error envelope {{\"errors\":[{{\"code\":…,\"message\":…}}]}} ({e}): {:?}",
            snippet(body, 120)
        )
    })?;
    if parsed.errors.is_empty() {
        return Err("error envelope has an empty \"errors\" list".into());
    }
    let mut codes = Vec::new();
    for entry in parsed.errors {
        let Some(code) = entry.code.as_str() else {
            return Err(format!("error code {} is not a string", entry.code));
        };
        if !is_error_code(code) {
            return Err(format!(
                "error code {code:?} is not uppercase letters and underscores"
            ));
        }
        if let Some(message) = &entry.message {
            if !message.is_string() && !message.is_null() {
                return Err(format!("error message {message} is not a string"));
            }
        }
        codes.push(code.to_owned());
    }
    Ok(codes)
}

/// Requires an error response: the given status, the JSON error envelope, and (unless `codes` is
/// empty) at least one of `codes`. Returns the first matching code (or the first code).
pub(crate) fn error(resp: &Response, expected: u16, codes: &[&str]) -> Result<String, Problem> {
    status(resp, expected)?;
    error_body(resp, codes)
}

/// Like [`error`], for a status already checked by the caller.
pub(crate) fn error_body(resp: &Response, codes: &[&str]) -> Result<String, Problem> {
    let found = match error_codes(&resp.body) {
        Ok(found) => found,
        Err(e) => {
            return fail(format!(
                "{} {} -> {}: {e}",
                resp.method,
                resp.url.path(),
                resp.status
            ))
        }
    };
    if codes.is_empty() {
        return Ok(found.first().cloned().unwrap_or_default());
    }
    match found.iter().find(|c| codes.contains(&c.as_str())) {
        Some(code) => Ok(code.clone()),
        None => fail(format!(
            "{} {} -> {} with error code(s) {}, expected {}",
            resp.method,
            resp.url.path(),
            resp.status,
            found.join(", "),
            codes.join(" or ")
        )),
    }
}

/// Requires a `HEAD` response to have no body.
pub(crate) fn no_body(resp: &Response) -> Result<(), Problem> {
    if resp.body.is_empty() {
        Ok(())
    } else {
        fail(format!(
            "{} {} returned a {}-byte body",
            resp.method,
            resp.url.path(),
            resp.body.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_envelope_shapes() {
        assert_eq!(
            error_codes(br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"x","detail":{}}]}"#),
            Ok(vec!["BLOB_UNKNOWN".to_string()])
        );
        assert_eq!(
            error_codes(br#"{"errors":[{"code":"A"},{"code":"B_C","message":""}]}"#),
            Ok(vec!["A".to_string(), "B_C".to_string()])
        );
        assert!(error_codes(b"404 page not found").is_err());
        assert!(error_codes(br#"{"errors":[]}"#).is_err());
        assert!(error_codes(br#"{"errors":[{"code":"lower"}]}"#).is_err());
        assert!(error_codes(br#"{"errors":[{"code":7}]}"#).is_err());
        assert!(error_codes(br#"{"errors":[{"code":"X","message":3}]}"#).is_err());
        assert!(error_codes(br#"{"error":"X"}"#).is_err());
    }
}
