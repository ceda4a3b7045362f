//! The web UI, as Debian's headless Chromium renders it: what was pushed, copied and tagged shows
//! on its pages, down to the tensors a new version changed; a private repository never shows up
//! for a visitor who may not pull it, and does once its user signs in.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::browser::Browser;
use crate::support::model::{bert_like, write_safetensors, TensorSpec};
use crate::support::oci::pseudo_random;
use crate::support::vial::{login, push_json, vial_ok};
use crate::support::{push_blob, push_manifest, Server};

/// A two-shard safetensors checkpoint; tensors named in `rewritten` get new bytes.
fn checkpoint(dir: &Path, generation: u64, rewritten: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    for shard in 0..2u64 {
        let specs: Vec<TensorSpec> = bert_like(2, 10 * shard + 1)
            .into_iter()
            .map(|(name, elements, seed)| {
                let name = format!("s{shard}.{name}");
                let seed = if rewritten.contains(&name.as_str()) {
                    seed + 1_000_000 * generation
                } else {
                    seed
                };
                (name, elements, seed)
            })
            .collect();
        write_safetensors(&dir.join(format!("model-{shard}.safetensors")), &specs);
    }
    std::fs::write(
        dir.join("config.json"),
        format!("{{\"generation\": {generation}}}"),
    )
    .unwrap();
}

/// Where screenshots go: `VIAL_UI_SCREENSHOTS` (docs/ui.md's pictures come from there), or a
/// temporary directory that goes with the test.
fn screenshots() -> (PathBuf, Option<tempfile::TempDir>) {
    match std::env::var_os("VIAL_UI_SCREENSHOTS") {
        Some(dir) => {
            std::fs::create_dir_all(&dir).unwrap();
            (PathBuf::from(dir), None)
        }
        None => {
            let t = tempfile::tempdir().unwrap();
            (t.path().to_owned(), Some(t))
        }
    }
}

