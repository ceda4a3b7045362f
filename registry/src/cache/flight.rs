//! Single-flight fills: however many requests want a digest the cache does not hold, one fetch
//! brings it in, and every one of them streams the bytes as they land in the temporary file, not
//! after the whole blob arrived.
//!
//! One fetch may fill several blobs in a row (a bulk read of chunks from the upstream): a writer
//! on a blocking thread takes the fetched bytes in order, cuts them at the expected sizes, hashes
//! and writes each blob to its own temporary file, publishes how far each has got, and moves each
//! into the store once its digest matched. A blob whose bytes do not match, or whose fetch fails,
//! is never stored; its followers get an error, never the whole of wrong bytes: a follower is
//! handed a blob's last byte only after its digest matched.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use vial_core::Digest;

use super::store::Store;
use crate::storage::ByteStream;

/// How far a fill has got.
#[derive(Debug, Clone)]
pub enum Progress {
    /// Waiting for the source to answer.
    Starting,
    /// This many bytes are in the file.
    Writing(u64),
    /// All `size` bytes are in, verified and stored.
    Done(u64),
    Failed(Failure),
}

#[derive(Debug, Clone)]
pub struct Failure {
    pub message: Arc<str>,
    /// The source says it does not have the blob (rather than being unreachable or broken).
    pub not_found: bool,
}

/// One blob being filled, as its followers see it.
#[derive(Debug)]
pub struct Flight {
    file: Arc<File>,
    progress: watch::Sender<Progress>,
}

impl Flight {
    /// Waits until the source has answered: `Err` when the fill failed before any byte came.
    pub async fn started(&self) -> Result<(), Failure> {
        let mut rx = self.progress.subscribe();
        loop {
            match &*rx.borrow_and_update() {
                Progress::Starting => {}
                Progress::Failed(f) => return Err(f.clone()),
                _ => return Ok(()),
            }
            if rx.changed().await.is_err() {
                return Err(Failure {
                    message: "the fill stopped".into(),
                    not_found: false,
                });
            }
        }
    }

    /// The bytes `start..end` of the blob, each handed out once it is in the file.
    pub fn follow(self: &Arc<Self>, start: u64, end: u64) -> ByteStream {
        let flight = Arc::clone(self);
        let rx = self.progress.subscribe();
        Box::pin(futures_util::stream::unfold(
            (flight, rx, start),
            move |(flight, mut rx, pos)| async move {
                if pos >= end {
                    return None;
                }
                loop {
                    let progress = rx.borrow_and_update().clone();
                    let available = match progress {
                        Progress::Starting => 0,
                        // The byte written last is held back until the digest is checked, so
                        // the blob's last byte goes out only once the whole blob matched: an
                        // answer that reaches its end is never complete with wrong bytes, it is
                        // cut instead. (Its other bytes stream as they land.)
                        Progress::Writing(n) => n.saturating_sub(1),
                        Progress::Done(n) => n,
                        Progress::Failed(f) => {
                            let e = std::io::Error::other(f.message.to_string());
                            return Some((Err(e), (flight, rx, end)));
                        }
                    };
                    if available > pos {
                        let upto = available.min(end).min(pos + READ_PIECE);
                        let read = read_at(Arc::clone(&flight.file), pos, upto).await;
                        let next = match &read {
                            Ok(b) => pos + b.len() as u64,
                            Err(_) => end,
                        };
                        return Some((read, (flight, rx, next)));
                    }
                    if rx.changed().await.is_err() {
                        let e = std::io::Error::other("the fill stopped");
                        return Some((Err(e), (flight, rx, end)));
                    }
                }
            },
        ))
    }
}

/// Largest read handed out at once.
const READ_PIECE: u64 = 512 * 1024;

async fn read_at(file: Arc<File>, start: u64, end: u64) -> std::io::Result<Bytes> {
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; (end - start) as usize];
        file.read_exact_at(&mut buf, start)?;
        Ok(Bytes::from(buf))
    })
    .await
    .map_err(std::io::Error::other)?
}

/// The bytes `start..end` of a stored blob's open file.
pub fn read_stored(file: File, start: u64, end: u64) -> ByteStream {
    let file = Arc::new(file);
    Box::pin(futures_util::stream::unfold(start, move |pos| {
        let file = Arc::clone(&file);
        async move {
            if pos >= end {
                return None;
            }
            let upto = end.min(pos + READ_PIECE);
            match read_at(file, pos, upto).await {
                Ok(b) => Some((Ok(b), upto)),
                Err(e) => Some((Err(e), end)),
            }
        }
    }))
}

/// A blob this request must fill: its flight, and where its bytes go.
#[derive(Debug)]
pub struct Pending {
    pub digest: Digest,
    /// The size the manifests give; `None` only for a lone blob fetched whole.
    pub size: Option<u64>,
    pub flight: Arc<Flight>,
    tmp: PathBuf,
}

impl Pending {
    pub fn new(store: &Store, digest: Digest, size: Option<u64>) -> std::io::Result<Pending> {
        let (tmp, file) = store.temp_file()?;
        let (progress, _) = watch::channel(Progress::Starting);
        Ok(Pending {
            digest,
            size,
            flight: Arc::new(Flight {
                file: Arc::new(file),
                progress,
            }),
            tmp,
        })
    }
}

