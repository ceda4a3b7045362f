//! The `tree` benchmark's volumes: many small files of pseudo-random bytes, [`PER_DIR`] to a
//! directory, and, for the mixed one, two large shards beside them.

use std::path::Path;

use anyhow::{bail, Result};

use crate::containerd::write_random;
use crate::data::xorshift_fill;

/// Bytes of each small file.
const SMALL: usize = 4096;
/// Small files per directory, as a dataset split into directories keeps them.
const PER_DIR: usize = 100;
/// Shards of the mixed volume.
const SHARDS: u64 = 2;

/// A directory to ship: `small` files of [`SMALL`] bytes, and [`SHARDS`] shards of
/// `shard_bytes` if it is not 0.
#[derive(Debug)]
pub struct Volume {
    pub name: &'static str,
    small: usize,
    shard_bytes: u64,
}

impl Volume {
    /// `10k`, `100k` or `mixed` (its shards 1 GiB, 64 MiB when `quick`).
    pub fn named(name: &str, quick: bool) -> Result<Volume> {
        let (name, small, shard_bytes) = match name {
            "10k" => ("10k", 10_000, 0),
            "100k" => ("100k", 100_000, 0),
            "mixed" => ("mixed", 1_000, if quick { 64 << 20 } else { 1 << 30 }),
            other => bail!("unknown volume {other:?}: 10k, 100k or mixed"),
        };
        Ok(Volume {
            name,
            small,
            shard_bytes,
        })
    }

    /// "100,000 files of 4 KiB", "1,000 files of 4 KiB + 2 shards of 1024 MiB".
    pub fn describe(&self) -> String {
        let small = format!("{} files of {} KiB", thousands(self.small), SMALL / 1024);
        if self.shard_bytes == 0 {
            return small;
        }
        format!(
            "{small} + {SHARDS} shards of {} MiB",
            self.shard_bytes >> 20
        )
    }

    /// Writes the volume into `dir`: small file `i` at `DDDD/IIIIII.bin` (directory `i / 100`),
    /// the shards at the top. Every file's bytes are distinct, so nothing deduplicates.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let mut buf = vec![0u8; SMALL];
        for i in 0..self.small {
            let sub = dir.join(format!("{:04}", i / PER_DIR));
            if i % PER_DIR == 0 {
                std::fs::create_dir_all(&sub)?;
            }
            xorshift_fill(&mut buf, i as u64);
            std::fs::write(sub.join(format!("{i:06}.bin")), &buf)?;
        }
        let shards = if self.shard_bytes > 0 { SHARDS } else { 0 };
        for k in 0..shards {
            let name = format!("shard-{}-of-{SHARDS}.bin", k + 1);
            write_random(&dir.join(name), self.shard_bytes, 48_000 + k)?;
        }
        Ok(())
    }
}

/// 100000 as "100,000".
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
