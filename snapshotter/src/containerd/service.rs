//! The containerd proxy snapshotter: containerd's Snapshots service over a unix socket.
//!
//! Ordinary image layers are plain directories stacked with overlayfs, as containerd's own overlay
//! snapshotter does. A vial volume's layer is remote: when containerd prepares it with the
//! remote-snapshot labels (see [`super::labels`]), the snapshotter mounts the volume lazily with
//! the same FUSE filesystem and node chunk cache as `vial mount`, commits the snapshot itself and
//! answers "already exists", so containerd downloads and unpacks nothing.

// The Snapshots service's error type is tonic's `Status`, which is large; it is what containerd
// receives, so it is used throughout rather than converted at the edge.
#![allow(clippy::result_large_err)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use containerd_snapshots::api::types::Mount;
use containerd_snapshots::tonic::{Code, Status};
use containerd_snapshots::{Info, Kind, Usage};
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use vial_client::{Registry, RegistryOptions};
use vial_core::{Digest, Reference};

use super::labels::{self, RemoteLayer};
use super::store::{Remote, Snap, SnapKind, Store};
use crate::mount::{MountOptions, Mounted};

/// Where and how the snapshotter keeps snapshots and reaches registries.
#[derive(Debug, Clone)]
pub struct SnapshotterOptions {
    pub root: PathBuf,
    pub mount: MountOptions,
    pub registry: RegistryOptions,
}

pub struct VialSnapshotter {
    options: SnapshotterOptions,
    store: tokio::sync::Mutex<Store>,
    /// Live FUSE mounts of remote snapshots, by snapshot id.
    mounts: std::sync::Mutex<HashMap<u64, Volume>>,
    /// Held through a remote prepare, so two pulls of one volume mount it once.
    preparing: tokio::sync::Mutex<()>,
    runtime: tokio::runtime::Handle,
}

/// A volume the snapshotter has mounted, and the chunks its version is made of.
struct Volume {
    mounted: Mounted,
    chunks: HashSet<Digest>,
}

impl std::fmt::Debug for VialSnapshotter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VialSnapshotter")
            .field("root", &self.options.root)
            .finish_non_exhaustive()
    }
}

fn internal(what: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("{what}: {e}"))
}

fn to_kind(kind: SnapKind) -> Kind {
    match kind {
        SnapKind::View => Kind::View,
        SnapKind::Active => Kind::Active,
        SnapKind::Committed => Kind::Committed,
    }
}

fn info(key: &str, snap: &Snap) -> Info {
    Info {
        kind: to_kind(snap.kind),
        name: key.to_owned(),
        parent: snap.parent.clone(),
        labels: snap.labels.clone(),
        created_at: snap.created_at,
        updated_at: snap.updated_at,
    }
}

fn bind(source: &Path, writable: bool) -> Mount {
    Mount {
        r#type: "bind".into(),
        source: source.display().to_string(),
        target: String::new(),
        options: vec![if writable { "rw" } else { "ro" }.into(), "rbind".into()],
    }
}

impl VialSnapshotter {
    /// Opens the snapshotter's record and mounts again every volume it had mounted.
    pub async fn open(options: SnapshotterOptions) -> std::io::Result<Arc<VialSnapshotter>> {
        let store = Store::open(&options.root)?;
        warn_if_cache_elsewhere(&options);
        let remotes: Vec<(u64, Remote)> = store
            .iter()
            .filter_map(|(_, s)| s.remote.clone().map(|r| (s.id, r)))
            .collect();
        let snapshotter = Arc::new(VialSnapshotter {
            options,
            store: tokio::sync::Mutex::new(store),
            mounts: std::sync::Mutex::new(HashMap::new()),
            preparing: tokio::sync::Mutex::new(()),
            runtime: tokio::runtime::Handle::current(),
        });
        for (id, remote) in remotes {
            match snapshotter.mount_remote(id, &remote).await {
                Ok(path) => {
                    tracing::info!(id, reference = %remote.reference, mountpoint = %path.display(), "volume mounted again")
                }
                Err(e) => {
                    tracing::error!(id, reference = %remote.reference, error = %e.message(), "cannot mount a volume snapshot again; reads of it fail until it is removed and pulled again")
                }
            }
        }
        Ok(snapshotter)
    }

