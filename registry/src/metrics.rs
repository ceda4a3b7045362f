//! Prometheus counters for `/metrics`: requests by endpoint, method and status, bytes in and out.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, String, u16), u64>>,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    manifest_bytes_in: AtomicU64,
    seal_layers_read: AtomicU64,
    seal_layers_reused: AtomicU64,
    seal_bytes_read: AtomicU64,
    packs_stored: AtomicU64,
    pack_chunks_stored: AtomicU64,
}

impl Metrics {
    pub fn record_request(&self, endpoint: &'static str, method: &str, status: u16) {
        if let Ok(mut map) = self.requests.lock() {
            *map.entry((endpoint, method.to_owned(), status))
                .or_default() += 1;
        }
    }

    pub fn add_bytes_in(&self, n: u64) {
        self.bytes_in.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_manifest_bytes_in(&self, n: u64) {
        self.manifest_bytes_in.fetch_add(n, Ordering::Relaxed);
    }

    /// A layer a seal read (with its size), or reused from an earlier seal of the same blob.
    pub fn record_seal_layer(&self, reused: bool, bytes: u64) {
        if reused {
            self.seal_layers_reused.fetch_add(1, Ordering::Relaxed);
        } else {
            self.seal_layers_read.fetch_add(1, Ordering::Relaxed);
            self.seal_bytes_read.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// A pack committed, holding `chunks` chunks.
    pub fn record_pack(&self, chunks: u64) {
        self.packs_stored.fetch_add(1, Ordering::Relaxed);
        self.pack_chunks_stored.fetch_add(chunks, Ordering::Relaxed);
    }

    pub fn add_bytes_out(&self, n: u64) {
        self.bytes_out.fetch_add(n, Ordering::Relaxed);
    }

    /// The text exposition format, with the gauge of open upload sessions read at scrape time.
    pub fn render(&self, uploads_open: Option<u64>) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP vial_http_requests_total HTTP requests by API endpoint, method and status.\n",
        );
        out.push_str("# TYPE vial_http_requests_total counter\n");
        if let Ok(map) = self.requests.lock() {
            for ((endpoint, method, status), n) in map.iter() {
                let _ = writeln!(
                    out,
                    "vial_http_requests_total{{endpoint=\"{endpoint}\",method=\"{method}\",status=\"{status}\"}} {n}"
                );
            }
        }
        write_counter(
            &mut out,
            "vial_bytes_received_total",
            "Blob bytes received in uploads.",
            &self.bytes_in,
        );
        write_counter(
            &mut out,
            "vial_manifest_bytes_received_total",
            "Manifest bytes received in pushes.",
            &self.manifest_bytes_in,
        );
        write_counter(
            &mut out,
            "vial_bytes_sent_total",
            "Blob bytes sent in downloads.",
            &self.bytes_out,
        );
        out.push_str("# HELP vial_seal_layers_total Artifact layers sealed, by whether they were read or reused from an earlier seal of the same blob.\n");
        out.push_str("# TYPE vial_seal_layers_total counter\n");
        for (how, n) in [
            ("read", &self.seal_layers_read),
            ("reused", &self.seal_layers_reused),
        ] {
            let _ = writeln!(
                out,
                "vial_seal_layers_total{{layer=\"{how}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        write_counter(
            &mut out,
            "vial_seal_bytes_read_total",
            "Layer bytes read by seals.",
            &self.seal_bytes_read,
        );
        write_counter(
            &mut out,
            "vial_packs_stored_total",
            "Packs (many chunks uploaded in one request) stored and committed.",
            &self.packs_stored,
        );
        write_counter(
            &mut out,
            "vial_pack_chunks_stored_total",
            "Chunks that arrived in packs.",
            &self.pack_chunks_stored,
        );
        if let Some(n) = uploads_open {
            out.push_str(
                "# HELP vial_upload_sessions_open Upload sessions started and not yet finished.\n",
            );
            out.push_str("# TYPE vial_upload_sessions_open gauge\n");
            let _ = writeln!(out, "vial_upload_sessions_open {n}");
        }
        out
    }
}

/// One unlabelled counter in the text exposition format: HELP, TYPE and value.
pub(crate) fn write_counter(out: &mut String, name: &str, help: &str, value: &AtomicU64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
        value.load(Ordering::Relaxed)
    );
}
