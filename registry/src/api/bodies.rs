//! Request bodies on their way into the stores: the memory budget they are held in ([`hold`]),
//! and the hashing beside the write (the running digest of an upload session is kept in
//! [`crate::service::Sessions`]).

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, Semaphore, SemaphorePermit};
use vial_core::{Algorithm, Digest, DigestHasher};

use crate::metrics::Metrics;
use crate::storage::ByteStream;

/// Body frames queued for the hashing thread of one upload: enough to ride out a pause of the
/// consumers beside it (the disk writer blocks for each direct MiB it writes). What all uploads
/// hold in memory is bounded by [`hold`], not by this.
const HASH_QUEUE: usize = 64;

/// Bytes of request bodies held in memory between the network and their consumers (the hashers,
/// the disk writer, an object store's part buffer), across every upload at once.
const HELD_BYTES: usize = 32 << 20;
/// The budget's unit: one permit of [`HELD`].
const HELD_UNIT: usize = 4096;
static HELD: Semaphore = Semaphore::const_new(HELD_BYTES / HELD_UNIT);

/// Waits until the registry may hold `frame` on top of the request bodies it holds already, and
/// ties that share of [`HELD_BYTES`] to the frame: it is given back when the last clone of the
/// frame is dropped (hashed, and written or copied into a part). Body queues are counted in
/// frames, and a frame is whatever one socket read brought in (about 130 KiB in a push on this
/// machine), so this is what keeps many concurrent uploads' queues within a fixed amount of memory.
///
/// Only for streams whose consumers let go of each frame without waiting for the next one: a
/// consumer that gathered the whole budget of frames before dropping any would wait forever.
pub async fn hold(frame: Bytes) -> Bytes {
    struct Held {
        frame: Bytes,
        _share: SemaphorePermit<'static>,
    }
    impl AsRef<[u8]> for Held {
        fn as_ref(&self) -> &[u8] {
            &self.frame
        }
    }
    // A frame larger than the whole budget waits for all of it.
    let units = frame.len().div_ceil(HELD_UNIT).min(HELD_BYTES / HELD_UNIT) as u32;
    match HELD.acquire_many(units).await {
        Ok(share) => Bytes::from_owner(Held {
            frame,
            _share: share,
        }),
        // Never closed; if it were, the frame would go on unaccounted rather than be lost.
        Err(_) => frame,
    }
}

/// Hashes bytes on a blocking thread as they are fed, so the executor never does SHA work.
pub struct HashPipe {
    tx: mpsc::Sender<Bytes>,
    task: tokio::task::JoinHandle<(DigestHasher, u64)>,
}

impl HashPipe {
    pub fn spawn(mut hasher: DigestHasher) -> Self {
        let (tx, mut rx) = mpsc::channel::<Bytes>(HASH_QUEUE);
        let task = tokio::task::spawn_blocking(move || {
            let mut n = 0u64;
            while let Some(bytes) = rx.blocking_recv() {
                hasher.update(&bytes);
                n += bytes.len() as u64;
            }
            (hasher, n)
        });
        HashPipe { tx, task }
    }

    /// Waits for the hasher to catch up and returns it with the number of bytes it saw.
    pub async fn finish(self) -> Option<(DigestHasher, u64)> {
        drop(self.tx);
        self.task.await.ok()
    }
}

/// Wraps a request body for the blob store: counts bytes, feeds the hasher if any, and turns a body
/// that is longer or shorter than `expected_len` into an error so a bad chunk is rolled back.
pub fn tee_body(
    body: axum::body::Body,
    hasher: Option<&HashPipe>,
    expected_len: Option<u64>,
    metrics: Arc<Metrics>,
) -> ByteStream {
    struct St {
        body: axum::body::BodyDataStream,
        tx: Option<mpsc::Sender<Bytes>>,
        seen: u64,
        expected: Option<u64>,
        done: bool,
        metrics: Arc<Metrics>,
    }
    let st = St {
        body: body.into_data_stream(),
        tx: hasher.map(|h| h.tx.clone()),
        seen: 0,
        expected: expected_len,
        done: false,
        metrics,
    };
    Box::pin(futures_util::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        match st.body.next().await {
            Some(Ok(bytes)) => {
                let bytes = hold(bytes).await;
                st.seen += bytes.len() as u64;
                st.metrics.add_bytes_in(bytes.len() as u64);
                if st.expected.is_some_and(|e| st.seen > e) {
                    st.done = true;
                    return Some((Err(length_error(st.expected, st.seen)), st));
                }
                if let Some(tx) = &st.tx {
                    if tx.send(bytes.clone()).await.is_err() {
                        st.tx = None;
                    }
                }
                Some((Ok(bytes), st))
            }
            Some(Err(e)) => {
                st.done = true;
                Some((Err(std::io::Error::other(e)), st))
            }
            None => {
                st.done = true;
                match st.expected {
                    Some(e) if e != st.seen => Some((Err(length_error(st.expected, st.seen)), st)),
                    _ => None,
                }
            }
        }
    }))
}

fn length_error(expected: Option<u64>, seen: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("body length {seen} does not match the declared {expected:?}"),
    )
}

/// Hashes a whole stream off the executor: used when the running digest was lost.
pub async fn hash_stream(mut stream: ByteStream, algorithm: Algorithm) -> std::io::Result<Digest> {
    let pipe = HashPipe::spawn(algorithm.hasher());
    while let Some(chunk) = stream.next().await {
        if pipe.tx.send(chunk?).await.is_err() {
            break;
        }
    }
    pipe.finish()
        .await
        .map(|(h, _)| h.finish())
        .ok_or_else(|| std::io::Error::other("hashing task failed"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    /// A frame waits while the budget is spent and goes on, unchanged, once a held frame (every
    /// clone of it) is dropped.
    #[tokio::test]
    async fn held_frames_wait_for_the_budget_and_give_it_back_when_dropped() {
        let whole = hold(Bytes::from(vec![7u8; HELD_BYTES])).await;
        let clone = whole.clone();
        let mut next = Box::pin(hold(Bytes::from_static(b"next frame")));
        assert!(
            next.as_mut().now_or_never().is_none(),
            "the budget is spent"
        );
        drop(whole);
        assert!(
            next.as_mut().now_or_never().is_none(),
            "a clone still holds it"
        );
        assert_eq!(clone.len(), HELD_BYTES);
        assert!(clone.iter().all(|&b| b == 7));
        drop(clone);
        assert_eq!(&next.await[..], b"next frame");
    }
}
