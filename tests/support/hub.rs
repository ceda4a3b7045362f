//! A small stand-in for the Hugging Face Hub's HTTP API, serving files the test made, in the
//! documented shape: `GET /api/models/{repo}/revision/{revision}` lists a commit's files
//! (`sha`, `siblings[].rfilename`, and with `?blobs=true` their sizes), and
//! `GET|HEAD /{repo}/resolve/{commit}/{path}` serves one. It counts downloads per file and can
//! hold one file back until the test releases it.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};

/// The commit every listing resolves to.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[derive(Default)]
struct State {
    repo: String,
    /// Path to content.
    files: BTreeMap<String, Vec<u8>>,
    /// Files whose size the listing leaves out, so the client must ask with HEAD.
    sizeless: Vec<String>,
    downloads: HashMap<String, usize>,
    /// A file whose download waits until released.
    held: Option<String>,
}

pub struct Hub {
    pub addr: String,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl Hub {
    /// Serves `files` as the model repository `repo` at [`COMMIT`].
    pub fn start(repo: &str, files: &[(&str, Vec<u8>)]) -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new((
            Mutex::new(State {
                repo: repo.to_owned(),
                files: files
                    .iter()
                    .map(|(p, c)| ((*p).to_owned(), c.clone()))
                    .collect(),
                ..State::default()
            }),
            Condvar::new(),
        ));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    let _ = serve(conn, &shared);
                });
            }
        });
        Hub { addr, state }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Leaves `path`'s size out of listings.
    pub fn hide_size(&self, path: &str) {
        self.state.0.lock().unwrap().sizeless.push(path.to_owned());
    }

    /// Holds downloads of `path` until [`Hub::release`].
    pub fn hold(&self, path: &str) {
        self.state.0.lock().unwrap().held = Some(path.to_owned());
    }

    pub fn release(&self) {
        self.state.0.lock().unwrap().held = None;
        self.state.1.notify_all();
    }

    /// GETs of each file so far.
    pub fn downloads(&self) -> HashMap<String, usize> {
        self.state.0.lock().unwrap().downloads.clone()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.release();
    }
}

fn serve(conn: TcpStream, shared: &(Mutex<State>, Condvar)) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_owned(),
        parts.next().unwrap_or("").to_owned(),
    );
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut out = conn;
    let respond = |out: &mut TcpStream, status: &str, kind: &str, body: &[u8], head: bool| {
        let header = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        out.write_all(header.as_bytes())?;
        if !head {
            out.write_all(body)?;
        }
        out.flush()
    };
    let (repo, listing_prefix) = {
        let state = shared.0.lock().unwrap();
        (
            state.repo.clone(),
            format!("/api/models/{}/revision/", state.repo),
        )
    };
    if method == "GET" && path.starts_with(&listing_prefix) {
        let state = shared.0.lock().unwrap();
        let blobs = query.split('&').any(|kv| kv == "blobs=true");
        let siblings: Vec<serde_json::Value> = state
            .files
            .iter()
            .map(|(p, c)| {
                if blobs && !state.sizeless.contains(p) {
                    serde_json::json!({ "rfilename": p, "size": c.len() })
                } else {
                    serde_json::json!({ "rfilename": p })
                }
            })
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({
            "id": repo,
            "sha": COMMIT,
            "siblings": siblings,
        }))
        .unwrap();
        drop(state);
        return respond(&mut out, "200 OK", "application/json", &body, false);
    }
    let resolve = format!("/{repo}/resolve/{COMMIT}/");
    if let (true, Some(file)) = (
        method == "GET" || method == "HEAD",
        path.strip_prefix(&resolve),
    ) {
        let file = decode(file);
        let head = method == "HEAD";
        let mut state = shared.0.lock().unwrap();
        if !head {
            *state.downloads.entry(file.clone()).or_default() += 1;
            while state.held.as_deref() == Some(file.as_str()) {
                state = shared.1.wait(state).unwrap();
            }
        }
        let Some(content) = state.files.get(&file).cloned() else {
            drop(state);
            return respond(
                &mut out,
                "404 Not Found",
                "text/plain",
                b"no such file",
                head,
            );
        };
        drop(state);
        return respond(
            &mut out,
            "200 OK",
            "application/octet-stream",
            &content,
            head,
        );
    }
    respond(&mut out, "404 Not Found", "text/plain", b"not found", false)
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
