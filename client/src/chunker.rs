//! Reads files from disk into chunks, with the format's chunker ([`vial_core::chunker`]) doing the
//! planning and cutting through positional reads of the open file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;
pub use vial_core::chunker::FileChunk;
use vial_core::chunker::{self, ReadAt};
use vial_core::chunking::Cutter;
use vial_core::safetensors::{Segment, SegmentKind};
use vial_core::{Algorithm, Digest};

use crate::ClientError;
use vial_io::{Aligned, ALIGN};

/// Positional reads of a file being pushed.
struct OnDisk<'a> {
    path: &'a Path,
    file: &'a File,
}

impl ReadAt for OnDisk<'_> {
    type Error = ClientError;

    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> Result<(), ClientError> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                file_shrank(self.path)
            } else {
                ClientError::io(self.path, e)
            }
        })
    }
}

/// Splits a file into the segments that are chunked independently.
pub fn plan_file(path: &Path, file: &File, size: u64) -> Result<Vec<Segment>, ClientError> {
    chunker::plan(&path.to_string_lossy(), &mut OnDisk { path, file }, size)
}

/// Bytes read per fill of a [`ReadBuffers`] buffer (which also holds the unfinished chunk
/// carried over from the previous fill, up to the largest chunk).
const FILL: usize = 8 << 20;
/// Files at least this large are read with O_DIRECT where the filesystem takes it.
const DIRECT_MIN: u64 = 16 << 20;

/// The handle to chunk `path` with, given the one it was planned with: a new one with O_DIRECT if
/// the file is large and the filesystem takes the flag (the bytes then go from the disk into
/// `vial push`'s own buffers, without filling the page cache with a checkpoint it will not read
/// again), else the one given. Says which.
pub fn reader_for(path: &Path, planned: File, size: u64) -> Result<(File, bool), ClientError> {
    use std::os::unix::fs::OpenOptionsExt;
    if size >= DIRECT_MIN {
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(ClientError::io(path, e)),
        }
    }
    Ok((planned, false))
}

/// A fixed number of page-aligned read buffers, shared by the hashing threads. The chunks cut
/// from a buffer are handed on as [`Bytes`] slices of it, so it comes back only when the last of
/// them is dropped (checked present, or uploaded); a thread that needs a buffer while all are out
/// waits. That bounds the bytes a push holds in memory, and lets the bytes read for hashing be
/// the bytes uploaded, without reading them again.
#[derive(Clone, Debug)]
pub struct ReadBuffers {
    shared: std::sync::Arc<(std::sync::Mutex<Pool>, std::sync::Condvar)>,
    len: usize,
    /// Told whenever a thread has to wait for a buffer, so that whoever holds chunks back (a
    /// pack waiting to fill) can let them go.
    starved: std::sync::Arc<tokio::sync::Notify>,
    /// The chunk of zeros, worked out on first use (`None` if the cutter never cuts zeros).
    zeros: std::sync::Arc<std::sync::OnceLock<Option<Zeros>>>,
}

#[derive(Debug)]
struct Pool {
    free: Vec<Aligned>,
    /// Buffers not yet allocated (allocated on first need, so a small push stays small).
    unmade: usize,
}

/// A buffer out of its pool (or a one-off for an outsized segment); returns on drop.
#[derive(Debug)]
struct Lent {
    buf: Aligned,
    pool: Option<ReadBuffers>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.buf.bytes()
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            let (lock, ready) = &*pool.shared;
            let mut p = lock.lock().unwrap_or_else(|e| e.into_inner());
            p.free.push(std::mem::take(&mut self.buf));
            ready.notify_one();
        }
    }
}

