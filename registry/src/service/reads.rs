//! Reading stored bytes: one blob or a range of it, and many chunks end to end (a bulk read).
//! Every read of blob bytes goes through here: the API's blob `GET` and bulk read, the web UI's
//! file view, and a seal reading the layer it cuts.
//!
//! A chunk's location can change under a reader: compaction (docs/gc.md, "Compaction") moves the
//! live chunks of a pack into a new one, and the old pack goes once the grace period since the
//! move has passed. A reader that looked a chunk up before the move and then finds its old pack
//! gone looks it up again and reads it where it is now; one that finds the old pack still there
//! reads the same bytes from it.
//!
//! A bulk read returns blobs in the order asked, which need not be the order they sit in: a
//! version's chunks stay where they were first stored (the packs of earlier pushes, packs cut
//! where the hashing threads paused, blobs another client uploaded whole), and a reader asks in
//! tree order. Small reads that do not follow one another are gathered: a window
//! of them is fetched as a few covering ranges, sorted by where they sit, then cut and sent in
//! the order asked ([`steps`]). On S3 that is a few ranged GETs where it was one per chunk.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt, TryStreamExt};
use vial_core::{Digest, RepoName};

use super::Service;
use crate::storage::{
    failed_stream, read_located, BlobLocation, BlobStore, ByteRange, ByteStream, MetadataStore,
    Source, StorageError,
};

/// Steps of a bulk read being read at once: the one streaming and the next.
const SEGMENTS_AHEAD: usize = 2;
/// A segment shorter than this may be gathered with others ([`steps`]).
const GATHER_BELOW: u64 = 1 << 20;
/// The bytes asked for that one gather covers at most: what it holds in memory, with
/// [`GATHER_SLACK`].
const GATHER_WINDOW: u64 = 4 << 20;
/// Bytes between gathered reads a gather may fetch and drop to save requests: at most three
/// times the window's own bytes, and this much more. A ranged GET's round trip costs about what
/// a megabyte more of its body does.
const GATHER_SLACK: u64 = 2 << 20;
/// Covering ranges of one gather fetched at once: small reads are mostly round trip.
const FETCHES_AT_ONCE: usize = 16;

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

/// How a bulk read reads its segments: one streamed where it is, or small ones gathered.
#[derive(Debug)]
pub(crate) enum Step {
    Stream(Segment),
    Gather(Gather),
}

/// Small segments read as a few covering ranges (`fetches`, each a segment from the first blob
/// of its range) and sent in the order asked: `pieces` are each segment's fetch and its span in
/// that fetch's bytes. `segments` are what is read one by one instead if a fetch finds its pack
/// gone (compaction moved the chunks).
#[derive(Debug)]
pub(crate) struct Gather {
    fetches: Vec<Segment>,
    pieces: Vec<(usize, ByteRange)>,
    segments: Vec<Segment>,
}

/// Groups `segments` ([`plan`]) into steps: a run of small ones is gathered a window at a time
/// (fetched together and sent in the order asked); every other segment streams on its own.
pub(crate) fn steps(segments: Vec<Segment>) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut window: Vec<Segment> = Vec::new();
    let mut asked = 0;
    for segment in segments {
        let len = segment.range.len();
        if len >= GATHER_BELOW {
            gather(std::mem::take(&mut window), &mut steps);
            asked = 0;
            steps.push(Step::Stream(segment));
            continue;
        }
        if asked + len > GATHER_WINDOW {
            gather(std::mem::take(&mut window), &mut steps);
            asked = 0;
        }
        asked += len;
        window.push(segment);
    }
    gather(window, &mut steps);
    steps
}

/// Where a segment's bytes are: its source and the absolute range in it (a blob stored whole is
/// a range of itself).
fn span(segment: &Segment) -> (Source, ByteRange) {
    let (source, offset) = match &segment.location.source {
        Some((source, offset)) => (source.clone(), *offset),
        None => (Source::Blob(segment.digest.clone()), 0),
    };
    let range = ByteRange {
        start: offset + segment.range.start,
        end: offset + segment.range.end,
    };
    (source, range)
}

