//! Reads files from disk into chunks, with the format's chunker ([`vial_core::chunker`]) doing the
//! planning and cutting through positional reads of the open file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use vial_core::chunker::{self, ReadAt};
pub use vial_core::chunker::{FileChunk, Window};
use vial_core::chunking::Cutter;
use vial_core::safetensors::Segment;

use crate::ClientError;

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
                ClientError::Invalid(format!(
                    "{} shrank while it was being read",
                    self.path.display()
                ))
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

/// Chunks and hashes one segment of a file, reading it through `window`.
pub fn chunk_segment(
    path: &Path,
    file: &File,
    segment: &Segment,
    cutter: &Cutter,
    window: &mut Window,
    on_bytes: &dyn Fn(u64),
) -> Result<Vec<FileChunk>, ClientError> {
    chunker::chunk_segment(
        &mut OnDisk { path, file },
        segment,
        cutter,
        window,
        &mut |chunk, _| {
            on_bytes(chunk.len);
            Ok(())
        },
    )
}
