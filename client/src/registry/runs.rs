//! Reading chunks in runs: the one way the client reads many chunks, used by pull, copy, and
//! the mount's demand reads, read-ahead and prefetch.
//!
//! A caller cuts the chunks it wants into runs with [`plan_runs`], then reads each run with
//! [`Registry::read_run`]: one bulk read where the registry has vial's extension (docs/format.md
//! "Packs"), a blob request per chunk where it has not, and a plain blob GET for a run of one. The
//! run hands back each chunk as it completes, as the frames it arrived in (no copy). Its bytes are
//! reachable only by verifying it against its digest and size ([`Arrived::verify`]), on
//! whichever thread the caller chooses to hash on.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use vial_core::{Digest, RepoName};
use vial_io::BufferPool;

use super::bulk::ChunkStream;
use super::Registry;
use crate::error::ClientError;

/// How much one bulk read asks for at most. Each reader's limits are here, with what chose them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSize {
    pub bytes: u64,
    pub chunks: usize,
}

impl RunSize {
    /// Pull: small enough that the runs in flight stay well inside the memory budget, large
    /// enough that a request per run costs nothing next to its bytes.
    pub const PULL: RunSize = RunSize {
        bytes: 16 << 20,
        chunks: 2048,
    };
    /// The mount's read-ahead, prefetch and demand reads. Larger runs mean fewer requests (S3
    /// GETs) but less parallelism in receiving and verifying: on the 2-core machine measured,
    /// 16 MiB runs cost the disk-backed cold read 5-15% against a request per chunk; 8 MiB runs
    /// were within the noise of it.
    pub const MOUNT: RunSize = RunSize {
        bytes: 8 << 20,
        chunks: 1024,
    };
    /// Copies between registries, which hold a whole run in memory to send it on as one pack.
    pub const COPY: RunSize = RunSize {
        bytes: 32 << 20,
        chunks: 4096,
    };
}

/// Cuts `items`, in the order given, into runs of at most `limit.bytes` (by `size`) and
/// `limit.chunks`. An item larger than `limit.bytes` is a run of its own.
pub fn plan_runs<T>(
    items: impl IntoIterator<Item = T>,
    size: impl Fn(&T) -> u64,
    limit: RunSize,
) -> Vec<Vec<T>> {
    let mut runs: Vec<Vec<T>> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let len = size(&item);
        match runs.last_mut() {
            Some(run) if bytes + len <= limit.bytes && run.len() < limit.chunks => {
                bytes += len;
                run.push(item);
            }
            _ => {
                bytes = len;
                runs.push(vec![item]);
            }
        }
    }
    runs
}

/// Blob requests one run keeps in flight on a registry without bulk reads.
const ONE_BY_ONE: usize = 4;

/// A chunk a run delivered, not yet checked: the only ways to its bytes verify it first.
#[derive(Debug)]
pub struct Arrived {
    /// Its place in the run.
    pub index: usize,
    digest: Digest,
    size: u64,
    frames: Vec<Bytes>,
}

/// A chunk whose bytes matched its digest and size.
#[derive(Debug)]
pub struct Verified {
    pub index: usize,
    pub digest: Digest,
    /// Its bytes, end to end, as they arrived.
    pub frames: Vec<Bytes>,
}

impl Arrived {
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// The size the run was told it has.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn len(&self) -> u64 {
        self.frames.iter().map(|f| f.len() as u64).sum()
    }

    fn check_size(&self) -> Result<(), ClientError> {
        match self.len() {
            n if n == self.size => Ok(()),
            actual => Err(ClientError::WrongSize {
                digest: self.digest.clone(),
                expected: self.size,
                actual,
            }),
        }
    }

    fn check_digest(&self, actual: Digest) -> Result<(), ClientError> {
        if actual == self.digest {
            return Ok(());
        }
        Err(ClientError::DigestMismatch {
            what: format!("chunk of {} bytes", self.size),
            expected: self.digest.clone(),
            actual,
        })
    }

    /// Hashes the frames where they are.
    pub fn verify(self) -> Result<Verified, ClientError> {
        self.check_size()?;
        let mut hasher = self.digest.algorithm().hasher();
        for f in &self.frames {
            hasher.update(f);
        }
        self.check_digest(hasher.finish())?;
        Ok(Verified {
            index: self.index,
            digest: self.digest,
            frames: self.frames,
        })
    }
}

