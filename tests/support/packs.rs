//! vial's own chunk API, spoken directly: packs sent with `POST /_vial/packs` and bulk reads
//! with `POST /_vial/chunks`, so a test can lay chunks out in packs in an order of its choosing.

use vial_core::{Algorithm, Digest};

/// Sends `chunks` to `repo` as one pack, in this order; their digests, in the same order.
pub fn send_pack(base: &str, repo: &str, chunks: &[Vec<u8>]) -> Vec<Digest> {
    let digests: Vec<Digest> = chunks
        .iter()
        .map(|c| Algorithm::Sha256.digest_bytes(c))
        .collect();
    let list: Vec<(&Digest, usize)> = digests
        .iter()
        .zip(chunks)
        .map(|(d, c)| (d, c.len()))
        .collect();
    let mut body = serde_json::to_vec(&serde_json::json!({ "chunks": list })).unwrap();
    body.push(b'\n');
    for chunk in chunks {
        body.extend_from_slice(chunk);
    }
    let resp = reqwest::blocking::Client::new()
        .post(format!("{base}/v2/{repo}/_vial/packs"))
        .header("content-type", "application/vnd.vial.pack.v1")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 201, "POST a pack: {}", resp.text().unwrap());
    digests
}

/// The body of a bulk read of `digests` from `repo`, in the order asked.
pub fn bulk_read(base: &str, repo: &str, digests: &[&Digest]) -> Vec<u8> {
    let resp = reqwest::blocking::Client::new()
        .post(format!("{base}/v2/{repo}/_vial/chunks"))
        .json(&serde_json::json!({ "digests": digests }))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200, "bulk read");
    resp.bytes().unwrap().to_vec()
}

/// Chunks that sit in two packs in one order and are asked for in another (a version's chunks
/// stay where they were first stored; a pull asks in tree order), one of them large, one asked
/// twice, and small blobs stored whole among them.
pub struct OutOfPackOrder {
    chunks: Vec<(Digest, Vec<u8>)>,
    order: Vec<usize>,
}

impl OutOfPackOrder {
    /// Sends the two packs to `repo`.
    pub fn send(base: &str, repo: &str) -> OutOfPackOrder {
        let small = |n: u64, seed: u64| -> Vec<Vec<u8>> {
            (0..n)
                .map(|i| super::oci::pseudo_random(1 + ((i * 7919) % 6000) as usize, seed + i))
                .collect()
        };
        let first = small(300, 1_000);
        let mut second = small(100, 5_000);
        // A chunk of 2 MiB in the middle of the second pack: read on its own, between small ones.
        second.insert(50, super::oci::pseudo_random(2 << 20, 9_999));
        let in_first = send_pack(base, repo, &first);
        let in_second = send_pack(base, repo, &second);
        // And 30 blobs uploaded whole, as another client pushes small files.
        let whole = small(30, 8_000);
        let client = reqwest::blocking::Client::new();
        let uploaded: Vec<Digest> = whole
            .iter()
            .map(|bytes| super::push_blob(&client, base, repo, bytes))
            .collect();
        let chunks: Vec<(Digest, Vec<u8>)> = in_first
            .into_iter()
            .zip(first)
            .chain(in_second.into_iter().zip(second))
            .chain(uploaded.into_iter().zip(whole))
            .collect();
        // A fixed shuffle (7 is prime to the 431 blobs): every one once, no chunk beside its
        // pack neighbour, and one asked again.
        let n = chunks.len();
        let mut order: Vec<usize> = (0..n).map(|i| (i * 7) % n).collect();
        order.push(order[3]);
        OutOfPackOrder { chunks, order }
    }

    /// Reads every chunk back in one bulk read, in the shuffled order, and checks each; the
    /// number asked for.
    pub fn read_and_check(&self, base: &str, repo: &str) -> usize {
        let asked: Vec<&Digest> = self.order.iter().map(|&i| &self.chunks[i].0).collect();
        let body = bulk_read(base, repo, &asked);
        let want: usize = self.order.iter().map(|&i| self.chunks[i].1.len()).sum();
        assert_eq!(body.len(), want, "the bulk read's length");
        // Chunk by chunk, so a failure names the first one out of place.
        let mut at = 0;
        for (k, &i) in self.order.iter().enumerate() {
            let chunk = &self.chunks[i].1;
            assert!(
                body[at..at + chunk.len()] == chunk[..],
                "chunk {k} of the bulk read (pack position {i}) came back wrong"
            );
            at += chunk.len();
        }
        self.order.len()
    }
}
