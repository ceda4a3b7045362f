//! `vial pull`: download a version into a directory, in parallel, verifying every chunk.
//!
//! Files are written as `.<name>.vial-part` next to their final name and renamed when complete.
//! An interrupted pull resumes: bytes already on disk (in part files or complete files) are hashed
//! and only the chunks that do not match are downloaded again.
//!
//! A pull may be given *seeds*: complete copies of other versions that vial pulled and verified on
//! this machine. A file whose content a seed holds (the same chunks, the same mode) is hard-linked
//! from it, and chunks of changed files are copied from wherever a seed holds them; only the rest
//! is fetched. This is how `vial pull --follow` applies a new version as a delta.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vial_core::volume::{EntryKind, Tree};
use vial_core::{Algorithm, Digest, RepoName, Target};

use crate::fds;
use crate::progress::{Event, Progress};
use crate::volume::{self, Version};
use crate::{plan_runs, Arrived, ClientError, Registry, RunSize, Verified};

#[derive(Debug, Clone)]
pub struct PullOptions {
    /// Downloads in flight at once: bulk reads of a run of chunks, or single chunks from a
    /// registry without them.
    pub runs: usize,
    /// Make every file durable (fsync) before it gets its final name and `pull` returns. Without
    /// it the files are in the page cache when `pull` returns, as after a `curl -o`; a pull run
    /// again after a power loss checks every chunk on disk and fetches what is missing.
    pub fsync: bool,
    /// Verified copies of other versions to take unchanged files and chunks from.
    pub seeds: Vec<Seed>,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            runs: 8,
            fsync: false,
            seeds: Vec::new(),
        }
    }
}

/// A complete copy of a version on this machine, written by a pull that verified every chunk of
/// it, and left unchanged since (`vial pull --follow` never writes into a version it completed).
/// Its bytes are trusted as they are: that is what lets a new version reuse them without reading
/// them again.
#[derive(Debug, Clone)]
pub struct Seed {
    pub dir: PathBuf,
    pub tree: Arc<Tree>,
}

/// What the seeds hold: whole files by content, and chunks by digest.
#[derive(Default)]
struct SeedIndex {
    /// (mode, chunk digests) of a file → its path in a seed.
    files: HashMap<(u32, Vec<Digest>), PathBuf>,
    /// Chunk digest → (path of a seed file holding it, offset).
    chunks: HashMap<Digest, (PathBuf, u64)>,
}

impl SeedIndex {
    fn build(seeds: &[Seed]) -> SeedIndex {
        let mut index = SeedIndex::default();
        for seed in seeds {
            for e in &seed.tree.entries {
                let EntryKind::File { mode, chunks, size } = &e.kind else {
                    continue;
                };
                let path = seed.dir.join(&e.path);
                // A file that is not what the tree says (removed, or written to after all) is no
                // seed: its chunks are fetched instead.
                let intact =
                    std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() == *size);
                if !intact {
                    continue;
                }
                let digests = chunks
                    .iter()
                    .map(|&c| seed.tree.chunks[c as usize].digest.clone())
                    .collect::<Vec<_>>();
                let mut offset = 0;
                for &c in chunks {
                    let chunk = &seed.tree.chunks[c as usize];
                    index
                        .chunks
                        .entry(chunk.digest.clone())
                        .or_insert_with(|| (path.clone(), offset));
                    offset += chunk.size;
                }
                index.files.entry((*mode, digests)).or_insert(path);
            }
        }
        index
    }

    /// A seed file with exactly this content, if one is still a regular file of the right size.
    fn file(&self, tree: &Tree, mode: u32, size: u64, chunks: &[u32]) -> Option<&Path> {
        let digests = chunks
            .iter()
            .map(|&c| tree.chunks[c as usize].digest.clone())
            .collect::<Vec<_>>();
        let path = self.files.get(&(mode, digests))?;
        std::fs::symlink_metadata(path)
            .is_ok_and(|m| m.is_file() && m.len() == size)
            .then_some(path.as_path())
    }
}

/// Chunks (with where their bytes go) fetched in one request.
type Run = Vec<(u32, Vec<(usize, u64)>)>;

