//! What sealing has learnt about layers: the files each layer blob held, read one way.

use async_trait::async_trait;
use vial_core::Digest;

use super::*;

#[async_trait]
impl SealMeta for SqlMetadataStore {
    async fn sealed_layer(
        &self,
        layer: &Digest,
        reading: &str,
    ) -> Result<Option<String>, StorageError> {
        Ok(sqlx::query_scalar(
            "SELECT files FROM sealed_layers WHERE layer_digest = $1 AND reading = $2",
        )
        .bind(layer.as_str())
        .bind(reading)
        .fetch_optional(&self.reader)
        .await?)
    }

    async fn record_sealed_layer(
        &self,
        layer: &Digest,
        reading: &str,
        files: &str,
    ) -> Result<(), StorageError> {
        sqlx::query(
            "INSERT INTO sealed_layers (layer_digest, reading, files, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (layer_digest, reading) DO NOTHING",
        )
        .bind(layer.as_str())
        .bind(reading)
        .bind(files)
        .bind(now_millis())
        .execute(&self.writer)
        .await?;
        Ok(())
    }
}
