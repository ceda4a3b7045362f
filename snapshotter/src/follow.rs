//! A following mount (`vial mount --follow`): the mount's root holds one directory per version the
//! tag has pointed at while mounted (`sha256-<hex>/`) and `current`, a symlink to the newest.
//!
//! A loader that resolves `current` once reads one version to the end, whatever the tag does
//! meanwhile; a file keeps reading the version it was opened in. Every version shares the mount's
//! fetcher and node cache, so a new version fetches only the chunks the old ones lacked. A version
//! that is no longer current and has no file open is dropped after a grace time.
//!
//! Kernel inode numbers: 1 is the root, 2 is `current`, and inode `i` of the `k`-th version's own
//! table is `k << 32 | i`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use vial_core::Digest;

use crate::lease::LeaseKeeper;
use crate::shared::Shared;

/// The root directory of a following mount.
pub const ROOT: u64 = 1;
/// The `current` symlink.
pub const CURRENT: u64 = 2;
/// Bits of a kernel inode number that hold a version's own inode.
const SHIFT: u32 = 32;

/// One version a following mount shows.
#[derive(Debug)]
pub struct Slot {
    /// Its directory's name at the root: `sha256-<hex>`.
    pub name: String,
    pub digest: Digest,
    pub shared: Arc<Shared>,
    /// Files of this version open now.
    pub opens: AtomicU64,
    /// When it stopped being current.
    retired: Mutex<Option<Instant>>,
    lease: LeaseKeeper,
}

impl Slot {
    /// The lease this mount holds on the version.
    pub fn lease(&self) -> &LeaseKeeper {
        &self.lease
    }

    pub fn new(name: String, digest: Digest, shared: Arc<Shared>, lease: LeaseKeeper) -> Slot {
        Slot {
            name,
            digest,
            shared,
            opens: AtomicU64::new(0),
            retired: Mutex::new(None),
            lease,
        }
    }
}

/// What a kernel inode number of a following mount names.
#[derive(Debug)]
pub enum Resolved {
    Root,
    Current,
    /// Inode `local` of a version's table; the kernel knows it as `base | local`.
    In {
        slot: Arc<Slot>,
        local: u64,
        base: u64,
    },
}

/// What a following mount shows: its versions and which is current.
#[derive(Debug, Default)]
pub struct Following {
    slots: RwLock<BTreeMap<u64, Arc<Slot>>>,
    current: RwLock<Option<u64>>,
    next: AtomicU64,
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl Following {
    pub fn resolve(&self, ino: u64) -> Option<Resolved> {
        match ino {
            ROOT => Some(Resolved::Root),
            CURRENT => Some(Resolved::Current),
            _ => {
                let k = ino >> SHIFT;
                let slot = read(&self.slots).get(&k).cloned()?;
                Some(Resolved::In {
                    slot,
                    local: ino & ((1 << SHIFT) - 1),
                    base: k << SHIFT,
                })
            }
        }
    }

    /// The version `current` names.
    pub fn current(&self) -> Option<Arc<Slot>> {
        let k = (*read(&self.current))?;
        read(&self.slots).get(&k).cloned()
    }

    /// The version whose directory is `name`, with its inode base.
    pub fn by_name(&self, name: &str) -> Option<(Arc<Slot>, u64)> {
        read(&self.slots)
            .iter()
            .find(|(_, s)| s.name == name)
            .map(|(k, s)| (Arc::clone(s), k << SHIFT))
    }

    /// The version of `digest`, if the mount shows it.
    pub fn by_digest(&self, digest: &Digest) -> Option<(Arc<Slot>, u64)> {
        read(&self.slots)
            .iter()
            .find(|(_, s)| &s.digest == digest)
            .map(|(k, s)| (Arc::clone(s), k << SHIFT))
    }

    /// Every version with its inode base, oldest first.
    pub fn versions(&self) -> Vec<(Arc<Slot>, u64)> {
        read(&self.slots)
            .iter()
            .map(|(k, s)| (Arc::clone(s), k << SHIFT))
            .collect()
    }

    /// Adds a version (not yet current).
    pub fn add(&self, slot: Slot) -> Arc<Slot> {
        let k = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let slot = Arc::new(slot);
        write(&self.slots).insert(k, Arc::clone(&slot));
        slot
    }

    /// Makes the version of `digest` current. Returns false if the mount does not show it.
    pub fn make_current(&self, digest: &Digest) -> bool {
        let slots = read(&self.slots);
        let Some((&k, _)) = slots.iter().find(|(_, s)| &s.digest == digest) else {
            return false;
        };
        let mut current = write(&self.current);
        if let Some(old) = current.and_then(|c| slots.get(&c)) {
            if old.digest != *digest {
                *old.retired.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            }
        }
        if let Some(new) = slots.get(&k) {
            *new.retired.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        *current = Some(k);
        true
    }

    /// Removes the versions that stopped being current more than `grace` ago and have no file
    /// open, dropping their leases. Returns their directory names.
    pub fn drop_retired(&self, grace: Duration) -> Vec<String> {
        let current = *read(&self.current);
        let mut slots = write(&self.slots);
        let gone: Vec<u64> = slots
            .iter()
            .filter(|(k, s)| {
                Some(**k) != current
                    && s.opens.load(Ordering::SeqCst) == 0
                    && s.retired
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .is_some_and(|at| at.elapsed() >= grace)
            })
            .map(|(k, _)| *k)
            .collect();
        gone.iter()
            .filter_map(|k| slots.remove(k))
            .map(|s| {
                s.lease.release_later();
                s.name.clone()
            })
            .collect()
    }

    /// Drops every version's lease (at unmount). Call from outside the runtime.
    pub fn release_all(&self) {
        for s in read(&self.slots).values() {
            s.lease.release();
        }
    }
}
