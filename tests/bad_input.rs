//! Malformed input of every kind gets a 4xx with the OCI error envelope, never a 5xx or a crash.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::{oci::pseudo_random, push_blob, push_manifest, Server};

const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn assert_oci_error(resp: reqwest::blocking::Response, what: &str) -> (u16, String) {
    let status = resp.status().as_u16();
    let body = resp.text().unwrap_or_default();
    assert!(
        (400..500).contains(&status),
        "{what}: expected a 4xx, got {status}: {body}"
    );
    let json: serde_json::Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {body:?}"));
    let code = json["errors"][0]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no error code in {body}"));
    assert!(
        json["errors"][0]["message"].is_string(),
        "{what}: no message in {body}"
    );
    (status, code.to_owned())
}

#[test]
fn malformed_requests_get_4xx_with_the_right_codes() {
    let server = Server::start();
    let base = server.url();
    let c = reqwest::blocking::Client::new();
    let blob = push_blob(&c, &base, "ok/repo", b"content");
    let (_manifest, _) = push_manifest(&c, &base, "ok/repo", "v1", &[(blob.clone(), 7)]);

    let cases: Vec<(reqwest::blocking::RequestBuilder, &str, u16, &str)> = vec![
        (c.get(format!("{base}/v2/UPPER/tags/list")), "upper-case name", 400, "NAME_INVALID"),
        (c.get(format!("{base}/v2/a..b/manifests/x")), "double dot name", 400, "NAME_INVALID"),
        (c.get(format!("{base}/v2/ok/repo/blobs/sha256:xyz")), "short digest", 400, "DIGEST_INVALID"),
        (c.get(format!("{base}/v2/ok/repo/blobs/md5:d41d8cd98f00b204e9800998ecf8427e")), "unsupported algorithm", 400, "DIGEST_INVALID"),
        // A reference that is neither a tag nor a digest names no manifest (the official
        // conformance suite GETs `.INVALID_MANIFEST_NAME`), but cannot name a new one either.
        (c.get(format!("{base}/v2/ok/repo/manifests/.INVALID_MANIFEST_NAME")), "invalid reference on GET", 404, "MANIFEST_UNKNOWN"),
        (c.get(format!("{base}/v2/ok/repo/manifests/sha256:xyz")), "invalid digest reference on GET", 404, "MANIFEST_UNKNOWN"),
        (c.put(format!("{base}/v2/ok/repo/manifests/.bad")).header("content-type", vial_core::media::OCI_MANIFEST).body("{}"), "invalid reference on PUT", 400, "TAG_INVALID"),
        (c.delete(format!("{base}/v2/ok/repo/manifests/md5:abc")), "invalid reference on DELETE", 400, "DIGEST_INVALID"),
        (c.get(format!("{base}/v2/ok/repo/manifests/nope")), "unknown tag", 404, "MANIFEST_UNKNOWN"),
        (c.get(format!("{base}/v2/ok/repo/blobs/{D}")), "unknown blob", 404, "BLOB_UNKNOWN"),
        (c.get(format!("{base}/v2/unknown/repo/tags/list")), "unknown repo", 404, "NAME_UNKNOWN"),
        (c.get(format!("{base}/v2/ok/repo/tags/list?n=abc")), "bad n", 400, "UNSUPPORTED"),
        (c.get(format!("{base}/v2/ok/repo/blobs/{blob}")).header("range", "bytes=100-200"), "range past the end", 416, "RANGE_INVALID"),
        (c.patch(format!("{base}/v2/ok/repo/blobs/uploads/00000000-0000-0000-0000-000000000000")), "unknown upload", 404, "BLOB_UPLOAD_UNKNOWN"),
        (c.patch(format!("{base}/v2/ok/repo/blobs/uploads/..%2F..%2Fetc")), "path-like upload id", 404, "BLOB_UPLOAD_UNKNOWN"),
        (c.put(format!("{base}/v2/ok/repo/manifests/v2")).header("content-type", vial_core::media::OCI_MANIFEST).body("{not json"), "manifest not JSON", 400, "MANIFEST_INVALID"),
        (c.put(format!("{base}/v2/ok/repo/manifests/v2")).header("content-type", "text/plain").body("{}"), "unknown manifest type", 400, "MANIFEST_INVALID"),
        (c.put(format!("{base}/v2/ok/repo/manifests/v2")).header("content-type", vial_core::media::OCI_MANIFEST).body(r#"{"schemaVersion":2,"config":{"mediaType":"x","digest":"sha256:1","size":1},"layers":[]}"#), "manifest with bad digest", 400, "MANIFEST_INVALID"),
        (c.put(format!("{base}/v2/ok/repo/manifests/{D}")).header("content-type", vial_core::media::OCI_MANIFEST).body(r#"{"schemaVersion":2,"config":{"mediaType":"x","digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":0},"layers":[]}"#), "manifest digest mismatch", 400, "DIGEST_INVALID"),
        (c.put(format!("{base}/v2/ok/repo/manifests/v3?tag=.bad")).header("content-type", vial_core::media::OCI_MANIFEST).body("{}"), "bad extra tag", 400, "TAG_INVALID"),
        (c.put(format!("{base}/v2/ok/repo/manifests/v3")).header("content-type", vial_core::media::OCI_MANIFEST).body(format!(r#"{{"schemaVersion":2,"config":{{"mediaType":"x","digest":"{D}","size":0}},"layers":[]}}"#)), "manifest with unknown blob", 400, "MANIFEST_BLOB_UNKNOWN"),
        (c.post(format!("{base}/v2/ok/repo/blobs/uploads/?digest={D}")).body("not empty"), "monolithic digest mismatch", 400, "DIGEST_INVALID"),
        (c.post(format!("{base}/v2/ok/repo/blobs/uploads/?digest=sha256:zz")).body("x"), "monolithic bad digest", 400, "DIGEST_INVALID"),
        (c.post(format!("{base}/v2/ok/repo/blobs/uploads/?digest-algorithm=md5")), "unsupported upload algorithm", 400, "UNSUPPORTED"),
        (c.post(format!("{base}/v2/ok/repo/blobs/uploads/?mount=nonsense&from=other")), "bad mount digest", 400, "DIGEST_INVALID"),
        (c.delete(format!("{base}/v2/ok/repo/manifests/{D}")), "delete unknown manifest", 404, "MANIFEST_UNKNOWN"),
        (c.delete(format!("{base}/v2/ok/repo/blobs/{D}")), "delete unknown blob", 404, "BLOB_UNKNOWN"),
        (c.post(format!("{base}/v2/ok/repo/manifests/v1")), "wrong method", 405, "UNSUPPORTED"),
        (c.get(format!("{base}/v2/nothing-here")), "unknown endpoint", 404, "UNSUPPORTED"),
    ];
    for (request, what, status, code) in cases {
        let (got_status, got_code) = assert_oci_error(request.send().unwrap(), what);
        assert_eq!((got_status, got_code.as_str()), (status, code), "{what}");
    }
}

#[test]
fn chunk_errors_are_416_and_leave_the_session_usable() {
    let server = Server::start();
    let base = server.url();
    let c = reqwest::blocking::Client::new();
    let data = pseudo_random(300_000, 5);
    let start = c
        .post(format!("{base}/v2/chunks/blobs/uploads/"))
        .send()
        .unwrap();
    assert_eq!(start.status(), 202);
    let location = format!("{base}{}", start.headers()["location"].to_str().unwrap());

    let first = c
        .patch(&location)
        .header("content-range", "0-99999")
        .body(data[..100_000].to_vec())
        .send()
        .unwrap();
    assert_eq!(first.status(), 202);
    assert_eq!(first.headers()["range"], "0-99999");

    for (range, what) in [
        ("0-99999", "repeated chunk"),
        ("150000-249999", "gap"),
        ("50000-149999", "overlap"),
    ] {
        let lo: usize = range.split('-').next().unwrap().parse().unwrap();
        let resp = c
            .patch(&location)
            .header("content-range", range)
            .body(data[lo..lo + 100_000].to_vec())
            .send()
            .unwrap();
        assert_eq!(
            resp.headers().get("range").map(|v| v.to_str().unwrap()),
            Some("0-99999"),
            "{what}"
        );
        let (status, code) = assert_oci_error(resp, what);
        assert_eq!(
            (status, code.as_str()),
            (416, "BLOB_UPLOAD_INVALID"),
            "{what}"
        );
    }
    // A chunk that starts where it should but whose Content-Range disagrees with its
    // Content-Length is not out of order (the spec's 416 is for a chunk that does not start
    // right after the last one, checked above): its length is wrong, which the spec's error
    // table calls SIZE_INVALID ("provided length did not match content length"), a 400, and
    // Distribution answers the same (registry/handlers/blobupload.go). Nothing of it is kept.
    let lying = c
        .patch(&location)
        .header("content-range", "100000-100009")
        .body(vec![0u8; 5])
        .send()
        .unwrap();
    let (status, code) = assert_oci_error(lying, "Content-Range longer than Content-Length");
    assert_eq!((status, code.as_str()), (400, "SIZE_INVALID"));
    let status = c.get(&location).send().unwrap();
    assert_eq!(status.status(), 204);
    assert_eq!(status.headers()["range"], "0-99999");
    // Without a Content-Length (a chunked body) only the body itself can disagree: it ends short
    // of its Content-Range, so the chunk did not arrive whole, and nothing of it is kept.
    let short = c
        .patch(&location)
        .header("content-range", "100000-100009")
        .body(reqwest::blocking::Body::new(std::io::Cursor::new(vec![
            0u8;
            5
        ])))
        .send()
        .unwrap();
    let (status, code) = assert_oci_error(short, "a chunked body shorter than its Content-Range");
    assert_eq!((status, code.as_str()), (400, "BLOB_UPLOAD_INVALID"));
    let status = c.get(&location).send().unwrap();
    assert_eq!(status.status(), 204);
    assert_eq!(status.headers()["range"], "0-99999");

    let rest = c
        .put(format!(
            "{location}?digest={}",
            vial_core::Algorithm::Sha256.digest_bytes(&data)
        ))
        .header("content-range", "100000-299999")
        .body(data[100_000..].to_vec())
        .send()
        .unwrap();
    assert_eq!(rest.status(), 201, "{}", rest.text().unwrap_or_default());
}

#[test]
fn oversized_manifests_are_refused_with_413() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_on(&dir.path().join("d"), &["--max-manifest-size", "1000"]);
    let c = reqwest::blocking::Client::new();
    let big = format!(
        r#"{{"schemaVersion":2,"annotations":{{"x":"{}"}}}}"#,
        "a".repeat(2000)
    );
    let resp = c
        .put(format!("{}/v2/big/manifests/v1", server.url()))
        .header("content-type", vial_core::media::OCI_MANIFEST)
        .body(big)
        .send()
        .unwrap();
    let (status, code) = assert_oci_error(resp, "oversized manifest");
    assert_eq!((status, code.as_str()), (413, "SIZE_INVALID"));
}

#[test]
fn garbage_on_the_socket_does_not_hurt_the_server() {
    let server = Server::start();
    for seed in 0..50u64 {
        let mut payload = pseudo_random(64 + (seed as usize * 37) % 2000, seed);
        if seed % 3 == 0 {
            // A plausible request line with a hostile path and headers.
            payload = format!(
                "GET /v2/{}/blobs/uploads/{} HTTP/1.1\r\nHost: x\r\nContent-Range: 99999999999999999999-1\r\nRange: bytes=-\r\n\r\n",
                "a/".repeat(seed as usize * 10),
                String::from_utf8_lossy(&pseudo_random(8, seed)).replace(['\r', '\n', ' '], "_")
            )
            .into_bytes();
        }
        if let Ok(mut s) = TcpStream::connect(&server.addr) {
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = s.write_all(&payload);
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            assert!(
                !head.starts_with("HTTP/1.1 5"),
                "seed {seed} got a 5xx: {head}"
            );
        }
    }
    let c = reqwest::blocking::Client::new();
    assert_eq!(
        c.get(format!("{}/v2/", server.url()))
            .send()
            .unwrap()
            .status(),
        200
    );
}
