//! Open files are a budget, not a given: a directory of a million files must push and pull under
//! the 1,024 descriptors most Linux users get (256 on macOS). Transfers read the process's limit
//! once and keep a bounded number of files open, whatever the file count; [`Handles`] keeps the
//! most recently used ones open for reuse.

use std::collections::HashMap;
use std::fs::File;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// Descriptors set aside for everything but the files a transfer reads or writes: connections to
/// the registry, the runtime's own, standard streams, a log file.
const RESERVED: u64 = 96;
/// Open files a transfer keeps for reuse at most, however high the limit: more buys nothing.
const MOST: u64 = 256;
/// And at least, however low the limit (below `RESERVED + 8` little else would work anyway).
const LEAST: u64 = 8;

/// The process's soft limit on open files (`RLIMIT_NOFILE`), read now from `/proc/self/limits`
/// (1,024, the usual default, if it cannot be read).
pub fn limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| parse_limit(&limits))
        .unwrap_or(1024)
}

/// The soft limit in `/proc/self/limits`' "Max open files" line.
fn parse_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    match line["Max open files".len()..].split_whitespace().next()? {
        "unlimited" => Some(u64::MAX),
        soft => soft.parse().ok(),
    }
}

/// Files one transfer may hold open at once, from the process's limit.
pub fn budget() -> usize {
    budget_for(limit())
}

fn budget_for(limit: u64) -> usize {
    (limit.saturating_sub(RESERVED) / 2).clamp(LEAST, MOST) as usize
}

/// Open files by key, at most `capacity` of them: opening one more closes the least recently used.
/// A handle still in use when it is dropped from the table stays open until its user lets go, so
/// the table's capacity plus the threads using it bound what is open.
#[derive(Debug)]
pub struct Handles<K> {
    capacity: usize,
    table: Mutex<Table<K>>,
}

#[derive(Debug)]
struct Table<K> {
    open: HashMap<K, (Arc<File>, u64)>,
    clock: u64,
}

impl<K: Hash + Eq + Clone> Handles<K> {
    pub fn new(capacity: usize) -> Handles<K> {
        Handles {
            capacity: capacity.max(1),
            table: Mutex::new(Table {
                open: HashMap::new(),
                clock: 0,
            }),
        }
    }

    /// The open file for `key`, opened with `open` if it is not open. The file is opened outside
    /// the table's lock; two threads opening the same key at once both open it, and one handle is
    /// kept.
    pub fn get(
        &self,
        key: &K,
        open: impl FnOnce() -> std::io::Result<File>,
    ) -> std::io::Result<Arc<File>> {
        {
            let mut table = self.lock();
            table.clock += 1;
            let now = table.clock;
            if let Some((file, used)) = table.open.get_mut(key) {
                *used = now;
                return Ok(Arc::clone(file));
            }
        }
        let file = Arc::new(open()?);
        let mut table = self.lock();
        table.clock += 1;
        let now = table.clock;
        if let Some((kept, used)) = table.open.get_mut(key) {
            *used = now;
            return Ok(Arc::clone(kept));
        }
        if table.open.len() >= self.capacity {
            if let Some(oldest) = table
                .open
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            {
                table.open.remove(&oldest);
            }
        }
        table.open.insert(key.clone(), (Arc::clone(&file), now));
        Ok(file)
    }

    /// Closes `key`'s file (once its current users let go): nothing more will be done with it.
    pub fn close(&self, key: &K) {
        self.lock().open.remove(key);
    }

    /// Files held open by the table now.
    pub fn len(&self) -> usize {
        self.lock().open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table<K>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_leaves_room_for_connections_and_stays_bounded() {
        assert_eq!(budget_for(256), 80);
        assert_eq!(budget_for(1024), 256);
        assert_eq!(budget_for(64), LEAST as usize);
        assert_eq!(budget_for(u64::MAX), MOST as usize);
        // What the process has now is what the transfers use.
        let now = limit();
        assert!(now > 0);
        let proc = "Max cpu time              unlimited            unlimited            seconds\n\
                    Max open files            256                  4096                 files\n";
        assert_eq!(parse_limit(proc), Some(256));
        assert_eq!(
            parse_limit(
                "Max open files            unlimited            unlimited            files"
            ),
            Some(u64::MAX)
        );
        assert_eq!(budget(), budget_for(now));
    }

    #[test]
    fn handles_keep_at_most_their_capacity_and_drop_the_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let opened = std::sync::atomic::AtomicUsize::new(0);
        let handles = Handles::new(3);
        let open = |i: usize| {
            let path = dir.path().join(i.to_string());
            let opened = &opened;
            move || {
                opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                File::create(path)
            }
        };
        for i in 0..3 {
            handles.get(&i, open(i)).unwrap();
        }
        // 0 is used again, so 1 is the one to go when 3 comes.
        handles.get(&0, open(0)).unwrap();
        handles.get(&3, open(3)).unwrap();
        assert_eq!(handles.len(), 3);
        assert_eq!(opened.load(std::sync::atomic::Ordering::Relaxed), 4);
        handles.get(&0, open(0)).unwrap();
        handles.get(&2, open(2)).unwrap();
        assert_eq!(opened.load(std::sync::atomic::Ordering::Relaxed), 4);
        handles.get(&1, open(1)).unwrap();
        assert_eq!(opened.load(std::sync::atomic::Ordering::Relaxed), 5);
        assert_eq!(handles.len(), 3);
        handles.close(&1);
        assert_eq!(handles.len(), 2);
    }
}
