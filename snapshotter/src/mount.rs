//! Mounting a version: build the filesystem, mount it with FUSE, serve until unmounted or told to
//! stop.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{Config, MountOption, SessionACL};
use vial_client::volume::Version;
use vial_client::Registry;
use vial_core::RepoName;

use crate::cache::ChunkCache;
use crate::fetch::Fetcher;
use crate::follow::{Following, Slot};
use crate::fs::{VialFs, View};
use crate::inodes::Inodes;
use crate::prefetch::Prefetch;
use crate::shared::Shared;
use crate::stats::Stats;

#[derive(Debug, Clone)]
pub struct MountOptions {
    pub cache_dir: PathBuf,
    pub cache_size: u64,
    pub prefetch: Prefetch,
    /// How long one chunk may take to arrive, retries included, before the read fails with EIO.
    pub timeout: Duration,
    /// Chunk downloads in flight at once.
    pub parallel: usize,
}

/// Downloads a mount keeps in flight unless told otherwise: on a local registry, 16 made a cold
/// full read slower than 8 (more runs in flight, and the chunk a reader waits for arrives later).
pub const DOWNLOADS: u32 = 8;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot open the chunk cache")]
    Cache(#[from] crate::cache::CacheError),
    #[error("cannot mount at {}", .0.display())]
    Fuse(PathBuf, #[source] std::io::Error),
    #[error("mountpoint {} does not exist or is not a directory", .0.display())]
    Mountpoint(PathBuf),
    #[error("mountpoint {} is not empty: a mount would hide its files (empty it, or pick another directory)", .0.display())]
    NotEmpty(PathBuf),
    #[error("FUSE is not available: {0}")]
    NoFuse(String),
}

/// A mounted filesystem, served by FUSE threads until [`Mounted::wait`] returns.
pub struct Mounted {
    unmounter: fuser::SessionUnmounter,
    cache: Arc<ChunkCache>,
    done: std::sync::mpsc::Receiver<std::io::Result<()>>,
    /// A mount of one version holds its lease here; a following mount, one per version shown.
    lease: Option<crate::lease::LeaseKeeper>,
    following: Option<Arc<Following>>,
    /// How the session ended, when [`Mounted::unmount`] already saw it end.
    ended: Option<std::io::Result<()>>,
    pub mountpoint: PathBuf,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted")
            .field("mountpoint", &self.mountpoint)
            .finish()
    }
}

/// Unmounts whatever is mounted at `path`: with fusermount3, or umount(8) where fusermount3 is
/// missing or refuses. `lazy` detaches the mount even while files are open on it. The error is what
/// the last tool that ran said.
pub fn unmount_path(path: &Path, lazy: bool) -> Result<(), String> {
    let tools: [(&str, &[&str]); 2] = if lazy {
        [("fusermount3", &["-u", "-z"]), ("umount", &["-l"])]
    } else {
        [("fusermount3", &["-u"]), ("umount", &[])]
    };
    let mut last_error = String::new();
    for (tool, flags) in tools {
        match std::process::Command::new(tool)
            .args(flags)
            .arg(path)
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => last_error = String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            Err(_) => continue,
        }
    }
    Err(last_error)
}