    /// Unmounts every volume, for a clean shutdown. Their snapshots stay and are mounted again
    /// at the next start.
    pub fn unmount_all(&self) {
        let mounts: Vec<Mounted> = match self.mounts.lock() {
            Ok(mut m) => m.drain().map(|(_, v)| v.mounted).collect(),
            Err(_) => return,
        };
        for mut m in mounts {
            m.unmount();
            m.close();
        }
    }

    /// Mounts the volume of a remote snapshot at its `fs` directory.
    async fn mount_remote(&self, id: u64, remote: &Remote) -> Result<PathBuf, Status> {
        let mountpoint = self.store.lock().await.dir(id).join("fs");
        clear_stale_mount(&mountpoint);
        std::fs::create_dir_all(&mountpoint).map_err(|e| internal("creating the mountpoint", e))?;
        let reference = Reference::parse(&remote.reference).map_err(|e| {
            Status::invalid_argument(format!("volume reference {:?}: {e}", remote.reference))
        })?;
        let registry = Registry::new(reference.registry(), &self.options.registry)
            .map_err(|e| Status::unavailable(vial_core::error_chain(&e)))?;
        let version = vial_client::volume::open(&registry, reference.repo(), &reference.target())
            .await
            .map_err(|e| Status::unavailable(format!("cannot open {reference}: {e}")))?;
        let tree = version
            .index
            .tree
            .clone()
            .unwrap_or_else(|| version.index.tree_manifest.digest.clone());
        if tree.as_str() != remote.layer {
            return Err(Status::failed_precondition(format!(
                "{reference} is not the volume of layer {}: its tree is {tree}",
                remote.layer
            )));
        }
        let pinned = reference.pinned(version.digest.clone());
        let chunks = version
            .tree
            .chunks
            .iter()
            .map(|c| c.digest.clone())
            .collect();
        let mounted = crate::mount::mount(
            &self.runtime,
            registry,
            reference.repo().clone(),
            version,
            format!("vial:{pinned}"),
            &mountpoint,
            &self.options.mount,
        )
        .map_err(|e| {
            Status::unavailable(format!(
                "cannot mount {pinned}: {}",
                vial_core::error_chain(&e)
            ))
        })?;
        let lease_taken = mounted.lease_taken();
        lease_taken.await;
        if let Ok(mut mounts) = self.mounts.lock() {
            mounts.insert(id, Volume { mounted, chunks });
        }
        Ok(mountpoint)
    }

    fn take_mount(&self, id: u64) -> Option<Volume> {
        self.mounts.lock().ok().and_then(|mut m| m.remove(&id))
    }

    /// The chunks of every volume still mounted.
    fn chunks_in_use(&self) -> HashSet<Digest> {
        self.mounts
            .lock()
            .map(|m| m.values().flat_map(|v| v.chunks.iter().cloned()).collect())
            .unwrap_or_default()
    }

    /// Creates an ordinary snapshot (an empty directory over its parents).
    async fn create(
        &self,
        key: String,
        parent: String,
        labels: HashMap<String, String>,
        kind: SnapKind,
    ) -> Result<Vec<Mount>, Status> {
        let mut store = self.store.lock().await;
        if store.get(&key).is_some() {
            return Err(Status::already_exists(format!("snapshot {key:?} exists")));
        }
        if !parent.is_empty() {
            match store.get(&parent) {
                Some(p) if p.kind == SnapKind::Committed => {}
                Some(_) => {
                    return Err(Status::failed_precondition(format!(
                        "parent {parent:?} is not committed"
                    )))
                }
                None => {
                    return Err(Status::not_found(format!(
                        "parent {parent:?} does not exist"
                    )))
                }
            }
        }
        let id = store.next_id();
        let dir = store.dir(id);
        std::fs::create_dir_all(dir.join("fs")).map_err(|e| internal("creating a snapshot", e))?;
        if kind == SnapKind::Active {
            std::fs::create_dir_all(dir.join("work"))
                .map_err(|e| internal("creating a snapshot", e))?;
        }
        let now = SystemTime::now();
        store.insert(
            key.clone(),
            Snap {
                id,
                kind,
                parent,
                labels,
                created_at: now,
                updated_at: now,
                remote: None,
            },
        );
        store
            .save()
            .map_err(|e| internal("saving the snapshot record", e))?;
        mounts_of(&store, &key)
    }