/// Plans one window of small segments: their ranges sorted by source and offset, touching or
/// overlapping ones joined, then the smallest gaps between them bridged while the bytes fetched
/// stay within four times the window's bytes plus [`GATHER_SLACK`]. The covering ranges are
/// fetched [`FETCHES_AT_ONCE`] at a time, so even blobs stored whole, which join nothing, are
/// read several at once rather than one after another.
fn gather(window: Vec<Segment>, steps: &mut Vec<Step>) {
    if window.len() < 2 {
        steps.extend(window.into_iter().map(Step::Stream));
        return;
    }
    let asked: u64 = window.iter().map(|s| s.range.len()).sum();
    let spans: Vec<(Source, ByteRange)> = window.iter().map(span).collect();
    fn key((source, range): &(Source, ByteRange)) -> ((u8, &str), u64) {
        (source_key(source), range.start)
    }
    let mut order: Vec<usize> = (0..window.len()).collect();
    order.sort_by(|&a, &b| key(&spans[a]).cmp(&key(&spans[b])));
    // Covering ranges in source order: (first segment in it, its span).
    let mut covers: Vec<(usize, &Source, ByteRange)> = Vec::new();
    for &i in &order {
        let (source, range) = &spans[i];
        match covers.last_mut() {
            Some((_, s, cover)) if *s == source && range.start <= cover.end => {
                cover.end = cover.end.max(range.end);
            }
            _ => covers.push((i, source, *range)),
        }
    }
    let mut fetched: u64 = covers.iter().map(|(_, _, r)| r.len()).sum();
    let mut gaps: Vec<(u64, usize)> = covers
        .windows(2)
        .enumerate()
        .filter(|(_, pair)| pair[0].1 == pair[1].1)
        .map(|(k, pair)| (pair[1].2.start - pair[0].2.end, k))
        .collect();
    gaps.sort_unstable();
    let budget = asked.saturating_mul(4).saturating_add(GATHER_SLACK);
    let mut bridged = vec![false; covers.len()];
    for (gap, k) in gaps {
        if fetched + gap > budget {
            break;
        }
        fetched += gap;
        bridged[k] = true;
    }
    let mut joined: Vec<(usize, &Source, ByteRange)> = Vec::new();
    for (k, cover) in covers.iter().enumerate() {
        match joined.last_mut() {
            Some(last) if k > 0 && bridged[k - 1] => last.2.end = cover.2.end,
            _ => joined.push(*cover),
        }
    }
    let fetches: Vec<Segment> = joined
        .iter()
        .map(|&(first, _, range)| {
            let head = &window[first];
            // The head's location puts its range at this offset of the source.
            let base = spans[first].1.start - head.range.start;
            Segment {
                digest: head.digest.clone(),
                location: head.location.clone(),
                range: ByteRange {
                    start: range.start - base,
                    end: range.end - base,
                },
                blobs: Vec::new(),
            }
        })
        .collect();
    let pieces = spans
        .iter()
        .map(|span| {
            // The last covering range that starts at or before this one holds it.
            let at = key(span);
            let f = joined.partition_point(|(_, s, r)| (source_key(s), r.start) <= at) - 1;
            let base = joined[f].2.start;
            let range = ByteRange {
                start: span.1.start - base,
                end: span.1.end - base,
            };
            (f, range)
        })
        .collect();
    steps.push(Step::Gather(Gather {
        fetches,
        pieces,
        segments: window,
    }));
}

