//! Reading stored bytes: one blob or a range of it, and many chunks end to end (a bulk read).
//! Every read of blob bytes goes through here: the API's blob `GET` and bulk read, the web UI's
//! file view, and a seal reading the layer it cuts.
//!
//! A chunk's location can change under a reader: compaction (docs/gc.md, "Compaction") moves the
//! live chunks of a pack into a new one, and the old pack goes once the grace period since the
//! move has passed. A reader that looked a chunk up before the move and then finds its old pack
//! gone looks it up again and reads it where it is now; one that finds the old pack still there
//! reads the same bytes from it.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use vial_core::{Digest, RepoName};

use super::Service;
use crate::storage::{
    failed_stream, read_located, BlobLocation, BlobStore, ByteRange, ByteStream, MetadataStore,
    Source, StorageError,
};

/// Segments of a bulk read being read at once: the one streaming and the next.
const SEGMENTS_AHEAD: usize = 2;

/// One read of a bulk read: a blob, or adjacent chunks of one pack or source blob merged.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    /// The first blob it covers (for a blob stored whole, the object itself).
    digest: Digest,
    location: BlobLocation,
    range: ByteRange,
    /// Every blob it covers, in order, with its size: what is looked up again if its bytes
    /// moved.
    blobs: Vec<(Digest, u64)>,
}

/// Reads of the blobs in order, adjacent ranges of one pack or blob merged into one.
pub(crate) fn plan(digests: &[Digest], locations: &HashMap<Digest, BlobLocation>) -> Vec<Segment> {
    let mut segments: Vec<Segment> = Vec::new();
    for digest in digests {
        let Some(location) = locations.get(digest) else {
            continue;
        };
        if let (Some(last), Some((source, offset))) = (segments.last_mut(), &location.source) {
            if let Some((last_source, last_offset)) = &last.location.source {
                if last_source == source && last_offset + last.range.end == *offset {
                    last.range.end += location.size;
                    last.blobs.push((digest.clone(), location.size));
                    continue;
                }
            }
        }
        segments.push(Segment {
            digest: digest.clone(),
            location: location.clone(),
            range: ByteRange {
                start: 0,
                end: location.size,
            },
            blobs: vec![(digest.clone(), location.size)],
        });
    }
    segments
}

/// Whether a location is in a pack, where compaction may have moved it from.
fn in_pack(location: &BlobLocation) -> bool {
    matches!(location.source, Some((Source::Pack(_), _)))
}

impl Service {
    /// Streams blob `digest` of `repo` (or a range of it), found at `location`. `None` when its
    /// bytes are not in the blob store (a storage fault: the metadata says they are).
    pub(crate) async fn read_blob(
        &self,
        repo: &RepoName,
        digest: &Digest,
        location: &BlobLocation,
        range: Option<ByteRange>,
    ) -> Result<Option<ByteStream>, StorageError> {
        if let Some(stream) = read_located(&*self.blobs, digest, location, range).await? {
            return Ok(Some(stream));
        }
        if !in_pack(location) {
            return Ok(None);
        }
        match self.meta.blob_location(repo, digest).await? {
            Some(moved) if moved != *location => {
                tracing::debug!(%repo, %digest, "chunk moved while it was read; reading it where it is now");
                read_located(&*self.blobs, digest, &moved, range).await
            }
            _ => Ok(None),
        }
    }

    /// Streams the blobs of `segments` ([`plan`]) end to end: the next segment's read starts
    /// while one streams, so on S3 its ranged GET's round trip hides behind this one's bytes. A
    /// segment whose bytes are missing ends the stream with an error (logged).
    pub(crate) fn read_segments(&self, repo: &RepoName, segments: Vec<Segment>) -> ByteStream {
        let reader = SegmentReader {
            meta: Arc::clone(&self.meta),
            blobs: Arc::clone(&self.blobs),
            repo: repo.clone(),
        };
        Box::pin(
            futures_util::stream::iter(segments)
                .map(move |segment| {
                    let reader = reader.clone();
                    async move {
                        let repo = &reader.repo;
                        match reader.read(&segment).await {
                            Ok(Some(stream)) => stream,
                            Ok(None) => {
                                tracing::error!(%repo, digest = %segment.digest, "blob is linked in metadata but missing from the blob store");
                                failed_stream("a blob's bytes are missing")
                            }
                            Err(e) => {
                                tracing::error!(%repo, error = %vial_core::error_chain(&e), "bulk read failed");
                                failed_stream("storage failure")
                            }
                        }
                    }
                })
                .buffered(SEGMENTS_AHEAD)
                .flatten(),
        )
    }
}

/// What a bulk read's stream holds on to: the stores, and whose blobs it reads.
#[derive(Clone)]
struct SegmentReader {
    meta: Arc<dyn MetadataStore>,
    blobs: Arc<dyn BlobStore>,
    repo: RepoName,
}

impl SegmentReader {
    /// One segment: read where it was planned, or, if its pack is gone, each of its blobs again
    /// where it is now.
    async fn read(&self, segment: &Segment) -> Result<Option<ByteStream>, StorageError> {
        let read = read_located(
            &*self.blobs,
            &segment.digest,
            &segment.location,
            Some(segment.range),
        )
        .await?;
        if read.is_some() || !in_pack(&segment.location) {
            return Ok(read);
        }
        let digests: Vec<Digest> = segment.blobs.iter().map(|(d, _)| d.clone()).collect();
        let locations = self.meta.blob_locations(&self.repo, &digests).await?;
        let again = plan(&digests, &locations);
        let covered: u64 = again.iter().map(|s| s.range.len()).sum();
        if covered != segment.range.len() {
            return Ok(None);
        }
        tracing::debug!(repo = %self.repo, blobs = digests.len(), "chunks moved while they were read; reading them where they are now");
        let mut streams = Vec::with_capacity(again.len());
        for s in &again {
            match read_located(&*self.blobs, &s.digest, &s.location, Some(s.range)).await? {
                Some(stream) => streams.push(stream),
                None => return Ok(None),
            }
        }
        Ok(Some(Box::pin(
            futures_util::stream::iter(streams).flatten(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{PackId, Source};

    fn d(n: u8) -> Digest {
        vial_core::Algorithm::Sha256.digest_bytes(&[n])
    }

    #[test]
    fn adjacent_ranges_of_one_pack_are_read_together() {
        let pack = PackId::random();
        let other = PackId::random();
        let at = |source: &PackId, offset: u64, size: u64| BlobLocation {
            size,
            source: Some((Source::Pack(source.clone()), offset)),
        };
        let locations = std::collections::HashMap::from([
            (d(1), at(&pack, 0, 10)),
            (d(2), at(&pack, 10, 5)),
            (d(3), at(&pack, 30, 5)),
            (d(4), at(&other, 35, 5)),
            (
                d(5),
                BlobLocation {
                    size: 7,
                    source: None,
                },
            ),
        ]);
        let segments = plan(&[d(1), d(2), d(3), d(4), d(5)], &locations);
        let ranges: Vec<(u64, u64)> = segments
            .iter()
            .map(|s| (s.range.start, s.range.end))
            .collect();
        assert_eq!(ranges, [(0, 15), (0, 5), (0, 5), (0, 7)]);
        assert_eq!(segments[0].digest, d(1));
        // Asked in another order, nothing merges: bytes come back in the order asked.
        assert_eq!(plan(&[d(2), d(1)], &locations).len(), 2);
    }
}