    /// A volume layer: mount it, commit it as `target`, and say it already exists.
    async fn prepare_remote(
        &self,
        parent: String,
        mut labels: HashMap<String, String>,
        layer: RemoteLayer,
    ) -> Result<Vec<Mount>, Status> {
        let already = || Status::already_exists(format!("target snapshot {:?}", layer.target));
        // A volume is an image of one layer whose diff ID, and so chain ID, is its tree's digest:
        // anything else would let an image commit a volume under another layer's chain ID.
        if !parent.is_empty() || layer.target != layer.layer {
            return Err(Status::invalid_argument(format!(
                "layer {} is not a volume's: a volume's snapshot has no parent and is named by its tree digest",
                layer.layer
            )));
        }
        let _one_at_a_time = self.preparing.lock().await;
        let id = {
            let mut store = self.store.lock().await;
            if store.find_by_ref(&layer.target).is_some() || store.get(&layer.target).is_some() {
                return Err(already());
            }
            store.next_id()
        };
        let remote = Remote {
            reference: layer.reference.clone(),
            layer: layer.layer.clone(),
        };
        let mountpoint = match self.mount_remote(id, &remote).await {
            Ok(path) => path,
            Err(e) => {
                let dir = self.store.lock().await.dir(id);
                let _ = std::fs::remove_dir_all(dir);
                return Err(e);
            }
        };
        labels.insert(labels::REMOTE.into(), "vial volume".into());
        labels.insert(labels::MOUNTPOINT.into(), mountpoint.display().to_string());
        labels.insert(labels::SNAPSHOT_REF.into(), layer.target.clone());
        let now = SystemTime::now();
        let mut store = self.store.lock().await;
        store.insert(
            layer.target.clone(),
            Snap {
                id,
                kind: SnapKind::Committed,
                parent,
                labels,
                created_at: now,
                updated_at: now,
                remote: Some(remote),
            },
        );
        store
            .save()
            .map_err(|e| internal("saving the snapshot record", e))?;
        tracing::info!(target = %layer.target, reference = %layer.reference, mountpoint = %mountpoint.display(), "volume layer mounted lazily");
        Err(already())
    }
}

/// Detaches whatever a killed snapshotter left mounted at `path` before it is mounted again: its
/// FUSE daemon is gone, but fusermount3's own clean-up may not have run yet, and a stat of it can
/// still succeed from cached attributes. Mounting on top would stack a second mount that a later
/// unmount would uncover. A few rounds, for stacks.
fn clear_stale_mount(path: &Path) {
    for _ in 0..4 {
        if !is_mountpoint(path) {
            return;
        }
        tracing::info!(path = %path.display(), "clearing a stale mount left by an earlier process");
        if let Err(e) = crate::mount::unmount_path(path, true) {
            tracing::warn!(path = %path.display(), error = %e, "cannot clear the stale mount");
        }
    }
}

/// Whether something is mounted at `path`, from /proc/self/mounts (whose paths escape spaces,
/// tabs, newlines and backslashes as octal).
fn is_mountpoint(path: &Path) -> bool {
    let escaped: String = path
        .to_string_lossy()
        .chars()
        .map(|c| match c {
            ' ' => "\\040".to_owned(),
            '\t' => "\\011".to_owned(),
            '\n' => "\\012".to_owned(),
            '\\' => "\\134".to_owned(),
            c => c.to_string(),
        })
        .collect();
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|mounts| {
        mounts
            .lines()
            .any(|line| line.split(' ').nth(1) == Some(escaped.as_str()))
    })
}

/// How containerd mounts snapshot `key`: a bind of its directory (or of its one parent, for a
/// view), or overlayfs over its parents, nearest first.
fn mounts_of(store: &Store, key: &str) -> Result<Vec<Mount>, Status> {
    let snap = store
        .get(key)
        .ok_or_else(|| Status::not_found(format!("snapshot {key:?} does not exist")))?;
    let dir = store.dir(snap.id);
    let lower = store.ancestors(key);
    let joined = || {
        lower
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    };
    Ok(match (snap.kind, lower.len()) {
        (SnapKind::Committed, _) => {
            return Err(Status::failed_precondition(format!(
                "snapshot {key:?} is committed: make a view of it to mount it"
            )))
        }
        (SnapKind::Active, 0) => vec![bind(&dir.join("fs"), true)],
        (SnapKind::View, 0) => vec![bind(&dir.join("fs"), false)],
        (SnapKind::View, 1) => vec![bind(&lower[0], false)],
        (SnapKind::View, _) => vec![Mount {
            r#type: "overlay".into(),
            source: "overlay".into(),
            target: String::new(),
            options: vec![format!("lowerdir={}", joined())],
        }],
        (SnapKind::Active, _) => vec![Mount {
            r#type: "overlay".into(),
            source: "overlay".into(),
            target: String::new(),
            options: vec![
                format!("workdir={}", dir.join("work").display()),
                format!("upperdir={}", dir.join("fs").display()),
                format!("lowerdir={}", joined()),
            ],
        }],
    })
}

