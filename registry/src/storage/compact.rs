//! What compaction reads and changes in the metadata store (docs/gc.md, "Compaction"): how full
//! each pack is, the chunks that live in one, and the one transaction that moves chunks into a
//! new pack.

use async_trait::async_trait;
use vial_core::Digest;

use super::{PackId, StorageError};

/// A committed pack: its bytes, and the bytes of the chunks that live in it (the rest are dead:
/// chunks collected while others in the pack still live).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackUse {
    pub id: PackId,
    pub size: u64,
    pub live: u64,
}

impl PackUse {
    pub fn dead(&self) -> u64 {
        self.size.saturating_sub(self.live)
    }
}

/// A chunk that lives in a pack, at `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackChunk {
    pub digest: Digest,
    pub size: u64,
    pub offset: u64,
}

/// A chunk compaction copied from `from` (at `from_offset`) to `to_offset` in the new pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkMove {
    pub digest: Digest,
    pub from: PackId,
    pub from_offset: u64,
    pub to_offset: u64,
}

#[async_trait]
pub trait CompactMeta: Send + Sync {
    /// The bytes of the committed packs and of the chunks that live in them, from one row per
    /// pack (`packs.live_bytes`, which triggers keep).
    async fn pack_totals(&self) -> Result<(u64, u64), StorageError>;

    /// Committed packs created (and last compacted) before `before` that some chunk lives in
    /// and whose dead bytes are at least `permille` thousandths of them, most dead bytes first;
    /// at most `limit`. Reads one row per pack.
    async fn packs_with_dead_bytes(
        &self,
        before: i64,
        permille: u32,
        limit: u32,
    ) -> Result<Vec<PackUse>, StorageError>;

    /// The chunks that live in `pack`, in offset order.
    async fn pack_chunks(&self, pack: &PackId) -> Result<Vec<PackChunk>, StorageError>;

    /// Moves into the pack `to` (begun at `size` bytes, whose bytes the blob store holds) every
    /// chunk of `moves` that still lives where it was copied from, commits `to` and records the
    /// move in the packs it left, in one transaction. Returns how many moved and their bytes;
    /// when none did, nothing is committed and `to` is left for the caller to remove.
    async fn commit_compaction(
        &self,
        to: &PackId,
        size: u64,
        moves: &[ChunkMove],
    ) -> Result<(u64, u64), StorageError>;
}
