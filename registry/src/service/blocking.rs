//! Reads that a job runs on blocking threads (a seal reads a layer through the chunker there), and
//! how a shutdown stops them.
//!
//! A graceful shutdown hands a running job back by dropping its future, but a blocking thread
//! cannot be dropped: left alone it would read the rest of its layer, however large, and tokio's
//! shutdown waits for it, while the runtime it reads through (an S3 body, its timers) goes away
//! under it. So each such read is [`Abandonable`]: once the future that started it is gone, its
//! next read fails, and the job runner waits (briefly) for the last of them before it returns.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// How many blocking reads are under way, and a wake-up when one ends.
#[derive(Debug, Default)]
pub struct Readers {
    live: AtomicUsize,
    ended: Notify,
}

impl Readers {
    /// Waits until no blocking read is under way, at most `limit`; returns whether none is.
    pub async fn done(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if self.live() == 0 {
                return true;
            }
            // `notify_one` keeps a permit when nobody waits, so an end between the load above and
            // this wait is not missed.
            if tokio::time::timeout_at(deadline, self.ended.notified())
                .await
                .is_err()
            {
                return self.live() == 0;
            }
        }
    }

    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

/// A reader for a blocking thread whose reads fail once its [`Abandon`] guard is dropped.
pub struct Abandonable<R> {
    inner: R,
    abandoned: Arc<AtomicBool>,
    readers: Arc<Readers>,
}

/// Held by the async side for as long as it wants the read: dropping it (the job's future was
/// dropped) makes the reader's next read fail.
pub struct Abandon(Arc<AtomicBool>);

impl Drop for Abandon {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Wraps `inner`, counting it among `readers` until the reader is dropped.
pub fn abandonable<R: Read>(readers: &Arc<Readers>, inner: R) -> (Abandonable<R>, Abandon) {
    let abandoned = Arc::new(AtomicBool::new(false));
    readers.live.fetch_add(1, Ordering::SeqCst);
    (
        Abandonable {
            inner,
            abandoned: Arc::clone(&abandoned),
            readers: Arc::clone(readers),
        },
        Abandon(abandoned),
    )
}

impl<R: Read> Read for Abandonable<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.abandoned.load(Ordering::SeqCst) {
            return Err(std::io::Error::other(
                "the job this read was for is gone (the registry is shutting down)",
            ));
        }
        self.inner.read(buf)
    }
}

impl<R> Drop for Abandonable<R> {
    fn drop(&mut self) {
        self.readers.live.fetch_sub(1, Ordering::SeqCst);
        self.readers.ended.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_read_stops_once_its_guard_is_dropped_and_the_runner_sees_it_end() {
        let readers = Arc::new(Readers::default());
        assert!(readers.done(Duration::from_millis(10)).await, "none yet");
        // An endless source, as a large layer is to the reader.
        let (mut reader, guard) = abandonable(&readers, std::io::repeat(7));
        let mut buf = [0u8; 4];
        reader.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [7; 4]);
        assert_eq!(readers.live(), 1);

        let thread = std::thread::spawn(move || {
            let mut total = 0u64;
            let mut buf = vec![0u8; 1 << 16];
            let error = loop {
                match reader.read(&mut buf) {
                    Ok(n) => total += n as u64,
                    Err(e) => break e,
                }
            };
            (total, error.to_string())
        });
        assert!(
            !readers.done(Duration::from_millis(50)).await,
            "the read is still under way"
        );
        drop(guard);
        assert!(
            readers.done(Duration::from_secs(30)).await,
            "the reader stopped and was counted out"
        );
        let (total, error) = thread.join().unwrap();
        assert!(total > 0);
        assert!(error.contains("shutting down"), "{error}");
    }
}