impl Verified {
    /// The bytes in one buffer (no copy when they arrived in one frame).
    pub fn into_bytes(self) -> Bytes {
        match <[Bytes; 1]>::try_from(self.frames) {
            Ok([one]) => one,
            Err(frames) => frames.concat().into(),
        }
    }
}

/// The chunks of a run as they arrive, in the run's order.
pub struct ChunkRun {
    chunks: Arc<[(Digest, u64)]>,
    source: Source,
    /// The chunk being collected, and the bytes of it that have arrived.
    next: usize,
    frames: Vec<Bytes>,
    have: u64,
    /// What is left of the last frame read.
    frame: Bytes,
    /// Set once the run has failed or ended: it yields nothing more.
    done: bool,
    /// Where chunks are gathered as they arrive, if the reader wants each in one aligned buffer
    /// ([`ChunkRun::gather_into`]), and the one being filled.
    gather: Option<(BufferPool, vial_io::Aligned)>,
}

impl std::fmt::Debug for ChunkRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkRun")
            .field("chunks", &self.chunks.len())
            .field("next", &self.next)
            .field("bulk", &matches!(self.source, Source::Bulk(_)))
            .finish()
    }
}

enum Source {
    /// The chunks end to end in one response.
    Bulk(ChunkStream),
    /// A blob request each, a few in flight, answered in order.
    OneByOne(BoxStream<'static, Result<Bytes, ClientError>>),
}

impl Registry {
    /// Reads `chunks` (digest and size), in one bulk read where the registry has them and one
    /// blob request each where it has not.
    pub async fn read_run(
        &self,
        repo: &RepoName,
        chunks: &[(Digest, u64)],
    ) -> Result<ChunkRun, ClientError> {
        let chunks: Arc<[(Digest, u64)]> = chunks.into();
        let bulk = match chunks.len() {
            0 | 1 => None,
            _ => self.read_chunks(repo, &digests(&chunks)).await?,
        };
        Ok(match bulk {
            Some(stream) => ChunkRun::new(chunks, Source::Bulk(stream)),
            None => self.one_by_one(repo, chunks),
        })
    }

    /// Reads `chunks` in one bulk read; `None` when the registry does not have them, for callers
    /// with a better way than a request per chunk.
    pub async fn read_run_in_bulk(
        &self,
        repo: &RepoName,
        chunks: &[(Digest, u64)],
    ) -> Result<Option<ChunkRun>, ClientError> {
        let chunks: Arc<[(Digest, u64)]> = chunks.into();
        let stream = self.read_chunks(repo, &digests(&chunks)).await?;
        Ok(stream.map(|s| ChunkRun::new(chunks, Source::Bulk(s))))
    }

    /// Reads one chunk: a run of one, a plain blob GET.
    pub async fn read_one(
        &self,
        repo: &RepoName,
        digest: &Digest,
        size: u64,
    ) -> Result<Arrived, ClientError> {
        let bytes = self.get_blob_unverified(repo, digest, None).await?;
        Ok(Arrived {
            index: 0,
            digest: digest.clone(),
            size,
            frames: vec![bytes],
        })
    }

    fn one_by_one(&self, repo: &RepoName, chunks: Arc<[(Digest, u64)]>) -> ChunkRun {
        let (registry, repo) = (self.clone(), repo.clone());
        let list = Arc::clone(&chunks);
        let requests = futures_util::stream::iter(0..list.len())
            .map(move |i| {
                let (registry, repo, list) = (registry.clone(), repo.clone(), Arc::clone(&list));
                async move { registry.get_blob_unverified(&repo, &list[i].0, None).await }
            })
            .buffered(ONE_BY_ONE)
            .boxed();
        ChunkRun::new(chunks, Source::OneByOne(requests))
    }
}

fn digests(chunks: &[(Digest, u64)]) -> Vec<Digest> {
    chunks.iter().map(|(d, _)| d.clone()).collect()
}

impl ChunkRun {
    fn new(chunks: Arc<[(Digest, u64)]>, source: Source) -> ChunkRun {
        ChunkRun {
            chunks,
            source,
            next: 0,
            frames: Vec::new(),
            have: 0,
            frame: Bytes::new(),
            done: false,
            gather: None,
        }
    }