fn into_runs(tree: &Tree, chunks: Vec<(u32, Vec<(usize, u64)>)>) -> Vec<Run> {
    plan_runs(
        chunks,
        |(chunk, _)| tree.chunks[*chunk as usize].size,
        RunSize::PULL,
    )
}

/// Orders runs so that those in flight at once fall in different files, taking each file's runs
/// in turn: a file takes one write at a time, and runs in file order would all be writing into
/// the same one.
fn across_files(runs: Vec<Run>) -> Vec<Run> {
    let mut by_file: std::collections::BTreeMap<usize, std::collections::VecDeque<Run>> =
        std::collections::BTreeMap::new();
    let total = runs.len();
    for run in runs {
        let file = run
            .first()
            .and_then(|(_, places)| places.first())
            .map_or(0, |&(f, _)| f);
        by_file.entry(file).or_default().push_back(run);
    }
    let mut ordered = Vec::with_capacity(total);
    while ordered.len() < total {
        for queue in by_file.values_mut() {
            ordered.extend(queue.pop_front());
        }
    }
    ordered
}

/// Positional writes into the files being pulled. A file is closed once every byte it waits for
/// is written, and at most [`fds::budget`] files are kept open between writes, so a pull of a
/// million files holds as few descriptors as a pull of one.
struct Writer {
    targets: Arc<Vec<FileTarget>>,
    open: fds::Handles<usize>,
    /// Bytes each file still waits for.
    left: Vec<AtomicU64>,
    /// One lock per file (by index modulo their number) that its writers take in turn: the kernel
    /// lets one write into a file at a time anyway, and threads that wait for it on this lock
    /// sleep, where waiting in the kernel spins (13% of a cold 4 GiB pull's CPU, eight writers
    /// on four files).
    turns: Vec<std::sync::Mutex<()>>,
}

impl Writer {
    fn new(
        targets: Arc<Vec<FileTarget>>,
        wanted: &[(u32, Vec<(usize, u64)>)],
        tree: &Tree,
    ) -> Writer {
        let left: Vec<AtomicU64> = targets.iter().map(|_| AtomicU64::new(0)).collect();
        for (chunk, places) in wanted {
            let size = tree.chunks[*chunk as usize].size;
            for &(file, _) in places {
                left[file].fetch_add(size, Ordering::Relaxed);
            }
        }
        Writer {
            targets,
            open: fds::Handles::new(fds::budget()),
            left,
            turns: (0..64).map(|_| std::sync::Mutex::new(())).collect(),
        }
    }

    /// Writes a verified chunk, as the frames it arrived in, everywhere it goes.
    fn put(&self, chunk: &Verified, places: &[(usize, u64)]) -> Result<(), ClientError> {
        let frames = &chunk.frames;
        let len: u64 = frames.iter().map(|f| f.len() as u64).sum();
        for &(file, offset) in places {
            let target = &self.targets[file];
            let path = &target.write_to;
            let f = self
                .open
                .get(&file, || open_to_write(target))
                .map_err(|e| ClientError::io(path, e))?;
            {
                let _turn = self.turns[file % self.turns.len()]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let mut at = offset;
                for frame in frames {
                    f.write_all_at(frame, at)
                        .map_err(|e| ClientError::io(path, e))?;
                    at += frame.len() as u64;
                }
            }
            if self.left[file].fetch_sub(len, Ordering::AcqRel) == len {
                self.open.close(&file);
            }
        }
        Ok(())
    }
}

