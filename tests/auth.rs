//! Token authentication: every endpoint refuses missing, expired, forged and wrong-scope tokens;
//! rules decide who may pull, push and delete where; anonymous pull only where allowed; password
//! guessing is cut off; real clients (skopeo, the ORAS SDK, the vial CLI) sign in as usual; HTTPS.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use reqwest::blocking::Client;
use vial_core::Algorithm;

use crate::support::oci::{pseudo_random, write_layout};
use crate::support::vial::{assert_same_tree, vial};
use crate::support::{oras_python, peer, push_blob, push_manifest, run, Server};

const ALICE: (&str, &str) = ("alice", "alice-secret-pw");
const BOB: (&str, &str) = ("bob", "bob-secret-pw");

/// alice may do anything in weights/*; bob may only pull there; anyone may pull public/*.
fn config(dir: &Path, token_ttl: &str) -> std::path::PathBuf {
    let htpasswd = dir.join("htpasswd");
    std::fs::write(
        &htpasswd,
        format!(
            "# test users\n{}:{}\n",
            BOB.0,
            bcrypt::hash(BOB.1, 4).unwrap()
        ),
    )
    .unwrap();
    let key = dir.join("token.key");
    std::fs::write(&key, pseudo_random(32, 1)).unwrap();
    let path = dir.join("vial.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[auth]
htpasswd = "{htpasswd}"
token-key-file = "{key}"
token-ttl = "{token_ttl}"

[[auth.users]]
name = "alice"
password-hash = "{alice_hash}"

[[auth.rules]]
repositories = "weights/*"
users = ["alice"]
actions = ["pull", "push", "delete"]

[[auth.rules]]
repositories = "public/*"
users = ["alice"]
actions = ["push"]

[[auth.rules]]
repositories = "weights/*"
users = ["bob"]
actions = ["pull"]

[[auth.rules]]
repositories = "public/*"
users = ["anonymous", "*"]
actions = ["pull"]
"#,
            htpasswd = htpasswd.display(),
            key = key.display(),
            alice_hash = bcrypt::hash(ALICE.1, 4).unwrap(),
        ),
    )
    .unwrap();
    path
}

fn serve(dir: &Path, token_ttl: &str) -> Server {
    let config = config(dir, token_ttl);
    Server::start_on(&dir.join("data"), &["--config", config.to_str().unwrap()])
}

/// Asks the token endpoint for `scope` as `user` (or anonymously).
fn token(c: &Client, base: &str, user: Option<(&str, &str)>, scope: &str) -> String {
    let mut req = c.get(format!("{base}/token?service=vial&scope={scope}"));
    if let Some((u, p)) = user {
        req = req.basic_auth(u, Some(p));
    }
    let r = req.send().unwrap();
    assert_eq!(r.status(), 200, "token for {user:?} {scope}");
    let v: serde_json::Value = r.json().unwrap();
    v["token"].as_str().unwrap().to_owned()
}

/// A client whose every request carries `token`.
fn with_token(token: &str) -> Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
    Client::builder().default_headers(headers).build().unwrap()
}

/// Every endpoint of `repo`, as (method, path) pairs.
fn endpoints(repo: &str, digest: &str) -> Vec<(reqwest::Method, String)> {
    use reqwest::Method;
    let id = "0a0b0c0d-0000-4000-8000-000000000001";
    vec![
        (Method::GET, "/v2/".into()),
        (Method::GET, "/v2/_catalog".into()),
        (Method::GET, format!("/v2/{repo}/tags/list")),
        (Method::GET, format!("/v2/{repo}/manifests/v1")),
        (Method::HEAD, format!("/v2/{repo}/manifests/v1")),
        (Method::PUT, format!("/v2/{repo}/manifests/v2")),
        (Method::DELETE, format!("/v2/{repo}/manifests/{digest}")),
        (Method::GET, format!("/v2/{repo}/blobs/{digest}")),
        (Method::HEAD, format!("/v2/{repo}/blobs/{digest}")),
        (Method::DELETE, format!("/v2/{repo}/blobs/{digest}")),
        (Method::POST, format!("/v2/{repo}/blobs/uploads/")),
        (Method::GET, format!("/v2/{repo}/blobs/uploads/{id}")),
        (Method::PATCH, format!("/v2/{repo}/blobs/uploads/{id}")),
        (
            Method::PUT,
            format!("/v2/{repo}/blobs/uploads/{id}?digest={digest}"),
        ),
        (Method::DELETE, format!("/v2/{repo}/blobs/uploads/{id}")),
        (Method::GET, format!("/v2/{repo}/referrers/{digest}")),
        (Method::POST, format!("/v2/{repo}/_vial/blobs/present")),
        (Method::GET, format!("/v2/{repo}/_vial/versions")),
    ]
}