    /// Copies each chunk, as its bytes arrive, into one page-aligned buffer from `buffers`, so that
    /// [`Arrived::verify`] hashes it there and [`Verified::into_bytes`] hands it over without
    /// copying it again. For a reader that
    /// keeps chunks whole (the mount's memory and node cache): the frames a response arrives in
    /// are let go at once, where gathering them later would hold both copies.
    pub fn gather_into(mut self, buffers: BufferPool) -> ChunkRun {
        self.gather = Some((buffers, vial_io::Aligned::default()));
        self
    }

    /// The chunk the run is waiting for, if any.
    pub fn waiting_for(&self) -> Option<&Digest> {
        self.chunks.get(self.next).map(|(d, _)| d)
    }

    /// The next chunk, once all of it has arrived; `None` after the last one, or after an error.
    /// A response with fewer or more bytes than the chunks hold is an error, after the chunks it
    /// did deliver.
    pub async fn next(&mut self) -> Option<Result<Arrived, ClientError>> {
        if self.done {
            return None;
        }
        let r = self.advance().await;
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
        }
        r
    }

    fn take(&mut self) -> Arrived {
        let (digest, size) = self.chunks[self.next].clone();
        if let Some((buffers, buf)) = self.gather.as_mut().filter(|_| self.have > 0) {
            let gathered = buffers.freeze(std::mem::take(buf), 0..self.have as usize);
            self.frames = vec![gathered];
        }
        let arrived = Arrived {
            index: self.next,
            digest,
            size,
            frames: std::mem::take(&mut self.frames),
        };
        (self.next, self.have) = (self.next + 1, 0);
        arrived
    }

