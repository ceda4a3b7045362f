//! Cuts one file into chunks the way every vial writer must, so a file yields the same chunks whether
//! `vial push` reads it from disk or the registry reads it from a blob or an archive while sealing.
//!
//! A file is first planned into segments (tensor-aware for safetensors), then FastCDC runs over each
//! segment through a fixed, page-aligned window and every chunk is hashed. Reading goes through
//! [`ReadAt`], so this module does no I/O of its own.

use crate::chunking::Cutter;
use crate::safetensors::{self, Segment, SegmentKind};
use crate::{Algorithm, Digest};

/// Bytes read per refill of the window, on top of one maximum chunk carried over.
const READ_SIZE: usize = 16 * 1024 * 1024;
/// The alignment of the window and of every read into it.
const PAGE: usize = 4096;

/// Positional reads of the file being chunked. [`chunk_file`] reads in increasing offset order,
/// except that what planning read (the safetensors header) is read again while chunking.
pub trait ReadAt {
    type Error;
    /// Fills `buf` with the file's bytes at `offset`; a short file is an error.
    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> Result<(), Self::Error>;

    /// Called once planning is over: reads from now on go forward from offset 0.
    fn planned(&mut self) {}
}

/// One chunk of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChunk {
    pub offset: u64,
    pub len: u64,
    pub digest: Digest,
}

/// A page-aligned byte buffer: misaligned buffers make copies and hashing several times slower.
#[derive(Debug)]
pub struct Window {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Window {
    /// The window a chunker with `cutter`'s parameters needs.
    pub fn for_cutter(cutter: &Cutter) -> Self {
        // One page more than a read and a carried-over chunk: the carry is placed so that the
        // read after it starts on a page boundary.
        let len = READ_SIZE + cutter.params().max + PAGE;
        let storage = vec![0u8; len + PAGE];
        let start = storage.as_ptr().align_offset(PAGE).min(PAGE);
        Window {
            storage,
            start,
            len,
        }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// Splits a file into segments. Safetensors files (a name ending in `.safetensors`, confirmed by a
/// valid header) are cut at tensor boundaries; everything else is one content-defined segment.
pub fn plan<R: ReadAt>(path: &str, reader: &mut R, size: u64) -> Result<Vec<Segment>, R::Error> {
    let whole = vec![Segment {
        start: 0,
        end: size,
        kind: SegmentKind::Cdc,
    }];
    if size == 0 {
        return Ok(Vec::new());
    }
    if !is_safetensors_name(path) || size < 8 {
        return Ok(whole);
    }
    let mut first8 = [0u8; 8];
    reader.read_exact_at(&mut first8, 0)?;
    let Ok(n) = safetensors::header_len(&first8, size) else {
        return Ok(whole);
    };
    let mut json = vec![0u8; n as usize];
    reader.read_exact_at(&mut json, 8)?;
    Ok(match safetensors::parse_header(&json, size) {
        Ok(tensors) => safetensors::plan_segments(size, 8 + n, &tensors),
        Err(_) => whole,
    })
}

/// Whether a file's name makes [`plan`] look for a safetensors header: the one thing besides its
/// bytes that decides how a file is chunked.
pub fn is_safetensors_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.len() > ".safetensors".len() && name.ends_with(".safetensors")
}

/// Chunks and hashes one segment, reading it through `window`. `on_chunk` sees every chunk with its
/// Called with each chunk cut and its bytes, in order.
pub type OnChunk<'a, E> = dyn FnMut(&FileChunk, &[u8]) -> Result<(), E> + 'a;

/// bytes as it is cut (to count progress, or to store it).
pub fn chunk_segment<R: ReadAt>(
    reader: &mut R,
    segment: &Segment,
    cutter: &Cutter,
    window: &mut Window,
    on_chunk: &mut OnChunk<'_, R::Error>,
) -> Result<Vec<FileChunk>, R::Error> {
    let buf = window.as_mut();
    let mut chunks = Vec::new();
    if segment.kind == SegmentKind::Single {
        // A group of small tensors: far smaller than the window, but never trust that blindly.
        let len = (segment.end - segment.start) as usize;
        let mut spill = Vec::new();
        let data = if len <= buf.len() {
            &mut buf[..len]
        } else {
            spill.resize(len, 0);
            &mut spill[..]
        };
        reader.read_exact_at(data, segment.start)?;
        let chunk = FileChunk {
            offset: segment.start,
            len: len as u64,
            digest: Algorithm::Sha256.digest_bytes(data),
        };
        on_chunk(&chunk, data)?;
        chunks.push(chunk);
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
            let chunk = FileChunk {
                offset: base,
                len: n as u64,
                digest: Algorithm::Sha256.digest_bytes(data),
            };
            on_chunk(&chunk, data)?;
            chunks.push(chunk);
            lo += n;
            base += n as u64;
        }
        if eof {
            break;
        }
        // Slide what is left to the front and read more behind it, into a page-aligned place:
        // the kernel copies into a misaligned buffer at a fraction of the speed.
        let carry = hi - lo;
        let to = (PAGE - carry % PAGE) % PAGE;
        buf.copy_within(lo..hi, to);
        lo = to;
        hi = to + carry;
        let want = ((segment.end - next_read) as usize).min(buf.len() - hi);
        reader.read_exact_at(&mut buf[hi..hi + want], next_read)?;
        hi += want;
        next_read += want as u64;
    }
    Ok(chunks)
}

/// Plans and chunks a whole file.
pub fn chunk_file<R: ReadAt>(
    path: &str,
    reader: &mut R,
    size: u64,
    cutter: &Cutter,
    window: &mut Window,
    on_chunk: &mut OnChunk<'_, R::Error>,
) -> Result<Vec<FileChunk>, R::Error> {
    let mut chunks = Vec::new();
    let segments = plan(path, reader, size)?;
    reader.planned();
    for segment in segments {
        chunks.extend(chunk_segment(reader, &segment, cutter, window, on_chunk)?);
    }
    Ok(chunks)
}

/// [`ReadAt`] over a reader that can only go forward (a blob being streamed, an archive entry), for
/// [`chunk_file`]: what planning reads is kept so it can be read again, a read ahead of the reader
/// skips forward, and a read behind it that was not kept is an error, never wrong bytes.
#[derive(Debug)]
pub struct Sequential<R> {
    inner: R,
    /// The file's first bytes, kept while planning for re-reading.
    prefix: Vec<u8>,
    planning: bool,
    /// Offset of the next byte `inner` yields.
    pos: u64,
}

/// How a [`Sequential`] read failed.
#[derive(Debug, thiserror::Error)]
pub enum SequentialError {
    #[error("reading the file: {0}")]
    Io(#[from] std::io::Error),
    #[error("read at offset {wanted} after reaching offset {pos}: the reader cannot go back")]
    Backwards { wanted: u64, pos: u64 },
}

impl<R: std::io::Read> Sequential<R> {
    pub fn new(inner: R) -> Self {
        Sequential {
            inner,
            prefix: Vec::new(),
            planning: true,
            pos: 0,
        }
    }