impl Mounted {
    /// Unmounts (idempotent: an external `umount` may have happened already).
    ///
    /// With `auto_unmount`, fuser's unmount only closes the socket fusermount3 watches, and
    /// fusermount3 leaves alone a mount whose daemon is still alive; so if the session has not
    /// ended shortly after, the mount is detached the way `vial umount --lazy` does it.
    pub fn unmount(&mut self) {
        if let Err(e) = self.unmounter.unmount() {
            tracing::warn!(error = %e, mountpoint = %self.mountpoint.display(), "unmount failed");
        }
        match self.done.recv_timeout(Duration::from_millis(300)) {
            Ok(result) => {
                self.ended = Some(result);
                return;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Err(e) = unmount_path(&self.mountpoint, true) {
            tracing::warn!(mountpoint = %self.mountpoint.display(), error = %e, "could not detach the mount");
        }
    }

    /// Blocks until the filesystem is unmounted, by us or by someone else.
    pub fn wait(&mut self) -> std::io::Result<()> {
        if let Some(result) = self.ended.take() {
            return result;
        }
        self.done.recv().unwrap_or(Ok(()))
    }

    /// Once the filesystem is unmounted: flushes what this mount cached to disk and drops the
    /// mount's lease on its version. Call from outside the runtime.
    pub fn close(&self) {
        self.cache.close();
        if let Some(lease) = &self.lease {
            lease.release();
        }
        if let Some(f) = &self.following {
            f.release_all();
        }
    }

    /// Waits until the registry has recorded this mount's lease on its version (at most a few
    /// seconds): from then on, deleting the version needs `--force`.
    pub fn lease_taken(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let first = match (&self.lease, &self.following) {
            (Some(lease), _) => Some(lease.first_taken()),
            (None, Some(f)) => f.current().map(|c| c.lease().first_taken()),
            (None, None) => None,
        };
        async move {
            if let Some(first) = first {
                first.await;
            }
        }
    }

    /// The node cache this mount reads through.
    pub fn cache(&self) -> &Arc<ChunkCache> {
        &self.cache
    }

    /// Whether the session has ended, without blocking.
    pub fn try_wait(&self) -> Option<std::io::Result<()>> {
        self.done.try_recv().ok()
    }
}

/// The kernel reads ahead only 128 KiB on a FUSE mount unless its backing device says otherwise:
/// raise it to 1 MiB so sequential readers send 1 MiB requests (vial's own read-ahead, which knows
/// chunk boundaries, keeps chunks in flight further ahead).
/// Needs root; without it the mount works, only slower for sequential reads.
fn raise_readahead(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = meta.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    match std::fs::write(&path, "1024") {
        Ok(()) => tracing::debug!(path, "kernel read-ahead raised to 1 MiB"),
        Err(e) => {
            tracing::info!(path, error = %e, "cannot raise kernel read-ahead; sequential reads will use 128 KiB requests")
        }
    }
}

/// Checks that this machine can mount FUSE filesystems, and says what to install where it cannot.
pub fn fuse_ready() -> Result<(), MountError> {
    if !Path::new("/dev/fuse").exists() {
        return Err(MountError::NoFuse(
            "/dev/fuse is missing: load the fuse kernel module (modprobe fuse), or in a container pass --device /dev/fuse".into(),
        ));
    }
    let on_path = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| dir.join("fusermount3").is_file())
    });
    if !on_path {
        return Err(MountError::NoFuse(
            "fusermount3 is not installed: install the fuse3 package (apt-get install fuse3, dnf install fuse3)".into(),
        ));
    }
    Ok(())
}

/// Everything every version of a mount shares: the node cache, the fetcher and the counters.
struct Common {
    cache: Arc<ChunkCache>,
    fetcher: Arc<Fetcher>,
    stats: Arc<Stats>,
    uid: u32,
    gid: u32,
}

/// Checks the mountpoint and opens the node cache.
fn prepare(
    registry: Registry,
    repo: RepoName,
    mountpoint: &Path,
    options: &MountOptions,
) -> Result<Common, MountError> {
    if !mountpoint.is_dir() {
        return Err(MountError::Mountpoint(mountpoint.to_owned()));
    }
    fuse_ready()?;
    if std::fs::read_dir(mountpoint)
        .map_err(|e| MountError::Fuse(mountpoint.to_owned(), e))?
        .next()
        .is_some()
    {
        return Err(MountError::NotEmpty(mountpoint.to_owned()));
    }
    let owner =
        std::fs::metadata(mountpoint).map_err(|e| MountError::Fuse(mountpoint.to_owned(), e))?;
    let stats = Arc::new(Stats::default());
    let cache = Arc::new(ChunkCache::open(
        &options.cache_dir,
        options.cache_size,
        Arc::clone(&stats),
    )?);
    let fetcher = Arc::new(Fetcher::new(
        registry,
        repo,
        Arc::clone(&cache),
        Arc::clone(&stats),
        options.parallel,
        options.timeout,
    ));
    Ok(Common {
        cache,
        fetcher,
        stats,
        uid: std::os::unix::fs::MetadataExt::uid(&owner),
        gid: std::os::unix::fs::MetadataExt::gid(&owner),
    })
}

