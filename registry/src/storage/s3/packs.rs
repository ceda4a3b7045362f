//! Packs in S3: one object per pack under `packs/<id>`, written with one streamed PutObject (so a
//! pack of any size costs one PUT request) and read by range.

use aws_sdk_s3::primitives::ByteStream as S3Body;
use bytes::Bytes;
use futures_util::StreamExt;

use super::bucket::{body_stream, is_not_found, s3_error};
use super::S3BlobStore;
use crate::storage::{ByteRange, ByteStream, PackId, StorageError, VerifyFuture};

/// Body frames queued between the request and the PutObject that streams them on.
const PUT_QUEUE: usize = 8;

impl S3BlobStore {
    fn pack_key(&self, id: &PackId) -> String {
        format!("{}packs/{id}", self.prefix)
    }

    pub(super) async fn put_pack_object(
        &self,
        id: &PackId,
        mut body: ByteStream,
        len: u64,
        verify: VerifyFuture,
    ) -> Result<bool, StorageError> {
        let key = self.pack_key(id);
        // The SDK wants a body it can share between threads; a channel's receiver is one.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::io::Error>>(
            PUT_QUEUE,
        );
        let pump = tokio::spawn(async move {
            let mut sent = 0u64;
            while let Some(item) = body.next().await {
                let failed = item.is_err();
                if let Ok(bytes) = &item {
                    sent += bytes.len() as u64;
                }
                if tx.send(item.map(http_body::Frame::data)).await.is_err() || failed {
                    break;
                }
            }
            sent
        });
        let stream =
            http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        // The bytes are verified chunk by chunk as they pass (the pack is committed only if every
        // chunk matched), so no payload hash is computed for signing.
        let put = self
            .s3
            .client
            .put_object()
            .bucket(&self.s3.name)
            .key(&key)
            .content_length(len as i64)
            .body(S3Body::from_body_1_x(stream))
            .customize()
            .disable_payload_signing()
            .send()
            .await;
        let sent = pump.await.unwrap_or(0);
        put.map_err(|e| s3_error("PutObject", &key, e))?;
        if sent != len || !verify.await {
            // Nothing names the pack yet: removing it is all the clean-up there is.
            self.delete_pack_object(id).await?;
            return Ok(false);
        }
        Ok(true)
    }

    pub(super) async fn read_pack_range(
        &self,
        id: &PackId,
        range: ByteRange,
    ) -> Result<Option<ByteStream>, StorageError> {
        if range.is_empty() {
            return Ok(Some(Box::pin(futures_util::stream::empty())));
        }
        let key = self.pack_key(id);
        let out = self
            .s3
            .client
            .get_object()
            .bucket(&self.s3.name)
            .key(&key)
            .range(format!("bytes={}-{}", range.start, range.end - 1))
            .send()
            .await;
        match out {
            Ok(out) => Ok(Some(body_stream(out.body))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(s3_error("GetObject", &key, e)),
        }
    }

    pub(super) async fn delete_pack_object(&self, id: &PackId) -> Result<bool, StorageError> {
        let key = self.pack_key(id);
        if self.head(&key).await?.is_none() {
            return Ok(false);
        }
        self.s3
            .client
            .delete_object()
            .bucket(&self.s3.name)
            .key(&key)
            .send()
            .await
            .map_err(|e| s3_error("DeleteObject", &key, e))?;
        Ok(true)
    }
}