    /// The underlying reader, for draining what the chunker did not read.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: std::io::Read> ReadAt for Sequential<R> {
    type Error = SequentialError;

    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> Result<(), SequentialError> {
        let end = offset + buf.len() as u64;
        if self.planning && self.pos == self.prefix.len() as u64 && end > self.pos {
            // Planning reads only the header, which is bounded: keep all of it.
            let old = self.prefix.len();
            let keep_to = end.min(8 + safetensors::MAX_HEADER) as usize;
            self.prefix.resize(keep_to.max(old), 0);
            self.inner.read_exact(&mut self.prefix[old..])?;
            self.pos = self.prefix.len() as u64;
        }
        let mut filled = 0usize;
        if offset < self.prefix.len() as u64 {
            let from = &self.prefix[offset as usize..(end as usize).min(self.prefix.len())];
            buf[..from.len()].copy_from_slice(from);
            filled = from.len();
        }
        if filled < buf.len() {
            let at = offset + filled as u64;
            if at < self.pos {
                return Err(SequentialError::Backwards {
                    wanted: at,
                    pos: self.pos,
                });
            }
            let skip = at - self.pos;
            if skip > 0 {
                let skipped = std::io::copy(
                    &mut <&mut R as std::io::Read>::take(&mut self.inner, skip),
                    &mut std::io::sink(),
                )?;
                if skipped < skip {
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                }
            }
            self.inner.read_exact(&mut buf[filled..])?;
            self.pos = end;
        }
        Ok(())
    }

    fn planned(&mut self) {
        self.planning = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunking::noise;
    use crate::chunking::DEFAULT_PARAMS;

    struct Slice<'a>(&'a [u8]);

