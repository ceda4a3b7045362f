//! The lease a mount holds on its version, so that `vial rm` of a version some node has mounted
//! warns first. Taken at mount, renewed while the mount lives, dropped at unmount; a node that
//! dies simply stops renewing and the lease lapses.

use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use vial_client::Registry;
use vial_core::{Digest, RepoName};

/// How long each renewal holds the lease.
const TTL: Duration = Duration::from_secs(180);
/// How often it is renewed: well inside the TTL, so one failed renewal does not lapse it.
const RENEW_EVERY: Duration = Duration::from_secs(60);
/// How long a mount waits for its first lease before it reports ready anyway.
const FIRST_WAIT: Duration = Duration::from_secs(10);

/// Keeps a lease renewed until [`LeaseKeeper::release`].
#[derive(Debug)]
pub struct LeaseKeeper {
    task: JoinHandle<()>,
    registry: Registry,
    repo: RepoName,
    digest: Digest,
    holder: String,
    runtime: Handle,
    /// Fires once the first lease is recorded (or the registry said it keeps none).
    first: tokio::sync::watch::Receiver<bool>,
}

/// `host:/mount/point`, which says to an operator where to go and unmount.
pub fn holder(mountpoint: &std::path::Path) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".into());
    format!("{host}:{}", mountpoint.display())
}

impl LeaseKeeper {
    pub fn start(
        runtime: &Handle,
        registry: Registry,
        repo: RepoName,
        digest: Digest,
        holder: String,
    ) -> LeaseKeeper {
        let (taken, first) = tokio::sync::watch::channel(false);
        let task = {
            let (registry, repo, digest, holder) = (
                registry.clone(),
                repo.clone(),
                digest.clone(),
                holder.clone(),
            );
            runtime.spawn(async move {
                loop {
                    match registry.lease(&repo, &digest, &holder, Some(TTL)).await {
                        Ok(true) => {
                            taken.send_replace(true);
                        }
                        Ok(false) => {
                            tracing::debug!("the registry keeps no leases; not renewing");
                            taken.send_replace(true);
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(error = %vial_core::error_chain(&e), "could not renew the mount's lease")
                        }
                    }
                    tokio::time::sleep(RENEW_EVERY).await;
                }
            })
        };
        LeaseKeeper {
            task,
            registry,
            repo,
            digest,
            holder,
            runtime: runtime.clone(),
            first,
        }
    }

    /// Waits until the first lease is recorded, so the version is protected from `vial rm` before
    /// the mount says it is ready; gives up after a while (the renewals keep trying).
    pub fn first_taken(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut first = self.first.clone();
        async move {
            let waited = tokio::time::timeout(FIRST_WAIT, first.wait_for(|taken| *taken)).await;
            if waited.is_err() {
                tracing::warn!(
                    "the registry has not recorded the mount's lease yet; ready without it"
                );
            }
        }
    }

    /// Stops renewing and drops the lease (best effort, a few seconds at most). Call from outside
    /// the runtime.
    pub fn release(&self) {
        self.task.abort();
        let drop = self
            .registry
            .lease(&self.repo, &self.digest, &self.holder, None);
        match self
            .runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), drop).await })
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %vial_core::error_chain(&e), "could not drop the mount's lease; it lapses on its own")
            }
            Err(_) => tracing::warn!("dropping the mount's lease timed out; it lapses on its own"),
        }
    }

    /// [`LeaseKeeper::release`] for callers inside the runtime: the lease is dropped by a task.
    pub fn release_later(&self) {
        self.task.abort();
        let (registry, repo, digest, holder) = (
            self.registry.clone(),
            self.repo.clone(),
            self.digest.clone(),
            self.holder.clone(),
        );
        self.runtime.spawn(async move {
            let drop = registry.lease(&repo, &digest, &holder, None);
            if !matches!(
                tokio::time::timeout(Duration::from_secs(5), drop).await,
                Ok(Ok(_))
            ) {
                tracing::warn!(%digest, "could not drop a lease; it lapses on its own");
            }
        });
    }
}
