//! The protocols that store bytes: a blob put whole or streamed, a pack of chunks, an upload
//! session committed or discarded. The module doc of [`super`] gives the order each keeps.

use bytes::Bytes;
use vial_core::{Algorithm, Digest, RepoName};

use super::Service;
use crate::storage::{
    self, ByteStream, PackId, PackedChunk, StorageError, UploadSession, VerifyFuture,
};

impl Service {
    /// Records a blob whose verified bytes the blob store now holds and links it to `repo`.
    pub(crate) async fn commit_stored_blob(
        &self,
        repo: &RepoName,
        digest: &Digest,
        size: u64,
    ) -> Result<(), StorageError> {
        let check = storage::stored_check(&self.blobs, digest);
        self.meta.commit_blob(repo, digest, size, check).await
    }

    /// Stores `bytes`, whose digest the caller has verified, and links the blob to `repo`.
    pub(crate) async fn put_blob(
        &self,
        repo: &RepoName,
        digest: &Digest,
        bytes: Bytes,
    ) -> Result<(), StorageError> {
        let size = bytes.len() as u64;
        self.blobs.put(digest, bytes).await?;
        self.commit_stored_blob(repo, digest, size).await
    }

    /// [`Service::put_blob`] for bytes the registry made itself, which the store may well hold
    /// already: they are written only if it does not.
    pub(crate) async fn ensure_blob(
        &self,
        repo: &RepoName,
        digest: &Digest,
        bytes: Bytes,
    ) -> Result<(), StorageError> {
        if self.blobs.stat(digest).await?.is_some() {
            return self
                .commit_stored_blob(repo, digest, bytes.len() as u64)
                .await;
        }
        self.put_blob(repo, digest, bytes).await
    }

    /// Streams a blob into the store, which publishes it only if `verify` says its digest matched;
    /// then links it to `repo`. `None` when the bytes were not `digest`'s: nothing was kept.
    pub(crate) async fn put_streamed_blob(
        &self,
        repo: &RepoName,
        digest: &Digest,
        body: ByteStream,
        verify: VerifyFuture,
    ) -> Result<Option<u64>, StorageError> {
        let Some(size) = self.blobs.put_streamed(digest, body, verify).await? else {
            return Ok(None);
        };
        self.commit_stored_blob(repo, digest, size).await?;
        Ok(Some(size))
    }

    /// Stores `chunks` (`size` bytes end to end, streamed as `bytes`) as one pack and makes each
    /// chunk a blob of `repo`. `verify` resolves once the bytes have been checked against every
    /// chunk's digest; `None` when it said no, and then nothing was kept.
    pub(crate) async fn store_pack(
        &self,
        repo: &RepoName,
        chunks: &[PackedChunk],
        size: u64,
        bytes: ByteStream,
        verify: VerifyFuture,
    ) -> Result<Option<PackId>, StorageError> {
        let id = PackId::random();
        // The row first: if this process dies while the bytes are stored, the janitor finds them.
        self.meta.begin_pack(&id, size).await?;
        match self.blobs.put_pack(&id, bytes, size, verify).await {
            Ok(true) => {}
            refused_or_failed => {
                // Nothing was published, or nothing that will be named: forget the pack now.
                let _ = self.meta.drop_pack(&id).await;
                return refused_or_failed.map(|_| None);
            }
        }
        if let Err(e) = self.meta.commit_pack(repo, &id, size, chunks).await {
            // Not committed, so nothing names the pack: take its bytes back (the janitor would).
            let _ = self.remove_pack(&id).await;
            return Err(e);
        }
        self.metrics.record_pack(chunks.len() as u64);
        Ok(Some(id))
    }

    /// Removes a pack nothing names: its bytes, then its row (which stays, for the janitor to try
    /// again, if the bytes could not be removed).
    pub(crate) async fn remove_pack(&self, id: &PackId) -> Result<(), StorageError> {
        self.blobs.delete_pack(id).await?;
        self.meta.drop_pack(id).await
    }

    /// Publishes the bytes of upload session `id`, which the caller has verified are `digest`,
    /// links the blob to `repo` and ends the session. Returns the blob's size.
    pub(crate) async fn publish_upload(
        &self,
        repo: &RepoName,
        id: &str,
        digest: &Digest,
    ) -> Result<u64, StorageError> {
        let size = self.blobs.commit_upload(id, digest).await?;
        self.commit_stored_blob(repo, digest, size).await?;
        self.meta.delete_upload(id).await?;
        self.sessions.remove(id);
        Ok(size)
    }

    /// Opens an upload session into `repo` whose bytes will be hashed with `algorithm`, and
    /// returns its id. The row first: if the process dies before the blob store has the session,
    /// the janitor finds the row and cleans up; the other order could leave data no row names.
    pub(crate) async fn open_upload(
        &self,
        repo: &RepoName,
        algorithm: Algorithm,
    ) -> Result<String, StorageError> {
        let id = uuid::Uuid::new_v4().to_string();
        let now = storage::now_millis();
        let session = UploadSession {
            id: id.clone(),
            repository: repo.clone(),
            created_at: now,
            updated_at: now,
        };
        self.meta.create_upload(&session).await?;
        self.blobs.create_upload(&id).await?;
        self.sessions.start(&id, algorithm);
        Ok(id)
    }

    /// Ends upload session `id` without publishing it: its bytes first, then its row. If the
    /// bytes could not be removed, the row and this process's entry for the session stay, and the
    /// janitor tries again.
    pub(crate) async fn discard_upload(&self, id: &str) -> Result<(), StorageError> {
        self.blobs.abort_upload(id).await?;
        self.meta.delete_upload(id).await?;
        self.sessions.remove(id);
        Ok(())
    }
}