/// kubelet learns how full the image filesystem is by statting the snapshotter's root (containerd
/// exports it as vial's image filesystem); a node cache on another filesystem fills unseen.
fn warn_if_cache_elsewhere(options: &SnapshotterOptions) {
    use std::os::unix::fs::MetadataExt;
    let cache = &options.mount.cache_dir;
    let _ = std::fs::create_dir_all(cache);
    let device = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    if let (Some(root), Some(cache_dev)) = (device(&options.root), device(cache)) {
        if root != cache_dev {
            tracing::warn!(
                root = %options.root.display(),
                cache_dir = %cache.display(),
                "the node cache is not on the filesystem of the snapshotter's root, the one kubelet \
                 watches: its image garbage collection and eviction will not see the cache fill"
            );
        }
    }
}

/// Bytes and inodes under `path` (not following links, not crossing into other filesystems).
fn disk_usage(path: &Path) -> Usage {
    use std::os::unix::fs::MetadataExt;
    let mut usage = Usage::default();
    let Ok(root) = std::fs::symlink_metadata(path) else {
        return usage;
    };
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            usage.inodes += 1;
            usage.size += (meta.blocks() * 512) as i64;
            if meta.is_dir() && meta.dev() == root.dev() {
                stack.push(entry.path());
            }
        }
    }
    usage
}

#[containerd_snapshots::tonic::async_trait]
impl containerd_snapshots::Snapshotter for VialSnapshotter {
    type Error = Status;

    async fn stat(&self, key: String) -> Result<Info, Status> {
        let store = self.store.lock().await;
        store
            .get(&key)
            .map(|s| info(&key, s))
            .ok_or_else(|| Status::not_found(format!("snapshot {key:?} does not exist")))
    }

    async fn update(&self, info_in: Info, fieldpaths: Option<Vec<String>>) -> Result<Info, Status> {
        let mut store = self.store.lock().await;
        let snap = store.get_mut(&info_in.name).ok_or_else(|| {
            Status::not_found(format!("snapshot {:?} does not exist", info_in.name))
        })?;
        let paths = fieldpaths.unwrap_or_default();
        if paths.is_empty() {
            snap.labels = info_in.labels;
        } else {
            for path in paths {
                if path == "labels" {
                    snap.labels = info_in.labels.clone();
                } else if let Some(label) = path.strip_prefix("labels.") {
                    match info_in.labels.get(label) {
                        Some(v) => snap.labels.insert(label.to_owned(), v.clone()),
                        None => snap.labels.remove(label),
                    };
                } else {
                    return Err(Status::invalid_argument(format!(
                        "cannot update field {path:?} of a snapshot"
                    )));
                }
            }
        }
        snap.updated_at = SystemTime::now();
        let out = info(&info_in.name, snap);
        store
            .save()
            .map_err(|e| internal("saving the snapshot record", e))?;
        Ok(out)
    }

    async fn usage(&self, key: String) -> Result<Usage, Status> {
        let (path, id, remote) = {
            let store = self.store.lock().await;
            let snap = store
                .get(&key)
                .ok_or_else(|| Status::not_found(format!("snapshot {key:?} does not exist")))?;
            (
                store.dir(snap.id).join("fs"),
                snap.id,
                snap.remote.is_some(),
            )
        };
        if remote {
            // What a volume holds on the node is its chunks in the node cache, fetched as they
            // were read (a chunk two volumes share counts in both).
            let (chunks, bytes) = self
                .mounts
                .lock()
                .ok()
                .and_then(|m| m.get(&id).map(|v| v.mounted.cache().held(&v.chunks)))
                .unwrap_or_default();
            return Ok(Usage {
                size: bytes as i64,
                inodes: chunks as i64,
            });
        }
        tokio::task::spawn_blocking(move || disk_usage(&path))
            .await
            .map_err(|e| internal("measuring usage", e))
    }

    async fn mounts(&self, key: String) -> Result<Vec<Mount>, Status> {
        let store = self.store.lock().await;
        mounts_of(&store, &key)
    }

