//! Following a tag: [`TagFollower`] says where a tag points each time it moves, and
//! [`FollowDir`] keeps a directory whose `current` symlink always names a complete, verified copy
//! of one version (`vial pull --follow`).
//!
//! The directory:
//! ```text
//! DIR/current -> versions/sha256-<hex>      the version in use; only ever names a complete one
//! DIR/versions/sha256-<hex>/…               complete versions, never written again
//! DIR/versions/.incoming-sha256-<hex>/…     a version being built (resumed after a crash)
//! DIR/.vial/trees/sha256-<hex>.json         each kept version's tree, for reusing its bytes
//! DIR/.vial/history                         digests in the order they became current
//! DIR/.vial/lock                            held while a follower runs
//! ```
//! A switch builds the new version beside the old ones (files whose content a kept version has
//! are hard-linked, chunks it holds copied, only the rest fetched), renames it into `versions/`,
//! then replaces `current` with one `rename(2)`. A process killed at any moment leaves `current`
//! naming the old version or the new one, never a partial one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vial_core::volume::{ChunkRef, Tree};
use vial_core::{Digest, RepoName, Tag, Target};

use crate::progress::Progress;
use crate::pull::{self, PullOptions, Seed};
use crate::registry::TagState;
use crate::{ClientError, Registry};

/// How long one tag watch request waits at the registry before asking again.
const WATCH_WAIT: Duration = Duration::from_secs(30);
/// How often a registry without vial's tag watch is asked where the tag points.
const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// The longest pause between attempts while the registry does not answer.
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Says where a tag points: at once the first time, then each time it points elsewhere.
#[derive(Debug)]
pub struct TagFollower {
    registry: Registry,
    repo: RepoName,
    tag: Tag,
    seen: Option<TagState>,
    /// Whether the registry has the tag watch, once known.
    watch: Option<bool>,
    /// How often a registry without the watch is polled.
    pub poll: Duration,
}

impl TagFollower {
    pub fn new(registry: Registry, repo: RepoName, tag: Tag) -> TagFollower {
        TagFollower {
            registry,
            repo,
            tag,
            seen: None,
            watch: None,
            poll: POLL_INTERVAL,
        }
    }

    /// Where the tag points now (the first call) or once it points somewhere else than the last
    /// answer (every later call). A registry that stops answering is asked again, with growing
    /// pauses, for as long as it takes; only an error on the first call, other than the registry
    /// being unreachable, is returned (bad credentials, no such repository).
    pub async fn next(&mut self) -> Result<TagState, ClientError> {
        let mut delay = Duration::from_millis(250);
        let mut failing = false;
        loop {
            match self.ask().await {
                Ok(state) => {
                    if failing {
                        tracing::info!(repo = %self.repo, tag = %self.tag, "registry answers again");
                    }
                    failing = false;
                    delay = Duration::from_millis(250);
                    if self.seen.as_ref() != Some(&state) {
                        self.seen = Some(state.clone());
                        return Ok(state);
                    }
                }
                Err(e) if self.seen.is_none() && !e.is_transient() => return Err(e),
                Err(e) => {
                    if !failing {
                        tracing::warn!(repo = %self.repo, tag = %self.tag, error = %vial_core::error_chain(&e), "cannot ask where the tag points; retrying");
                        failing = true;
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        }
    }

    async fn ask(&mut self) -> Result<TagState, ClientError> {
        if self.watch != Some(false) {
            let answer = self
                .registry
                .watch_tag(&self.repo, &self.tag, self.seen.as_ref(), WATCH_WAIT)
                .await?;
            match answer {
                Some(state) => {
                    self.watch = Some(true);
                    return Ok(state);
                }
                None => {
                    tracing::info!(registry = %self.registry.host(), "the registry has no tag watch: polling the tag every {:?}", self.poll);
                    self.watch = Some(false);
                }
            }
        }
        if self.seen.is_some() {
            tokio::time::sleep(self.poll).await;
        }
        self.registry.tag_digest(&self.repo, &self.tag).await
    }
}

/// One switch of `current` to another version.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Switch {
    pub digest: String,
    pub previous: Option<String>,
    /// The version's directory.
    pub path: PathBuf,
    /// Chunk bytes fetched from the registry for this version.
    pub bytes_fetched: u64,
    /// Bytes taken from kept versions instead (hard-linked files and copied chunks).
    pub bytes_reused: u64,
    pub files_linked: u64,
    /// Whether the version was kept from before: nothing was fetched.
    pub was_kept: bool,
    /// From the move being seen to `current` naming the new version.
    pub seconds: f64,
}

/// A directory that follows a tag (see the module docs). Holds the directory's lock while alive.
#[derive(Debug)]
pub struct FollowDir {
    root: PathBuf,
    _lock: std::fs::File,
}

/// `sha256-<hex>`: a digest as a directory name that needs no quoting in a shell or a bind-mount
/// specification.
pub fn dir_name(digest: &Digest) -> String {
    format!("{}-{}", digest.algorithm().as_str(), digest.hex())
}

fn from_dir_name(name: &str) -> Option<Digest> {
    let (algorithm, hex) = name.split_once('-')?;
    Digest::parse(&format!("{algorithm}:{hex}")).ok()
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ClientError + '_ {
    move |e| ClientError::io(path, e)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedTree {
    chunks: Vec<ChunkRef>,
    tree: String,
}

impl FollowDir {
    /// Opens (creating) a follow directory and takes its lock; fails if another follower holds it.
    pub fn open(root: &Path) -> Result<FollowDir, ClientError> {
        for dir in [root.join("versions"), root.join(".vial/trees")] {
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        }
        let lock_path = root.join(".vial/lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(ClientError::Invalid(format!(
                    "another follower is using {} (it holds {})",
                    root.display(),
                    lock_path.display()
                )))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(ClientError::io(&lock_path, e)),
        }
        // A switch that was cut off between creating the new link and renaming it.
        let _ = std::fs::remove_file(root.join(".current.tmp"));
        Ok(FollowDir {
            root: root.to_owned(),
            _lock: lock,
        })
    }

