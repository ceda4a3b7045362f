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
/// The first lease waits this long after the mount is ready: a registry write in the moment a
/// model starts reading its first tensors only competes with those reads.
const FIRST_AFTER: Duration = Duration::from_secs(2);

/// Keeps a lease renewed until [`LeaseKeeper::release`].
#[derive(Debug)]
pub struct LeaseKeeper {
    task: JoinHandle<()>,
    registry: Registry,
    repo: RepoName,
    digest: Digest,
    holder: String,
    runtime: Handle,
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
        let task = {
            let (registry, repo, digest, holder) = (
                registry.clone(),
                repo.clone(),
                digest.clone(),
                holder.clone(),
            );
            runtime.spawn(async move {
                tokio::time::sleep(FIRST_AFTER).await;
                loop {
                    match registry.lease(&repo, &digest, &holder, Some(TTL)).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::debug!("the registry keeps no leases; not renewing");
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
}
