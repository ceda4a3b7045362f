//! Upload bytes written to disk with O_DIRECT where the filesystem takes it.
//!
//! A buffered write copies every byte into page-cache pages the kernel must first find and
//! charge, then writes them back while the next bytes arrive, and the fsync that publishes the
//! blob waits for all of it. On the machines vial is measured on that costs more CPU than hashing
//! the bytes: 2 GiB written and fdatasynced took 2.2-2.9 s of CPU buffered and 0.1-0.2 s with
//! O_DIRECT, and reached the disk 2-3× sooner (docs/performance.md). A blob just uploaded is
//! rarely read again before it has left the page cache anyway.
//!
//! Body frames arrive at any length and alignment, so they are gathered into a page-aligned
//! staging buffer and written a block-aligned MiB at a time. The last partial block is written
//! padded with zeros and the file cut back to its length. Where the filesystem refuses O_DIRECT
//! (tmpfs, some network filesystems), or an upload resumes at an offset that is not block aligned,
//! the writes are ordinary ones; so are those of uploads beyond the 16 that have a staging buffer.
//! Either way the bytes are durable only after the caller's fsync.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

use vial_io::{Aligned, ALIGN};

/// Bytes gathered before each write: large enough to keep the disk streaming, small enough that
/// dozens of concurrent uploads stay within a few tens of MiB.
const STAGE: usize = 1 << 20;
/// Staging buffers there may be at once, which bounds their memory (16 MiB). They are made when
/// first needed and kept for reuse (memory touched for the first time costs a page fault per
/// 4 KiB); an upload that finds none free is written the ordinary way.
const STAGES: usize = 16;

/// The staging buffers not in use, and how many were made.
static POOL: Mutex<(Vec<Stage>, usize)> = Mutex::new((Vec::new(), 0));

/// A page-aligned buffer of [`STAGE`] bytes; back to the pool when dropped.
#[derive(Debug)]
struct Stage(Aligned);

impl Stage {
    fn take() -> Option<Stage> {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stage) = pool.0.pop() {
            return Some(stage);
        }
        if pool.1 == STAGES {
            return None;
        }
        pool.1 += 1;
        drop(pool);
        Some(Stage(Aligned::new(STAGE)))
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.0.bytes_mut()[..STAGE]
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        if !buf.bytes().is_empty() {
            POOL.lock()
                .unwrap_or_else(|e| e.into_inner())
                .0
                .push(Stage(buf));
        }
    }
}

/// Direct writes in progress: the O_DIRECT handle and the bytes staged since the writer's `at`.
#[derive(Debug)]
struct Direct {
    file: File,
    stage: Stage,
    filled: usize,
}

/// Appends to an upload file from `offset` on.
#[derive(Debug)]
pub(super) struct UploadWriter {
    file: File,
    direct: Option<Direct>,
    /// Where the next byte goes (staged bytes included).
    end: u64,
    /// File offset of the first staged byte.
    at: u64,
}

