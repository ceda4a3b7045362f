//! The machine's in-process ceiling for a push: SHA-256 alone, FastCDC (format v1's parameters)
//! alone, both as vial cuts (`vial_core::chunking`, lanes) and as the `fastcdc` crate's slice API
//! cuts, and FastCDC followed by SHA-256 of every chunk, over generated checkpoint bytes held in
//! memory, on one thread and on two (each thread takes one half of the buffer).

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, Result};
use serde::Serialize;
use vial_core::chunking::{Cutter, DEFAULT_PARAMS};
use vial_core::Algorithm;

/// Rounds per figure; the best is kept.
const ROUNDS: usize = 2;

#[derive(Clone, Debug, Default, Serialize)]
pub struct Ceiling {
    pub bytes: u64,
    /// GB/s, 10^9 bytes per second.
    pub sha256_1t_gb_s: f64,
    pub sha256_2t_gb_s: f64,
    /// Cutting alone: vial's lane scan, and the `fastcdc` crate's (the same cuts).
    pub cdc_1t_gb_s: f64,
    pub cdc_crate_1t_gb_s: f64,
    pub cdc_sha256_1t_gb_s: f64,
    pub cdc_sha256_2t_gb_s: f64,
    /// Chunks FastCDC cut in the buffer, and their mean size.
    pub chunks: usize,
    pub mean_chunk_bytes: f64,
}

/// A page-aligned buffer: the allocator's large blocks are 16 bytes off a page boundary, which
/// slows hashing of misaligned data on some machines.
struct Aligned {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let storage = vec![0u8; len + 4096];
        let start = storage.as_ptr().align_offset(4096).min(4096);
        Aligned {
            storage,
            start,
            len,
        }
    }
    fn bytes(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

fn sha_only(data: &[u8]) -> usize {
    std::hint::black_box(Algorithm::Sha256.digest_bytes(data));
    1
}

/// Cuts with vial's scan; returns the chunk count.
fn cdc_only(data: &[u8]) -> usize {
    Cutter::new(DEFAULT_PARAMS).cut_all(data).len()
}

/// Cuts with the `fastcdc` crate's slice API, the same parameters and normalization.
fn cdc_crate(data: &[u8]) -> usize {
    let p = DEFAULT_PARAMS;
    fastcdc::v2020::FastCDC::new(data, p.min, p.avg, p.max).count()
}

/// Cuts then hashes each chunk; returns the chunk count.
fn cdc_sha(data: &[u8]) -> usize {
    let cutter = Cutter::new(DEFAULT_PARAMS);
    let mut pos = 0;
    let lens = cutter.cut_all(data);
    for &n in &lens {
        std::hint::black_box(Algorithm::Sha256.digest_bytes(&data[pos..pos + n]));
        pos += n;
    }
    lens.len()
}

/// Best GB/s of [`ROUNDS`] runs of `f` over `data` split into `threads` parts, one per thread.
fn measure(data: &[u8], threads: usize, f: fn(&[u8]) -> usize) -> Result<(f64, usize)> {
    let mut best = 0.0f64;
    let mut count = 0;
    let part = data.len().div_ceil(threads).div_ceil(4096) * 4096;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let counts: Vec<usize> = std::thread::scope(|scope| {
            let handles: Vec<_> = data
                .chunks(part.max(1))
                .map(|p| scope.spawn(move || f(p)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| anyhow!("hashing thread panicked")))
                .collect::<Result<_>>()
        })?;
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        best = best.max(data.len() as f64 / secs / 1e9);
        count = counts.iter().sum();
    }
    Ok((best, count))
}

/// Reads up to `limit` bytes from `files` (in order) into memory, then measures.
pub fn measure_files(files: &[&Path], limit: u64) -> Result<Ceiling> {
    let total: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    let len = total.min(limit) as usize;
    let mut buf = Aligned::new(len);
    let mut at = 0;
    for path in files {
        if at == len {
            break;
        }
        let mut f = File::open(path)?;
        let want = (len - at).min(std::fs::metadata(path)?.len() as usize);
        f.read_exact(&mut buf.bytes_mut()[at..at + want])?;
        at += want;
    }
    let data = buf.bytes();
    let (sha256_1t_gb_s, _) = measure(data, 1, sha_only)?;
    let (sha256_2t_gb_s, _) = measure(data, 2, sha_only)?;
    let (cdc_1t_gb_s, ours) = measure(data, 1, cdc_only)?;
    let (cdc_crate_1t_gb_s, theirs) = measure(data, 1, cdc_crate)?;
    if ours != theirs {
        return Err(anyhow!(
            "vial cut {ours} chunks where the fastcdc crate cut {theirs}"
        ));
    }
    let (cdc_sha256_1t_gb_s, chunks) = measure(data, 1, cdc_sha)?;
    let (cdc_sha256_2t_gb_s, _) = measure(data, 2, cdc_sha)?;
    Ok(Ceiling {
        bytes: len as u64,
        sha256_1t_gb_s,
        sha256_2t_gb_s,
        cdc_1t_gb_s,
        cdc_crate_1t_gb_s,
        cdc_sha256_1t_gb_s,
        cdc_sha256_2t_gb_s,
        chunks,
        mean_chunk_bytes: len as f64 / chunks.max(1) as f64,
    })
}
