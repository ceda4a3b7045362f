//! In-process state of upload sessions: a lock per session and the running digest of what it holds.
//!
//! The running digest is an optimisation, never a source of truth. It is kept only while it is known
//! to cover exactly the bytes in the blob store; whenever that is in doubt (a failed chunk, a restart,
//! a session continued on another replica) it is dropped and the upload is hashed again from storage
//! when it is finished.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use vial_core::{Algorithm, Digest, DigestHasher};

use crate::metrics::Metrics;
use crate::storage::ByteStream;

/// Body frames queued for the hashing thread of one upload: small, so that many concurrent uploads
/// stay within a few MiB each.
const HASH_QUEUE: usize = 8;

#[derive(Debug)]
pub struct HashState {
    /// Bytes covered by `hasher`.
    pub offset: u64,
    pub hasher: Option<DigestHasher>,
}

#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Arc<tokio::sync::Mutex<HashState>>>>,
}

impl Sessions {
    /// Registers a new, empty session whose uploads will be hashed with `algorithm`.
    pub fn start(&self, id: &str, algorithm: Algorithm) {
        let state = HashState {
            offset: 0,
            hasher: Some(algorithm.hasher()),
        };
        if let Ok(mut map) = self.map.lock() {
            map.insert(id.to_owned(), Arc::new(tokio::sync::Mutex::new(state)));
        }
    }

    /// The session's lock, created without a running digest if this process has not seen it.
    pub fn get(&self, id: &str) -> Arc<tokio::sync::Mutex<HashState>> {
        let fresh = || {
            Arc::new(tokio::sync::Mutex::new(HashState {
                offset: 0,
                hasher: None,
            }))
        };
        match self.map.lock() {
            Ok(mut map) => map.entry(id.to_owned()).or_insert_with(fresh).clone(),
            Err(_) => fresh(),
        }
    }

    pub fn remove(&self, id: &str) {
        if let Ok(mut map) = self.map.lock() {
            map.remove(id);
        }
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
