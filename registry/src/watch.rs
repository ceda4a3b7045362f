//! Tag watches: `GET /v2/<name>/_vial/tags/<tag>?wait=…&since=…` answers the moment a tag points
//! somewhere other than where the client last saw it.
//!
//! Every waiting request holds a receiver of one `tokio::sync::watch` channel per watched tag. One
//! task hears the metadata store's notices of tag moves ([`TagMeta::tag_moves`]: in-process on
//! SQLite, LISTEN/NOTIFY across replicas on PostgreSQL), reads each watched tag that moved once,
//! and sends the answer to every waiter: one metadata read per move, however many wait.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, watch};
use vial_core::{Digest, RepoName, Tag};

use crate::storage::{StorageError, TagMeta, TagMoved};

/// Where a tag points: `None` when it does not exist.
pub(crate) type TagState = Option<Digest>;

type Key = (RepoName, String);

/// The watched tags of this process.
pub(crate) struct TagWatch {
    /// The one part of the metadata store it reads: tags.
    meta: Arc<dyn TagMeta>,
    watched: Mutex<HashMap<Key, watch::Sender<TagState>>>,
    /// Set at shutdown: waiting requests answer at once, so the server can stop.
    closing: watch::Sender<bool>,
    /// Metadata reads after notices of moves (one per watched tag per move).
    reads: AtomicU64,
    /// Moves answered to waiting requests.
    answered: AtomicU64,
}

impl std::fmt::Debug for TagWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TagWatch")
            .field("reads", &self.reads)
            .field("answered", &self.answered)
            .finish_non_exhaustive()
    }
}

impl TagWatch {
    /// Starts hearing tag moves. Call inside the runtime.
    pub(crate) fn start(meta: Arc<dyn TagMeta>) -> Arc<TagWatch> {
        let moves = meta.tag_moves();
        let hub = Arc::new(TagWatch {
            meta,
            watched: Mutex::new(HashMap::new()),
            closing: watch::channel(false).0,
            reads: AtomicU64::new(0),
            answered: AtomicU64::new(0),
        });
        tokio::spawn(Arc::clone(&hub).hear(moves));
        hub
    }

    /// Answers every waiting request now: the server is shutting down.
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Waits until `tag` of `repo` points somewhere other than `since`, or `wait` passes, or the
    /// server shuts down; returns where it points then.
    pub(crate) async fn wait(
        &self,
        repo: &RepoName,
        tag: &Tag,
        since: &TagState,
        wait: std::time::Duration,
    ) -> Result<TagState, StorageError> {
        // Subscribe before reading, so a move between the two is not missed.
        let mut moved = self.subscribe(repo, tag);
        let mut closing = self.closing.subscribe();
        let now = self.meta.tag_target(repo, tag).await?;
        if &now != since || wait.is_zero() || *closing.borrow() {
            return Ok(now);
        }
        let deadline = tokio::time::sleep(wait);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                changed = moved.changed() => {
                    if changed.is_err() {
                        // The hub forgot the tag (it cannot while we hold a receiver): read again.
                        return self.meta.tag_target(repo, tag).await;
                    }
                    let seen = moved.borrow_and_update().clone();
                    if &seen != since {
                        self.answered.fetch_add(1, Ordering::Relaxed);
                        return Ok(seen);
                    }
                }
                () = &mut deadline => return Ok(since.clone()),
                // Nothing moved as far as this request knows; the client asks again elsewhere.
                _ = closing.changed() => return Ok(since.clone()),
            }
        }
    }

    /// Prometheus lines: requests waiting now, reads after moves, moves answered.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        let waiting: usize = self
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|tx| tx.receiver_count())
            .sum();
        out.push_str("# HELP vial_tag_watch_waiting Requests waiting for a tag to move.\n");
        out.push_str("# TYPE vial_tag_watch_waiting gauge\n");
        out.push_str(&format!("vial_tag_watch_waiting {waiting}\n"));
        out.push_str("# HELP vial_tag_watch_reads_total Tag reads after notices of moves: one per watched tag per move, however many wait.\n");
        out.push_str("# TYPE vial_tag_watch_reads_total counter\n");
        out.push_str(&format!(
            "vial_tag_watch_reads_total {}\n",
            self.reads.load(Ordering::Relaxed)
        ));
        out.push_str("# HELP vial_tag_watch_answered_total Waiting requests answered because their tag moved.\n");
        out.push_str("# TYPE vial_tag_watch_answered_total counter\n");
        out.push_str(&format!(
            "vial_tag_watch_answered_total {}\n",
            self.answered.load(Ordering::Relaxed)
        ));
    }

    fn subscribe(&self, repo: &RepoName, tag: &Tag) -> watch::Receiver<TagState> {
        let mut watched = self.watched.lock().unwrap_or_else(|p| p.into_inner());
        // Forget the tags nobody waits on any more.
        watched.retain(|_, tx| tx.receiver_count() > 0);
        let key = (repo.clone(), tag.as_str().to_owned());
        match watched.get(&key) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(None);
                watched.insert(key, tx);
                rx
            }
        }
    }

    /// The tags someone waits on among those a notice names.
    fn waited_on(&self, notice: &TagMoved) -> Vec<(Key, watch::Sender<TagState>)> {
        let watched = self.watched.lock().unwrap_or_else(|p| p.into_inner());
        let wanted = |k: &Key, tx: &watch::Sender<TagState>| {
            tx.receiver_count() > 0
                && match notice {
                    TagMoved::Tag(repo, tag) => k.0 == *repo && k.1 == *tag,
                    TagMoved::Lost => true,
                }
        };
        watched
            .iter()
            .filter(|(k, tx)| wanted(k, tx))
            .map(|(k, tx)| (k.clone(), tx.clone()))
            .collect()
    }

    async fn hear(self: Arc<Self>, mut moves: broadcast::Receiver<TagMoved>) {
        loop {
            let notice = match moves.recv().await {
                Ok(notice) => notice,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(
                        lost = n,
                        "tag watch fell behind the tag moves; reading every watched tag again"
                    );
                    TagMoved::Lost
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            for ((repo, tag), tx) in self.waited_on(&notice) {
                let Ok(parsed) = Tag::parse(&tag) else {
                    continue;
                };
                self.reads.fetch_add(1, Ordering::Relaxed);
                match self.meta.tag_target(&repo, &parsed).await {
                    Ok(target) => {
                        tracing::debug!(%repo, tag, digest = ?target.as_ref().map(Digest::as_str), waiting = tx.receiver_count(), "watched tag moved");
                        tx.send_replace(target);
                    }
                    Err(e) => {
                        tracing::warn!(%repo, tag, error = %vial_core::error_chain(&e), "cannot read a watched tag after it moved; its watchers find out at their timeout")
                    }
                }
            }
        }
    }
}
