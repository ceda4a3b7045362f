//! How one replica hears the tag moves of every other on PostgreSQL: a LISTEN connection on the
//! channel each move NOTIFYs in its transaction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use vial_core::RepoName;

use crate::storage::metadata::TagMoved;

/// The PostgreSQL channel that carries tag moves between replicas: `repository tag` per notice.
pub(super) const TAG_MOVES_CHANNEL: &str = "vial_tag_moves";

/// Hears the tag moves of every replica on PostgreSQL: one connection that LISTENs on
/// [`TAG_MOVES_CHANNEL`], started by the first [`TagMeta::tag_moves`] and closed once nobody
/// watches. Each (re)connection is followed by [`TagMoved::Lost`], since moves made while it was
/// not listening were not heard.
pub(super) struct Listener {
    url: String,
    running: AtomicBool,
}

impl std::fmt::Debug for Listener {
    // The URL may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("running", &self.running)
            .finish_non_exhaustive()
    }
}

/// How often an idle listener checks whether anyone still watches.
const LISTENER_IDLE_CHECK: Duration = Duration::from_secs(30);

impl Listener {
    pub(super) fn new(url: &str) -> Listener {
        Listener {
            url: url.to_owned(),
            running: AtomicBool::new(false),
        }
    }

    pub(super) fn start(self: &Arc<Self>, moves: broadcast::Sender<TagMoved>) {
        if self.running.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.running.store(false, Ordering::SeqCst);
            tracing::warn!("tag moves of other replicas cannot be heard outside a runtime");
            return;
        };
        let me = Arc::clone(self);
        runtime.spawn(async move {
            me.listen(&moves).await;
            me.running.store(false, Ordering::SeqCst);
        });
    }

    async fn listen(&self, moves: &broadcast::Sender<TagMoved>) {
        let mut delay = Duration::from_millis(100);
        let mut failing = false;
        while moves.receiver_count() > 0 {
            let connected = async {
                let mut l = sqlx::postgres::PgListener::connect(&self.url).await?;
                l.listen(TAG_MOVES_CHANNEL).await?;
                Ok::<_, sqlx::Error>(l)
            }
            .await;
            let mut l = match connected {
                Ok(l) => l,
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %vial_core::error_chain(&e), "cannot listen for tag moves of other replicas; retrying");
                        failing = true;
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            if failing {
                tracing::info!("listening for tag moves of other replicas again");
            }
            (failing, delay) = (false, Duration::from_millis(100));
            let _ = moves.send(TagMoved::Lost);
            loop {
                match tokio::time::timeout(LISTENER_IDLE_CHECK, l.try_recv()).await {
                    Err(_) if moves.receiver_count() == 0 => return,
                    Err(_) => {}
                    Ok(Ok(Some(notice))) => {
                        let parsed = notice
                            .payload()
                            .split_once(' ')
                            .and_then(|(r, t)| Some((RepoName::parse(r).ok()?, t.to_owned())));
                        match parsed {
                            Some((repo, tag)) => {
                                let _ = moves.send(TagMoved::Tag(repo, tag));
                            }
                            None => tracing::warn!(
                                payload = notice.payload(),
                                "unreadable tag move notice"
                            ),
                        }
                    }
                    // The connection dropped: connect and LISTEN again, then say what may be lost.
                    Ok(Ok(None)) => break,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %vial_core::error_chain(&e), "lost the connection that hears tag moves; reconnecting");
                        break;
                    }
                }
            }
        }
    }
}