impl UploadWriter {
    /// Opens `path` (which must exist) for appending at `offset`. Fails with `NotFound` if it does
    /// not exist; the caller checks that `offset` is the file's current length.
    pub(super) fn open(path: &Path, offset: u64) -> std::io::Result<(UploadWriter, u64)> {
        let mut file = OpenOptions::new().write(true).open(path)?;
        let actual = file.metadata()?.len();
        file.seek(SeekFrom::Start(offset))?;
        let stage = if offset.is_multiple_of(ALIGN as u64) {
            Stage::take()
        } else {
            None
        };
        let direct = match stage {
            Some(stage) => match OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(file) => Some(Direct {
                    file,
                    stage,
                    filled: 0,
                }),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => None,
                Err(e) => return Err(e),
            },
            None => None,
        };
        let writer = UploadWriter {
            file,
            direct,
            end: offset,
            at: offset,
        };
        Ok((writer, actual))
    }

    /// Appends `bytes`.
    pub(super) fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        self.end += bytes.len() as u64;
        while !bytes.is_empty() {
            let Some(d) = self.direct.as_mut() else {
                return self.file.write_all(bytes);
            };
            let n = (STAGE - d.filled).min(bytes.len());
            d.stage.bytes()[d.filled..d.filled + n].copy_from_slice(&bytes[..n]);
            d.filled += n;
            bytes = &bytes[n..];
            if d.filled == STAGE {
                self.flush_stage()?;
            }
        }
        Ok(())
    }

    /// Writes the staged bytes at `at`, a last partial block padded with zeros (which `finish`
    /// cuts off again).
    fn flush_stage(&mut self) -> std::io::Result<()> {
        let Some(d) = self.direct.as_mut() else {
            return Ok(());
        };
        let padded = d.filled.div_ceil(ALIGN) * ALIGN;
        let filled = d.filled;
        let stage = d.stage.bytes();
        stage[filled..padded].fill(0);
        match d.file.write_all_at(&stage[..padded], self.at) {
            Ok(()) => {}
            // The filesystem took the flag but not the write: go on with ordinary writes.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.file.write_all_at(&stage[..filled], self.at)?;
                self.file.seek(SeekFrom::Start(self.at + filled as u64))?;
                self.direct = None;
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        self.at += filled as u64;
        d.filled = 0;
        Ok(())
    }

    /// Writes whatever is staged and cuts off the padding; returns the length written to.
    pub(super) fn finish(mut self) -> std::io::Result<u64> {
        if self.direct.is_some() {
            self.flush_stage()?;
            if self.file.metadata()?.len() != self.end {
                self.file.set_len(self.end)?;
            }
        }
        Ok(self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vial_core::chunking::noise;

    /// The tests that count on staging buffers take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn append(path: &Path, offset: u64, frames: &[&[u8]]) -> u64 {
        let (mut w, actual) = UploadWriter::open(path, offset).unwrap();
        assert_eq!(actual, offset);
        for f in frames {
            w.write(f).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn frames_of_any_size_land_whole_at_any_offset() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        // Beside the sources rather than in /tmp, which may be a tmpfs without O_DIRECT.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("upload");
        let data = noise(3 * STAGE + 12_345, 1);
        File::create(&path).unwrap();
        let (writer, _) = UploadWriter::open(&path, 0).unwrap();
        assert!(
            writer.direct.is_some(),
            "this test's directory takes O_DIRECT"
        );
        drop(writer);
        // Odd frame sizes, a first append that ends mid-block, and a second that resumes there
        // (ordinary writes), then one that resumes on a block boundary (direct again).
        let first = STAGE + 777;
        let frames: Vec<&[u8]> = data[..first].chunks(100_003).collect();
        assert_eq!(append(&path, 0, &frames), first as u64);
        let second = 2 * STAGE;
        assert_eq!(
            append(&path, first as u64, &[&data[first..second]]),
            second as u64
        );
        assert_eq!(
            append(&path, second as u64, &[&data[second..]]),
            data.len() as u64
        );
        assert_eq!(std::fs::read(&path).unwrap(), data);
    }

    #[test]
    fn uploads_beyond_the_staging_buffers_are_written_the_ordinary_way() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let data = noise(STAGE + 4321, 2);
        let mut writers = Vec::new();
        // Uploads of the fs store's tests may hold some buffers too, so the ordinary writer
        // comes at the latest once all of them are out.
        for i in 0..=STAGES {
            let path = dir.path().join(format!("upload-{i}"));
            File::create(&path).unwrap();
            let (w, _) = UploadWriter::open(&path, 0).unwrap();
            let plain = w.direct.is_none();
            writers.push((path, w));
            if plain {
                break;
            }
        }
        assert!(writers.last().unwrap().1.direct.is_none());
        assert!(writers.len() <= STAGES + 1);
        for (path, mut w) in writers {
            w.write(&data).unwrap();
            assert_eq!(w.finish().unwrap(), data.len() as u64);
            assert_eq!(std::fs::read(&path).unwrap(), data);
        }
    }

    #[test]
    fn an_empty_append_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("upload");
        std::fs::write(&path, b"").unwrap();
        assert_eq!(append(&path, 0, &[]), 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }
}
