//! Reads files into chunks: plans segments (tensor-aware for safetensors), then runs FastCDC over
//! each segment through a fixed, page-aligned window and hashes every chunk.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use vial_core::chunking::Cutter;
use vial_core::safetensors::{self, Segment, SegmentKind};
use vial_core::{Algorithm, Digest};

use crate::ClientError;

/// Bytes read per refill of the window, on top of one maximum chunk carried over.
const READ_SIZE: usize = 16 * 1024 * 1024;

/// One chunk of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChunk {
    pub offset: u64,
    pub len: u64,
    pub digest: Digest,
}

/// A page-aligned byte buffer: misaligned buffers make copies and hashing several times slower.
#[derive(Debug)]
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> Self {
        let storage = vec![0u8; len + 4096];
        let start = storage.as_ptr().align_offset(4096).min(4096);
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    pub fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// The window a worker needs for the given cutter.
pub fn window_for(cutter: &Cutter) -> AlignedBuf {
    AlignedBuf::new(READ_SIZE + cutter.params().max)
}

/// Splits a file into segments. Safetensors files (by name, confirmed by a valid header) are cut at
/// tensor boundaries; everything else is one content-defined segment.
pub fn plan_file(path: &Path, file: &File, size: u64) -> Result<Vec<Segment>, ClientError> {
    let whole = vec![Segment {
        start: 0,
        end: size,
        kind: SegmentKind::Cdc,
    }];
    if size == 0 {
        return Ok(Vec::new());
    }
    if path.extension().and_then(|e| e.to_str()) != Some("safetensors") || size < 8 {
        return Ok(whole);
    }
    let mut first8 = [0u8; 8];
    file.read_exact_at(&mut first8, 0)
        .map_err(|e| ClientError::io(path, e))?;
    let Ok(n) = safetensors::header_len(&first8, size) else {
        tracing::debug!(path = %path.display(), "not a valid safetensors header; chunking as a plain file");
        return Ok(whole);
    };
    let mut json = vec![0u8; n as usize];
    file.read_exact_at(&mut json, 8)
        .map_err(|e| ClientError::io(path, e))?;
    match safetensors::parse_header(&json, size) {
        Ok(tensors) => Ok(safetensors::plan_segments(size, 8 + n, &tensors)),
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "unusable safetensors header; chunking as a plain file");
            Ok(whole)
        }
    }
}

/// Chunks and hashes one segment of a file, reading it through `buf`.
pub fn chunk_segment(
    path: &Path,
    file: &File,
    segment: &Segment,
    cutter: &Cutter,
    buf: &mut AlignedBuf,
    on_bytes: &dyn Fn(u64),
) -> Result<Vec<FileChunk>, ClientError> {
    let io = |e| ClientError::io(path, e);
    let buf = buf.as_mut();
    let mut chunks = Vec::new();
    if segment.kind == SegmentKind::Single {
        let len = (segment.end - segment.start) as usize;
        let data = if len <= buf.len() {
            &mut buf[..len]
        } else {
            return Err(ClientError::Invalid(
                "segment larger than the window".into(),
            ));
        };
        file.read_exact_at(data, segment.start).map_err(io)?;
        on_bytes(len as u64);
        chunks.push(FileChunk {
            offset: segment.start,
            len: len as u64,
            digest: Algorithm::Sha256.digest_bytes(data),
        });
        return Ok(chunks);
    }
    // `buf[lo..hi]` holds file bytes starting at file offset `base`.
    let (mut lo, mut hi) = (0usize, 0usize);
    let mut base = segment.start;
    let mut next_read = segment.start;
    loop {
        let eof = next_read >= segment.end;
        while let Some(n) = cutter.next_cut(&buf[lo..hi], eof) {
            let data = &buf[lo..lo + n];
            chunks.push(FileChunk {
                offset: base,
                len: n as u64,
                digest: Algorithm::Sha256.digest_bytes(data),
            });
            on_bytes(n as u64);
            lo += n;
            base += n as u64;
        }
        if eof {
            break;
        }
        // Slide what is left to the front and read more behind it.
        buf.copy_within(lo..hi, 0);
        hi -= lo;
        lo = 0;
        let want = ((segment.end - next_read) as usize).min(buf.len() - hi);
        file.read_exact_at(&mut buf[hi..hi + want], next_read)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    ClientError::Invalid(format!(
                        "{} shrank while it was being read",
                        path.display()
                    ))
                } else {
                    ClientError::io(path, e)
                }
            })?;
        hi += want;
        next_read += want as u64;
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vial_core::chunking::DEFAULT_PARAMS;

    #[test]
    fn windowed_file_chunking_matches_in_memory_chunking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob.bin");
        let mut x = 7u64;
        let data: Vec<u8> = (0..40_000_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let cutter = Cutter::new(DEFAULT_PARAMS);
        let segments = plan_file(&path, &file, data.len() as u64).unwrap();
        assert_eq!(segments.len(), 1);
        let mut buf = window_for(&cutter);
        let chunks = chunk_segment(&path, &file, &segments[0], &cutter, &mut buf, &|_| {}).unwrap();
        let expected = cutter.cut_all(&data);
        assert_eq!(
            chunks.iter().map(|c| c.len as usize).collect::<Vec<_>>(),
            expected
        );
        let mut pos = 0;
        for c in &chunks {
            assert_eq!(c.offset, pos);
            assert_eq!(
                c.digest,
                Algorithm::Sha256.digest_bytes(&data[pos as usize..(pos + c.len) as usize])
            );
            pos += c.len;
        }
    }
}
