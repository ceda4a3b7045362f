//! Checking a pack's bytes against its chunks' digests as they stream past: for packs a client
//! uploads (`POST /_vial/packs`) and for the packs compaction writes.

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use vial_core::Digest;

/// Body frames queued for the chunk hasher of one pack (the bytes are bounded by what the
/// producer holds: a request body's frames, or compaction's reads).
const HASH_QUEUE: usize = 64;

/// Hashes the pack's bytes chunk by chunk on a blocking thread as they pass; says at the end
/// whether every chunk had its digest and the bytes ended exactly after the last one.
pub(crate) struct ChunkCheck {
    pub(crate) tx: mpsc::Sender<Bytes>,
    pub(crate) verdict: oneshot::Receiver<Result<(), String>>,
}

impl ChunkCheck {
    pub(crate) fn spawn(chunks: Vec<(Digest, u64)>) -> ChunkCheck {
        let (tx, mut rx) = mpsc::channel::<Bytes>(HASH_QUEUE);
        let (done, verdict) = oneshot::channel();
        tokio::task::spawn_blocking(move || {
            let mut expected = chunks.into_iter();
            let mut current = expected.next();
            let mut hasher = current.as_ref().map(|(d, _)| d.algorithm().hasher());
            let mut left = current.as_ref().map_or(0, |(_, s)| *s);
            let mut result = Ok(());
            // Chunks of zero bytes end where they start.
            let close = |current: &mut Option<(Digest, u64)>,
                         hasher: &mut Option<vial_core::DigestHasher>,
                         left: &mut u64,
                         expected: &mut std::vec::IntoIter<(Digest, u64)>|
             -> Result<(), String> {
                while let (Some((digest, _)), 0) = (current.as_ref(), *left) {
                    let got = hasher.take().map(|h| h.finish());
                    if got.as_ref() != Some(digest) {
                        return Err(format!(
                            "chunk {digest} of the pack has digest {}",
                            got.map_or_else(|| "?".to_owned(), |d| d.to_string())
                        ));
                    }
                    *current = expected.next();
                    *hasher = current.as_ref().map(|(d, _)| d.algorithm().hasher());
                    *left = current.as_ref().map_or(0, |(_, s)| *s);
                }
                Ok(())
            };
            result =
                result.and_then(|()| close(&mut current, &mut hasher, &mut left, &mut expected));
            while let Some(mut bytes) = rx.blocking_recv() {
                while !bytes.is_empty() && result.is_ok() {
                    let Some(h) = hasher.as_mut() else {
                        result = Err("the pack holds bytes after its last chunk".into());
                        break;
                    };
                    let take = (left as usize).min(bytes.len());
                    h.update(&bytes[..take]);
                    bytes = bytes.slice(take..);
                    left -= take as u64;
                    result = close(&mut current, &mut hasher, &mut left, &mut expected);
                }
            }
            if result.is_ok() {
                if let Some((digest, _)) = current {
                    result = Err(format!("the pack ends before the end of chunk {digest}"));
                }
            }
            let _ = done.send(result);
        });
        ChunkCheck { tx, verdict }
    }
}
