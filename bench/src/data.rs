//! Benchmark payloads: distinct xorshift pseudo-random blobs whose sha256 digests are computed before
//! any timing starts, and the shared body that many clients push at once with distinct endings.

use std::num::NonZeroUsize;

use bytes::Bytes;
use vial_core::{Algorithm, DigestHasher};

/// One blob held in memory, with its digest (`sha256:hex`).
#[derive(Clone, Debug)]
pub struct Blob {
    pub data: Bytes,
    pub digest: String,
}

impl Blob {
    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }
}

/// splitmix64, to turn small seeds into well-spread, non-zero xorshift states.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}

/// Fills `buf` with xorshift64 output (never all zeros: the state is never zero).
pub fn xorshift_fill(buf: &mut [u8], seed: u64) {
    let mut x = splitmix(seed);
    let mut chunks = buf.chunks_exact_mut(8);
    for chunk in &mut chunks {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let tail = x.to_le_bytes();
    rest.copy_from_slice(&tail[..rest.len()]);
}

fn make_blob(seed: u64, size: usize) -> Blob {
    let mut data = vec![0u8; size];
    xorshift_fill(&mut data, seed);
    let digest = Algorithm::Sha256.digest_bytes(&data).to_string();
    Blob {
        data: Bytes::from(data),
        digest,
    }
}

/// `count` distinct blobs of `size` bytes, generated and hashed on all cores. `class` keeps the
/// blobs of different size classes distinct from each other.
pub fn make_blobs(class: u64, size: usize, count: usize) -> Vec<Blob> {
    let threads = std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .clamp(1, count.max(1));
    let per_thread = count.div_ceil(threads).max(1);
    let mut out: Vec<Option<Blob>> = vec![None; count];
    std::thread::scope(|scope| {
        for (t, slots) in out.chunks_mut(per_thread).enumerate() {
            scope.spawn(move || {
                for (j, slot) in slots.iter_mut().enumerate() {
                    let index = (t * per_thread + j) as u64;
                    *slot = Some(make_blob((class << 32) | index, size));
                }
            });
        }
    });
    out.into_iter().flatten().collect()
}

/// A body of `head.len() + 8` bytes that many clients push at once: every client streams the same
/// shared `head` (no per-client copy) and ends with its own 8 bytes, so the digests differ. The
/// distinct bytes go at the end rather than the front so `head` is hashed once and each client's
/// digest only costs hashing 8 more bytes from a cloned hasher state.
#[derive(Debug)]
pub struct SharedBody {
    head: Bytes,
    state: DigestHasher,
}

impl SharedBody {
    pub fn new(head: Bytes) -> Self {
        let mut state = Algorithm::Sha256.hasher();
        state.update(&head);
        SharedBody { head, state }
    }

    pub fn len(&self) -> u64 {
        self.head.len() as u64 + 8
    }

    /// The distinct ending of client `i`.
    pub fn suffix(i: usize) -> [u8; 8] {
        let mut s = *b"rss\0\0\0\0\0";
        s[4..].copy_from_slice(&(i as u32).to_be_bytes());
        s
    }

    pub fn digest(&self, suffix: &[u8; 8]) -> String {
        let mut h = self.state.clone();
        h.update(suffix);
        h.finish().to_string()
    }

    /// A streamed request body: `head` in 1 MiB zero-copy slices, then the suffix.
    pub fn body(&self, suffix: [u8; 8]) -> reqwest::Body {
        const CHUNK: usize = 1 << 20;
        let head = self.head.clone();
        let n = head.len();
        let chunks = (0..n.div_ceil(CHUNK))
            .map(move |i| head.slice(i * CHUNK..((i + 1) * CHUNK).min(n)))
            .chain(std::iter::once(Bytes::copy_from_slice(&suffix)))
            .map(Ok::<Bytes, std::io::Error>);
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_distinct_and_not_zero() {
        let blobs = make_blobs(1, 1000, 5);
        assert_eq!(blobs.len(), 5);
        for (i, a) in blobs.iter().enumerate() {
            assert_eq!(a.data.len(), 1000);
            assert!(a.data.iter().any(|&b| b != 0));
            assert_eq!(
                a.digest,
                Algorithm::Sha256.digest_bytes(&a.data).to_string()
            );
            for b in &blobs[i + 1..] {
                assert_ne!(a.digest, b.digest);
            }
        }
    }

    #[test]
    fn shared_body_digest_matches_its_bytes() {
        let head = make_blobs(2, 3000, 1).remove(0).data;
        let shared = SharedBody::new(head.clone());
        let suffix = SharedBody::suffix(7);
        let mut whole = head.to_vec();
        whole.extend_from_slice(&suffix);
        assert_eq!(
            shared.digest(&suffix),
            Algorithm::Sha256.digest_bytes(&whole).to_string()
        );
        assert_ne!(
            shared.digest(&suffix),
            shared.digest(&SharedBody::suffix(8))
        );
    }
}