    async fn advance(&mut self) -> Option<Result<Arrived, ClientError>> {
        let stream = match &mut self.source {
            Source::OneByOne(requests) => {
                let bytes = requests.next().await?;
                return Some(bytes.map(|b| {
                    self.frames.push(b);
                    self.take()
                }));
            }
            Source::Bulk(stream) => stream,
        };
        loop {
            let Some(&(_, size)) = self.chunks.get(self.next) else {
                // Every chunk is out: the response must end here.
                let extra = self.frame.len() as u64;
                let extra = match extra {
                    0 => match stream.next().await? {
                        Ok(frame) => frame.len() as u64,
                        Err(e) => return Some(Err(e)),
                    },
                    n => n,
                };
                return match extra {
                    0 => None,
                    _ => Some(Err(ClientError::InvalidVolume(format!(
                        "a bulk read of {} chunks returned more bytes than they hold",
                        self.chunks.len()
                    )))),
                };
            };
            // Chunks of zero bytes are complete at once.
            if self.have == size {
                return Some(Ok(self.take()));
            }
            if self.frame.is_empty() {
                match stream.next().await {
                    Some(Ok(frame)) => self.frame = frame,
                    Some(Err(e)) => return Some(Err(e)),
                    None => {
                        return Some(Err(ClientError::InvalidVolume(format!(
                            "a bulk read of {} chunks ended after {}",
                            self.chunks.len(),
                            self.next
                        ))))
                    }
                }
                continue;
            }
            let piece = self
                .frame
                .split_to(((size - self.have) as usize).min(self.frame.len()));
            let at = self.have as usize;
            self.have += piece.len() as u64;
            match &mut self.gather {
                Some((buffers, buf)) => {
                    if at == 0 {
                        *buf = buffers.take(size as usize);
                    }
                    buf.bytes_mut()[at..at + piece.len()].copy_from_slice(&piece);
                }
                None => self.frames.push(piece),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vial_core::Algorithm;

    fn chunk(bytes: &[u8]) -> (Digest, u64) {
        (Algorithm::Sha256.digest_bytes(bytes), bytes.len() as u64)
    }

    fn run(chunks: &[&[u8]], frames: Vec<&'static [u8]>) -> ChunkRun {
        let list: Vec<(Digest, u64)> = chunks.iter().map(|c| chunk(c)).collect();
        let stream = futures_util::stream::iter(
            frames
                .into_iter()
                .map(|f| Ok(Bytes::from_static(f)))
                .collect::<Vec<_>>(),
        )
        .boxed();
        ChunkRun::new(list.into(), Source::Bulk(stream))
    }

    async fn all(mut run: ChunkRun) -> (Vec<Vec<u8>>, Option<String>) {
        let mut out = Vec::new();
        while let Some(r) = run.next().await {
            match r.and_then(Arrived::verify) {
                Ok(v) => out.push(v.into_bytes().to_vec()),
                Err(e) => return (out, Some(e.to_string())),
            }
        }
        (out, None)
    }

    #[tokio::test]
    async fn a_bulk_read_is_split_into_its_chunks_whatever_the_framing() {
        let chunks: [&[u8]; 4] = [b"hello", b"", b"wide world", b"!"];
        for frames in [
            vec![&b"hellowide world!"[..]],
            vec![&b"he"[..], b"llowi", b"de world", b"!"],
            vec![&b"hello"[..], b"", b"wide world!"],
        ] {
            let (got, err) = all(run(&chunks, frames)).await;
            assert_eq!(err, None);
            assert_eq!(got, chunks.iter().map(|c| c.to_vec()).collect::<Vec<_>>());
        }
    }

    #[tokio::test]
    async fn a_short_or_long_bulk_read_fails_after_the_chunks_it_delivered() {
        let chunks: [&[u8]; 2] = [b"hello", b"world"];
        let (got, err) = all(run(&chunks, vec![b"hellowor"])).await;
        assert_eq!(got, vec![b"hello".to_vec()]);
        assert!(err.unwrap().contains("ended after 1"));
        let (got, err) = all(run(&chunks, vec![b"hello", b"world", b"?"])).await;
        assert_eq!(got.len(), 2);
        assert!(err.unwrap().contains("more bytes than they hold"));
    }

    #[tokio::test]
    async fn a_chunk_whose_bytes_do_not_match_is_refused_and_never_handed_out() {
        let good = chunk(b"hello");
        let mut r = ChunkRun::new(
            vec![good.clone(), good].into(),
            Source::Bulk(
                futures_util::stream::iter([Ok(Bytes::from_static(b"hellohellO"))]).boxed(),
            ),
        );
        assert!(r.next().await.unwrap().unwrap().verify().is_ok());
        let bad = r.next().await.unwrap().unwrap();
        match bad.verify() {
            Err(ClientError::DigestMismatch { .. }) => {}
            other => panic!("a corrupt chunk was accepted: {other:?}"),
        }
        assert!(r.next().await.is_none());
    }

    #[tokio::test]
    async fn a_gathering_run_hands_each_chunk_over_in_one_buffer() {
        let pool = BufferPool::new(2);
        let chunks: [&[u8]; 3] = [b"hello", b"", b"wide world"];
        let mut r = run(&chunks, vec![b"he", b"llowi", b"de world"]).gather_into(pool.clone());
        for want in chunks {
            let arrived = r.next().await.unwrap().unwrap();
            assert!(arrived.frames.len() <= 1, "{} frames", arrived.frames.len());
            assert_eq!(&arrived.verify().unwrap().into_bytes()[..], want);
        }
        assert!(r.next().await.is_none());
    }

    #[tokio::test]
    async fn verification_joins_frames_and_checks_the_size() {
        let mut r = run(&[b"hello world"], vec![b"hello", b" wor", b"ld"]);
        let arrived = r.next().await.unwrap().unwrap();
        assert_eq!(arrived.frames.len(), 3);
        assert_eq!(&arrived.verify().unwrap().into_bytes()[..], b"hello world");
        let wrong = Arrived {
            index: 0,
            digest: chunk(b"hello").0,
            size: 5,
            frames: vec![Bytes::from_static(b"hell")],
        };
        assert!(matches!(
            wrong.verify().map(|_| ()),
            Err(ClientError::WrongSize {
                expected: 5,
                actual: 4,
                ..
            })
        ));
    }

    #[test]
    fn runs_keep_order_and_respect_both_limits() {
        let limit = RunSize {
            bytes: 10,
            chunks: 3,
        };
        let runs = plan_runs([4u64, 4, 4, 1, 1, 1, 1, 20, 2], |&n| n, limit);
        assert_eq!(
            runs,
            vec![vec![4, 4], vec![4, 1, 1], vec![1, 1], vec![20], vec![2]]
        );
        assert!(plan_runs(Vec::<u64>::new(), |&n| n, limit).is_empty());
    }
}
