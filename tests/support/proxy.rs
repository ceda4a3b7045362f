//! A misbehaving registry: a proxy in front of a real one that corrupts, truncates, fails or stalls
//! blob downloads on demand, to test the error paths of clients and mounts.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to blob downloads: blob GETs, and vial's bulk chunk reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Pass everything through.
    None,
    /// Flip one byte in the middle of every blob body.
    Corrupt,
    /// Answer 503 to the next N blob GETs, then pass through.
    Unavailable(usize),
    /// Close the connection without answering the next N blob GETs (as a server closing an idle
    /// connection just as a request arrives on it), then pass through.
    Hangup(usize),
    /// Send the headers and half the body, then close the connection.
    Truncate,
    /// Accept the request and never answer.
    Stall,
}

/// One blob download the proxy answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobGet {
    /// The digest in the request path, or the digests a bulk read asked for.
    pub digests: Vec<String>,
    /// The status sent back (an injected 503, or the upstream's).
    pub status: u16,
    /// Body bytes sent back.
    pub bytes: usize,
}

pub struct Proxy {
    pub addr: String,
    fault: Arc<Mutex<Fault>>,
    stop: Arc<AtomicBool>,
    /// Blob GETs seen, whatever happened to them.
    pub blob_gets: Arc<AtomicUsize>,
    /// Every blob GET answered, in order.
    answered: Arc<Mutex<Vec<BlobGet>>>,
}

impl Proxy {
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let fault = Arc::new(Mutex::new(Fault::None));
        let stop = Arc::new(AtomicBool::new(false));
        let blob_gets = Arc::new(AtomicUsize::new(0));
        let answered = Arc::new(Mutex::new(Vec::new()));
        let (f, s, g, a, up) = (
            fault.clone(),
            stop.clone(),
            blob_gets.clone(),
            answered.clone(),
            upstream.to_owned(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (f, g, a, up) = (f.clone(), g.clone(), a.clone(), up.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &up, &f, &g, &a);
                });
            }
        });
        Proxy {
            addr,
            fault,
            stop,
            blob_gets,
            answered,
        }
    }

    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
    }

    /// The fault in force now (`Unavailable(0)` once every injected 503 was sent).
    pub fn fault(&self) -> Fault {
        *self.fault.lock().unwrap()
    }

    /// The blob GETs answered so far, and forgets them.
    pub fn take_answered(&self) -> Vec<BlobGet> {
        std::mem::take(&mut *self.answered.lock().unwrap())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(&self.addr);
    }
}

fn serve(
    mut conn: TcpStream,
    upstream: &str,
    fault: &Mutex<Fault>,
    blob_gets: &AtomicUsize,
    answered: &Mutex<Vec<BlobGet>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut parts = request_line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or("").to_owned(),
        parts.next().unwrap_or("").to_owned(),
    );
    let mut headers = Vec::new();
    let mut content_length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_owned());
            if k == "content-length" {
                content_length = v.parse().unwrap_or(0);
            }
            if !matches!(
                k.as_str(),
                "host" | "connection" | "content-length" | "transfer-encoding"
            ) {
                headers.push((k, v));
            }
        }
    }
    let mut body = vec![0u8; content_length];
    reader.read_exact(&mut body)?;

    let bulk_read = method == "POST" && path.ends_with("/_vial/chunks");
    let is_blob_get =
        bulk_read || (method == "GET" && path.contains("/blobs/") && !path.contains("/uploads"));
    let digests: Vec<String> = if bulk_read {
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["digests"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|d| d.as_str().map(str::to_owned))
            .collect()
    } else {
        vec![path
            .rsplit('/')
            .next()
            .unwrap_or("")
            .split('?')
            .next()
            .unwrap_or("")
            .to_owned()]
    };
    let record = |status: u16, bytes: usize| {
        answered.lock().unwrap().push(BlobGet {
            digests: digests.clone(),
            status,
            bytes,
        });
    };
    // Read and spent in one step, so two GETs at once cannot both take the last injected 503.
    let current = {
        let mut f = fault.lock().unwrap();
        let current = *f;
        match (is_blob_get, current) {
            (true, Fault::Unavailable(n)) => *f = Fault::Unavailable(n.saturating_sub(1)),
            (true, Fault::Hangup(n)) => *f = Fault::Hangup(n.saturating_sub(1)),
            _ => {}
        }
        current
    };
    if is_blob_get {
        blob_gets.fetch_add(1, Ordering::Relaxed);
        match current {
            Fault::Unavailable(n) if n > 0 => {
                let msg = br#"{"errors":[{"code":"UNAVAILABLE","message":"injected"}]}"#;
                record(503, 0);
                write!(conn, "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", msg.len())?;
                return conn.write_all(msg);
            }
            Fault::Hangup(n) if n > 0 => {
                record(0, 0);
                return conn.shutdown(std::net::Shutdown::Both);
            }
            Fault::Stall => {
                std::thread::sleep(Duration::from_secs(3600));
                return Ok(());
            }
            _ => {}
        }
    }

    let client = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut req = client
        .request(method.parse().unwrap(), format!("http://{upstream}{path}"))
        .body(body);
    for (k, v) in &headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let resp = match req.send() {
        Ok(r) => r,
        Err(_) => {
            return conn.write_all(
                b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    };
    let status = resp.status();
    let resp_headers = resp.headers().clone();
    let mut payload = resp.bytes().map(|b| b.to_vec()).unwrap_or_default();
    let declared = payload.len();
    if is_blob_get && status.is_success() && !payload.is_empty() {
        match current {
            Fault::Corrupt => {
                let mid = payload.len() / 2;
                payload[mid] ^= 0xff;
            }
            Fault::Truncate => payload.truncate(payload.len() / 2),
            _ => {}
        }
    }
    // Recorded before the answer goes out, so a client that has its answer finds it recorded.
    if is_blob_get {
        record(status.as_u16(), payload.len());
    }
    write!(
        conn,
        "HTTP/1.1 {} {}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    )?;
    for (k, v) in resp_headers.iter() {
        if !matches!(
            k.as_str(),
            "content-length" | "connection" | "transfer-encoding"
        ) {
            conn.write_all(format!("{}: ", k.as_str()).as_bytes())?;
            conn.write_all(v.as_bytes())?;
            conn.write_all(b"\r\n")?;
        }
    }
    let length = if method == "HEAD" {
        resp_headers
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    } else {
        declared
    };
    write!(
        conn,
        "content-length: {length}\r\nconnection: close\r\n\r\n"
    )?;
    if method != "HEAD" {
        conn.write_all(&payload)?;
    }
    conn.flush()
}
