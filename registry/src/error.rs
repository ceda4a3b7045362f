//! The wire errors of the Distribution API: the `{"errors":[…]}` envelope with the spec's codes.
//!
//! Every failure a handler returns is an [`ApiError`]. Codes map to their wire names in one exhaustive
//! match; backend failures are logged here with their full cause and reach the client only as a
//! generic message.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::storage::{CommitManifestError, StorageError};

/// The error codes of the distribution-spec, plus `UNAVAILABLE` for a backend that is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BlobUnknown,
    BlobUploadInvalid,
    BlobUploadUnknown,
    DigestInvalid,
    ManifestBlobUnknown,
    ManifestInvalid,
    ManifestUnknown,
    NameInvalid,
    NameUnknown,
    SizeInvalid,
    TagInvalid,
    Unauthorized,
    Denied,
    Unsupported,
    TooManyRequests,
    RangeInvalid,
    PreconditionFailed,
    Unavailable,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BlobUnknown => "BLOB_UNKNOWN",
            ErrorCode::BlobUploadInvalid => "BLOB_UPLOAD_INVALID",
            ErrorCode::BlobUploadUnknown => "BLOB_UPLOAD_UNKNOWN",
            ErrorCode::DigestInvalid => "DIGEST_INVALID",
            ErrorCode::ManifestBlobUnknown => "MANIFEST_BLOB_UNKNOWN",
            ErrorCode::ManifestInvalid => "MANIFEST_INVALID",
            ErrorCode::ManifestUnknown => "MANIFEST_UNKNOWN",
            ErrorCode::NameInvalid => "NAME_INVALID",
            ErrorCode::NameUnknown => "NAME_UNKNOWN",
            ErrorCode::SizeInvalid => "SIZE_INVALID",
            ErrorCode::TagInvalid => "TAG_INVALID",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Denied => "DENIED",
            ErrorCode::Unsupported => "UNSUPPORTED",
            ErrorCode::TooManyRequests => "TOOMANYREQUESTS",
            ErrorCode::RangeInvalid => "RANGE_INVALID",
            ErrorCode::PreconditionFailed => "PRECONDITION_FAILED",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::Internal => "INTERNAL_ERROR",
        }
    }
}

/// An error response: status, code, a message for humans and optional structured detail.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
    pub detail: Option<serde_json::Value>,
    /// Extra headers, e.g. `Range` on a 416 for an upload.
    pub headers: Vec<(&'static str, String)>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    errors: [WireError<'a>; 1],
}

#[derive(Serialize)]
struct WireError<'a> {
    code: &'static str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a serde_json::Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            detail: None,
            headers: Vec::new(),
        }
    }

    pub fn with_detail(mut self, detail: serde_json::Value) -> Self {
        self.detail = Some(detail);
        self
    }

    pub fn with_header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    /// A failure of the server itself; the message is logged and sent.
    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        tracing::error!(error = %message, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            message,
        )
    }

    pub fn bad_request(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    pub fn blob_unknown(digest: &vial_core::Digest) -> Self {
        Self::not_found(
            ErrorCode::BlobUnknown,
            format!("blob {digest} is not in this repository"),
        )
        .with_detail(serde_json::json!({ "digest": digest.as_str() }))
    }

    pub fn upload_unknown(id: &str) -> Self {
        Self::not_found(
            ErrorCode::BlobUploadUnknown,
            format!("upload session {id} is unknown"),
        )
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        if let StorageError::NotReady(why) = &e {
            tracing::warn!(error = %why, "refused until an operator acts");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                why.clone(),
            )
        } else if e.is_unavailable() {
            tracing::warn!(error = %error_chain(&e), "storage backend unavailable");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                "storage backend is unavailable, retry later",
            )
        } else {
            tracing::error!(error = %error_chain(&e), "storage failure");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                "internal storage error",
            )
        }
    }
}

impl From<CommitManifestError> for ApiError {
    fn from(e: CommitManifestError) -> Self {
        match e {
            CommitManifestError::MissingBlobs(ref digests)
            | CommitManifestError::MissingManifests(ref digests) => {
                let detail = serde_json::json!({ "missing": digests });
                ApiError::bad_request(ErrorCode::ManifestBlobUnknown, e.to_string())
                    .with_detail(detail)
            }
            CommitManifestError::SizeMismatch {
                ref digest,
                declared,
                actual,
            } => {
                let detail = serde_json::json!({
                    "digest": digest, "declared": declared, "actual": actual,
                });
                ApiError::bad_request(ErrorCode::ManifestInvalid, e.to_string()).with_detail(detail)
            }
            CommitManifestError::TagMoved { ref current, .. } => {
                let detail = serde_json::json!({ "current": current });
                ApiError::new(
                    StatusCode::PRECONDITION_FAILED,
                    ErrorCode::PreconditionFailed,
                    e.to_string(),
                )
                .with_detail(detail)
            }
            CommitManifestError::Storage(s) => s.into(),
        }
    }
}

use vial_core::error_chain;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Envelope {
            errors: [WireError {
                code: self.code.as_str(),
                message: &self.message,
                detail: self.detail.as_ref(),
            }],
        };
        let json = serde_json::to_vec(&body).unwrap_or_else(|_| b"{\"errors\":[]}".to_vec());
        let mut response = (self.status, json).into_response();
        let headers = response.headers_mut();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        for (name, value) in self.headers {
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(name, v);
            }
        }
        response
    }
}
