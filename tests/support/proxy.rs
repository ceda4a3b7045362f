//! A misbehaving registry: a proxy in front of a real one that corrupts, truncates, fails or stalls
//! blob downloads on demand, to test the error paths of clients and mounts.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to blob GETs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Pass everything through.
    None,
    /// Flip one byte in the middle of every blob body.
    Corrupt,
    /// Answer 503 to the next N blob GETs, then pass through.
    Unavailable(usize),
    /// Send the headers and half the body, then close the connection.
    Truncate,
    /// Accept the request and never answer.
    Stall,
}

pub struct Proxy {
    pub addr: String,
    fault: Arc<Mutex<Fault>>,
    stop: Arc<AtomicBool>,
    /// Blob GETs seen, whatever happened to them.
    pub blob_gets: Arc<AtomicUsize>,
}

impl Proxy {
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let fault = Arc::new(Mutex::new(Fault::None));
        let stop = Arc::new(AtomicBool::new(false));
        let blob_gets = Arc::new(AtomicUsize::new(0));
        let (f, s, g, up) = (
            fault.clone(),
            stop.clone(),
            blob_gets.clone(),
            upstream.to_owned(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (f, g, up) = (f.clone(), g.clone(), up.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &up, &f, &g);
                });
            }
        });
        Proxy {
            addr,
            fault,
            stop,
            blob_gets,
        }
    }

    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
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

    let is_blob_get = method == "GET" && path.contains("/blobs/") && !path.contains("/uploads");
    let current = *fault.lock().unwrap();
    if is_blob_get {
        blob_gets.fetch_add(1, Ordering::Relaxed);
        match current {
            Fault::Unavailable(n) if n > 0 => {
                *fault.lock().unwrap() = Fault::Unavailable(n - 1);
                let msg = br#"{"errors":[{"code":"UNAVAILABLE","message":"injected"}]}"#;
                write!(conn, "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", msg.len())?;
                return conn.write_all(msg);
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