impl Common {
    /// The filesystem state of one version.
    fn shared(
        &self,
        runtime: &tokio::runtime::Handle,
        version: &Version,
        source: String,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            inodes: Inodes::build(&version.tree),
            chunks: version.tree.chunks.clone(),
            fetcher: Arc::clone(&self.fetcher),
            stats: Arc::clone(&self.stats),
            runtime: runtime.clone(),
            reference: source,
            uid: self.uid,
            gid: self.gid,
            time: SystemTime::now(),
            readahead: Default::default(),
            walk: Default::default(),
            tensors: Default::default(),
            stats_opens: Default::default(),
        })
    }
}

/// A FUSE session serving `fs` at `mountpoint`, on its own thread.
struct Session {
    unmounter: fuser::SessionUnmounter,
    notifier: fuser::Notifier,
    done: std::sync::mpsc::Receiver<std::io::Result<()>>,
}

fn start_session(fs: VialFs, mountpoint: &Path, source: String) -> Result<Session, MountError> {
    let config = {
        let mut c = Config::default();
        c.mount_options = vec![
            MountOption::FSName(source),
            MountOption::Subtype("vial".to_owned()),
            MountOption::RO,
            MountOption::NoDev,
            MountOption::NoSuid,
            MountOption::DefaultPermissions,
            // If this process dies, fusermount3 unmounts for us: no stuck mountpoint.
            MountOption::AutoUnmount,
        ];
        c.acl = SessionACL::All;
        c.n_threads = Some(2);
        c.clone_fd = true;
        c
    };
    let mut session = fuser::Session::new(fs, mountpoint, &config)
        .map_err(|e| MountError::Fuse(mountpoint.to_owned(), e))?;
    let unmounter = session.unmount_callable();
    let notifier = session.notifier();
    let (tx, done) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("vial-fuse".into())
        .spawn(move || {
            let _ = tx.send(session.run());
        })
        .map_err(|e| MountError::Fuse(mountpoint.to_owned(), e))?;
    raise_readahead(mountpoint);
    Ok(Session {
        unmounter,
        notifier,
        done,
    })
}

/// Mounts `version` of `repo` at `mountpoint`. `source` is what `mount`/`findmnt` show, e.g.
/// `vial:localhost:5000/weights/x@sha256:…`.
pub fn mount(
    runtime: &tokio::runtime::Handle,
    registry: Registry,
    repo: RepoName,
    version: Version,
    source: String,
    mountpoint: &Path,
    options: &MountOptions,
) -> Result<Mounted, MountError> {
    let common = prepare(registry.clone(), repo.clone(), mountpoint, options)?;
    let shared = common.shared(runtime, &version, source.clone());
    let session = start_session(
        VialFs {
            view: View::One(Arc::clone(&shared)),
        },
        mountpoint,
        source,
    )?;
    // Only a mount that exists holds a lease.
    let lease = crate::lease::LeaseKeeper::start(
        runtime,
        registry,
        repo,
        version.digest.clone(),
        crate::lease::holder(mountpoint),
    );
    runtime.spawn(crate::prefetch::prefetch(shared, options.prefetch.clone()));
    Ok(Mounted {
        unmounter: session.unmounter,
        cache: common.cache,
        done: session.done,
        lease: Some(lease),
        following: None,
        ended: None,
        mountpoint: mountpoint.to_owned(),
    })
}

/// A following mount's side that takes new versions in (see [`crate::follow`]).
pub struct Follow {
    following: Arc<Following>,
    common: Common,
    runtime: tokio::runtime::Handle,
    registry: Registry,
    repo: RepoName,
    holder: String,
    prefetch: Prefetch,
    notifier: fuser::Notifier,
}

impl std::fmt::Debug for Follow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follow")
            .field("repo", &self.repo)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

/// What one switch of a following mount did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MountSwitch {
    pub digest: String,
    pub previous: Option<String>,
    /// The version's directory at the mount's root.
    pub dir: String,
    /// Bytes the node fetched for the switch (the version's chunks the cache lacked, with
    /// `--prefetch all`; metadata only without it, chunks come as they are read).
    pub bytes_fetched: u64,
    /// Whether the mount still showed the version: nothing was fetched.
    pub was_kept: bool,
    pub seconds: f64,
}

