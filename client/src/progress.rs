//! Progress reporting: the engine emits events, the CLI draws them (or not).

/// Something a long transfer reports as it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The directory was walked: this many files and bytes will be read (or reused).
    Scanned { files: u64, bytes: u64 },
    /// Bytes of files read and chunked, or reused from the local index.
    Hashed(u64),
    /// Bytes known to be needed on the other side (to upload or download).
    Needed(u64),
    /// Bytes sent or received.
    Transferred(u64),
}

/// Receives progress events; implementations must be cheap and thread-safe.
pub trait Progress: Send + Sync {
    fn event(&self, event: Event);
}

/// Discards all events.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Progress for Silent {
    fn event(&self, _: Event) {}
}