#[test]
fn every_endpoint_refuses_missing_forged_expired_and_wrong_scope_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), "5m");
    let base = server.url();
    let plain = Client::new();
    let digest = Algorithm::Sha256.digest_bytes(b"x").to_string();

    let alice = token(
        &plain,
        &base,
        Some(ALICE),
        "repository:weights/a:pull,push,delete",
    );
    let forged = {
        // Same header and signature, a payload that claims more: the signature no longer fits.
        let mut parts: Vec<String> = alice.split('.').map(str::to_owned).collect();
        let other = token(&plain, &base, Some(BOB), "repository:weights/b:pull");
        parts[1] = other.split('.').nth(1).unwrap().to_owned();
        parts.join(".")
    };
    let wrong_scope = token(
        &plain,
        &base,
        Some(ALICE),
        "repository:weights/other:pull,push,delete",
    );

    for (method, path) in endpoints("weights/a", &digest) {
        let r = plain
            .request(method.clone(), format!("{base}{path}"))
            .send()
            .unwrap();
        assert_eq!(r.status(), 401, "no token: {method} {path}");
        let challenge = r.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert!(
            challenge.starts_with(&format!("Bearer realm=\"{base}/token\",service=\"vial\"")),
            "{challenge}"
        );
        let r = with_token(&forged)
            .request(method.clone(), format!("{base}{path}"))
            .send()
            .unwrap();
        assert_eq!(r.status(), 401, "forged token: {method} {path}");
        if path != "/v2/" && path != "/v2/_catalog" {
            assert!(
                challenge.contains("scope=\"repository:weights/a:"),
                "{challenge}"
            );
            let r = with_token(&wrong_scope)
                .request(method.clone(), format!("{base}{path}"))
                .send()
                .unwrap();
            assert_eq!(
                r.status(),
                403,
                "token for another repository: {method} {path}"
            );
            if method != reqwest::Method::HEAD {
                let body: serde_json::Value = r.json().unwrap();
                assert_eq!(body["errors"][0]["code"], "DENIED");
            }
        }
        // The valid token gets past authorization (whatever the endpoint then says).
        let r = with_token(&alice)
            .request(method.clone(), format!("{base}{path}"))
            .send()
            .unwrap();
        assert!(
            ![401, 403].contains(&r.status().as_u16()) || path == "/v2/_catalog",
            "valid token refused: {method} {path}: {}",
            r.status()
        );
    }
    // The catalog needs pull on everything, which nobody here has.
    let r = with_token(&alice)
        .get(format!("{base}/v2/_catalog"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);

    let body: serde_json::Value = with_token(&forged)
        .get(format!("{base}/v2/weights/a/tags/list"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(body["errors"][0]["message"], "token signature is not valid");

    // Expiry, on a registry of its own whose tokens live a second, so that how long the requests
    // above took cannot matter: the token is used until the registry refuses it, and the refusal
    // must then be for its age, not for anything else.
    let short = tempfile::tempdir().unwrap();
    let server = serve(short.path(), "1s");
    let base = server.url();
    let expiring = with_token(&token(
        &plain,
        &base,
        Some(ALICE),
        "repository:weights/a:pull,push,delete",
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let r = loop {
        let r = expiring
            .get(format!("{base}/v2/weights/a/tags/list"))
            .send()
            .unwrap();
        if r.status() == 401 {
            break r;
        }
        assert!(
            [200, 404].contains(&r.status().as_u16()),
            "a valid token refused: {}",
            r.status()
        );
        assert!(
            std::time::Instant::now() < deadline,
            "a one-second token was still accepted a minute later"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        r.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .contains("error=\"invalid_token\""),
        "an expired token"
    );
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["errors"][0]["code"], "UNAUTHORIZED");
    assert_eq!(body["errors"][0]["message"], "token has expired");
}

#[test]
fn rules_decide_who_pulls_pushes_and_deletes_and_anonymous_reads_only_public() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), "5m");
    let base = server.url();
    let plain = Client::new();

    // Asking for more than allowed gets a token for what is allowed: bob's push is cut off.
    let bob = token(&plain, &base, Some(BOB), "repository:weights/m:pull,push");
    let payload = bob.split('.').nth(1).unwrap();
    use base64::Engine;
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["access"][0]["actions"], serde_json::json!(["pull"]));
    let bob = with_token(&bob);
    let r = bob
        .post(format!("{base}/v2/weights/m/blobs/uploads/"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 403, "bob may only read weights/*");

    let alice = with_token(&token(
        &plain,
        &base,
        Some(ALICE),
        "repository:weights/m:pull,push,delete",
    ));
    let layer = push_blob(&alice, &base, "weights/m", b"weights");
    let (manifest, _) = push_manifest(&alice, &base, "weights/m", "v1", &[(layer.clone(), 7)]);
    // bob reads what alice pushed.
    let r = bob
        .get(format!("{base}/v2/weights/m/blobs/{layer}"))
        .send()
        .unwrap();
    assert_eq!(r.bytes().unwrap().as_ref(), b"weights");
    // bob cannot delete; alice can.
    let r = bob
        .delete(format!("{base}/v2/weights/m/manifests/{manifest}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);

    // Anonymous: nothing in weights/*, pulls in public/* with or without an anonymous token.
    let r = plain
        .get(format!("{base}/v2/weights/m/tags/list"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = plain
        .get(format!(
            "{base}/token?service=vial&scope=repository:weights/m:pull"
        ))
        .send()
        .unwrap();
    let anon: serde_json::Value = r.json().unwrap();
    let r = with_token(anon["token"].as_str().unwrap())
        .get(format!("{base}/v2/weights/m/tags/list"))
        .send()
        .unwrap();
    assert_eq!(
        r.status(),
        403,
        "an anonymous token grants nothing in weights/*"
    );

    let alice_public = with_token(&token(
        &plain,
        &base,
        Some(ALICE),
        "repository:public/p:push",
    ));
    let public_layer = push_blob(&alice_public, &base, "public/p", b"open data");
    let r = plain
        .get(format!("{base}/v2/public/p/blobs/{public_layer}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "anonymous pull of public/*");
    let r = plain
        .post(format!("{base}/v2/public/p/blobs/uploads/"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401, "but no anonymous push");

    // A cross-repository mount needs pull on the source too. Without it the mount is dropped and
    // the client gets an ordinary upload session, so no blob leaks between repositories.
    let mount = |client: &Client| {
        client
            .post(format!(
                "{base}/v2/public/p/blobs/uploads/?mount={layer}&from=weights/m"
            ))
            .send()
            .unwrap()
            .status()
    };
    assert_eq!(
        mount(&alice_public),
        202,
        "no pull on weights/m in this token: no mount"
    );
    let both = with_token(&token(
        &plain,
        &base,
        Some(ALICE),
        "repository:public/p:push&scope=repository:weights/m:pull",
    ));
    assert_eq!(
        mount(&both),
        201,
        "with pull on the source the mount happens"
    );
    // vial's bulk existence check links blobs across repositories only for callers who may pull
    // everything: alice may not, so a weights/* blob is not offered to her in public/*.
    let present = |client: &Client, repo: &str| -> serde_json::Value {
        client
            .post(format!("{base}/v2/{repo}/_vial/blobs/present"))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "digests": [layer.to_string()] }).to_string())
            .send()
            .unwrap()
            .json()
            .unwrap()
    };
    let alice_q = with_token(&token(
        &plain,
        &base,
        Some(ALICE),
        "repository:public/q:pull,push",
    ));
    assert_eq!(
        present(&alice_q, "public/q")["present"],
        serde_json::json!([])
    );
    assert_eq!(
        present(&alice, "weights/m")["present"],
        serde_json::json!([layer.to_string()]),
        "a blob the repository holds is reported"
    );

    let r = alice
        .delete(format!("{base}/v2/weights/m/manifests/{manifest}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 202);
}

#[test]
fn password_guessing_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), "5m");
    let base = server.url();
    let c = Client::new();
    let attempt = |password: &str| {
        c.get(format!(
            "{base}/token?service=vial&scope=repository:weights/a:pull"
        ))
        .basic_auth(BOB.0, Some(password))
        .send()
        .unwrap()
    };
    for i in 0..10 {
        let r = attempt(&format!("guess-{i}"));
        assert_eq!(r.status(), 401);
        let body: serde_json::Value = r.json().unwrap();
        assert_eq!(body["errors"][0]["code"], "UNAUTHORIZED");
    }
    // Even the right password is refused now, for the rest of the window.
    let r = attempt(BOB.1);
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["errors"][0]["code"], "TOOMANYREQUESTS");
    // Other users are not locked out by bob's guesser.
    let r = c
        .get(format!(
            "{base}/token?service=vial&scope=repository:weights/a:pull"
        ))
        .basic_auth(ALICE.0, Some(ALICE.1))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[test]
fn skopeo_oras_and_the_vial_cli_sign_in_as_usual() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), "5m");

    if let Some(skopeo) = peer("skopeo") {
        let layout = dir.path().join("layout");
        let manifest = write_layout(&layout, "v1", &[1 << 20, 4096], 3);
        let remote = format!("docker://{}/weights/skopeo:v1", server.addr);
        let copy = |creds: &str| {
            Command::new(&skopeo)
                .args([
                    "--insecure-policy",
                    "copy",
                    "--dest-tls-verify=false",
                    "--preserve-digests",
                ])
                .args(["--dest-creds", creds])
                .arg(format!("oci:{}:v1", layout.display()))
                .arg(&remote)
                .output()
                .unwrap()
        };
        let refused = copy(&format!("{}:{}", BOB.0, BOB.1));
        assert!(!refused.status.success(), "bob may not push");
        // And it failed for that reason: the registry's refusal, not some other error.
        let why = String::from_utf8_lossy(&refused.stderr);
        assert!(
            why.contains("denied: bob may not push weights/skopeo"),
            "bob's push failed, but not on authorization: {why}"
        );
        let ok = copy(&format!("{}:{}", ALICE.0, ALICE.1));
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        let raw = run(Command::new(&skopeo).args([
            "inspect",
            "--tls-verify=false",
            "--raw",
            "--creds",
            &format!("{}:{}", BOB.0, BOB.1),
            &remote,
        ]));
        assert_eq!(Algorithm::Sha256.digest_bytes(raw.as_bytes()), manifest);
    }

    if let Some(python) = oras_python() {
        let work = dir.path().join("oras");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(work.join("config.json"), b"{\"layers\": 2}").unwrap();
        let script = r#"
import sys, os, oras.client
host, target, user, password, workdir = sys.argv[1:6]
os.chdir(workdir)
client = oras.client.OrasClient(hostname=host, insecure=True)
print(client.login(username=user, password=password, hostname=host, tls_verify=False))
client.push(target=target, files=["config.json"])
client.pull(target=target, outdir="out")
print(open("out/config.json").read())
"#;
        let out = run(Command::new(&python)
            .args(["-c", script, &server.addr])
            .arg(format!("{}/weights/oras:v1", server.addr))
            .args([ALICE.0, ALICE.1])
            .arg(&work));
        assert!(out.contains("\"layers\": 2"), "{out}");
    }

    // vial login stores the credentials where every registry client looks; push and pull use them.
    let home = dir.path().join("home");
    let src = home.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("w.bin"), pseudo_random(3 << 20, 9)).unwrap();
    let reference = format!("{}/weights/cli", server.addr);
    let out = vial(
        &home,
        &["push", src.to_str().unwrap(), &reference, "--tag", "v1"],
    );
    assert!(!out.status.success(), "push without signing in");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.to_lowercase().contains("login")
            || stderr.contains("401")
            || stderr.to_lowercase().contains("auth"),
        "{stderr}"
    );
    let mut login = Command::new(crate::support::vial_bin())
        .args(["login", &server.addr, "-u", ALICE.0, "--password-stdin"])
        .env("HOME", &home)
        .env("DOCKER_CONFIG", home.join("docker"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    login
        .stdin
        .take()
        .unwrap()
        .write_all(ALICE.1.as_bytes())
        .unwrap();
    assert!(login.wait().unwrap().success());
    let config = std::fs::read_to_string(home.join("docker/config.json")).unwrap();
    assert!(
        !config.contains(ALICE.1),
        "the password is stored encoded, not in clear"
    );
    crate::support::vial::vial_ok(
        &home,
        &["push", src.to_str().unwrap(), &reference, "--tag", "v1"],
    );
    let out = home.join("out");
    crate::support::vial::vial_ok(
        &home,
        &["pull", &format!("{reference}:v1"), out.to_str().unwrap()],
    );
    assert_same_tree(&src, &out);
}

#[test]
fn https_with_a_given_certificate() {
    let Some(openssl) = peer("openssl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    run(Command::new(openssl)
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ])
        .args([
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert));
    let server = Server::start_on(
        &dir.path().join("data"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let base = format!("https://{}", server.addr);
    let trusted = Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&cert).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let layer = push_blob(&trusted, &base, "tls/x", &pseudo_random(1 << 20, 2));
    let r = trusted
        .get(format!("{base}/v2/tls/x/blobs/{layer}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().unwrap().len(), 1 << 20);
    // A client that does not trust the certificate fails the handshake; plain HTTP gets nothing.
    assert!(Client::new().get(format!("{base}/v2/")).send().is_err());
    assert!(Client::new()
        .get(format!("http://{}/v2/", server.addr))
        .send()
        .is_err());

    // skopeo, verifying the certificate (no --tls-verify=false), given it as its CA.
    if let Some(skopeo) = peer("skopeo") {
        let certs = dir.path().join("certs.d");
        std::fs::create_dir_all(&certs).unwrap();
        std::fs::copy(&cert, certs.join("ca.crt")).unwrap();
        let layout = dir.path().join("layout");
        let manifest = write_layout(&layout, "v1", &[1 << 20], 6);
        let remote = format!("docker://{}/tls/image:v1", server.addr);
        run(Command::new(&skopeo)
            .args([
                "--insecure-policy",
                "copy",
                "--preserve-digests",
                "--dest-cert-dir",
            ])
            .arg(&certs)
            .arg(format!("oci:{}:v1", layout.display()))
            .arg(&remote));
        let raw = run(Command::new(&skopeo)
            .args(["inspect", "--raw", "--cert-dir"])
            .arg(&certs)
            .arg(&remote));
        assert_eq!(Algorithm::Sha256.digest_bytes(raw.as_bytes()), manifest);
        // Without the CA, skopeo refuses the server.
        let refused = Command::new(&skopeo)
            .args(["inspect", "--raw", &remote])
            .output()
            .unwrap();
        assert!(
            !refused.status.success(),
            "skopeo trusted an unknown certificate"
        );
    }
}

/// The name the private-CA test gives the registry: `.test` never resolves in public DNS (RFC 2606),
/// so only the hosts file the test mounts makes it point at this machine.
const TLS_HOST: &str = "registry.vial.test";

/// `unshare --mount` then a bind mount of `hosts` over /etc/hosts: the command after it resolves
/// names through that file, and nothing outside its mount namespace sees the change.
fn with_hosts_file(hosts: &Path, program: &Path) -> Command {
    let mut c = Command::new("unshare");
    c.args([
        "--mount",
        "sh",
        "-c",
        r#"mount --bind "$0" /etc/hosts && exec "$@""#,
    ])
    .arg(hosts)
    .arg(program);
    c
}

/// Whether this machine lets the test mount a private /etc/hosts (root and mount namespaces). Without
/// that the test is skipped, or fails under VIAL_TEST_REQUIRE_ALL=1.
fn private_hosts_work(hosts: &Path) -> bool {
    if peer("unshare").is_none() {
        return false;
    }
    let probe = with_hosts_file(hosts, Path::new("cat"))
        .arg("/etc/hosts")
        .output()
        .unwrap();
    let ok = probe.status.success() && probe.stdout == std::fs::read(hosts).unwrap();
    if !ok {
        assert!(
            !crate::support::require_all(),
            "a private /etc/hosts (unshare --mount, as root) is required (VIAL_TEST_REQUIRE_ALL=1): {}",
            String::from_utf8_lossy(&probe.stderr)
        );
        eprintln!("SKIP: cannot mount a private /etc/hosts here (needs root)");
    }
    ok
}

#[test]
fn the_vial_cli_trusts_a_private_ca_from_the_system_store() {
    // The CLI speaks plain HTTP to loopback addresses and names, so the registry gets a name of
    // its own, which a hosts file seen only by the CLI's mount namespace points at 127.0.0.1: the
    // test needs no network and no address of the machine's but loopback.
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(
        &hosts,
        format!("127.0.0.1 localhost\n127.0.0.1 {TLS_HOST}\n"),
    )
    .unwrap();
    if !private_hosts_work(&hosts) {
        return;
    }
    let Some(openssl) = peer("openssl") else {
        return;
    };
    let p = |name: &str| dir.path().join(name).display().to_string();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    run(Command::new(&openssl)
        .args(["req", "-x509", "-days", "1", "-subj", "/CN=vial test CA"])
        .args(ec)
        .args(["-keyout", &p("ca.key"), "-out", &p("ca.pem")]));
    run(Command::new(&openssl)
        .args(["req", "-subj", &format!("/CN={TLS_HOST}")])
        .args(ec)
        .args(["-keyout", &p("key.pem"), "-out", &p("leaf.csr")]));
    std::fs::write(
        p("leaf.ext"),
        format!("subjectAltName=DNS:{TLS_HOST}\nbasicConstraints=CA:FALSE\n"),
    )
    .unwrap();
    run(Command::new(&openssl)
        .args(["x509", "-req", "-days", "1", "-in", &p("leaf.csr")])
        .args([
            "-CA",
            &p("ca.pem"),
            "-CAkey",
            &p("ca.key"),
            "-CAcreateserial",
        ])
        .args(["-extfile", &p("leaf.ext"), "-out", &p("cert.pem")]));
    let server = Server::start_on(
        &dir.path().join("data"),
        &["--tls-cert", &p("cert.pem"), "--tls-key", &p("key.pem")],
    );
    let port = server.addr.rsplit_once(':').unwrap().1;

    let home = dir.path().join("home");
    let src = home.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("w.bin"), pseudo_random(2 << 20, 4)).unwrap();
    let reference = format!("{TLS_HOST}:{port}/weights/tls:v1");
    let vial_with_ca = |ca: &str, args: &[&str]| {
        with_hosts_file(&hosts, &crate::support::vial_bin())
            .args(args)
            .env("HOME", &home)
            .env("DOCKER_CONFIG", home.join("docker"))
            .env("SSL_CERT_FILE", ca)
            .env("VIAL_LOG", "warn")
            .output()
            .unwrap()
    };
    // With the system's usual roots the private CA is unknown: refused.
    let refused = vial_with_ca(
        "/etc/ssl/certs/ca-certificates.crt",
        &["push", src.to_str().unwrap(), &reference],
    );
    assert!(!refused.status.success(), "an unknown CA was trusted");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("certificate"),
        "the error should say why: {why}"
    );
    // With the CA in the trust store (SSL_CERT_FILE, as for curl and git), push and pull work.
    let pushed = vial_with_ca(&p("ca.pem"), &["push", src.to_str().unwrap(), &reference]);
    assert!(
        pushed.status.success(),
        "{}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    let out = home.join("out");
    let pulled = vial_with_ca(&p("ca.pem"), &["pull", &reference, out.to_str().unwrap()]);
    assert!(
        pulled.status.success(),
        "{}",
        String::from_utf8_lossy(&pulled.stderr)
    );
    assert_same_tree(&src, &out);
}