impl ReadBuffers {
    /// `count` buffers, each large enough for a fill plus the largest chunk `cutter` makes.
    pub fn new(cutter: &Cutter, count: usize) -> Self {
        let pool = Pool {
            free: Vec::new(),
            unmade: count.max(1),
        };
        ReadBuffers {
            shared: std::sync::Arc::new((std::sync::Mutex::new(pool), std::sync::Condvar::new())),
            len: Self::buffer_len(cutter),
            starved: std::sync::Arc::new(tokio::sync::Notify::new()),
            zeros: std::sync::Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// The chunk a run of zeros is cut into, once worked out.
    fn zeros(&self, cutter: &Cutter) -> Option<&Zeros> {
        self.zeros.get_or_init(|| Zeros::new(cutter)).as_ref()
    }

    /// Notified each time a thread starts waiting for a buffer.
    pub fn starved(&self) -> std::sync::Arc<tokio::sync::Notify> {
        std::sync::Arc::clone(&self.starved)
    }

    /// Bytes held by all the buffers.
    pub fn capacity_bytes(count: usize, cutter: &Cutter) -> u64 {
        // Each buffer's storage has a page of slack in front, to start it on a page boundary.
        (count * (Self::buffer_len(cutter) + ALIGN)) as u64
    }

    /// The usable bytes of each buffer: a fill, the largest chunk carried over from the fill
    /// before, and a block of slack at each end for O_DIRECT's alignment.
    fn buffer_len(cutter: &Cutter) -> usize {
        FILL + cutter.params().max + 2 * ALIGN
    }

    /// A buffer, waiting for one to come back if all are out.
    fn take(&self) -> Lent {
        let (lock, ready) = &*self.shared;
        let mut p = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(buf) = p.free.pop() {
                return self.lend(buf);
            }
            if p.unmade > 0 {
                p.unmade -= 1;
                drop(p);
                return self.lend(Aligned::new(self.len));
            }
            self.starved.notify_one();
            p = ready.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn lend(&self, buf: Aligned) -> Lent {
        Lent {
            buf,
            pool: Some(self.clone()),
        }
    }
}

/// Zero chunks handed on at once from a hole.
const ZERO_BATCH: u64 = 1024;

/// What the chunker makes of zeros: a chunk that starts in a run of zeros at least `max + 1` long
/// is always the same `len` bytes (the gear hash of zeros settles after 64 bytes, so the cut falls
/// at the same place each time). A sparse file's holes read as zeros by definition, so their
/// chunks are known from where the holes are, without reading or hashing 100 GiB of nothing. Only
/// holes take this path; zeros written out are read as any other bytes (the same chunks either
/// way).
#[derive(Debug)]
pub(crate) struct Zeros {
    len: u64,
    digest: Digest,
    bytes: Bytes,
    max: u64,
}

impl Zeros {
    fn new(cutter: &Cutter) -> Option<Zeros> {
        let max = cutter.params().max;
        let zeros = vec![0u8; max + 1];
        let len = cutter.next_cut(&zeros, false)?;
        let bytes = Bytes::from(vec![0u8; len]);
        Some(Zeros {
            len: len as u64,
            digest: Algorithm::Sha256.digest_bytes(&bytes),
            bytes,
            max: max as u64,
        })
    }

    /// How many zero chunks start at `offset`, one after another, inside a hole of `file` and
    /// before `end`: each must have a whole maximum-sized chunk's worth of hole (and one byte
    /// more) ahead of it, so that the cutter would find the same cut in the bytes.
    fn chunks_at(&self, file: &File, offset: u64, end: u64) -> u64 {
        use rustix::fs::{seek, SeekFrom};
        // The next byte that is not in a hole; none (ENXIO) means a hole up to the end of the
        // file. Filesystems without holes answer `offset` itself.
        let data = match seek(file, SeekFrom::Data(offset)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => end,
            Err(_) => return 0,
        };
        // Chunk `i` starts at `offset + i * len` and needs its `max + 1` bytes inside the hole.
        data.min(end)
            .saturating_sub(offset + self.max)
            .div_ceil(self.len)
    }
}

/// Reads `want` bytes of `file` at `offset` into `buf[at..]`. With `direct`, the read is widened
/// to whole blocks: it starts `offset % ALIGN` bytes before `at` (which the caller placed so that
/// `buf[at - offset % ALIGN]` is block aligned) and may run past `want` into `buf`'s slack.
/// Returns whether the direct read worked (false: the filesystem refused it, and the bytes were
/// read the ordinary way).
fn fill(
    path: &Path,
    file: &File,
    direct: bool,
    buf: &mut [u8],
    at: usize,
    offset: u64,
    want: usize,
) -> Result<bool, ClientError> {
    let shrank = || file_shrank(path);
    if direct {
        let delta = (offset % ALIGN as u64) as usize;
        let from = at - delta;
        let len = (delta + want).div_ceil(ALIGN) * ALIGN;
        let mut got = 0;
        while got < delta + want {
            match file.read_at(
                &mut buf[from + got..from + len],
                offset - delta as u64 + got as u64,
            ) {
                Ok(0) => return Err(shrank()),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && got == 0 => {
                    let mut plain = OnDisk { path, file };
                    plain.read_exact_at(&mut buf[at..at + want], offset)?;
                    return Ok(false);
                }
                Err(e) => return Err(ClientError::io(path, e)),
            }
        }
        return Ok(true);
    }
    OnDisk { path, file }.read_exact_at(&mut buf[at..at + want], offset)?;
    Ok(true)
}

/// Chunks and hashes one segment of a file as [`vial_core::chunker::chunk_segment`] does (the
/// same cuts, so the same chunks), but through buffers of `buffers`, handing each fill's chunks with their bytes to
/// `on_chunks` as they are cut. `direct` says `file` was opened with O_DIRECT.
pub fn chunk_segment_owned(
    path: &Path,
    file: &File,
    mut direct: bool,
    segment: &Segment,
    cutter: &Cutter,
    buffers: &ReadBuffers,
    on_chunks: &mut dyn FnMut(Vec<(FileChunk, Bytes)>) -> Result<(), ClientError>,
) -> Result<(), ClientError> {
    let seg_len = (segment.end - segment.start) as usize;
    if segment.kind == SegmentKind::Single {
        // One chunk: a buffer of the pool if it fills a good part of one, else one of its own
        // (so that a small chunk waiting in a pack does not hold a whole buffer).
        let mut lent = if seg_len >= FILL / 2 && seg_len + 2 * ALIGN <= buffers.len {
            buffers.take()
        } else {
            Lent {
                buf: Aligned::new(seg_len + 2 * ALIGN),
                pool: None,
            }
        };
        let at = (segment.start % ALIGN as u64) as usize;
        fill(
            path,
            file,
            direct,
            lent.buf.bytes_mut(),
            at,
            segment.start,
            seg_len,
        )?;
        let bytes = Bytes::from_owner(lent).slice(at..at + seg_len);
        let chunk = FileChunk {
            offset: segment.start,
            len: seg_len as u64,
            digest: Algorithm::Sha256.digest_bytes(&bytes),
        };
        return on_chunks(vec![(chunk, bytes)]);
    }
    // The bytes read but not yet cut, and the file offset of their first byte.
    let mut carry = Bytes::new();
    let mut base = segment.start;
    let mut next_read = segment.start;
    while next_read < segment.end {
        // At a cut, in a hole of a sparse file: its chunks are known without reading a byte.
        if carry.is_empty() {
            if let Some(zeros) = buffers.zeros(cutter) {
                let count = zeros.chunks_at(file, base, segment.end);
                if count > 0 {
                    let mut left = count;
                    while left > 0 {
                        let batch = left.min(ZERO_BATCH);
                        let cut = (0..batch)
                            .map(|i| {
                                let chunk = FileChunk {
                                    offset: base + i * zeros.len,
                                    len: zeros.len,
                                    digest: zeros.digest.clone(),
                                };
                                (chunk, zeros.bytes.clone())
                            })
                            .collect();
                        on_chunks(cut)?;
                        base += batch * zeros.len;
                        left -= batch;
                    }
                    next_read = base;
                    continue;
                }
            }
        }
        let mut lent = buffers.take();
        let buf = lent.buf.bytes_mut();
        // New bytes go at `at`: past the carry, and where a block-aligned read of `next_read`'s
        // block lands on a block boundary (the bytes of that block before `next_read` are the
        // carry's own last bytes, or fall before it).
        let delta = (next_read % ALIGN as u64) as usize;
        let at = delta + (carry.len().saturating_sub(delta)).div_ceil(ALIGN) * ALIGN;
        let start = at - carry.len();
        let want = ((segment.end - next_read) as usize).min(buffers.len - ALIGN - at);
        direct = fill(path, file, direct, buf, at, next_read, want)?;
        buf[start..at].copy_from_slice(&carry);
        next_read += want as u64;
        let eof = next_read >= segment.end;
        let data = Bytes::from_owner(lent).slice(start..at + want);
        let mut lo = 0;
        let mut cut = Vec::new();
        while let Some(n) = cutter.next_cut(&data[lo..], eof) {
            let bytes = data.slice(lo..lo + n);
            let chunk = FileChunk {
                offset: base,
                len: n as u64,
                digest: Algorithm::Sha256.digest_bytes(&bytes),
            };
            cut.push((chunk, bytes));
            lo += n;
            base += n as u64;
        }
        carry = data.slice(lo..);
        // The end of a segment may fill little of its buffer: copy those chunks out, so that
        // they do not hold the whole buffer while they wait to be checked and sent.
        let cut_bytes: usize = cut.iter().map(|(_, b)| b.len()).sum();
        if eof && cut_bytes < FILL / 2 {
            for (_, bytes) in &mut cut {
                *bytes = Bytes::copy_from_slice(bytes);
            }
        }
        drop(data);
        if !cut.is_empty() {
            on_chunks(cut)?;
        }
    }
    Ok(())
}

/// A file that ended early while a push was reading it.
fn file_shrank(path: &Path) -> ClientError {
    ClientError::ChangedDuringPush {
        paths: vec![path.to_path_buf()],
        how: "it shrank while it was being read".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vial_core::chunking::{noise, DEFAULT_PARAMS};

    /// The owned chunker cuts exactly what the format's chunker cuts, and hands on each chunk's
    /// own bytes, with O_DIRECT and without, for segments that start anywhere.
    #[test]
    fn owned_chunks_are_the_formats_chunks_with_their_bytes() {
        // Beside the sources rather than in /tmp, which may be a tmpfs without O_DIRECT.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("weights.bin");
        let data = noise(45 << 20, 7);
        std::fs::write(&path, &data).unwrap();
        let cutter = Cutter::new(DEFAULT_PARAMS);
        let end = data.len() as u64;
        let segments = [
            Segment {
                start: 0,
                end: 4093,
                kind: SegmentKind::Cdc,
            },
            Segment {
                start: 4093,
                end: 4093 + 777,
                kind: SegmentKind::Single,
            },
            Segment {
                start: 4870,
                end: 21 << 20,
                kind: SegmentKind::Cdc,
            },
            Segment {
                start: 21 << 20,
                end: (21 << 20) + 3,
                kind: SegmentKind::Cdc,
            },
            Segment {
                start: (21 << 20) + 3,
                end,
                kind: SegmentKind::Cdc,
            },
            Segment {
                start: end,
                end,
                kind: SegmentKind::Cdc,
            },
        ];
        for direct in [false, true] {
            let (file, opened_direct) = if direct {
                reader_for(&path, File::open(&path).unwrap(), end).unwrap()
            } else {
                (File::open(&path).unwrap(), false)
            };
            assert_eq!(
                opened_direct, direct,
                "this test's directory takes O_DIRECT"
            );
            let plain = File::open(&path).unwrap();
            // Two buffers: one for the carry, one to fill; so a leak would hang, not pass.
            let buffers = ReadBuffers::new(&cutter, 2);
            for segment in &segments {
                let mut window = vial_core::chunker::Window::for_cutter(&cutter);
                let expected = vial_core::chunker::chunk_segment(
                    &mut OnDisk {
                        path: &path,
                        file: &plain,
                    },
                    segment,
                    &cutter,
                    &mut window,
                    &mut |_, _| Ok(()),
                )
                .unwrap();
                let mut got = Vec::new();
                chunk_segment_owned(
                    &path,
                    &file,
                    direct,
                    segment,
                    &cutter,
                    &buffers,
                    &mut |cut| {
                        for (chunk, bytes) in cut {
                            let at = chunk.offset as usize;
                            assert_eq!(&bytes[..], &data[at..at + chunk.len as usize]);
                            got.push(chunk);
                        }
                        Ok(())
                    },
                )
                .unwrap();
                assert_eq!(got, expected, "segment {segment:?}, direct {direct}");
            }
        }
    }

    /// A sparse file's holes are cut without being read, into exactly the chunks reading them
    /// would give: holes at the start, between data and at the end, in segments that start
    /// anywhere.
    #[test]
    fn holes_are_cut_as_the_zeros_they_read_as() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("sparse.bin");
        let f = File::create(&path).unwrap();
        let len: u64 = 96 << 20;
        f.set_len(len).unwrap();
        f.write_all_at(&noise(300_000, 5), 40 << 20).unwrap();
        f.write_all_at(b"tail", len - 4).unwrap();
        drop(f);
        let file = File::open(&path).unwrap();
        let cutter = Cutter::new(DEFAULT_PARAMS);
        let zeros = Zeros::new(&cutter).unwrap();
        assert!(
            zeros.chunks_at(&file, 0, len) > 0,
            "this test's directory has holes (SEEK_DATA)"
        );
        assert_eq!(zeros.chunks_at(&file, 40 << 20, len), 0, "data is read");
        let buffers = ReadBuffers::new(&cutter, 4);
        for start in [0, 4093, 40 << 20, (40 << 20) + 300_000] {
            let segment = Segment {
                start,
                end: len,
                kind: SegmentKind::Cdc,
            };
            let mut window = vial_core::chunker::Window::for_cutter(&cutter);
            let expected = vial_core::chunker::chunk_segment(
                &mut OnDisk {
                    path: &path,
                    file: &file,
                },
                &segment,
                &cutter,
                &mut window,
                &mut |_, _| Ok(()),
            )
            .unwrap();
            let mut got = Vec::new();
            chunk_segment_owned(
                &path,
                &file,
                false,
                &segment,
                &cutter,
                &buffers,
                &mut |cut| {
                    for (chunk, bytes) in cut {
                        assert_eq!(bytes.len() as u64, chunk.len);
                        assert_eq!(Algorithm::Sha256.digest_bytes(&bytes), chunk.digest);
                        got.push(chunk);
                    }
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(got, expected, "segment from {start}");
        }
    }

    #[test]
    fn a_file_that_shrank_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.bin");
        std::fs::write(&path, noise(20 << 20, 3)).unwrap();
        let (file, direct) = reader_for(&path, File::open(&path).unwrap(), 20 << 20).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(5 << 20)
            .unwrap();
        let cutter = Cutter::new(DEFAULT_PARAMS);
        let segment = Segment {
            start: 0,
            end: 20 << 20,
            kind: SegmentKind::Cdc,
        };
        let err = chunk_segment_owned(
            &path,
            &file,
            direct,
            &segment,
            &cutter,
            &ReadBuffers::new(&cutter, 2),
            &mut |_| Ok(()),
        )
        .unwrap_err();
        assert!(err.to_string().contains("shrank"), "{err}");
    }
}