/// Fetches a run of chunks ([`Registry::read_run`]). Each chunk is handed, as the frames it
/// arrived in (no copy), to a blocking thread that verifies it and then writes it: nothing is
/// written before it is verified.
async fn fetch_run(
    registry: &Registry,
    repo: &RepoName,
    tree: &Arc<Tree>,
    run: Run,
    writer: &Arc<Writer>,
    progress: &dyn Progress,
    downloaded: &AtomicU64,
) -> Result<(), ClientError> {
    let chunks: Vec<(Digest, u64)> = run
        .iter()
        .map(|(c, _)| {
            let chunk = &tree.chunks[*c as usize];
            (chunk.digest.clone(), chunk.size)
        })
        .collect();
    let len: u64 = chunks.iter().map(|(_, n)| n).sum();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Arrived>(4);
    let sink = {
        let writer = Arc::clone(writer);
        tokio::task::spawn_blocking(move || {
            while let Some(arrived) = rx.blocking_recv() {
                let chunk = arrived.verify()?;
                let (_, places) = &run[chunk.index];
                writer.put(&chunk, places)?;
            }
            Ok::<_, ClientError>(())
        })
    };
    let received = async {
        let mut chunks = registry.read_run(repo, &chunks).await?;
        while let Some(arrived) = chunks.next().await {
            if tx.send(arrived?).await.is_err() {
                break; // The writer failed; its error is reported.
            }
        }
        Ok::<_, ClientError>(())
    }
    .await;
    drop(tx);
    let written = sink.await.map_err(ClientError::task("write"))?;
    received?;
    written?;
    downloaded.fetch_add(len, Ordering::Relaxed);
    progress.event(Event::Transferred(len));
    Ok(())
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PullReport {
    pub digest: String,
    pub files: u64,
    pub bytes: u64,
    pub chunks: u64,
    pub chunks_downloaded: u64,
    pub bytes_downloaded: u64,
    pub bytes_already_present: u64,
    /// Bytes taken from seeds: files hard-linked and chunks copied.
    pub bytes_reused: u64,
    /// Files hard-linked from seeds.
    pub files_linked: u64,
    pub seconds: f64,
    /// The version's tree, for callers that keep it (`vial pull --follow` reuses its bytes).
    #[serde(skip)]
    pub tree: Option<Arc<Tree>>,
}

/// Where each chunk goes: (file index, offset in the file), by chunk index.
type Places = HashMap<u32, Vec<(usize, u64)>>;

/// A file being written: where its bytes go now, and its final name.
struct FileTarget {
    write_to: PathBuf,
    final_path: PathBuf,
    mode: u32,
    /// Whether the file was just created empty, so nothing in it needs checking.
    fresh: bool,
    /// Whether [`prepare`] left the file for its first write to create (an empty destination).
    unmade: bool,
    /// Whether the file is complete already, hard-linked from a seed: nothing in it is fetched,
    /// copied or checked.
    linked: bool,
}

/// Pulls `target` of `repo` into `dest`, creating it if needed.
pub async fn pull(
    registry: &Registry,
    repo: &RepoName,
    target: &Target,
    dest: &Path,
    options: &PullOptions,
    progress: Arc<dyn Progress>,
) -> Result<PullReport, ClientError> {
    let started = Instant::now();
    let version = volume::open(registry, repo, target).await?;
    let Version { digest, tree, .. } = version;
    let tree = Arc::new(tree);
    let dest = dest.to_path_buf();

    let seeds = Arc::new(SeedIndex::build(&options.seeds));
    let (files, t, s) = (Arc::clone(&tree), dest.clone(), Arc::clone(&seeds));
    let targets = tokio::task::spawn_blocking(move || prepare(&t, &files, &s))
        .await
        .map_err(ClientError::task("prepare"))??;
    let targets = Arc::new(targets);
    progress.event(Event::Scanned {
        files: targets.len() as u64,
        bytes: tree.total_bytes(),
    });

    // Where each chunk goes: (file index, offset). Files linked from a seed are complete.
    let mut wanted: Places = HashMap::new();
    let mut file_index = 0;
    let mut linked_bytes = 0;
    for e in &tree.entries {
        if let EntryKind::File { chunks, size, .. } = &e.kind {
            if targets[file_index].linked {
                linked_bytes += size;
                file_index += 1;
                continue;
            }
            let mut offset = 0;
            for &c in chunks {
                wanted.entry(c).or_default().push((file_index, offset));
                offset += tree.chunks[c as usize].size;
            }
            file_index += 1;
        }
    }
    let files_linked = targets.iter().filter(|t| t.linked).count() as u64;

    // Keep only the places whose bytes are not already right, then fill what seeds hold.
    let (t, tr, w, s) = (
        Arc::clone(&targets),
        Arc::clone(&tree),
        wanted,
        Arc::clone(&seeds),
    );
    let (wanted, present_bytes, copied_bytes) = tokio::task::spawn_blocking(move || {
        let (wanted, present) = verify_existing(&t, &tr, w)?;
        let (wanted, copied) = copy_from_seeds(&t, &tr, wanted, &s)?;
        Ok::<_, ClientError>((wanted, present, copied))
    })
    .await
    .map_err(ClientError::task("verify"))??;
    progress.event(Event::Hashed(present_bytes + linked_bytes + copied_bytes));
    let needed: u64 = wanted.keys().map(|c| tree.chunks[*c as usize].size).sum();
    progress.event(Event::Needed(needed));

    let downloaded = Arc::new(AtomicU64::new(0));
    // In chunk-table order, which is the order of first use: consecutive chunks are usually
    // consecutive in a pack too, so a run of them is one read at the registry.
    let mut order: Vec<(u32, Vec<(usize, u64)>)> = wanted.into_iter().collect();
    order.sort_by_key(|(c, _)| *c);
    let chunks_downloaded = order.len() as u64;
    let writer = Arc::new(Writer::new(Arc::clone(&targets), &order, &tree));
    let runs = across_files(into_runs(&tree, order));
    // Each run is a task of its own, on the runtime's workers beside the connection tasks that
    // receive its bytes: polled from the caller's thread instead (`block_on` in the CLI), every
    // body frame woke that thread from a worker, a context switch per frame (a quarter of a
    // 4 GiB pull's switches). Dropping the pull aborts the runs in flight.
    let mut runs = runs.into_iter();
    let mut tasks = tokio::task::JoinSet::new();
    let mut failed: Option<ClientError> = None;
    loop {
        while failed.is_none() && tasks.len() < options.runs.max(1) {
            let Some(run) = runs.next() else { break };
            let (registry, repo, tree, writer, progress, downloaded) = (
                registry.clone(),
                repo.clone(),
                Arc::clone(&tree),
                Arc::clone(&writer),
                Arc::clone(&progress),
                Arc::clone(&downloaded),
            );
            tasks.spawn(async move {
                fetch_run(
                    &registry,
                    &repo,
                    &tree,
                    run,
                    &writer,
                    &*progress,
                    &downloaded,
                )
                .await
            });
        }
        let Some(joined) = tasks.join_next().await else {
            break;
        };
        let result = joined
            .map_err(ClientError::task("download"))
            .and_then(|r| r);
        // The first failure stops new runs; those in flight finish, and it is reported.
        if let Err(e) = result {
            failed.get_or_insert(e);
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }

    let t = Arc::clone(&targets);
    let tr = Arc::clone(&tree);
    let fsync = options.fsync;
    tokio::task::spawn_blocking(move || finish(&t, &dest, &tr, fsync))
        .await
        .map_err(ClientError::task("finish"))??;

    Ok(PullReport {
        digest: digest.to_string(),
        files: targets.len() as u64,
        bytes: tree.total_bytes(),
        chunks: tree.chunks.len() as u64,
        chunks_downloaded,
        bytes_downloaded: downloaded.load(Ordering::Relaxed),
        bytes_already_present: present_bytes,
        bytes_reused: linked_bytes + copied_bytes,
        files_linked,
        seconds: started.elapsed().as_secs_f64(),
        tree: Some(Arc::clone(&tree)),
    })
}

/// Where a file is written until it is complete: `.<name>.vial-part` beside it, or, for a name
/// too long to take the decoration (a file system's names stop at 255 bytes),
/// `.vial-part-<hash of the name>`.
fn part_path(final_path: &Path) -> PathBuf {
    let name = final_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let part = format!(".{name}.vial-part");
    if part.len() <= 255 {
        return final_path.with_file_name(part);
    }
    let hash = Algorithm::Sha256.digest_bytes(name.as_bytes());
    final_path.with_file_name(format!(".vial-part-{}", &hash.hex()[..32]))
}

/// Creates directories and symlinks, and creates every file to be written (in an empty `dest`,
/// files with bytes are created by their first write instead: nothing there needs checking, and
/// a pull of many small files spends most of its time in the file system's calls). Refuses to
/// follow anything in `dest` that is not what the tree says (a symlink where a directory should
/// be, for instance).
fn prepare(dest: &Path, tree: &Tree, seeds: &SeedIndex) -> Result<Vec<FileTarget>, ClientError> {
    let empty = match std::fs::read_dir(dest) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(ClientError::io(dest, e)),
    };
    std::fs::create_dir_all(dest).map_err(|e| ClientError::io(dest, e))?;
    let mut targets = Vec::new();
    for e in &tree.entries {
        let path = dest.join(&e.path);
        // In an empty destination only this pull makes anything.
        let existing = if empty {
            None
        } else {
            std::fs::symlink_metadata(&path).ok()
        };
        match &e.kind {
            EntryKind::Dir { .. } => match existing {
                Some(m) if m.is_dir() => {}
                Some(_) => {
                    return Err(ClientError::InTheWay {
                        path,
                        why: "it is not a directory",
                    })
                }
                None => std::fs::create_dir(&path).map_err(|e| ClientError::io(&path, e))?,
            },
            EntryKind::Symlink { target } => {
                if let Some(m) = existing {
                    if m.is_dir() {
                        return Err(ClientError::InTheWay {
                            path,
                            why: "it is a directory, not a symlink",
                        });
                    }
                    std::fs::remove_file(&path).map_err(|e| ClientError::io(&path, e))?;
                }
                std::os::unix::fs::symlink(target, &path).map_err(|e| ClientError::io(&path, e))?;
            }
            EntryKind::File { mode, size, chunks } => {
                let complete = existing
                    .as_ref()
                    .is_some_and(|m| m.is_file() && m.len() == *size);
                if existing.as_ref().is_some_and(|m| m.is_dir()) {
                    return Err(ClientError::InTheWay {
                        path,
                        why: "it is a directory, not a file",
                    });
                }
                // A seed holding this very content: link it (or find it linked by a pull that
                // was interrupted). Where links cannot be made (another filesystem), its chunks
                // are still copied from it below.
                let seed = seeds.file(tree, *mode, *size, chunks);
                let linked = seed.is_some_and(|from| match &existing {
                    None => std::fs::hard_link(from, &path).is_ok(),
                    Some(m) => std::fs::metadata(from).is_ok_and(|f| {
                        use std::os::unix::fs::MetadataExt;
                        (f.dev(), f.ino()) == (m.dev(), m.ino())
                    }),
                });
                if linked {
                    targets.push(FileTarget {
                        write_to: path.clone(),
                        final_path: path,
                        mode: *mode,
                        fresh: false,
                        unmade: false,
                        linked: true,
                    });
                    continue;
                }
                let unmade = empty && *size > 0;
                let (write_to, fresh) = if complete {
                    (path.clone(), false)
                } else if unmade {
                    (part_path(&path), true)
                } else {
                    let part = part_path(&path);
                    let had_part = std::fs::symlink_metadata(&part).is_ok_and(|m| m.is_file());
                    let f = OpenOptions::new()
                        .create(true)
                        .truncate(false)
                        .write(true)
                        .open(&part)
                        .map_err(|e| ClientError::io(&part, e))?;
                    f.set_len(*size).map_err(|e| ClientError::io(&part, e))?;
                    (part, !had_part)
                };
                targets.push(FileTarget {
                    write_to,
                    final_path: path,
                    mode: *mode,
                    fresh,
                    unmade,
                    linked: false,
                });
            }
        }
    }
    Ok(targets)
}

/// Opens a file being pulled to write into it, creating it only if [`prepare`] left that to its
/// first write: a part file that vanished mid-pull is an error, never a new file with holes.
fn open_to_write(t: &FileTarget) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(t.unmade)
        .truncate(false)
        .open(&t.write_to)
}