#[test]
fn the_pages_show_what_was_pushed_copied_and_tagged_down_to_the_changed_tensors() {
    let Some(mut browser) = Browser::start() else {
        return;
    };
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let (v1, v2) = (home.path().join("v1"), home.path().join("v2"));
    checkpoint(&v1, 0, &[]);
    checkpoint(&v2, 1, &["s1.layer.1.ffn.weight"]);
    let repo = format!("{}/weights/model", server.addr);
    let p1 = push_json(home.path(), &v1, &repo, &["--tag", "candidate"]);
    let p2 = push_json(home.path(), &v2, &repo, &["--tag", "candidate"]);
    let (d1, d2) = (
        p1["digest"].as_str().unwrap().to_owned(),
        p2["digest"].as_str().unwrap().to_owned(),
    );
    // A tag move and a copy, as a release would do them.
    vial_ok(
        home.path(),
        &["tag", "set", &format!("{repo}@{d1}"), "prod"],
    );
    vial_ok(
        home.path(),
        &[
            "copy",
            &format!("{repo}:candidate"),
            &format!("{}/weights/copied:v2", server.addr),
        ],
    );
    // An ordinary image beside the volumes.
    let client = reqwest::blocking::Client::new();
    let layer = push_blob(
        &client,
        &server.url(),
        "images/app",
        &pseudo_random(4096, 9),
    );
    let (image_digest, _) = push_manifest(
        &client,
        &server.url(),
        "images/app",
        "1.0",
        &[(layer.clone(), 4096)],
    );
    let base = server.url();
    let (shots, _keep) = screenshots();

    // `/` leads to the UI.
    let r = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(&base)
        .send()
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/ui/");

    let home_page = browser.open(&format!("{base}/ui/"));
    for name in ["weights/model", "weights/copied", "images/app"] {
        assert!(
            home_page.contains(name),
            "{name} missing from the home page"
        );
    }
    browser.screenshot(&shots.join("home.png"));
    let searched = browser.open(&format!("{base}/ui/?q=copied"));
    assert!(searched.contains("weights/copied") && !searched.contains("weights/model"));

    // The volume: both versions with their sizes and tags, the pinned reference to copy.
    browser.open(&format!("{base}/ui/r/weights/model"));
    let text = browser.text();
    assert!(
        text.contains(&d1[..19]) && text.contains(&d2[..19]),
        "{text}"
    );
    assert!(
        text.contains("prod") && text.contains("candidate"),
        "{text}"
    );
    assert!(browser
        .html()
        .contains(&format!("{}/weights/model@{d2}", server.addr)));
    let size = p2["bytes"].as_u64().unwrap();
    assert!(
        text.contains(&format!("{:.1} MiB", size as f64 / (1 << 20) as f64)),
        "{text}"
    );
    assert!(text.contains("Versions (2)"), "{text}");
    browser.screenshot(&shots.join("volume.png"));

    // A version: its files and sizes, and what it shares with the one before.
    browser.open(&format!("{base}/ui/r/weights/model/-/v/{d2}"));
    let text = browser.text();
    for f in ["model-0.safetensors", "model-1.safetensors", "config.json"] {
        assert!(text.contains(f), "{f} missing: {text}");
    }
    assert!(text.contains("Shared with the version before"), "{text}");
    browser.screenshot(&shots.join("version.png"));

    // The comparison names the rewritten tensor and only the files that changed.
    browser.open(&format!(
        "{base}/ui/r/weights/model/-/compare?a={d1}&b={d2}"
    ));
    let text = browser.text();
    assert!(
        !text.contains("s0.layer.1.ffn.weight"),
        "an unchanged tensor listed: {text}"
    );
    assert!(
        !text.contains("model-0.safetensors"),
        "the unchanged shard is listed: {text}"
    );
    let tables = browser.tables();
    // The files table lists the changed files, each marked as such, and nothing else.
    let mut files = tables[0].clone();
    files.sort();
    assert_eq!(
        files,
        [["M", "config.json"], ["M", "model-1.safetensors"]],
        "{text}"
    );
    // The changed shard's tensor table (after its heading row) names the rewritten tensor alone.
    let tensors: Vec<&str> = tables[1][1..].iter().map(|r| r[1].as_str()).collect();
    assert_eq!(tensors, ["s1.layer.1.ffn.weight"], "{text}");
    browser.screenshot(&shots.join("compare.png"));

    // The tag's history, newest first: pushed to v2's predecessor, then moved to v2 by the next
    // push. Columns: when, by, from, to, why.
    browser.open(&format!("{base}/ui/r/weights/model/-/tags/candidate"));
    let history: Vec<Vec<String>> = browser.tables()[0][1..]
        .iter()
        .map(|row| row[2..].to_vec())
        .collect();
    assert_eq!(
        history,
        [
            [&d1[..19], &d2[..19], "push"],
            ["(none)", &d1[..19], "push"]
        ],
        "{}",
        browser.text()
    );
    browser.open(&format!("{base}/ui/r/weights/model/-/tags/prod"));
    assert!(browser.text().contains(&d1[..19]));

    // The copy is its own repository with the same version; the image shows its layers.
    assert!(browser
        .open(&format!("{base}/ui/r/weights/copied"))
        .contains(&d2[..19]));
    browser.open(&format!("{base}/ui/r/images/app"));
    assert!(browser.text().contains("1.0"));
    browser.open(&format!("{base}/ui/r/images/app/-/v/{image_digest}"));
    let text = browser.text();
    assert!(
        text.contains("application/octet-stream") && text.contains(&layer.as_str()[..19]),
        "{text}"
    );

    // Storage counts every live version and shows the dedup the copy brought.
    browser.open(&format!("{base}/ui/storage"));
    let text = browser.text();
    assert!(
        text.contains("Live versions") && text.contains("Dedup ratio"),
        "{text}"
    );
    // Both versions of the volume and the copy's one, with their files' bytes.
    let html = browser.html();
    assert!(html.contains("Live versions<b>3</b>"), "{html}");
    let referenced = p1["bytes"].as_u64().unwrap() + 2 * size;
    let shown = format!("{:.1} MiB", referenced as f64 / (1 << 20) as f64);
    assert!(
        html.contains(&format!("Files of every live version<b>{shown}</b>")),
        "{shown} missing: {html}"
    );
    browser.screenshot(&shots.join("storage.png"));

    // Phone width, dark mode: the same page, laid out for it.
    browser.emulate(390, 844, true);
    browser.open(&format!("{base}/ui/r/weights/model"));
    browser.screenshot(&shots.join("volume-phone-dark.png"));
    let overflow = browser.eval("document.documentElement.scrollWidth <= window.innerWidth");
    assert_eq!(overflow, true, "the volume page is wider than a phone");
}

