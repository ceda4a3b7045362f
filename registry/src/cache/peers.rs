//! Cache replicas side by side (`--peers`): every digest has one owner among them, chosen by
//! rendezvous hashing over the same list on every replica, so the upstream sends each blob to one
//! replica and the others get it from that one at local network speed.
//!
//! A replica asked for a digest it does not own fetches it from the owner, sending the request on
//! with the client's own credentials and a `vial-cache-hop` header naming itself; a request that
//! carries the header is served from the disk or the upstream, never sent on again, so nothing
//! loops. A peer that does not answer is skipped for the next one in the digest's order, and
//! past the list the upstream is asked: clients never see a peer's failure. A replica learns which
//! entry of the list is itself by asking each for its instance id (`GET /_vial/cache/id`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use vial_core::{Algorithm, Digest, RepoName};

/// The header a replica sends on a request it passes to the owner: its instance id.
pub const HOP_HEADER: &str = "vial-cache-hop";

const UNKNOWN: usize = usize::MAX;

#[derive(Debug)]
pub struct Peers {
    urls: Vec<String>,
    /// This replica's entry in `urls`, once known.
    me: AtomicUsize,
    /// A random id of this process, answered at `/_vial/cache/id`.
    pub instance: String,
    http: reqwest::Client,
}

impl Peers {
    pub fn new(urls: &[String]) -> Result<Peers, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(vial_client::IDLE_CONNECTION)
            .build()
            .map_err(|e| format!("peer client: {e}"))?;
        Ok(Peers {
            urls: urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect(),
            me: AtomicUsize::new(UNKNOWN),
            instance: uuid::Uuid::new_v4().to_string(),
            http,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    pub fn url(&self, peer: usize) -> &str {
        &self.urls[peer]
    }

    /// The peers to ask for `digest` before the upstream: the replicas in the digest's
    /// rendezvous order, up to this replica (which asks the upstream itself).
    pub fn route(&self, digest: &Digest) -> Vec<usize> {
        let mut order: Vec<(u64, usize)> = self
            .urls
            .iter()
            .enumerate()
            .map(|(i, url)| (score(url, digest), i))
            .collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        let me = self.me.load(Ordering::Relaxed);
        order
            .into_iter()
            .map(|(_, i)| i)
            .take_while(|i| *i != me)
            .collect()
    }

    /// Learns which entry of the list this replica is, asking each entry for its instance id
    /// until one answers with ours (the listener may not be up for the first tries).
    pub async fn find_myself(&self) {
        for _ in 0..60 {
            for (i, url) in self.urls.iter().enumerate() {
                let answer = self
                    .http
                    .get(format!("{url}/_vial/cache/id"))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await;
                if let Ok(r) = answer {
                    if r.text().await.is_ok_and(|id| id.trim() == self.instance) {
                        self.me.store(i, Ordering::Relaxed);
                        tracing::info!(peer = %url, "this cache replica found itself among its peers");
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        tracing::warn!(peers = ?self.urls, "this cache replica is not among its --peers: every digest goes to the peers first");
    }

    /// Records that `peer` is this replica (it answered a hop with our own id).
    pub fn is_me(&self, peer: usize) {
        self.me.store(peer, Ordering::Relaxed);
    }

    /// Asks `peer` for `digests` of `repo`, end to end: one blob download, or one bulk read.
    pub async fn fetch(
        &self,
        peer: usize,
        repo: &RepoName,
        digests: &[Digest],
        authorization: Option<&str>,
    ) -> Result<impl Stream<Item = Result<Bytes, String>>, PeerError> {
        let url = &self.urls[peer];
        let request = match digests {
            [one] => self.http.get(format!("{url}/v2/{repo}/blobs/{one}")),
            many => self
                .http
                .post(format!("{url}/v2/{repo}/_vial/chunks"))
                .header("content-type", "application/json")
                .body(serde_json::json!({ "digests": many }).to_string()),
        };
        let request = request.header(HOP_HEADER, &self.instance);
        let request = match authorization {
            Some(a) => request.header("authorization", a),
            None => request,
        };
        let r = request
            .send()
            .await
            .map_err(|e| PeerError::Unreachable(e.to_string()))?;
        match r.status().as_u16() {
            200 => Ok(r.bytes_stream().map(|b| b.map_err(|e| e.to_string()))),
            508 => Err(PeerError::Myself),
            s => Err(PeerError::Unreachable(format!("answered {s}"))),
        }
    }
}

#[derive(Debug)]
pub enum PeerError {
    /// The peer is this replica.
    Myself,
    Unreachable(String),
}

/// The rendezvous score of `digest` on the replica at `url`: the replica with the highest owns it.
fn score(url: &str, digest: &Digest) -> u64 {
    let mut hasher = Algorithm::Sha256.hasher();
    hasher.update(url.as_bytes());
    hasher.update(b"\n");
    hasher.update(digest.as_str().as_bytes());
    let hex = hasher.finish().hex().to_owned();
    u64::from_str_radix(&hex[..16], 16).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_replica_agrees_on_owners_and_they_spread_evenly() {
        let urls: Vec<String> = (0..4).map(|i| format!("http://cache-{i}:5000")).collect();
        let peers = Peers::new(&urls).unwrap();
        let mut owned = [0usize; 4];
        for n in 0..4000u32 {
            let digest = Algorithm::Sha256.digest_bytes(&n.to_le_bytes());
            let route = peers.route(&digest);
            assert_eq!(
                route.len(),
                4,
                "with itself unknown, a replica may ask every peer"
            );
            owned[route[0]] += 1;
        }
        for n in owned {
            assert!((800..1200).contains(&n), "owners spread evenly: {owned:?}");
        }
        // Replica 2 asks only the peers ranked above itself, then the upstream.
        peers.is_me(2);
        for n in 0..100u32 {
            let digest = Algorithm::Sha256.digest_bytes(&n.to_le_bytes());
            let route = peers.route(&digest);
            assert!(!route.contains(&2));
            let full = Peers::new(&urls).unwrap().route(&digest);
            assert_eq!(route, full[..full.iter().position(|i| *i == 2).unwrap()]);
        }
    }
}