impl Follow {
    /// Makes `current` name `version`, adding its directory first unless the mount still shows
    /// it. With `--prefetch all` the version's chunks are fetched into the node cache before the
    /// switch, so `current` reads at cache speed from the first byte.
    pub async fn switch(
        &self,
        version: Version,
        source: String,
        seen: std::time::Instant,
    ) -> MountSwitch {
        let fetched_before = self
            .common
            .stats
            .bytes_fetched
            .load(std::sync::atomic::Ordering::Relaxed);
        let previous = self.following.current().map(|c| c.digest.to_string());
        let was_kept = self.following.by_digest(&version.digest).is_some();
        if !was_kept {
            let shared = self.common.shared(&self.runtime, &version, source);
            crate::prefetch::prefetch(Arc::clone(&shared), self.prefetch.clone()).await;
            let lease = crate::lease::LeaseKeeper::start(
                &self.runtime,
                self.registry.clone(),
                self.repo.clone(),
                version.digest.clone(),
                self.holder.clone(),
            );
            self.following.add(Slot::new(
                vial_client::follow::dir_name(&version.digest),
                version.digest.clone(),
                shared,
                lease,
            ));
        }
        self.following.make_current(&version.digest);
        // `current` is never cached by the kernel (its entry lives 0 s); this drops a lookup
        // already under way.
        let _ = self.notifier.inval_entry(
            fuser::INodeNo(crate::follow::ROOT),
            std::ffi::OsStr::new("current"),
        );
        let fetched = self
            .common
            .stats
            .bytes_fetched
            .load(std::sync::atomic::Ordering::Relaxed);
        MountSwitch {
            digest: version.digest.to_string(),
            previous,
            dir: vial_client::follow::dir_name(&version.digest),
            bytes_fetched: fetched.saturating_sub(fetched_before),
            was_kept,
            seconds: seen.elapsed().as_secs_f64(),
        }
    }

    /// Drops the versions no longer current and with no file open for `grace`; returns their
    /// directory names.
    pub fn drop_retired(&self, grace: Duration) -> Vec<String> {
        let gone = self.following.drop_retired(grace);
        for name in &gone {
            let _ = self.notifier.inval_entry(
                fuser::INodeNo(crate::follow::ROOT),
                std::ffi::OsStr::new(name),
            );
        }
        gone
    }

    /// The digest `current` names.
    pub fn current(&self) -> Option<vial_core::Digest> {
        self.following.current().map(|c| c.digest.clone())
    }
}

/// Mounts a following view at `mountpoint`, with `first` as its current version. `source` names
/// the mount (`vial:host/name:tag`, what `findmnt` shows), `first_source` the first version.
// The arguments of `mount`, and the version's own name: grouping them would only rename them.
#[allow(clippy::too_many_arguments)]
pub fn mount_following(
    runtime: &tokio::runtime::Handle,
    registry: Registry,
    repo: RepoName,
    first: Version,
    source: String,
    first_source: String,
    mountpoint: &Path,
    options: &MountOptions,
) -> Result<(Mounted, Follow), MountError> {
    let common = prepare(registry.clone(), repo.clone(), mountpoint, options)?;
    let following = Arc::new(Following::default());
    let holder = crate::lease::holder(mountpoint);
    let digest = first.digest.clone();
    let shared = common.shared(runtime, &first, first_source);
    let lease = crate::lease::LeaseKeeper::start(
        runtime,
        registry.clone(),
        repo.clone(),
        digest.clone(),
        holder.clone(),
    );
    following.add(Slot::new(
        vial_client::follow::dir_name(&digest),
        digest.clone(),
        Arc::clone(&shared),
        lease,
    ));
    following.make_current(&digest);
    let session = start_session(
        VialFs {
            view: View::Following(Arc::clone(&following)),
        },
        mountpoint,
        source,
    )?;
    runtime.spawn(crate::prefetch::prefetch(shared, options.prefetch.clone()));
    let mounted = Mounted {
        unmounter: session.unmounter,
        cache: Arc::clone(&common.cache),
        done: session.done,
        lease: None,
        following: Some(Arc::clone(&following)),
        ended: None,
        mountpoint: mountpoint.to_owned(),
    };
    let follow = Follow {
        following,
        common,
        runtime: runtime.clone(),
        registry,
        repo,
        holder,
        prefetch: options.prefetch.clone(),
        notifier: session.notifier,
    };
    Ok((mounted, follow))
}
