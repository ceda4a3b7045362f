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

    /// Sends one DevTools command and returns its answer, an error included (events in between
    /// are skipped).
    fn send(&mut self, method: &str, params: Value) -> Value {
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
                return v;
            }
        }
    }

    /// Sends one DevTools command and returns its result; a command that fails fails the test.
    fn call(&mut self, method: &str, params: Value) -> Value {
        let v = self.send(method, params);
        assert!(v.get("error").is_none(), "{method} failed: {v}");
        v["result"].clone()
    }

    /// Evaluates JavaScript in the page: its value, or what went wrong (the expression threw, or
    /// the page had no document to run it in, as happens in the middle of a navigation).
    fn try_eval(&mut self, expression: &str) -> Result<Value, Value> {
        let v = self.send(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        if let Some(error) = v.get("error") {
            return Err(error.clone());
        }
        let r = &v["result"];
        match r.get("exceptionDetails") {
            Some(exception) => Err(exception.clone()),
            None => Ok(r["result"]["value"].clone()),
        }
    }

    /// Evaluates JavaScript in the page and returns its value. An expression that throws fails
    /// the test: its `undefined` would pass for an empty answer.
    pub fn eval(&mut self, expression: &str) -> Value {
        self.try_eval(expression)
            .unwrap_or_else(|e| panic!("evaluating {expression:?} failed: {e}"))
    }

    /// Marks the document shown now, so `settle` can tell when another has replaced it.
    fn mark_document(&mut self) {
        self.eval("window.__vialReplaced = false; true");
    }

    /// Waits until the navigation started after `mark_document` has replaced the document and the
    /// new one has loaded; a navigation that failed (Chromium's own error page) fails the test.
    fn settle(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let loaded = "window.__vialReplaced === undefined && document.readyState === 'complete'";
        while self.try_eval(loaded) != Ok(Value::Bool(true)) {
            assert!(Instant::now() < deadline, "the page did not finish loading");
            std::thread::sleep(Duration::from_millis(20));
        }
        let at = self.eval("location.href");
        assert!(
            !at.as_str().unwrap_or_default().starts_with("chrome-error:"),
            "the navigation failed: Chromium shows its error page: {}",
            self.text()
        );
    }

    /// Loads `url` and returns the rendered document. A navigation that fails (no server, a
    /// refused connection) fails the test: Chromium's error page would pass every check that
    /// something is absent.
    pub fn open(&mut self, url: &str) -> String {
        self.mark_document();
        let r = self.call("Page.navigate", json!({ "url": url }));
        assert!(
            r.get("errorText").is_none(),
            "navigating to {url} failed: {}",
            r["errorText"]
        );
        self.settle();
        self.html()
    }

    /// Runs `script`, which submits a form or otherwise navigates, and waits for the page it
    /// leads to.
    pub fn submit(&mut self, script: &str) {
        self.mark_document();
        self.eval(script);
        self.settle();
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

    /// Every table on the page, as rows of cells' text: what a visitor reads in each column, so a
    /// check can name the row and column a value belongs in rather than find it anywhere.
    pub fn tables(&mut self) -> Vec<Vec<Vec<String>>> {
        let tables = self.eval(
            "Array.from(document.querySelectorAll('table')).map(t => Array.from(t.rows)\
             .map(r => Array.from(r.cells).map(c => c.innerText.trim())))",
        );
        serde_json::from_value(tables).expect("tables as rows of cells")
    }

    /// The cookies the browser sends with the page shown now, as DevTools reports them (`name`,
    /// `httpOnly`, …).
    pub fn cookies(&mut self) -> Vec<Value> {
        let r = self.call("Network.getCookies", json!({}));
        r["cookies"].as_array().cloned().unwrap_or_default()
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
        self.submit(&script);
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