const ALICE: (&str, &str) = ("alice", "alice-ui-pw");

/// Anonymous may pull `public/*`; alice may do anything anywhere.
fn auth_config(dir: &Path) -> PathBuf {
    let key = dir.join("token.key");
    std::fs::write(&key, pseudo_random(32, 3)).unwrap();
    let path = dir.join("vial.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[auth]
token-key-file = "{key}"

[[auth.users]]
name = "alice"
password-hash = "{hash}"

[[auth.rules]]
repositories = "*"
users = ["alice"]
actions = ["pull", "push", "delete"]

[[auth.rules]]
repositories = "public/*"
users = ["anonymous", "*"]
actions = ["pull"]
"#,
            key = key.display(),
            hash = bcrypt::hash(ALICE.1, 4).unwrap(),
        ),
    )
    .unwrap();
    path
}

#[test]
fn a_private_repository_is_invisible_to_anonymous_visitors_and_visible_once_signed_in() {
    let Some(mut browser) = Browser::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = auth_config(dir.path());
    let server = Server::start_on(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    login(&home, &server.addr, ALICE.0, ALICE.1);
    let src = home.join("src");
    checkpoint(&src, 0, &[]);
    push_json(
        &home,
        &src,
        &format!("{}/public/open", server.addr),
        &["--tag", "v1"],
    );
    let secret = push_json(
        &home,
        &src,
        &format!("{}/private/secret-model", server.addr),
        &["--tag", "v1"],
    );
    let secret_digest = secret["digest"].as_str().unwrap().to_owned();
    let base = server.url();

    // Anonymous: the public volume, and no trace of the private one anywhere.
    let anonymous_pages = [
        "/ui/".to_owned(),
        "/ui/?q=secret".to_owned(),
        "/ui/?q=private".to_owned(),
        "/ui/jobs".to_owned(),
        "/ui/storage".to_owned(),
        "/ui/r/private/secret-model".to_owned(),
        format!("/ui/r/private/secret-model/-/v/{secret_digest}"),
        "/ui/r/private/secret-model/-/tags/v1".to_owned(),
        format!("/ui/r/private/secret-model/-/compare?a={secret_digest}&b={secret_digest}"),
    ];
    let home_page = browser.open(&format!("{base}/ui/"));
    assert!(home_page.contains("public/open"));
    for page in &anonymous_pages {
        let html = browser.open(&format!("{base}{page}"));
        // vial's own page (its header), not an empty or foreign one that shows nothing anyway.
        assert_eq!(
            browser.eval("document.querySelector('header a.brand') !== null"),
            true,
            "{page} is not a page of the UI: {html}"
        );
        assert!(
            !html.contains("secret-model"),
            "{page} shows the private repository to an anonymous visitor"
        );
        assert!(
            !html.contains(&secret_digest[7..]),
            "{page} shows the private digest"
        );
    }
    // The private repository's own pages answer as if it did not exist.
    let r = reqwest::blocking::get(format!("{base}/ui/r/private/secret-model")).unwrap();
    assert_eq!(r.status(), 404);
    let missing = reqwest::blocking::get(format!("{base}/ui/r/private/no-such-thing")).unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(r.text().unwrap(), missing.text().unwrap());

    // A wrong password is refused on the form; the right one signs in.
    browser.sign_in(&base, ALICE.0, "wrong");
    assert!(browser.text().contains("Wrong user name or password"));
    browser.sign_in(&base, ALICE.0, ALICE.1);
    let text = browser.text();
    assert!(text.contains("signed in as alice"), "{text}");
    assert!(
        text.contains("private/secret-model") && text.contains("public/open"),
        "{text}"
    );
    browser.open(&format!(
        "{base}/ui/r/private/secret-model/-/v/{secret_digest}"
    ));
    assert!(browser.text().contains("model-0.safetensors"));
    // The browser holds the session as a cookie, and scripts cannot read it: a cookie a script
    // sets is all `document.cookie` shows (so the read itself works).
    let session: Vec<Value> = browser
        .cookies()
        .into_iter()
        .filter(|c| c["name"] == "vial_session")
        .collect();
    assert_eq!(session.len(), 1, "no session cookie: {session:?}");
    assert_eq!(session[0]["httpOnly"], true, "{session:?}");
    assert_eq!(
        browser.eval("document.cookie = 'probe=1'; document.cookie"),
        "probe=1",
        "the session cookie is readable from scripts"
    );
    browser.eval("document.cookie = 'probe=; max-age=0'; true");

    // The cookie, as the server sets it.
    let r = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{base}/ui/login"))
        .form(&[("username", ALICE.0), ("password", ALICE.1)])
        .send()
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.starts_with("vial_session="), "{cookie}");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains("Secure"),
        "Secure is for TLS: this registry serves plain HTTP"
    );

    // Signing out drops the session: the private repository is gone again.
    browser.submit("document.querySelector('header form').submit(); true");
    let html = browser.open(&format!("{base}/ui/"));
    assert!(!html.contains("secret-model"));
}