/// Drops from `wanted` every place whose bytes on disk already hash to the chunk's digest. Files
/// are read one at a time, each once, in order.
fn verify_existing(
    targets: &[FileTarget],
    tree: &Tree,
    mut wanted: Places,
) -> Result<(Places, u64), ClientError> {
    let mut to_check: Vec<(usize, u64, u32)> = Vec::new();
    for (chunk, places) in &wanted {
        for &(file, offset) in places {
            if !targets[file].fresh {
                to_check.push((file, offset, *chunk));
            }
        }
    }
    to_check.sort_unstable();
    let mut present = 0;
    let mut open: Option<(usize, File)> = None;
    let mut buf = Vec::new();
    for (file, offset, chunk) in to_check {
        let t = &targets[file];
        let f = match &open {
            Some((at, f)) if *at == file => f,
            _ => {
                let f = File::open(&t.write_to).map_err(|e| ClientError::io(&t.write_to, e))?;
                &open.insert((file, f)).1
            }
        };
        let c = &tree.chunks[chunk as usize];
        buf.resize(c.size as usize, 0);
        if f.read_exact_at(&mut buf, offset).is_ok() && matches_digest(&buf, &c.digest) {
            present += c.size;
            if let Some(places) = wanted.get_mut(&chunk) {
                places.retain(|&p| p != (file, offset));
            }
        }
    }
    wanted.retain(|_, places| !places.is_empty());
    Ok((wanted, present))
}