    impl ReadAt for Slice<'_> {
        type Error = std::io::Error;
        fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            let at = offset as usize;
            let src = self.0.get(at..at + buf.len()).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "short file")
            })?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }

    /// A small safetensors file: a header naming `tensors` of the given sizes, then their bytes.
    fn safetensors_file(tensors: &[(&str, usize)]) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        let mut offset = 0;
        for (name, len) in tensors {
            header.insert(
                (*name).to_owned(),
                serde_json::json!({"dtype": "U8", "shape": [len], "data_offsets": [offset, offset + len]}),
            );
            offset += len;
        }
        let json = serde_json::to_vec(&header).unwrap();
        let mut file = (json.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(&json);
        file.extend_from_slice(&noise(offset, 5));
        file
    }

    #[test]
    fn windowed_chunking_matches_in_memory_chunking() {
        let data = noise(40_000_000, 7);
        let cutter = Cutter::new(DEFAULT_PARAMS);
        let mut window = Window::for_cutter(&cutter);
        let mut seen = 0u64;
        let chunks = chunk_file(
            "blob.bin",
            &mut Slice(&data),
            data.len() as u64,
            &cutter,
            &mut window,
            &mut |c, bytes| {
                assert_eq!(c.len as usize, bytes.len());
                seen += c.len;
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, data.len() as u64);
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

    /// Records where each read lands in memory.
    struct Aligned<'a>(Slice<'a>, Vec<usize>);

    impl ReadAt for Aligned<'_> {
        type Error = std::io::Error;
        fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.1.push(buf.as_ptr() as usize % PAGE);
            self.0.read_exact_at(buf, offset)
        }
    }

    #[test]
    fn every_refill_of_the_window_lands_on_a_page_boundary() {
        let data = noise(100_000_000, 11);
        let cutter = Cutter::new(DEFAULT_PARAMS);
        let mut window = Window::for_cutter(&cutter);
        let mut reader = Aligned(Slice(&data), Vec::new());
        let segment = Segment {
            start: 0,
            end: data.len() as u64,
            kind: SegmentKind::Cdc,
        };
        chunk_segment(&mut reader, &segment, &cutter, &mut window, &mut |_, _| {
            Ok(())
        })
        .unwrap();
        assert!(reader.1.len() >= 3, "100 MB takes several refills");
        assert!(reader.1.iter().all(|&a| a == 0), "{:?}", reader.1);
    }

    #[test]
    fn a_forward_only_reader_yields_the_chunks_of_positional_reads() {
        let cutter = Cutter::new(DEFAULT_PARAMS);
        let mut window = Window::for_cutter(&cutter);
        let st = safetensors_file(&[("a", 3 << 20), ("b", 1000), ("c", 2000), ("d", 9 << 20)]);
        for (name, data) in [("x.safetensors", st), ("x.bin", noise(20_000_000, 3))] {
            let size = data.len() as u64;
            let positional = chunk_file(
                name,
                &mut Slice(&data),
                size,
                &cutter,
                &mut window,
                &mut |_, _| Ok(()),
            )
            .unwrap();
            let mut seq = Sequential::new(&data[..]);
            let sequential = chunk_file(name, &mut seq, size, &cutter, &mut window, &mut |_, _| {
                Ok(())
            })
            .unwrap();
            assert_eq!(positional, sequential, "{name}");
            assert!(positional.len() > 3, "{name} should make several chunks");
        }
    }

    #[test]
    fn a_forward_only_reader_rereads_only_what_planning_kept() {
        let data = noise(1_000_000, 1);
        let mut seq = Sequential::new(&data[..]);
        let mut buf = vec![0u8; 10];
        seq.read_exact_at(&mut buf, 100).unwrap();
        seq.planned();
        // Within what planning read, going back is fine; reads skip forward; going back past what
        // was kept is an error, never wrong bytes.
        seq.read_exact_at(&mut buf, 5).unwrap();
        assert_eq!(buf, data[5..15]);
        seq.read_exact_at(&mut buf, 500_000).unwrap();
        assert_eq!(buf, data[500_000..500_010]);
        assert!(matches!(
            seq.read_exact_at(&mut buf, 400_000),
            Err(SequentialError::Backwards { .. })
        ));
        assert!(matches!(
            seq.read_exact_at(&mut buf, 999_995),
            Err(SequentialError::Io(_))
        ));
    }
}
