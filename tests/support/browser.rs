//! Debian's Chromium, headless, driven over the DevTools protocol: pages are loaded, forms filled
//! and submitted, and the rendered DOM read back or captured as a picture, as a visitor's browser
//! would see them.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{peer, require_all};

/// A running headless Chromium with one page (tab) under our control.
pub struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    next_id: u64,
}

fn chromium() -> Option<PathBuf> {
    let found = peer("chromium");
    if found.is_none() {
        assert!(
            !require_all(),
            "chromium is required (VIAL_TEST_REQUIRE_ALL=1): apt-get install chromium"
        );
        eprintln!("SKIP: chromium not found");
    }
    found
}

impl Browser {
    /// Starts Chromium with an empty profile; `None` (a skip) where it is not installed.
    pub fn start() -> Option<Browser> {
        let program = chromium()?;
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(program)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        // Chromium says where its DevTools endpoint listens on stderr, once it is up; the rest of
        // what it prints is drained so it never blocks on a full pipe.
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stderr.lines() {
                let line = line.unwrap_or_default();
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(url.trim().to_owned());
                }
            }
        });
        let browser_url = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("chromium printed no DevTools address");
        let port = browser_url
            .trim_start_matches("ws://127.0.0.1:")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        // The page Chromium opened at start.
        let targets: Value = reqwest::blocking::get(format!("http://127.0.0.1:{port}/json/list"))
            .unwrap()
            .json()
            .unwrap();
        let page = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .expect("no page target")["webSocketDebuggerUrl"]
            .as_str()
            .unwrap()
            .to_owned();
        let (socket, _) = tungstenite::connect(page).expect("connect to the page's DevTools");
        let mut b = Browser {
            child,
            _profile: profile,
            socket,
            next_id: 0,
        };
        b.call("Page.enable", json!({}));
        Some(b)
    }

    /// Sends one DevTools command and returns its result (events in between are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.socket
            .send(tungstenite::Message::text(
                json!({ "id": id, "method": method, "params": params }).to_string(),
            ))
            .unwrap();
        loop {
            let message = self.socket.read().unwrap();
            let Ok(text) = message.to_text() else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method} failed: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates JavaScript in the page and returns its value.
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        r["result"]["value"].clone()
    }

    /// Waits until the page has loaded (after a navigation or a form's submission).
    fn settle(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        // A navigation takes a moment to start: wait for the old document to go, then the new to
        // be complete.
        std::thread::sleep(Duration::from_millis(50));
        while self.eval("document.readyState") != "complete" {
            assert!(Instant::now() < deadline, "the page did not finish loading");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Loads `url` and returns the rendered document.
    pub fn open(&mut self, url: &str) -> String {
        self.call("Page.navigate", json!({ "url": url }));
        self.settle();
        self.html()
    }

    /// The rendered document as HTML.
    pub fn html(&mut self) -> String {
        self.eval("document.documentElement.outerHTML")
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The text a visitor reads on the page.
    pub fn text(&mut self) -> String {
        self.eval("document.body.innerText")
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Fills the sign-in form and submits it, as a visitor would.
    pub fn sign_in(&mut self, base: &str, user: &str, password: &str) {
        self.open(&format!("{base}/ui/login"));
        let script = format!(
            "document.querySelector('[name=username]').value = {};\
             document.querySelector('[name=password]').value = {};\
             document.querySelector('form.panel').submit(); true",
            serde_json::to_string(user).unwrap(),
            serde_json::to_string(password).unwrap()
        );
        self.eval(&script);
        self.settle();
    }

    /// Sets the viewport (a phone is 390 wide) and the colour scheme the page sees.
    pub fn emulate(&mut self, width: u32, height: u32, dark: bool) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600 }),
        );
        self.call(
            "Emulation.setEmulatedMedia",
            json!({ "features": [{ "name": "prefers-color-scheme", "value": if dark { "dark" } else { "light" } }] }),
        );
    }

    /// Writes what the page looks like now to `path` (PNG).
    pub fn screenshot(&mut self, path: &Path) {
        use base64::Engine;
        let r = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": false }),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
