//! Compaction: a pack whose chunks are partly garbage keeps all its bytes until the last one goes,
//! so a pass rewrites the live chunks of the packs most of whose bytes are dead into new packs,
//! and the old packs go (docs/gc.md, "Compaction", argues why no live chunk can be lost).
//!
//! Per group of old packs: their live chunks are read by range (adjacent chunks in one read),
//! checked against their digests as they stream into one new pack (a row first, as for any pack:
//! the janitor finds the bytes of a pass that died here), and one transaction moves every chunk
//! that still lives where it was read from into the new pack. The old packs, empty now, are
//! removed by the collection of packs once the grace period since the move has passed.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;

use super::report::Plan;
use crate::service::{ChunkCheck, Service};
use crate::storage::{
    failed_stream, ByteRange, ByteStream, ChunkMove, PackId, PackUse, StorageError, VerifyFuture,
};
use vial_core::error_chain;

/// The live bytes gathered into one new pack: what `vial push` puts in one.
const PACK_TARGET: u64 = 64 << 20;

/// Packs looked at per pass, the emptiest first.
pub(super) const CANDIDATES: u32 = 100_000;

/// The packs a pass compacts, from those with dead bytes (`live` as the pass will leave it):
/// every one whose dead bytes are at least `threshold` of it, the most dead bytes first, until
/// their live bytes reach `budget` (the pack that reaches it is the last).
pub(super) fn choose(mut packs: Vec<PackUse>, threshold: f64, budget: u64) -> Vec<PackUse> {
    packs.retain(|p| p.live > 0 && p.dead() > 0 && p.dead() as f64 >= threshold * p.size as f64);
    packs.sort_by(|a, b| b.dead().cmp(&a.dead()).then_with(|| a.id.cmp(&b.id)));
    let mut live = 0;
    let mut chosen = Vec::new();
    for p in packs {
        if live >= budget {
            break;
        }
        live += p.live;
        chosen.push(p);
    }
    chosen
}

/// What compacting `packs` means, in sums.
pub(super) fn sum(packs: &[PackUse]) -> Plan {
    Plan {
        packs: packs.len() as u64,
        live: packs.iter().map(|p| p.live).sum(),
        dead: packs.iter().map(PackUse::dead).sum(),
    }
}

/// The threshold as the thousandths the metadata store filters by.
pub(super) fn permille(threshold: f64) -> u32 {
    (threshold.clamp(0.0, 1.0) * 1000.0).floor() as u32
}

/// What compaction would do after a pass that collects `freed` bytes of chunks in these packs:
/// the dry run's answer.
pub(crate) async fn estimate(
    service: &Service,
    before: i64,
    freed: &[(PackId, u64)],
) -> Result<Plan, StorageError> {
    let budget = service.config.gc_compact_bytes;
    if budget == 0 {
        return Ok(Plan::default());
    }
    let freed: HashMap<&PackId, u64> = freed.iter().map(|(p, b)| (p, *b)).collect();
    let mut packs = service
        .meta
        .packs_with_dead_bytes(before, 0, u32::MAX)
        .await?;
    for p in &mut packs {
        p.live = p
            .live
            .saturating_sub(freed.get(&p.id).copied().unwrap_or(0));
    }
    let chosen = choose(packs, service.config.gc_compact_threshold, budget);
    Ok(sum(&chosen))
}

/// The packs a pass compacts now ([`choose`] among those the store finds with dead bytes).
pub(super) async fn chosen(service: &Service, before: i64) -> Result<Vec<PackUse>, StorageError> {
    let (threshold, budget) = (
        service.config.gc_compact_threshold,
        service.config.gc_compact_bytes,
    );
    if budget == 0 {
        return Ok(Vec::new());
    }
    let packs = service
        .meta
        .packs_with_dead_bytes(before, permille(threshold), CANDIDATES)
        .await?;
    Ok(choose(packs, threshold, budget))
}

