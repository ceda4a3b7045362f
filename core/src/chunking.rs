//! Content-defined chunking: FastCDC 2020 cut points, usable on a sliding window of a file.
//!
//! A FastCDC cut depends only on the bytes between the chunk's start and the cut, so a cut found
//! before the end of the available data is final. Callers can therefore feed a file through a bounded
//! window and get exactly the chunks the whole-file slice API would produce.

use fastcdc::v2020::{self, Normalization};

/// Sizes that shape content-defined chunks. docs/format.md explains the chosen values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkParams {
    pub min: usize,
    pub avg: usize,
    pub max: usize,
}

/// Format v1's parameters: 512 KiB minimum, 2 MiB average, 8 MiB maximum.
pub const DEFAULT_PARAMS: ChunkParams = ChunkParams {
    min: 512 * 1024,
    avg: 2 * 1024 * 1024,
    max: 8 * 1024 * 1024,
};

/// Finds cut points with fixed parameters.
#[derive(Debug, Clone)]
pub struct Cutter {
    params: ChunkParams,
    mask_s: u64,
    mask_l: u64,
}

impl Cutter {
    pub fn new(params: ChunkParams) -> Self {
        let (mask_s, mask_l) = v2020::select_masks(params.avg, Normalization::Level1);
        Cutter {
            params,
            mask_s,
            mask_l,
        }
    }

    pub fn params(&self) -> ChunkParams {
        self.params
    }

    /// The length of the next chunk at the start of `data`, or `None` if more data is needed to
    /// decide. `eof` says that `data` runs to the end of the region being chunked.
    pub fn next_cut(&self, data: &[u8], eof: bool) -> Option<usize> {
        if data.is_empty() {
            return None;
        }
        let (_, n) = v2020::cut(
            data,
            self.params.min,
            self.params.avg,
            self.params.max,
            self.mask_s,
            self.mask_l,
            self.mask_s << 1,
            self.mask_l << 1,
        );
        // A cut before the end of the data, or at the maximum size, cannot change with more data.
        if n < data.len() || n >= self.params.max || eof {
            Some(n)
        } else {
            None
        }
    }

    /// All chunk lengths of an in-memory region.
    pub fn cut_all(&self, data: &[u8]) -> Vec<usize> {
        let mut out = Vec::new();
        let mut pos = 0;
        while let Some(n) = self.next_cut(&data[pos..], true) {
            out.push(n);
            pos += n;
        }
        out
    }
}

/// Deterministic pseudo-random bytes (xorshift): incompressible data with cut points anywhere,
/// for the tests and benchmarks of every crate that chunks or stores bytes.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: ChunkParams = ChunkParams {
        min: 4096,
        avg: 16384,
        max: 65536,
    };

    #[test]
    fn windowed_cutting_equals_whole_slice_cutting() {
        let data = noise(1_000_000, 9);
        let cutter = Cutter::new(SMALL);
        let whole = cutter.cut_all(&data);
        assert_eq!(whole.iter().sum::<usize>(), data.len());
        // Feed the same data through a window of 100 KB at a time.
        let mut windowed = Vec::new();
        let (mut start, mut end) = (0, 0);
        loop {
            end = (end + 100_000).min(data.len());
            let eof = end == data.len();
            while let Some(n) = cutter.next_cut(&data[start..end], eof) {
                windowed.push(n);
                start += n;
            }
            if eof {
                break;
            }
        }
        assert_eq!(windowed, whole);
    }

    #[test]
    fn chunks_respect_the_bounds_and_resync_after_an_insertion() {
        let data = noise(2_000_000, 3);
        let cutter = Cutter::new(SMALL);
        let a = cutter.cut_all(&data);
        for (i, n) in a.iter().enumerate() {
            assert!(*n <= SMALL.max);
            assert!(*n >= SMALL.min || i == a.len() - 1);
        }
        let mut shifted = noise(1000, 77);
        shifted.extend_from_slice(&data);
        let b = cutter.cut_all(&shifted);
        // After the insertion the boundaries fall back into step: most chunks have the same bytes.
        let slices = |d: &[u8], lens: &[usize]| {
            let mut pos = 0;
            lens.iter()
                .map(|n| {
                    pos += n;
                    d[pos - n..pos].to_vec()
                })
                .collect::<std::collections::HashSet<_>>()
        };
        let (sa, sb) = (slices(&data, &a), slices(&shifted, &b));
        let shared = sa.intersection(&sb).count();
        assert!(
            shared + 2 >= a.len(),
            "only {shared} of {} chunks shared",
            a.len()
        );
    }
}