    async fn prepare(
        &self,
        key: String,
        parent: String,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>, Status> {
        if let Some(layer) = RemoteLayer::from_labels(&labels) {
            let explicit = layer.explicit;
            match self
                .prepare_remote(parent.clone(), labels.clone(), layer)
                .await
            {
                Err(e) if !explicit && e.code() != Code::AlreadyExists => {
                    tracing::debug!(key, reason = %e.message(), "not a volume layer; unpacking it as usual");
                }
                other => return other,
            }
        }
        self.create(key, parent, labels, SnapKind::Active).await
    }

    async fn view(
        &self,
        key: String,
        parent: String,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>, Status> {
        self.create(key, parent, labels, SnapKind::View).await
    }

    async fn commit(
        &self,
        name: String,
        key: String,
        labels: HashMap<String, String>,
    ) -> Result<(), Status> {
        let mut store = self.store.lock().await;
        if store.get(&name).is_some() {
            return Err(Status::already_exists(format!("snapshot {name:?} exists")));
        }
        match store.get(&key) {
            Some(s) if s.kind == SnapKind::Active => {}
            Some(_) => {
                return Err(Status::failed_precondition(format!(
                    "snapshot {key:?} is not active"
                )))
            }
            None => {
                return Err(Status::not_found(format!(
                    "snapshot {key:?} does not exist"
                )))
            }
        }
        let Some(mut snap) = store.remove(&key) else {
            return Err(Status::not_found(format!(
                "snapshot {key:?} does not exist"
            )));
        };
        snap.kind = SnapKind::Committed;
        snap.labels.extend(labels);
        snap.updated_at = SystemTime::now();
        let _ = std::fs::remove_dir_all(store.dir(snap.id).join("work"));
        store.insert(name, snap);
        store
            .save()
            .map_err(|e| internal("saving the snapshot record", e))
    }

    async fn remove(&self, key: String) -> Result<(), Status> {
        let (snap, dir) = {
            let mut store = self.store.lock().await;
            if store.has_children(&key) {
                return Err(Status::failed_precondition(format!(
                    "snapshot {key:?} has children"
                )));
            }
            let snap = store
                .remove(&key)
                .ok_or_else(|| Status::not_found(format!("snapshot {key:?} does not exist")))?;
            store
                .save()
                .map_err(|e| internal("saving the snapshot record", e))?;
            let dir = store.dir(snap.id);
            (snap, dir)
        };
        if let Some(remote) = &snap.remote {
            tracing::info!(key, reference = %remote.reference, "volume snapshot removed; unmounting");
            if let Some(Volume {
                mut mounted,
                chunks,
            }) = self.take_mount(snap.id)
            {
                let in_use = self.chunks_in_use();
                // Unmounting waits for the FUSE session: off the async threads.
                let (files, bytes) = tokio::task::spawn_blocking(move || {
                    // Detached even if a container still has files open: the volume goes away
                    // when the last one is closed.
                    mounted.unmount();
                    mounted.close();
                    // Removing an image is how kubelet's image garbage collection frees disk:
                    // the chunks no other mounted volume uses leave the node cache now.
                    mounted.cache().discard(chunks.difference(&in_use))
                })
                .await
                .map_err(|e| internal("unmounting a volume", e))?;
                tracing::info!(
                    key,
                    chunks = files,
                    bytes,
                    "volume unmounted; its chunks released from the node cache"
                );
            }
        }
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir))
            .await
            .map_err(|e| internal("removing a snapshot", e))?
            .or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(internal("removing a snapshot's files", e))
                }
            })
    }

    type InfoStream = BoxStream<'static, Result<Info, Status>>;

    async fn list(
        &self,
        _snapshotter: String,
        _filters: Vec<String>,
    ) -> Result<Self::InfoStream, Status> {
        // Every snapshot: containerd applies the filters itself where it needs them (and its
        // garbage collection must see everything the snapshotter holds).
        let store = self.store.lock().await;
        let all: Vec<Result<Info, Status>> = store.iter().map(|(k, s)| Ok(info(k, s))).collect();
        Ok(futures_util::stream::iter(all).boxed())
    }
}

/// Serves the Snapshots service on the unix socket `address` until `shutdown` resolves.
pub async fn serve(
    snapshotter: Arc<VialSnapshotter>,
    address: &Path,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if let Some(dir) = address.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(address) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let listener = tokio::net::UnixListener::bind(address)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    containerd_snapshots::tonic::transport::Server::builder()
        .add_service(containerd_snapshots::server(snapshotter))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}