/// A version whose tree is larger than the registry reads for the UI (`--ui-max-tree`, here a
/// few hundred bytes) still has a page: the figures its index gives and the command that lists
/// its files; comparing it names the `vial diff` to run. Below the limit, the same volume's page
/// lists its files.
#[test]
fn a_version_whose_tree_is_over_the_ui_limit_is_shown_from_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let small = Server::start_on(&dir.path().join("small"), &["--ui-max-tree", "300"]);
    let large = Server::start_on(&dir.path().join("large"), &[]);
    let home = dir.path().join("home");
    let src = home.join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..40 {
        std::fs::write(src.join(format!("file-{i:03}.txt")), format!("{i}\n")).unwrap();
    }
    let page = |server: &Server, path: &str| {
        let r = reqwest::blocking::get(format!("{}{path}", server.url())).unwrap();
        let status = r.status();
        let text = r.text().unwrap();
        assert!(status.is_success(), "{path}: {status}: {text}");
        text
    };
    for (server, over) in [(&small, true), (&large, false)] {
        let repo = format!("{}/files/many", server.addr);
        let first = push_json(&home, &src, &repo, &[]);
        std::fs::write(src.join("file-000.txt"), "changed\n").unwrap();
        let second = push_json(&home, &src, &repo, &[]);
        std::fs::write(src.join("file-000.txt"), "0\n").unwrap();
        let (a, b) = (
            first["digest"].as_str().unwrap(),
            second["digest"].as_str().unwrap(),
        );
        let version = page(server, &format!("/ui/r/files/many/-/v/{b}"));
        let compare = page(server, &format!("/ui/r/files/many/-/compare?a={a}&b={b}"));
        if over {
            // The index's figures: 40 files of 2 or 3 bytes (`N\n`, and `changed\n`).
            assert!(version.contains("<b>40</b>"), "{version}");
            assert!(version.contains("vial inspect"), "{version}");
            assert!(!version.contains("file-039.txt"), "{version}");
            assert!(
                compare.contains(&format!("vial diff {repo}@{a} {repo}@{b}")),
                "{compare}"
            );
        } else {
            assert!(version.contains("file-039.txt"), "{version}");
            assert!(compare.contains("file-000.txt"), "{compare}");
        }
    }
}
