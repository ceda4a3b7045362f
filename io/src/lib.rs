//! vial-io: page-aligned buffers, a pool that reuses them, and O_DIRECT writes. Its own crate so
//! that the client, the registry's storage and the node cache share them without the registry
//! importing the client.
//!
//! O_DIRECT reads and writes need a buffer that starts on a block boundary, and the kernel copies
//! file bytes into a misaligned one at a fraction of the speed (measured here: 1.8 against
//! 9-11 GB/s). Memory a process touches for the first time costs a page fault per 4 KiB,
//! which on the VMs vial is measured on is about a second of system time per GiB, so buffers that
//! carry every byte of a transfer are reused rather than allocated per read. Used by `vial push`
//! (read and pack buffers), the registry (uploads written and blobs read) and the mount (chunks
//! fetched into the node cache).

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Alignment of O_DIRECT transfers: buffer address, length and file offset.
pub const ALIGN: usize = 4096;

/// Zeroed bytes that start on a page boundary.
#[derive(Debug, Default)]
pub struct Aligned {
    storage: Vec<u8>,
    start: usize,
}

impl Aligned {
    /// At least `len` zeroed bytes from a page boundary.
    pub fn new(len: usize) -> Self {
        let storage = vec![0u8; len + ALIGN];
        let start = storage.as_ptr().align_offset(ALIGN).min(ALIGN);
        Aligned { storage, start }
    }

    /// Makes room for at least `len` bytes, replacing the buffer if it is smaller.
    pub fn grow(&mut self, len: usize) {
        if self.bytes().len() < len {
            *self = Aligned::new(len);
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.storage[self.start..]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..]
    }
}

/// Buffers given back by the [`Bytes`] made of them, for the next taker. At most `keep` wait
/// here; the rest are freed.
#[derive(Clone, Debug)]
pub struct BufferPool {
    free: Arc<Mutex<Vec<Aligned>>>,
    keep: usize,
}

impl BufferPool {
    pub fn new(keep: usize) -> Self {
        BufferPool {
            free: Arc::default(),
            keep,
        }
    }

    /// A buffer of at least `len` bytes: the smallest returned one that is large enough, else
    /// the largest returned one grown, else a new one. Its bytes are whatever the last user left.
    ///
    /// Taking the best fit matters where sizes vary (chunks): a buffer that has to grow is freed
    /// and allocated anew, and that churn is what leaves a heap holding memory nobody uses.
    pub fn take(&self, len: usize) -> Aligned {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let fit = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.bytes().len() >= len)
            .min_by_key(|(_, b)| b.bytes().len())
            .or_else(|| free.iter().enumerate().max_by_key(|(_, b)| b.bytes().len()))
            .map(|(i, _)| i);
        let mut buf = fit.map(|i| free.swap_remove(i)).unwrap_or_default();
        drop(free);
        buf.grow(len);
        buf
    }

    /// `range` of `buf` as [`Bytes`]; the buffer comes back to the pool when the last clone or
    /// slice of them is dropped.
    pub fn freeze(&self, buf: Aligned, range: Range<usize>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            range,
            pool: self.clone(),
        })
    }
}

struct Pooled {
    buf: Aligned,
    range: Range<usize>,
    pool: BufferPool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf.bytes()[self.range.clone()]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut free = self.pool.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.pool.keep {
            free.push(buf);
        }
    }
}

/// Writes `bytes` from offset 0 of a file opened with O_DIRECT, leaving it exactly `bytes` long.
/// Whole blocks go straight from `bytes` when it starts on a block boundary; anything else goes
/// through an aligned copy, and the last partial block is written padded, then cut off.
pub fn write_direct(f: &File, bytes: &[u8]) -> std::io::Result<()> {
    let whole = if bytes.as_ptr().align_offset(ALIGN) == 0 {
        bytes.len() / ALIGN * ALIGN
    } else {
        0
    };
    if whole > 0 {
        f.write_all_at(&bytes[..whole], 0)?;
    }
    let rest = &bytes[whole..];
    if !rest.is_empty() {
        let padded = rest.len().div_ceil(ALIGN) * ALIGN;
        let mut block = Aligned::new(padded);
        block.bytes_mut()[..rest.len()].copy_from_slice(rest);
        f.write_all_at(&block.bytes()[..padded], whole as u64)?;
    }
    f.set_len(bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_come_back_when_their_last_slice_goes() {
        let pool = BufferPool::new(1);
        let mut buf = pool.take(10_000);
        assert_eq!(buf.bytes().as_ptr().align_offset(ALIGN), 0);
        assert!(buf.bytes().len() >= 10_000);
        buf.bytes_mut()[..5].copy_from_slice(b"hello");
        let address = buf.bytes().as_ptr();
        let bytes = pool.freeze(buf, 1..5);
        assert_eq!(&bytes[..], b"ello");
        let slice = bytes.slice(1..3);
        drop(bytes);
        assert!(
            pool.free.lock().unwrap().is_empty(),
            "back while a slice lives"
        );
        drop(slice);
        let again = pool.take(4096);
        assert_eq!(again.bytes().as_ptr(), address, "the buffer was not reused");
        // Beyond `keep`, given-back buffers are freed.
        let (a, b) = (pool.take(1), pool.take(1));
        drop(pool.freeze(a, 0..0));
        drop(pool.freeze(b, 0..0));
        assert_eq!(pool.free.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_taker_gets_the_smallest_returned_buffer_that_fits() {
        let pool = BufferPool::new(4);
        let (small, large) = (pool.take(1 << 20), pool.take(4 << 20));
        let (small_at, large_at) = (small.bytes().as_ptr(), large.bytes().as_ptr());
        // Returned large first, small last: the last one back is not the answer to everything.
        drop(pool.freeze(large, 0..0));
        drop(pool.freeze(small, 0..0));
        let two = pool.take(2 << 20);
        assert_eq!(
            two.bytes().as_ptr(),
            large_at,
            "a 2 MiB taker was not given the 4 MiB buffer"
        );
        let half = pool.take(1 << 19);
        assert_eq!(
            half.bytes().as_ptr(),
            small_at,
            "a 512 KiB taker was not given the 1 MiB buffer"
        );
    }
}
