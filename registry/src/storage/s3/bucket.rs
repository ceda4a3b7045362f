//! The bucket every request of the S3 store addresses, and what S3's answers mean: which failures
//! are worth another try, which say the object is not there, and how a body becomes a stream.

use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream as S3Body;
use aws_sdk_s3::Client;

use crate::storage::{ByteStream, StorageError};

/// A client and the bucket it sends to.
#[derive(Clone)]
pub(super) struct Bucket {
    pub(super) client: Client,
    pub(super) name: String,
}

pub(super) fn is_not_found<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> bool {
    match e {
        SdkError::ServiceError(s) => {
            matches!(
                s.err().code(),
                Some("NoSuchKey" | "NotFound" | "NoSuchUpload")
            )
        }
        _ => false,
    }
}

/// Whether another try may succeed: the server was unreachable, timed out, or said it is busy.
pub(crate) fn is_transient<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> bool {
    match e {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(s) => matches!(
            s.err().code(),
            Some("SlowDown" | "ServiceUnavailable" | "InternalError" | "RequestTimeout")
        ),
        _ => false,
    }
}

/// Turns an SDK error into a storage error that says which call on which key failed and whether the
/// server was simply unreachable (a 503 for the client) or refused the request.
pub(super) fn s3_error<E, R>(op: &'static str, key: &str, e: SdkError<E, R>) -> StorageError
where
    E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let unavailable = is_transient(&e);
    StorageError::S3 {
        op,
        key: key.to_owned(),
        message: DisplayErrorContext(&e).to_string(),
        unavailable,
    }
}

/// An object's body as the registry's byte stream.
pub(super) fn body_stream(body: S3Body) -> ByteStream {
    Box::pin(futures_util::stream::unfold(body, |mut body| async move {
        match body.next().await {
            Some(Ok(bytes)) => Some((Ok(bytes), body)),
            Some(Err(e)) => Some((Err(std::io::Error::other(e)), body)),
            None => None,
        }
    }))
}