/// Writes every wanted chunk a seed holds from the seed's file into its places, and drops it from
/// `wanted`. Returns what is left to fetch and the bytes copied (counted once per chunk).
///
/// Unchanged stretches of a changed file are usually unchanged stretches of the seed's file too:
/// pieces that follow each other in both are copied as one range, in the kernel
/// (`copy_file_range(2)` through `std::io::copy`), not chunk by chunk through a buffer.
fn copy_from_seeds(
    targets: &[FileTarget],
    tree: &Tree,
    mut wanted: Places,
    seeds: &SeedIndex,
) -> Result<(Places, u64), ClientError> {
    if seeds.chunks.is_empty() {
        return Ok((wanted, 0));
    }
    // (target file, offset there, length, seed file, offset there), one per place.
    let mut pieces: Vec<(usize, u64, u64, &Path, u64)> = Vec::new();
    let mut copied = 0;
    let held: Vec<u32> = wanted
        .keys()
        .copied()
        .filter(|c| seeds.chunks.contains_key(&tree.chunks[*c as usize].digest))
        .collect();
    for chunk in held {
        let c = &tree.chunks[chunk as usize];
        let Some((path, offset)) = seeds.chunks.get(&c.digest) else {
            continue;
        };
        let Some(places) = wanted.remove(&chunk) else {
            continue;
        };
        for (file, at) in places {
            pieces.push((file, at, c.size, path.as_path(), *offset));
        }
        copied += c.size;
    }
    pieces.sort_by_key(|p| (p.0, p.1));
    let mut ranges: Vec<(usize, u64, u64, &Path, u64)> = Vec::new();
    for p in pieces {
        match ranges.last_mut() {
            Some(r) if r.0 == p.0 && r.1 + r.2 == p.1 && r.3 == p.3 && r.4 + r.2 == p.4 => {
                r.2 += p.2;
            }
            _ => ranges.push(p),
        }
    }
    // Ranges go in target file order, so one target is open at a time; seed files come in any
    // order, and a bounded table keeps the recent ones open.
    let sources: fds::Handles<&Path> = fds::Handles::new(fds::budget());
    let mut sink: Option<(usize, File)> = None;
    for (file, at, len, path, offset) in ranges {
        let t = &targets[file];
        let source = sources
            .get(&path, || File::open(path))
            .map_err(|e| ClientError::io(path, e))?;
        let to = match &sink {
            Some((open, f)) if *open == file => f,
            _ => {
                let f = open_to_write(t).map_err(|e| ClientError::io(&t.write_to, e))?;
                &sink.insert((file, f)).1
            }
        };
        copy_range(&source, offset, to, at, len).map_err(|e| ClientError::io(&t.write_to, e))?;
    }
    Ok((wanted, copied))
}

