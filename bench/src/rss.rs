//! Server memory under load: N clients each push a distinct large blob at once while a thread
//! samples the server's VmRSS every 100 ms; reports the sampled maximum, VmHWM and aggregate MB/s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use serde::Serialize;
use tokio::task::JoinSet;

use crate::blobs;
use crate::data::SharedBody;
use crate::servers::{proc_status_kib, Server};

#[derive(Clone, Debug, Serialize)]
pub struct RssPush {
    pub server: String,
    pub clients: usize,
    pub blob_bytes: u64,
    /// Highest VmRSS seen by the 100 ms sampler.
    pub max_vmrss_kib: u64,
    /// VmHWM when the pushes finished (the server was started fresh for this test).
    pub vmhwm_kib: u64,
    pub samples: usize,
    pub aggregate_mb_s: f64,
    pub elapsed_s: f64,
}

/// Samples VmRSS of `pid` every `every` on its own thread (so a busy async runtime cannot delay it)
/// until `stop` is set; returns (max KiB, sample count).
pub fn sampler(
    pid: u32,
    stop: Arc<AtomicBool>,
    every: Duration,
) -> std::thread::JoinHandle<(u64, usize)> {
    std::thread::spawn(move || {
        let (mut max, mut samples) = (0, 0);
        loop {
            if let Some(kib) = proc_status_kib(pid, "VmRSS") {
                max = max.max(kib);
                samples += 1;
            }
            if stop.load(Ordering::Relaxed) {
                return (max, samples);
            }
            std::thread::sleep(every);
        }
    })
}

pub async fn run(
    server: &Server,
    repo: &str,
    shared: &SharedBody,
    clients: usize,
) -> Result<RssPush> {
    let pid = server.pid();
    let len = shared.len();
    // Digests and clients are ready before the clock starts.
    let mut jobs = Vec::with_capacity(clients);
    for i in 0..clients {
        let suffix = SharedBody::suffix(i);
        jobs.push((
            blobs::client()?,
            shared.digest(&suffix),
            shared.body(suffix),
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sampling = sampler(pid, Arc::clone(&stop), Duration::from_millis(100));
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for (client, digest, body) in jobs {
        let (base, repo) = (server.base.clone(), repo.to_string());
        tasks.spawn(async move { blobs::push(&client, &base, &repo, &digest, body, len).await });
    }
    let mut outcome = Ok(());
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done.map_err(anyhow::Error::from).and_then(|r| r) {
            outcome = Err(e);
            break;
        }
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (max_vmrss_kib, samples) = sampling
        .join()
        .map_err(|_| anyhow!("RSS sampler panicked"))?;
    let vmhwm_kib = proc_status_kib(pid, "VmHWM").unwrap_or(0);
    outcome?;
    Ok(RssPush {
        server: server.name.to_string(),
        clients,
        blob_bytes: len,
        max_vmrss_kib,
        vmhwm_kib,
        samples,
        aggregate_mb_s: blobs::mb_per_s(len * clients as u64, elapsed),
        elapsed_s: elapsed.as_secs_f64(),
    })
}
