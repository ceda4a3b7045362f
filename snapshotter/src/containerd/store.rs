//! The snapshotter's own record of its snapshots: one JSON file under its root, rewritten whole
//! (to a temporary file, synced, renamed) after every change, so a crash leaves the old record or
//! the new one. A few hundred snapshots per node keep it small.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapKind {
    View,
    Active,
    Committed,
}

/// A volume layer served by a lazy mount instead of unpacked files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remote {
    /// The pinned volume: `host/name@sha256:…` of its index.
    pub reference: String,
    /// The layer (the volume's tree blob) the snapshot stands for.
    pub layer: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snap {
    /// Names the snapshot's directory, `snapshots/<id>`.
    pub id: u64,
    pub kind: SnapKind,
    /// The parent's key; empty for none.
    pub parent: String,
    pub labels: HashMap<String, String>,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<Remote>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    next_id: u64,
    snapshots: BTreeMap<String, Snap>,
}

#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    record: Record,
}

impl Store {
    /// Loads the record under `root`, or starts an empty one.
    pub fn open(root: &Path) -> std::io::Result<Store> {
        std::fs::create_dir_all(root.join("snapshots"))?;
        let path = root.join("snapshots.json");
        let record = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::other(format!("{} is not readable: {e}", path.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Record::default(),
            Err(e) => return Err(e),
        };
        Ok(Store {
            root: root.to_owned(),
            record,
        })
    }

    pub fn save(&self) -> std::io::Result<()> {
        let path = self.root.join("snapshots.json");
        let tmp = self.root.join("snapshots.json.tmp");
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&serde_json::to_vec_pretty(&self.record).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&self.root)?.sync_all()
    }

    /// The directory of snapshot `id`: `fs` holds its files (or is the volume's mountpoint), `work`
    /// is overlayfs's work directory.
    pub fn dir(&self, id: u64) -> PathBuf {
        self.root.join("snapshots").join(id.to_string())
    }

    pub fn next_id(&mut self) -> u64 {
        self.record.next_id += 1;
        self.record.next_id
    }

    pub fn get(&self, key: &str) -> Option<&Snap> {
        self.record.snapshots.get(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Snap> {
        self.record.snapshots.get_mut(key)
    }

    pub fn insert(&mut self, key: String, snap: Snap) {
        self.record.snapshots.insert(key, snap);
    }

    pub fn remove(&mut self, key: &str) -> Option<Snap> {
        self.record.snapshots.remove(key)
    }

    pub fn has_children(&self, key: &str) -> bool {
        self.record.snapshots.values().any(|s| s.parent == key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Snap)> {
        self.record.snapshots.iter()
    }

    /// The committed snapshot a remote layer was recorded under, if any: its `snapshot.ref` label.
    pub fn find_by_ref(&self, target: &str) -> Option<&String> {
        self.record.snapshots.iter().find_map(|(k, s)| {
            (s.kind == SnapKind::Committed
                && s.labels
                    .get(super::labels::SNAPSHOT_REF)
                    .map(String::as_str)
                    == Some(target))
            .then_some(k)
        })
    }

    /// The `fs` directories of `key`'s ancestors, nearest first.
    pub fn ancestors(&self, key: &str) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut next = self.get(key).map(|s| s.parent.clone());
        while let Some(parent) = next.filter(|p| !p.is_empty()) {
            let Some(snap) = self.get(&parent) else { break };
            out.push(self.dir(snap.id).join("fs"));
            next = Some(snap.parent.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(id: u64, parent: &str, kind: SnapKind) -> Snap {
        Snap {
            id,
            kind,
            parent: parent.into(),
            labels: HashMap::new(),
            created_at: SystemTime::now(),
            updated_at: SystemTime::now(),
            remote: None,
        }
    }

    #[test]
    fn the_record_survives_a_reopen_and_walks_parents_nearest_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let (a, b, c) = (store.next_id(), store.next_id(), store.next_id());
        store.insert("base".into(), snap(a, "", SnapKind::Committed));
        store.insert("mid".into(), snap(b, "base", SnapKind::Committed));
        store.insert("top".into(), snap(c, "mid", SnapKind::Active));
        store.save().unwrap();
        let mut again = Store::open(dir.path()).unwrap();
        assert_eq!(
            again.ancestors("top"),
            vec![again.dir(b).join("fs"), again.dir(a).join("fs")]
        );
        assert!(again.has_children("mid"));
        assert!(!again.has_children("top"));
        assert_eq!(again.next_id(), 4, "ids are never reused");
    }
}