/// Copies `len` bytes at `from_offset` of `from` to `to_offset` of `to`; a source shorter than
/// that (a seed file changed under us) is an error.
///
/// On filesystems that share extents (XFS, btrfs), `copy_file_range(2)` clones block-aligned
/// ranges instead of copying them, so a range whose two offsets sit at the same place within a
/// block is copied as a head up to the next block boundary, a block-aligned middle (cloned there,
/// copied elsewhere) and a tail. Unchanged tensors of a changed safetensors file usually sit at
/// the same offsets in both versions.
fn copy_range(
    from: &File,
    from_offset: u64,
    to: &File,
    to_offset: u64,
    len: u64,
) -> std::io::Result<()> {
    const BLOCK: u64 = 4096;
    if from_offset % BLOCK == to_offset % BLOCK && len >= 2 * BLOCK {
        let head = (BLOCK - from_offset % BLOCK) % BLOCK;
        let middle = (len - head) / BLOCK * BLOCK;
        let tail = len - head - middle;
        for (at, n) in [(0, head), (head, middle), (head + middle, tail)] {
            if n > 0 {
                copy_exact(from, from_offset + at, to, to_offset + at, n)?;
            }
        }
        return Ok(());
    }
    copy_exact(from, from_offset, to, to_offset, len)
}

