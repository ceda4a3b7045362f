//! Upload sessions in this process: a lock per session, and the running digest of what it holds.
//!
//! The running digest is an optimisation, never a source of truth. It is kept only while it is known
//! to cover exactly the bytes in the blob store; whenever that is in doubt (a failed chunk, a restart,
//! a session continued on another replica) it is dropped and the upload is hashed again from storage
//! when it is finished.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use vial_core::{Algorithm, DigestHasher};

#[derive(Debug)]
pub struct HashState {
    /// Bytes covered by `hasher`.
    pub offset: u64,
    pub hasher: Option<DigestHasher>,
}

#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Arc<tokio::sync::Mutex<HashState>>>>,
}

impl Sessions {
    /// Registers a new, empty session whose uploads will be hashed with `algorithm`.
    pub fn start(&self, id: &str, algorithm: Algorithm) {
        let state = HashState {
            offset: 0,
            hasher: Some(algorithm.hasher()),
        };
        if let Ok(mut map) = self.map.lock() {
            map.insert(id.to_owned(), Arc::new(tokio::sync::Mutex::new(state)));
        }
    }

    /// The session's lock, created without a running digest if this process has not seen it.
    pub fn get(&self, id: &str) -> Arc<tokio::sync::Mutex<HashState>> {
        let fresh = || {
            Arc::new(tokio::sync::Mutex::new(HashState {
                offset: 0,
                hasher: None,
            }))
        };
        match self.map.lock() {
            Ok(mut map) => map.entry(id.to_owned()).or_insert_with(fresh).clone(),
            Err(_) => fresh(),
        }
    }

    pub fn remove(&self, id: &str) {
        if let Ok(mut map) = self.map.lock() {
            map.remove(id);
        }
    }
}
