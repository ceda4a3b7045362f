//! The second stage of a push: threads that read files and cut them into chunks.

use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use vial_core::chunking::Cutter;
use vial_core::safetensors::Segment;

use super::work::{FileJob, Hashed, Stats};
use crate::chunker::{self, FileChunk, ReadBuffers};
use crate::progress::{Event, Progress};
use crate::ClientError;

/// Plans and chunks every file that the local index could not vouch for, on `threads` threads.
/// Files known from the index are announced whole, so their chunks are still checked.
///
/// A file is opened when a hasher takes it up and closed when its last segment is chunked: a
/// hasher takes up a new file only when no segment of an open one is waiting, so at most about
/// two files per thread are open, however many the directory holds.
pub(super) fn hash_all(
    files: &[FileJob],
    cutter: &Cutter,
    threads: usize,
    buffers: &ReadBuffers,
    tx: &mpsc::Sender<Hashed>,
    progress: &dyn Progress,
    stats: &Stats,
) -> Result<(), ClientError> {
    let mut to_read = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let Some(cached) = &f.cached else {
            to_read.push(i);
            continue;
        };
        let mut offset = 0;
        let chunks = cached
            .iter()
            .map(|c| {
                let fc = FileChunk {
                    offset,
                    len: c.size,
                    digest: c.digest.clone(),
                };
                offset += c.size;
                (fc, None)
            })
            .collect();
        progress.event(Event::Hashed(f.stamp.size));
        tx.blocking_send((i, 0, chunks))
            .map_err(|_| ClientError::Cancelled)?;
    }
    let work = std::sync::Mutex::new(Work {
        next: 0,
        waiting: std::collections::VecDeque::new(),
    });
    let failed = std::sync::atomic::AtomicBool::new(false);
    let hasher = || -> Result<(), ClientError> {
        while !failed.load(Ordering::Relaxed) {
            let taken = {
                let mut w = work.lock().unwrap_or_else(|p| p.into_inner());
                match w.waiting.pop_front() {
                    Some(job) => Ok(job),
                    None if w.next < to_read.len() => {
                        w.next += 1;
                        Err(to_read[w.next - 1])
                    }
                    None => return Ok(()),
                }
            };
            let (open, seg, segment) = match taken {
                Ok(job) => job,
                Err(file) => {
                    let (open, mut segments) = open_file(file, &files[file])?;
                    let Some((seg, segment)) = segments.next() else {
                        open.finished(&files[file])?;
                        continue;
                    };
                    work.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .waiting
                        .extend(segments.map(|(seg, s)| (Arc::clone(&open), seg, s)));
                    (open, seg, segment)
                }
            };
            let f = &files[open.file];
            chunker::chunk_segment_owned(
                &f.abs,
                &open.reader,
                open.direct,
                &segment,
                cutter,
                buffers,
                &mut |cut| {
                    let n: u64 = cut.iter().map(|(c, _)| c.len).sum();
                    stats.bytes_read.fetch_add(n, Ordering::Relaxed);
                    progress.event(Event::Hashed(n));
                    let cut = cut.into_iter().map(|(c, b)| (c, Some(b))).collect();
                    tx.blocking_send((open.file, seg, cut))
                        .map_err(|_| ClientError::Cancelled)
                },
            )?;
            if open.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                open.finished(f)?;
            }
        }
        Ok(())
    };
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let r = hasher();
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let mut result = Ok(());
        for w in workers {
            let r = w
                .join()
                .unwrap_or_else(|_| Err(ClientError::Panicked("hashing")));
            if result.is_ok() {
                result = r;
            }
        }
        result
    })
}

/// What the hashers share: the next file to take up, and segments of open files nobody has
/// taken yet.
struct Work {
    next: usize,
    waiting: std::collections::VecDeque<(Arc<OpenFile>, usize, Segment)>,
}

/// A file being chunked, open while any of its segments is.
struct OpenFile {
    file: usize,
    reader: File,
    direct: bool,
    /// Segments not chunked yet.
    left: AtomicUsize,
}

impl OpenFile {
    /// Checks, once every segment is chunked, that the file still has the size the scan saw: a
    /// file that changed size would make a tree that lies about it.
    fn finished(&self, job: &FileJob) -> Result<(), ClientError> {
        let now = self
            .reader
            .metadata()
            .map_err(|e| ClientError::io(&*job.abs, e))?
            .len();
        if now != job.stamp.size {
            return Err(ClientError::ChangedDuringPush {
                paths: vec![job.abs.to_path_buf()],
                how: format!("{} bytes when scanned, {now} now", job.stamp.size),
            });
        }
        Ok(())
    }
}

/// Opens a file to chunk and plans its segments (a safetensors file's are its tensors).
fn open_file(
    file: usize,
    job: &FileJob,
) -> Result<(Arc<OpenFile>, impl Iterator<Item = (usize, Segment)>), ClientError> {
    let handle = File::open(&*job.abs).map_err(|e| ClientError::io(&*job.abs, e))?;
    let segments = chunker::plan_file(&job.abs, &handle, job.stamp.size)?;
    let (reader, direct) = chunker::reader_for(&job.abs, handle, job.stamp.size)?;
    let open = Arc::new(OpenFile {
        file,
        reader,
        direct,
        left: AtomicUsize::new(segments.len()),
    });
    Ok((open, segments.into_iter().enumerate()))
}
