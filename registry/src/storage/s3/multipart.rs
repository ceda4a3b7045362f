//! S3 multipart uploads: how streamed blobs and assembled upload sessions reach their keys.

use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::ByteStream as S3Body;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;

use super::bucket::{s3_error, Bucket};
use crate::storage::StorageError;

/// One multipart upload in progress. One part at a time is in flight, sent while the caller
/// gathers the next one, so receiving and sending overlap.
/// S3's part-count limit.
pub(super) const MAX_PARTS: i32 = 10_000;

pub(super) struct Multipart {
    pub(super) key: String,
    pub(super) upload_id: String,
    pub(super) parts: Vec<CompletedPart>,
    pub(super) in_flight: Option<tokio::task::JoinHandle<Result<CompletedPart, StorageError>>>,
}

impl Multipart {
    pub(super) async fn create(s3: &Bucket, key: &str) -> Result<Self, StorageError> {
        let out = s3
            .client
            .create_multipart_upload()
            .bucket(&s3.name)
            .key(key)
            .send()
            .await
            .map_err(|e| s3_error("CreateMultipartUpload", key, e))?;
        let upload_id = out.upload_id().ok_or_else(|| StorageError::S3 {
            op: "CreateMultipartUpload",
            key: key.to_owned(),
            message: "no upload id in the response".into(),
            unavailable: false,
        })?;
        Ok(Multipart {
            key: key.to_owned(),
            upload_id: upload_id.to_owned(),
            parts: Vec::new(),
            in_flight: None,
        })
    }

    fn next_number(&self) -> Result<i32, StorageError> {
        let n = self.parts.len() as i32 + 1;
        if n > MAX_PARTS {
            return Err(StorageError::S3 {
                op: "UploadPart",
                key: self.key.clone(),
                message: "blob exceeds the 10,000-part limit of a multipart upload".into(),
                unavailable: false,
            });
        }
        Ok(n)
    }

    /// Waits for the part in flight, if any.
    async fn settle(&mut self) -> Result<(), StorageError> {
        if let Some(task) = self.in_flight.take() {
            let part = task.await.map_err(|e| StorageError::S3 {
                op: "UploadPart",
                key: self.key.clone(),
                message: e.to_string(),
                unavailable: false,
            })??;
            self.parts.push(part);
        }
        Ok(())
    }

    /// Sends `body` as the next part, once the previous part is done.
    pub(super) async fn upload(&mut self, s3: &Bucket, body: Bytes) -> Result<(), StorageError> {
        self.settle().await?;
        let n = self.next_number()?;
        let request = s3
            .client
            .upload_part()
            .bucket(&s3.name)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .part_number(n)
            .body(S3Body::from(body));
        let key = self.key.clone();
        self.in_flight = Some(tokio::spawn(async move {
            let out = request
                .send()
                .await
                .map_err(|e| s3_error("UploadPart", &key, e))?;
            Ok(CompletedPart::builder()
                .part_number(n)
                .set_e_tag(out.e_tag().map(str::to_owned))
                .build())
        }));
        Ok(())
    }

    pub(super) async fn copy(
        &mut self,
        s3: &Bucket,
        source_key: &str,
        start: u64,
        end: u64,
    ) -> Result<(), StorageError> {
        self.settle().await?;
        let n = self.next_number()?;
        let out = s3
            .client
            .upload_part_copy()
            .bucket(&s3.name)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .part_number(n)
            .copy_source(format!("{}/{source_key}", s3.name))
            .copy_source_range(format!("bytes={start}-{}", end - 1))
            .send()
            .await
            .map_err(|e| s3_error("UploadPartCopy", source_key, e))?;
        let etag = out
            .copy_part_result()
            .and_then(|r| r.e_tag())
            .map(str::to_owned);
        self.parts.push(
            CompletedPart::builder()
                .part_number(n)
                .set_e_tag(etag)
                .build(),
        );
        Ok(())
    }

    pub(super) async fn complete(&mut self, s3: &Bucket) -> Result<(), StorageError> {
        self.settle().await?;
        s3.client
            .complete_multipart_upload()
            .bucket(&s3.name)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(std::mem::take(&mut self.parts)))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| s3_error("CompleteMultipartUpload", &self.key, e))?;
        Ok(())
    }

    /// Best effort: an upload left behind is removed later by [`BlobStore::sweep`].
    pub(super) async fn abort(self, s3: &Bucket) {
        if let Some(task) = &self.in_flight {
            task.abort();
        }
        if let Err(e) = s3
            .client
            .abort_multipart_upload()
            .bucket(&s3.name)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .send()
            .await
        {
            tracing::warn!(key = %self.key, error = %DisplayErrorContext(&e), "could not abort multipart upload");
        }
    }
}
