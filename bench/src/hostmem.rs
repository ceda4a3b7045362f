//! Guest memory the host backs only while it is in use.
//!
//! A virtual machine with a balloon device that does free page reporting hands every large block
//! of memory the guest frees back to its host (`/sys/module/page_reporting`), and the next write
//! to that memory costs a fault in the host as well as in the guest. Dropping the page cache
//! before a cold measurement frees gigabytes, so whichever run first grows the page cache again
//! pays the host to back it: on the development machine, 21 GiB touched for the first time took
//! 47 s where the same memory touched again took 13 s, and in a 4 GiB pull the writes into the
//! page cache ran several times slower per byte once they went past what earlier runs had left
//! backed. Which client paid depended on the order of the runs, not on the client.
//!
//! [`Pinned::start`] turns the reporting off for the run (a reporting order above any free block)
//! and writes once to the free memory, so every page a run allocates is already backed; dropping
//! it puts the reporting order back. Without root, or on a machine without free page reporting,
//! it does nothing and says so.

use std::path::Path;
use std::time::Instant;

const ORDER: &str = "/sys/module/page_reporting/parameters/page_reporting_order";
const REPORTED: &str = "/sys/module/page_reporting/parameters/reported_kib";
/// Free memory left untouched by the pre-fault, so nothing else on the machine runs short.
const MARGIN: u64 = 1 << 30;

/// Free page reporting turned off for as long as this lives.
pub struct Pinned {
    /// The reporting order found, put back on drop.
    restore: Option<String>,
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Writes a byte to every page of `bytes` of newly allocated memory, then frees it.
fn touch(bytes: u64) -> u64 {
    const PIECE: usize = 256 << 20;
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut done = 0u64;
    while done + PIECE as u64 <= bytes {
        // `vec![0; n]` maps zero pages without writing them; the writes below back each page.
        let mut piece = vec![0u8; PIECE];
        for i in (0..PIECE).step_by(4096) {
            piece[i] = 1;
        }
        std::hint::black_box(&piece);
        held.push(piece);
        done += PIECE as u64;
    }
    done
}

impl Pinned {
    pub fn start() -> Pinned {
        let Some(original) = read(ORDER) else {
            eprintln!("vial-bench: no free page reporting on this machine (no {ORDER})");
            return Pinned { restore: None };
        };
        // The kernel takes orders up to its largest; one past any free block it can hold turns
        // reporting off. Try from the top until one is taken.
        let taken = ["32", "16", "11", "10"]
            .into_iter()
            .find(|o| std::fs::write(ORDER, o).is_ok() && read(ORDER).as_deref() == Some(*o));
        let Some(order) = taken else {
            eprintln!(
                "vial-bench: could not turn off free page reporting ({ORDER} is {original}, \
                 not writable here): cold figures may include the host backing freed memory again"
            );
            return Pinned { restore: None };
        };
        let started = Instant::now();
        let touched = touch(
            (crate::mounted::meminfo_kib("MemFree:").unwrap_or(0) * 1024).saturating_sub(MARGIN),
        );
        eprintln!(
            "vial-bench: free page reporting off for the run (page_reporting_order {original} -> \
             {order}, {} KiB reported so far); wrote to {:.1} GiB of free memory in {:.1} s so \
             the host backs it",
            read(REPORTED).unwrap_or_else(|| "?".into()),
            touched as f64 / (1u64 << 30) as f64,
            started.elapsed().as_secs_f64()
        );
        Pinned {
            restore: Some(original),
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(original) = &self.restore {
            if let Err(e) = std::fs::write(Path::new(ORDER), original) {
                eprintln!("vial-bench: could not put page_reporting_order back to {original}: {e}");
            }
        }
    }
}