fn copy_exact(
    from: &File,
    from_offset: u64,
    to: &File,
    to_offset: u64,
    len: u64,
) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let (mut from, mut to) = (from, to);
    from.seek(SeekFrom::Start(from_offset))?;
    to.seek(SeekFrom::Start(to_offset))?;
    let n = std::io::copy(&mut from.take(len), &mut to)?;
    if n != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("a seed file ended {} bytes early", len - n),
        ));
    }
    Ok(())
}

fn matches_digest(bytes: &[u8], digest: &Digest) -> bool {
    let algorithm: Algorithm = digest.algorithm();
    &algorithm.digest_bytes(bytes) == digest
}

/// Gives written files their modes and final names (durable first with `fsync`), then fixes
/// directory modes.
fn finish(
    targets: &[FileTarget],
    dest: &Path,
    tree: &Tree,
    fsync: bool,
) -> Result<(), ClientError> {
    let written: Vec<&FileTarget> = targets.iter().filter(|t| !t.linked).collect();
    // Two threads: with many small files this is mostly the kernel's time, and directories
    // apart take their renames at once.
    let half = written.len().div_ceil(2).max(1);
    std::thread::scope(|scope| {
        let parts: Vec<_> = written
            .chunks(half)
            .map(|part| scope.spawn(move || finish_files(part, fsync)))
            .collect();
        parts
            .into_iter()
            .try_for_each(|p| p.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
    })?;
    for e in &tree.entries {
        if let EntryKind::Dir { mode } = e.kind {
            let path = dest.join(&e.path);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| ClientError::io(&path, e))?;
        }
    }
    Ok(())
}

/// Gives each file its mode and its final name, durable first with `fsync`.
fn finish_files(targets: &[&FileTarget], fsync: bool) -> Result<(), ClientError> {
    for t in targets {
        if fsync {
            let f = File::open(&t.write_to).map_err(|e| ClientError::io(&t.write_to, e))?;
            f.sync_all().map_err(|e| ClientError::io(&t.write_to, e))?;
        }
        std::fs::set_permissions(&t.write_to, std::fs::Permissions::from_mode(t.mode))
            .map_err(|e| ClientError::io(&t.write_to, e))?;
        if t.write_to != t.final_path {
            std::fs::rename(&t.write_to, &t.final_path)
                .map_err(|e| ClientError::io(&t.final_path, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of one chunk that goes to `file`.
    fn run(chunk: u32, file: usize) -> Run {
        vec![(chunk, vec![(file, 0)])]
    }

    #[test]
    fn part_files_of_names_at_the_limit_stay_within_it() {
        let short = part_path(Path::new("/d/model.bin"));
        assert_eq!(short, Path::new("/d/.model.bin.vial-part"));
        let long = "n".repeat(255);
        let part = part_path(&Path::new("/d").join(&long));
        let name = part.file_name().unwrap().len();
        assert!(name <= 255, "{name} bytes");
        assert_ne!(part, part_path(&Path::new("/d").join("m".repeat(255))));
    }

    #[test]
    fn runs_take_turns_between_files_and_each_file_keeps_its_order() {
        let runs = vec![
            run(0, 0),
            run(1, 0),
            run(2, 0),
            run(3, 1),
            run(4, 1),
            run(5, 2),
        ];
        let order: Vec<u32> = across_files(runs).iter().map(|r| r[0].0).collect();
        assert_eq!(order, [0, 3, 5, 1, 4, 2]);
    }
}