    fn version_dir(&self, digest: &Digest) -> PathBuf {
        self.root.join("versions").join(dir_name(digest))
    }

    fn tree_file(&self, digest: &Digest) -> PathBuf {
        self.root
            .join(".vial/trees")
            .join(format!("{}.json", dir_name(digest)))
    }

    /// The version `current` names, if any.
    pub fn current(&self) -> Option<Digest> {
        let target = std::fs::read_link(self.root.join("current")).ok()?;
        from_dir_name(target.file_name()?.to_str()?)
    }

    /// The complete versions on disk.
    pub fn kept(&self) -> Vec<Digest> {
        let Ok(entries) = std::fs::read_dir(self.root.join("versions")) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| from_dir_name(e.ok()?.file_name().to_str()?))
            .collect()
    }

    fn history(&self) -> Vec<Digest> {
        std::fs::read_to_string(self.root.join(".vial/history"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| Digest::parse(l.trim()).ok())
            .collect()
    }

    fn write_history(&self, history: &[Digest]) -> Result<(), ClientError> {
        let path = self.root.join(".vial/history");
        let tmp = self.root.join(".vial/history.tmp");
        let text: String = history.iter().map(|d| format!("{d}\n")).collect();
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
    }

    fn seeds(&self, first: Option<&Digest>) -> Vec<Seed> {
        let mut kept = self.kept();
        // The version in use first: it is the likeliest to share the most with the next one.
        kept.sort_by_key(|d| Some(d) != first);
        kept.iter()
            .filter_map(|d| {
                let text = std::fs::read(self.tree_file(d)).ok()?;
                let saved: SavedTree = serde_json::from_slice(&text).ok()?;
                let tree = Tree::from_parts(saved.tree.as_bytes(), saved.chunks).ok()?;
                Some(Seed {
                    dir: self.version_dir(d),
                    tree: Arc::new(tree),
                })
            })
            .collect()
    }

    /// Makes `current` name `digest`, building the version first unless it is kept; `seen` is
    /// when the move was seen, for the report.
    pub async fn switch_to(
        &self,
        registry: &Registry,
        repo: &RepoName,
        digest: &Digest,
        options: &PullOptions,
        progress: Arc<dyn Progress>,
        seen: Instant,
    ) -> Result<Switch, ClientError> {
        let previous = self.current();
        let dir = self.version_dir(digest);
        let mut report = Switch {
            digest: digest.to_string(),
            previous: previous.as_ref().map(Digest::to_string),
            path: dir.clone(),
            bytes_fetched: 0,
            bytes_reused: 0,
            files_linked: 0,
            was_kept: dir.is_dir(),
            seconds: 0.0,
        };
        if !report.was_kept {
            let incoming = self
                .root
                .join("versions")
                .join(format!(".incoming-{}", dir_name(digest)));
            self.drop_incoming_except(&incoming);
            let mut options = options.clone();
            options.seeds = self.seeds(previous.as_ref());
            let pulled = pull::pull(
                registry,
                repo,
                &Target::Digest(digest.clone()),
                &incoming,
                &options,
                progress,
            )
            .await?;
            report.bytes_fetched = pulled.bytes_downloaded;
            report.bytes_reused = pulled.bytes_reused;
            report.files_linked = pulled.files_linked;
            let Some(version) = pulled.tree else {
                return Err(ClientError::Invalid("the pull reported no tree".into()));
            };
            let saved = SavedTree {
                chunks: version.chunks.clone(),
                tree: String::from_utf8_lossy(&version.to_json()).into_owned(),
            };
            let tree_file = self.tree_file(digest);
            let text = serde_json::to_vec(&saved).unwrap_or_default();
            std::fs::write(&tree_file, text).map_err(io(&tree_file))?;
            std::fs::rename(&incoming, &dir).map_err(io(&dir))?;
            let versions = self.root.join("versions");
            std::fs::File::open(&versions)
                .and_then(|d| d.sync_all())
                .map_err(io(&versions))?;
        }
        self.point_current_at(digest)?;
        let mut history = self.history();
        history.retain(|d| d != digest);
        history.push(digest.clone());
        self.write_history(&history)?;
        report.seconds = seen.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Replaces `current` with a link to `digest`'s directory in one rename.
    fn point_current_at(&self, digest: &Digest) -> Result<(), ClientError> {
        let tmp = self.root.join(".current.tmp");
        let _ = std::fs::remove_file(&tmp);
        let target = Path::new("versions").join(dir_name(digest));
        std::os::unix::fs::symlink(&target, &tmp).map_err(io(&tmp))?;
        let current = self.root.join("current");
        std::fs::rename(&tmp, &current).map_err(io(&current))?;
        // The rename itself durable: after a power loss `current` is the old link or the new.
        std::fs::File::open(&self.root)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.root))
    }

    /// Removes versions being built other than `keep`: a follower that was cut off while building
    /// a version the tag has since moved on from.
    fn drop_incoming_except(&self, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(self.root.join("versions")) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let stale = e.file_name().to_string_lossy().starts_with(".incoming-") && path != keep;
            if stale {
                if let Err(e) = remove_tree(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove an abandoned version");
                }
            }
        }
    }

    /// Removes every kept version but the `keep` that were current most recently (`current`
    /// always among them). Returns the digests removed.
    pub fn prune(&self, keep: usize) -> Vec<Digest> {
        let current = self.current();
        let mut recent: Vec<Digest> = self.history();
        recent.reverse();
        let mut keeping: Vec<Digest> = current.iter().cloned().collect();
        for d in recent {
            if keeping.len() >= keep.max(1) {
                break;
            }
            if !keeping.contains(&d) {
                keeping.push(d);
            }
        }
        let mut removed = Vec::new();
        for d in self.kept() {
            if keeping.contains(&d) {
                continue;
            }
            let dir = self.version_dir(&d);
            // The tree goes last: a version whose removal is cut off is found again and removed.
            match remove_tree(&dir) {
                Ok(()) => {
                    let _ = std::fs::remove_file(self.tree_file(&d));
                    removed.push(d);
                }
                Err(e) => {
                    tracing::warn!(path = %dir.display(), error = %e, "cannot remove an old version")
                }
            }
        }
        if !removed.is_empty() {
            let mut history = self.history();
            history.retain(|d| !removed.contains(d));
            if let Err(e) = self.write_history(&history) {
                tracing::warn!(error = %vial_core::error_chain(&e), "cannot record the kept versions");
            }
        }
        removed
    }
}

/// Removes a directory tree whose directories may be read-only (a version's modes are its own).
fn remove_tree(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let make_writable = |p: &Path| {
        if let Ok(m) = std::fs::symlink_metadata(p) {
            if m.is_dir() && m.permissions().mode() & 0o700 != 0o700 {
                let _ = std::fs::set_permissions(
                    p,
                    std::fs::Permissions::from_mode(m.permissions().mode() | 0o700),
                );
            }
        }
    };
    fn walk(p: &Path, f: &dyn Fn(&Path)) {
        f(p);
        if let Ok(entries) = std::fs::read_dir(p) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), f);
                }
            }
        }
    }
    walk(path, &make_writable);
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_through_directory_names() {
        let d = vial_core::Algorithm::Sha256.digest_bytes(b"v1");
        let name = dir_name(&d);
        assert!(name.starts_with("sha256-") && !name.contains(':'));
        assert_eq!(from_dir_name(&name), Some(d));
        assert_eq!(from_dir_name(".incoming-sha256-00"), None);
        assert_eq!(from_dir_name("current"), None);
    }
}
