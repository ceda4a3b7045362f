//! Content-defined chunking: FastCDC 2020 cut points, usable on a sliding window of a file.
//!
//! A FastCDC cut depends only on the bytes between the chunk's start and the cut, so a cut found
//! before the end of the available data is final. Callers can therefore feed a file through a bounded
//! window and get exactly the chunks the whole-file slice API would produce.
//!
//! The cut search is our own: the `fastcdc` crate's two-bytes-at-a-time gear scan, run in several
//! lanes at once over neighbouring blocks (see [`Scanner`]). The crate's scan is one chain of
//! dependent additions, so a core runs it at a fraction of what it could do; interleaved lanes
//! are independent chains. The cut points are the crate's to the byte, which the tests check.

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
    scanner: Scanner,
}

impl Cutter {
    pub fn new(params: ChunkParams) -> Self {
        let (mask_s, mask_l) = v2020::select_masks(params.avg, Normalization::Level1);
        Cutter {
            params,
            mask_s,
            mask_l,
            scanner: Scanner::new(),
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
        let n = self.cut(data);
        // A cut before the end of the data, or at the maximum size, cannot change with more data.
        if n < data.len() || n >= self.params.max || eof {
            Some(n)
        } else {
            None
        }
    }

    /// The length of the first chunk of `data` if `data` ran to the end of its region: the
    /// result of `fastcdc::v2020::cut` with these parameters and masks.
    fn cut(&self, data: &[u8]) -> usize {
        let ChunkParams { min, avg, max } = self.params;
        if data.len() <= min {
            return data.len();
        }
        // Normalized chunking: a strict mask up to the average size, a looser one after it.
        let longest = data.len().min(max);
        // Positions are counted in pairs of bytes, as the scan reads them.
        let (base, center, end) = (min / 2, avg.min(longest) / 2, longest / 2);
        let s = &self.scanner;
        s.find(data, base, base, center, self.mask_s)
            .or_else(|| s.find(data, base, center, end, self.mask_l))
            .unwrap_or(longest)
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

/// Pairs of bytes a lane scans per round.
const BLOCK: usize = 4096;
/// Lanes scanned side by side.
const LANES: usize = 4;
/// Pairs after which a byte no longer counts in the gear hash: each pair shifts it left by two
/// bits, so after 32 pairs it has left the 64-bit hash. A lane that starts its hash this many
/// pairs before its block has the hash a scan from the chunk's start would have there.
const WARM: usize = 32;

/// A lane's pairs before it is given its own.
static NO_PAIRS: [[u8; 2]; WARM + BLOCK] = [[0; 2]; WARM + BLOCK];

/// The gear-hash scan of FastCDC 2020, in lanes.
///
/// Byte pairs `(a, b)` fold into the hash as `hash = (hash << 2) + GEAR_LS[a]`, tested against
/// the mask shifted left by one (a cut after `a`), then `hash += GEAR[b]`, tested against the mask
/// (a cut after `b`); the hash starts at zero at the minimum chunk size. A cut is the first
/// position whose test passes. Because the hash only remembers the last 32 pairs, the lanes can
/// each take a neighbouring block of a round and start 32 pairs early; when any lane finds a cut,
/// the blocks are scanned again one at a time, in order, for the first.
#[derive(Debug, Clone)]
struct Scanner {
    gear: [u64; 256],
    gear_ls: [u64; 256],
}

impl Scanner {
    fn new() -> Self {
        let (gear, gear_ls) = v2020::get_gear_with_seed(0);
        let table = |t: &[u64]| -> [u64; 256] {
            let mut out = [0; 256];
            out.copy_from_slice(t);
            out
        };
        Scanner {
            gear: table(&gear),
            gear_ls: table(&gear_ls),
        }
    }

    /// The first cut at a pair in `from..to` (pairs counted from the start of `data`; the hash
    /// starts at pair `base`), as a length in bytes.
    fn find(&self, data: &[u8], base: usize, from: usize, to: usize, mask: u64) -> Option<usize> {
        let mut p = from;
        // A lane must be able to start its hash 32 pairs early without reaching before `base`.
        if p < base + WARM {
            let head = (base + WARM).min(to);
            if let Some(n) = self.scalar(data, base, p, head, mask) {
                return Some(n);
            }
            p = head;
        }
        while to.saturating_sub(p) >= LANES * BLOCK {
            if self.lanes_hit(data, p, mask) {
                for lane in 0..LANES {
                    let start = p + lane * BLOCK;
                    if let Some(n) = self.scalar(data, base, start, start + BLOCK, mask) {
                        return Some(n);
                    }
                }
            }
            p += LANES * BLOCK;
        }
        self.scalar(data, base, p, to, mask)
    }

    /// Whether any of the round's `LANES` blocks of `BLOCK` pairs, starting at pair `p`, holds a
    /// cut (`p >= base + WARM`).
    fn lanes_hit(&self, data: &[u8], p: usize, mask: u64) -> bool {
        let (gear, gear_ls, mask_ls) = (&self.gear, &self.gear_ls, mask << 1);
        let span = 2 * (WARM + BLOCK);
        // Each lane's pairs as an array, so that indexing them needs no bounds checks. The
        // caller keeps rounds inside `data`; were one not, the blocks would be scanned one by
        // one, which is always right.
        let mut lanes = [&NO_PAIRS; LANES];
        for (i, lane) in lanes.iter_mut().enumerate() {
            let start = 2 * (p + i * BLOCK - WARM);
            let pairs = data
                .get(start..start + span)
                .and_then(|d| d.as_chunks::<2>().0.first_chunk::<{ WARM + BLOCK }>());
            match pairs {
                Some(pairs) => *lane = pairs,
                None => return true,
            }
        }
        let mut hash = [0u64; LANES];
        for k in 0..WARM {
            for (h, l) in hash.iter_mut().zip(&lanes) {
                let [a, b] = l[k];
                *h = (*h << 2)
                    .wrapping_add(gear_ls[a as usize])
                    .wrapping_add(gear[b as usize]);
            }
        }
        for k in WARM..WARM + BLOCK {
            for (h, l) in hash.iter_mut().zip(&lanes) {
                let [a, b] = l[k];
                *h = (*h << 2).wrapping_add(gear_ls[a as usize]);
                if *h & mask_ls == 0 {
                    return true;
                }
                *h = h.wrapping_add(gear[b as usize]);
                if *h & mask == 0 {
                    return true;
                }
            }
        }
        false
    }

    /// The first cut at a pair in `from..to`, scanning one pair at a time.
    fn scalar(&self, data: &[u8], base: usize, from: usize, to: usize, mask: u64) -> Option<usize> {
        let (gear, gear_ls, mask_ls) = (&self.gear, &self.gear_ls, mask << 1);
        let start = from.saturating_sub(WARM).max(base);
        let mut hash = 0u64;
        for [a, b] in data[2 * start..2 * from].as_chunks::<2>().0 {
            hash = (hash << 2)
                .wrapping_add(gear_ls[*a as usize])
                .wrapping_add(gear[*b as usize]);
        }
        for (i, [a, b]) in data[2 * from..2 * to].as_chunks::<2>().0.iter().enumerate() {
            hash = (hash << 2).wrapping_add(gear_ls[*a as usize]);
            if hash & mask_ls == 0 {
                return Some(2 * (from + i));
            }
            hash = hash.wrapping_add(gear[*b as usize]);
            if hash & mask == 0 {
                return Some(2 * (from + i) + 1);
            }
        }
        None
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

    /// The crate's own scan, which ours must match to the byte.
    fn reference(cutter: &Cutter, data: &[u8]) -> usize {
        let p = cutter.params;
        let (mask_s, mask_l) = (cutter.mask_s, cutter.mask_l);
        let (_, n) = v2020::cut(
            data,
            p.min,
            p.avg,
            p.max,
            mask_s,
            mask_l,
            mask_s << 1,
            mask_l << 1,
        );
        n
    }

    /// Every cut of `data`, and of prefixes of it, is the crate's.
    fn assert_same_cuts(params: ChunkParams, data: &[u8]) -> usize {
        let cutter = Cutter::new(params);
        let mut pos = 0;
        let mut cuts = 0;
        while pos < data.len() {
            let n = cutter.cut(&data[pos..]);
            assert_eq!(
                n,
                reference(&cutter, &data[pos..]),
                "at {pos} with {params:?}"
            );
            // A prefix ending anywhere, including inside the lanes' rounds.
            let short = &data[pos..pos + (n * 7 / 8 + 1).min(data.len() - pos)];
            assert_eq!(
                cutter.cut(short),
                reference(&cutter, short),
                "prefix at {pos}"
            );
            pos += n;
            cuts += 1;
        }
        cuts
    }

    #[test]
    fn lane_scans_cut_where_the_crate_cuts() {
        // Cuts in every lane and round: averages from far below a round to several rounds.
        for (i, avg) in [16 << 10, 64 << 10, 256 << 10, 2 << 20]
            .into_iter()
            .enumerate()
        {
            let params = ChunkParams {
                min: 4096,
                avg,
                max: avg * 4,
            };
            let data = noise(24 << 20, 40 + i as u64);
            assert!(assert_same_cuts(params, &data) > 8);
        }
        assert!(assert_same_cuts(DEFAULT_PARAMS, &noise(48 << 20, 5)) > 10);
        // Data with no cut anywhere (each chunk runs to the maximum), odd lengths, tiny inputs.
        assert_same_cuts(DEFAULT_PARAMS, &vec![0u8; 20 << 20]);
        assert_same_cuts(SMALL, &noise(1_000_001, 6));
        for len in [0, 1, 4095, 4096, 4097, 16385, 65537] {
            assert_same_cuts(SMALL, &noise(len, 7));
        }
    }

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