/// An order of sources: gathered ranges are sorted by source first.
fn source_key(source: &Source) -> (u8, &str) {
    match source {
        Source::Blob(digest) => (0, digest.as_str()),
        Source::Pack(pack) => (1, pack.as_str()),
    }
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

    /// Streams the blobs of `segments` ([`plan`]) end to end, small ones gathered ([`steps`]):
    /// the next step's read starts while one streams, so on S3 its ranged GET's round trip hides
    /// behind this one's bytes. A segment whose bytes are missing ends the stream with an error
    /// (logged).
    pub(crate) fn read_segments(&self, repo: &RepoName, segments: Vec<Segment>) -> ByteStream {
        let reader = SegmentReader {
            meta: Arc::clone(&self.meta),
            blobs: Arc::clone(&self.blobs),
            repo: repo.clone(),
        };
        let steps = steps(segments);
        tracing::debug!(
            %repo,
            steps = steps.len(),
            gathers = steps.iter().filter(|s| matches!(s, Step::Gather(_))).count(),
            reads = steps.iter().map(|s| match s {
                Step::Stream(_) => 1,
                Step::Gather(g) => g.fetches.len(),
            }).sum::<usize>(),
            "bulk read planned"
        );
        Box::pin(
            futures_util::stream::iter(steps)
                .map(move |step| {
                    let reader = reader.clone();
                    async move {
                        let repo = &reader.repo;
                        let (read, digest) = match &step {
                            Step::Stream(segment) => (reader.read(segment).await, &segment.digest),
                            Step::Gather(g) => (reader.gather(g).await, &g.segments[0].digest),
                        };
                        match read {
                            Ok(Some(stream)) => stream,
                            Ok(None) => {
                                tracing::error!(%repo, %digest, "blob is linked in metadata but missing from the blob store");
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

    /// A gather: its covering ranges fetched into memory, then each segment's bytes cut from them
    /// in the order asked. If a range's pack is gone, its segments are read one by one instead,
    /// each where it is now.
    async fn gather(&self, g: &Gather) -> Result<Option<ByteStream>, StorageError> {
        // Owned, not borrowed: a stream of futures borrowing `g` is not `Send` for every lifetime.
        let fetched: Vec<Option<Bytes>> = futures_util::stream::iter(g.fetches.clone())
            .map(|fetch| {
                let reader = self.clone();
                async move { reader.fetch(&fetch).await }
            })
            .buffered(FETCHES_AT_ONCE)
            .try_collect()
            .await?;
        let Some(fetched) = fetched.into_iter().collect::<Option<Vec<Bytes>>>() else {
            return self.one_by_one(&g.segments).await;
        };
        let pieces: Vec<Result<Bytes, std::io::Error>> = g
            .pieces
            .iter()
            .map(|(f, r)| Ok(fetched[*f].slice(r.start as usize..r.end as usize)))
            .collect();
        Ok(Some(Box::pin(futures_util::stream::iter(pieces))))
    }

    /// One covering range of a gather, whole in memory; `None` if its pack is gone.
    async fn fetch(&self, fetch: &Segment) -> Result<Option<Bytes>, StorageError> {
        let Some(stream) = read_located(
            &*self.blobs,
            &fetch.digest,
            &fetch.location,
            Some(fetch.range),
        )
        .await?
        else {
            return Ok(None);
        };
        let want = fetch.range.len() as usize;
        let failed = |source| StorageError::Io {
            path: format!("a range of the source of {}", fetch.digest),
            source,
        };
        let bytes = stream
            .try_fold(BytesMut::with_capacity(want), |mut all, part| async move {
                all.extend_from_slice(&part);
                Ok(all)
            })
            .await
            .map_err(failed)?;
        if bytes.len() != want {
            return Err(failed(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the stored range ended at {} of {want} bytes", bytes.len()),
            )));
        }
        Ok(Some(bytes.freeze()))
    }

    /// Each of `segments` read on its own ([`SegmentReader::read`]), end to end.
    async fn one_by_one(&self, segments: &[Segment]) -> Result<Option<ByteStream>, StorageError> {
        let mut streams = Vec::with_capacity(segments.len());
        for segment in segments {
            match self.read(segment).await? {
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

    fn small_in(pack: &PackId, offsets: &[(u8, u64, u64)]) -> HashMap<Digest, BlobLocation> {
        offsets
            .iter()
            .map(|&(n, offset, size)| {
                let location = BlobLocation {
                    size,
                    source: Some((Source::Pack(pack.clone()), offset)),
                };
                (d(n), location)
            })
            .collect()
    }

    fn ranges(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|step| match step {
                Step::Stream(s) => format!("stream {}..{}", s.range.start, s.range.end),
                Step::Gather(g) => {
                    let fetches: Vec<String> = g
                        .fetches
                        .iter()
                        .map(|f| {
                            format!(
                                "{}+{}..{}",
                                f.digest.hex()[..4].to_owned(),
                                f.range.start,
                                f.range.end
                            )
                        })
                        .collect();
                    let pieces: Vec<String> = g
                        .pieces
                        .iter()
                        .map(|(f, r)| format!("{f}:{}..{}", r.start, r.end))
                        .collect();
                    format!("gather [{}] [{}]", fetches.join(" "), pieces.join(" "))
                }
            })
            .collect()
    }

    #[test]
    fn small_chunks_asked_out_of_pack_order_are_gathered_from_one_range() {
        let pack = PackId::random();
        // Four chunks back to back at 100.., asked 3, 1, 4, 2 (and 1 again).
        let locations = small_in(
            &pack,
            &[(1, 100, 10), (2, 110, 20), (3, 130, 5), (4, 135, 7)],
        );
        let asked = [d(3), d(1), d(4), d(2), d(1)];
        let steps = steps(plan(&asked, &locations));
        assert_eq!(steps.len(), 1, "{:?}", ranges(&steps));
        let Step::Gather(g) = &steps[0] else {
            panic!("not gathered: {:?}", ranges(&steps))
        };
        // One fetch from the first chunk in the pack, d(1) at 100, covering 100..142.
        assert_eq!(g.fetches.len(), 1);
        assert_eq!(g.fetches[0].digest, d(1));
        assert_eq!((g.fetches[0].range.start, g.fetches[0].range.end), (0, 42));
        let pieces: Vec<(usize, u64, u64)> =
            g.pieces.iter().map(|(f, r)| (*f, r.start, r.end)).collect();
        assert_eq!(
            pieces,
            [
                (0, 30, 35),
                (0, 0, 10),
                (0, 35, 42),
                (0, 10, 30),
                (0, 0, 10)
            ]
        );
    }

    #[test]
    fn far_apart_chunks_and_whole_blobs_are_fetched_apart_and_large_ones_stream() {
        let pack = PackId::random();
        let mut locations = small_in(
            &pack,
            // d(1) and d(2) far apart (one range would fetch 64 MiB for 20 bytes); d(3) large.
            &[(1, 0, 10), (2, 64 << 20, 10), (3, 1000, GATHER_BELOW)],
        );
        let whole = |size| BlobLocation { size, source: None };
        locations.insert(d(4), whole(5));
        locations.insert(d(5), whole(6));
        let asked = [d(2), d(4), d(1), d(3), d(5)];
        let steps = steps(plan(&asked, &locations));
        let short = |n: u8| d(n).hex()[..4].to_owned();
        let (one, two, four) = (short(1), short(2), short(4));
        assert_eq!(
            ranges(&steps),
            [
                // Three reads at once, sent in the order asked: d(2), d(4), d(1).
                format!("gather [{four}+0..5 {one}+0..10 {two}+0..10] [2:0..10 0:0..5 1:0..10]"),
                format!("stream 0..{GATHER_BELOW}"),
                "stream 0..6".to_owned(),
            ]
        );
    }

    #[test]
    fn a_gather_holds_at_most_a_window_of_asked_bytes() {
        let pack = PackId::random();
        // 1,000 chunks of 10 KiB asked in reverse: 10,000 KiB, more than two windows of 4 MiB.
        let size = 10 << 10;
        let mut locations = HashMap::new();
        let mut asked = Vec::new();
        for i in 0..1000u64 {
            let digest = vial_core::Algorithm::Sha256.digest_bytes(&i.to_le_bytes());
            locations.insert(
                digest.clone(),
                BlobLocation {
                    size,
                    source: Some((Source::Pack(pack.clone()), i * size)),
                },
            );
            asked.push(digest);
        }
        asked.reverse();
        let steps = steps(plan(&asked, &locations));
        assert_eq!(steps.len(), 3, "{:?}", ranges(&steps));
        for step in &steps {
            let Step::Gather(g) = step else {
                panic!("not gathered: {:?}", ranges(&steps))
            };
            let asked: u64 = g.segments.iter().map(|s| s.range.len()).sum();
            assert!(asked <= GATHER_WINDOW, "a gather of {asked} bytes");
            assert_eq!(g.fetches.len(), 1, "{:?}", ranges(&steps));
        }
    }
}