/// `packs` in groups whose live bytes fill a new pack each.
pub(super) fn groups(packs: Vec<PackUse>) -> Vec<Vec<PackUse>> {
    let mut groups = Vec::new();
    let mut group: Vec<PackUse> = Vec::new();
    for p in packs {
        let full = group.iter().map(|p| p.live).sum::<u64>() + p.live > PACK_TARGET;
        if full && !group.is_empty() {
            groups.push(std::mem::take(&mut group));
        }
        group.push(p);
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

/// Rewrites the live chunks of `group` into one new pack and moves them there. Returns the new
/// pack, the chunks moved and their bytes, and the bytes written; `None` when no chunk was left
/// to move.
pub(super) async fn compact_group(
    service: &Service,
    group: &[PackUse],
) -> Result<Option<(PackId, u64, u64, u64)>, StorageError> {
    let mut moves: Vec<ChunkMove> = Vec::new();
    let mut expected = Vec::new();
    let mut reads: Vec<(PackId, ByteRange)> = Vec::new();
    let mut size = 0;
    for pack in group {
        for chunk in service.meta.pack_chunks(&pack.id).await? {
            // Adjacent live chunks are one ranged read.
            match reads.last_mut() {
                Some((from, range)) if *from == pack.id && range.end == chunk.offset => {
                    range.end += chunk.size
                }
                _ => reads.push((
                    pack.id.clone(),
                    ByteRange {
                        start: chunk.offset,
                        end: chunk.offset + chunk.size,
                    },
                )),
            }
            moves.push(ChunkMove {
                digest: chunk.digest.clone(),
                from: pack.id.clone(),
                from_offset: chunk.offset,
                to_offset: size,
            });
            expected.push((chunk.digest, chunk.size));
            size += chunk.size;
        }
    }
    if moves.is_empty() {
        return Ok(None);
    }
    let to = PackId::random();
    tracing::info!(pack = %to, from = group.len(), chunks = moves.len(), bytes = size, "compacting packs");
    // The row first: if this process dies while the bytes are stored, the janitor finds them.
    service.meta.begin_pack(&to, size).await?;
    let check = ChunkCheck::spawn(expected);
    let verdict = check.verdict;
    let verify: VerifyFuture = Box::pin(async move { matches!(verdict.await, Ok(Ok(()))) });
    let blobs = Arc::clone(&service.blobs);
    let tx = check.tx;
    let body: ByteStream = Box::pin(
        futures_util::stream::iter(reads)
            .then(move |(pack, range)| {
                let blobs = Arc::clone(&blobs);
                async move {
                    match blobs.read_pack(&pack, range).await {
                        Ok(Some(stream)) => stream,
                        Ok(None) => failed_stream(format!("pack {pack} is gone")),
                        Err(e) => failed_stream(error_chain(&e)),
                    }
                }
            })
            .flatten()
            .then(move |item| {
                let tx = tx.clone();
                async move {
                    let bytes = item?;
                    // The checker stops early only on a mismatch, which fails the pack anyway.
                    let _ = tx.send(bytes.clone()).await;
                    Ok(bytes)
                }
            }),
    );
    match service.blobs.put_pack(&to, body, size, verify).await {
        Ok(true) => {}
        Ok(false) => {
            let _ = service.meta.drop_pack(&to).await;
            return Err(StorageError::Corrupt(
                "a chunk read back for compaction did not match its digest".into(),
            ));
        }
        Err(e) => {
            let _ = service.remove_pack(&to).await;
            return Err(e);
        }
    }
    match service.meta.commit_compaction(&to, size, &moves).await {
        Ok((0, _)) => {
            service.remove_pack(&to).await?;
            Ok(None)
        }
        Ok((chunks, moved)) => Ok(Some((to, chunks, moved, size))),
        Err(e) => {
            // Not committed, so nothing names the new pack: take its bytes back.
            let _ = service.remove_pack(&to).await;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(n: u8, size: u64, live: u64) -> PackUse {
        PackUse {
            id: PackId::parse(&format!("{n:032x}")).unwrap(),
            size,
            live,
        }
    }

    #[test]
    fn the_packs_most_dead_bytes_go_first_until_the_budget() {
        let packs = vec![
            pack(1, 100, 95), // 5% dead: under the threshold
            pack(2, 100, 50),
            pack(3, 1000, 600),
            pack(4, 100, 0),   // nothing lives: collection removes it whole
            pack(5, 100, 100), // nothing dead: never rewritten
            pack(6, 100, 80),
        ];
        let ids = |chosen: Vec<PackUse>| -> Vec<u64> {
            chosen
                .iter()
                .map(|p| u64::from_str_radix(p.id.as_str(), 16).unwrap())
                .collect()
        };
        assert_eq!(ids(choose(packs.clone(), 0.1, u64::MAX)), [3, 2, 6]);
        // The budget is reached by the pack that crosses it, which is the last.
        assert_eq!(ids(choose(packs.clone(), 0.1, 600)), [3]);
        assert_eq!(ids(choose(packs.clone(), 0.1, 601)), [3, 2]);
        assert_eq!(ids(choose(packs.clone(), 0.5, u64::MAX)), [2]);
        let plan = sum(&choose(packs, 0.1, u64::MAX));
        assert_eq!(
            plan,
            Plan {
                packs: 3,
                live: 730,
                dead: 470
            }
        );
    }

    #[test]
    fn the_threshold_becomes_thousandths() {
        assert_eq!(permille(0.1), 100);
        assert_eq!(permille(0.0), 0);
        assert_eq!(permille(2.0), 1000);
    }
}