/// What the fetching task sends the writer.
#[derive(Debug)]
pub enum Feed {
    Bytes(Bytes),
    /// The source ended its answer.
    End,
    /// The source failed.
    Abort(Failure),
}

/// Called with each blob as it is settled: stored (`Ok(size)`) or given up.
pub type Settled = Box<dyn Fn(&Digest, Result<u64, &Failure>) + Send + Sync>;

/// Starts the writer for `blobs`, to be filled in this order from what is fed to the returned
/// sender. Each blob is committed to `store` (as `cold` when kept only for others) once whole
/// and verified.
pub fn spawn_writer(
    store: Arc<Store>,
    blobs: Vec<Pending>,
    cold: bool,
    settled: Settled,
) -> mpsc::Sender<Feed> {
    let (tx, mut rx) = mpsc::channel::<Feed>(8);
    tokio::task::spawn_blocking(move || {
        let mut queue = blobs.into_iter();
        let mut current = None;
        let settle = |w: Writing| {
            let (digest, result) = w.finish(&store, cold);
            if let Err(f) = &result {
                tracing::warn!(%digest, error = %f.message, "a blob fetched for the cache was refused");
            }
            settled(&digest, result.as_ref().map(|s| *s));
        };
        // Moves to the next blob, settling the ones that are whole already (empty blobs).
        let advance = |current: &mut Option<Writing>, queue: &mut std::vec::IntoIter<Pending>| {
            *current = queue.next().map(Writing::new);
            while let Some(w) = current.take_if(|w| w.pending.size == Some(w.written)) {
                settle(w);
                *current = queue.next().map(Writing::new);
            }
        };
        let fail_rest =
            |current: Option<Writing>, queue: std::vec::IntoIter<Pending>, f: Failure| {
                for p in current.map(|w| w.pending).into_iter().chain(queue) {
                    let _ = std::fs::remove_file(&p.tmp);
                    p.flight.progress.send_replace(Progress::Failed(f.clone()));
                    settled(&p.digest, Err(&f));
                }
            };
        advance(&mut current, &mut queue);
        while let Some(feed) = rx.blocking_recv() {
            match feed {
                Feed::Bytes(mut bytes) => {
                    while !bytes.is_empty() {
                        let Some(w) = current.as_mut() else {
                            let f = failure("the source sent more bytes than were asked for");
                            return fail_rest(None, queue, f);
                        };
                        let room = w.pending.size.map_or(u64::MAX, |s| s - w.written);
                        let take = (bytes.len() as u64).min(room) as usize;
                        let piece = bytes.split_to(take);
                        if let Err(e) = w.write(&piece) {
                            let f = failure(&format!("cache write failed: {e}"));
                            return fail_rest(current, queue, f);
                        }
                        if let Some(w) = current.take_if(|w| w.pending.size == Some(w.written)) {
                            settle(w);
                            advance(&mut current, &mut queue);
                        }
                    }
                }
                Feed::End => {
                    // A lone blob of unannounced size ends with the answer; anything else still
                    // waiting was never sent.
                    if let Some(w) = current.take_if(|w| w.pending.size.is_none()) {
                        settle(w);
                        advance(&mut current, &mut queue);
                    }
                    if current.is_some() {
                        let f = failure("the source's answer ended early");
                        return fail_rest(current, queue, f);
                    }
                    return;
                }
                Feed::Abort(f) => return fail_rest(current, queue, f),
            }
        }
        // The fetching task went away without a word.
        fail_rest(current, queue, failure("the fetch was dropped"));
    });
    tx
}

fn failure(message: &str) -> Failure {
    Failure {
        message: message.into(),
        not_found: false,
    }
}

/// One blob being written.
struct Writing {
    pending: Pending,
    written: u64,
    hasher: vial_core::DigestHasher,
}

impl Writing {
    fn new(pending: Pending) -> Writing {
        let hasher = pending.digest.algorithm().hasher();
        Writing {
            pending,
            written: 0,
            hasher,
        }
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.pending.flight.file.write_all_at(bytes, self.written)?;
        self.hasher.update(bytes);
        self.written += bytes.len() as u64;
        self.pending
            .flight
            .progress
            .send_replace(Progress::Writing(self.written));
        Ok(())
    }

    /// Verifies and stores the blob; its followers learn the outcome.
    fn finish(self, store: &Store, cold: bool) -> (Digest, Result<u64, Failure>) {
        let Writing {
            pending,
            written,
            hasher,
        } = self;
        let actual = hasher.finish();
        let result = if actual != pending.digest {
            Err(failure(&format!(
                "the source sent bytes with digest {actual} for {}",
                pending.digest
            )))
        } else {
            store
                .commit(&pending.tmp, &pending.digest, written, cold)
                .map(|()| written)
                .map_err(|e| failure(&format!("cache write failed: {e}")))
        };
        match &result {
            Ok(size) => pending.flight.progress.send_replace(Progress::Done(*size)),
            Err(f) => {
                let _ = std::fs::remove_file(&pending.tmp);
                pending
                    .flight
                    .progress
                    .send_replace(Progress::Failed(f.clone()))
            }
        };
        (pending.digest, result)
    }
}
