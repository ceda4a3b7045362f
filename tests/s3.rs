//! The registry on an S3-compatible object store: conformance on SQLite + S3 and Postgres + S3,
//! uploads of every shape assembled in the bucket, presigned redirects, two replicas over Postgres
//! and one bucket, the object store going away mid-push, packs at one PUT per 64 MiB, and the
//! sweep of abandoned multipart uploads.

use std::path::Path;
use std::time::Duration;

use vial_core::Algorithm;

use crate::support::oci::pseudo_random;
use crate::support::packs::OutOfPackOrder;
use crate::support::postgres::PgCluster;
use crate::support::s3::{Moto, S3Server, BUCKET};
use crate::support::vial::{assert_same_tree, push_json, vial_ok};
use crate::support::{push_blob, Server};

fn serve_s3(s3: &S3Server, data: &Path, prefix: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--blob-url".to_owned(), s3.blob_url(prefix)];
    args.extend(extra.iter().map(|s| s.to_string()));
    if !extra.contains(&"--metadata-url") {
        // The embedded metadata store, whatever VIAL_TEST_BACKEND says.
        args.extend([
            "--metadata-url".to_owned(),
            format!("sqlite://{}/metadata.db", data.display()),
        ]);
    }
    Server::start_with(data, &args, &s3.env())
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

#[test]
fn s3_backends_pass_every_conformance_check() {
    let Some(s3) = S3Server::start() else { return };
    let Some(pg) = PgCluster::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = serve_s3(&s3, &dir.path().join("a"), "sqlite", &[]);
    crate::support::conformance::assert_all_pass(
        &crate::support::conformance::run(&sqlite.url()),
        "SQLite + S3",
    );
    let url = pg.database("conformance");
    let postgres = serve_s3(&s3, &dir.path().join("b"), "pg", &["--metadata-url", &url]);
    crate::support::conformance::assert_all_pass(
        &crate::support::conformance::run(&postgres.url()),
        "PostgreSQL + S3",
    );
}

/// Starts a chunked upload, sends `chunks` in order and finishes it; returns the digest.
fn chunked_upload(
    c: &reqwest::blocking::Client,
    base: &str,
    repo: &str,
    chunks: &[&[u8]],
) -> String {
    let all: Vec<u8> = chunks.concat();
    let digest = Algorithm::Sha256.digest_bytes(&all);
    let r = c
        .post(format!("{base}/v2/{repo}/blobs/uploads/"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 202);
    let mut location = r.headers()["location"].to_str().unwrap().to_owned();
    let mut offset = 0;
    for chunk in chunks {
        let r = c
            .patch(format!("{base}{location}"))
            .header(
                "content-range",
                format!("{offset}-{}", offset + chunk.len() - 1),
            )
            .body(chunk.to_vec())
            .send()
            .unwrap();
        assert_eq!(r.status(), 202, "{}", r.text().unwrap_or_default());
        location = r.headers()["location"].to_str().unwrap().to_owned();
        offset += chunk.len();
    }
    let r = c
        .put(format!("{base}{location}?digest={digest}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().unwrap_or_default());
    digest.to_string()
}

fn assert_blob(c: &reqwest::blocking::Client, base: &str, repo: &str, digest: &str, data: &[u8]) {
    let body = c
        .get(format!("{base}/v2/{repo}/blobs/{digest}"))
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    assert!(body.as_ref() == data, "blob {digest} read back differently");
    // A range in the middle, across where chunks were joined.
    let (start, end) = (
        data.len() / 3,
        data.len() / 3 + 7_000_000.min(data.len() / 2),
    );
    let r = c
        .get(format!("{base}/v2/{repo}/blobs/{digest}"))
        .header("range", format!("bytes={start}-{}", end - 1))
        .send()
        .unwrap();
    assert_eq!(r.status(), 206);
    assert!(r.bytes().unwrap().as_ref() == &data[start..end]);
}

#[test]
fn uploads_of_every_shape_become_whole_objects_and_leave_no_session_data() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = serve_s3(&s3, &dir.path().join("data"), "shapes", &[]);
    let c = client();
    let base = server.url();
    let data = pseudo_random(48 << 20, 11);

    // Chunks of every size: a large one the server copies in ranges, small ones it gathers, and a
    // large one after small ones, which is split between the two.
    let cuts = [
        0,
        7 << 20,
        8 << 20,
        (8 << 20) + 300_000,
        (21 << 20) + 5,
        24 << 20,
    ];
    let chunks: Vec<&[u8]> = cuts.windows(2).map(|w| &data[w[0]..w[1]]).collect();
    let digest = chunked_upload(&c, &base, "shapes/chunked", &chunks);
    assert_blob(&c, &base, "shapes/chunked", &digest, &data[..24 << 20]);

    // A small chunked upload: gathered and written in one request.
    let small = &data[..3 << 20];
    let digest = chunked_upload(
        &c,
        &base,
        "shapes/small",
        &[&small[..1 << 20], &small[1 << 20..]],
    );
    assert_blob(&c, &base, "shapes/small", &digest, small);

    // A monolithic push too large to hold in memory streams through a multipart upload.
    let digest = Algorithm::Sha256.digest_bytes(&data);
    let r = c
        .post(format!(
            "{base}/v2/shapes/mono/blobs/uploads/?digest={digest}"
        ))
        .body(data.clone())
        .send()
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().unwrap_or_default());
    assert_blob(&c, &base, "shapes/mono", digest.as_str(), &data);

    // The same size in the PUT that finishes an empty session (how most clients push): streamed
    // to the blob's place and published once verified.
    let tail = &data[8 << 20..];
    let tail_digest = Algorithm::Sha256.digest_bytes(tail);
    let r = c
        .post(format!("{base}/v2/shapes/put/blobs/uploads/"))
        .send()
        .unwrap();
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    let r = c
        .put(format!("{base}{location}?digest={tail_digest}"))
        .body(tail.to_vec())
        .send()
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().unwrap_or_default());
    assert_blob(&c, &base, "shapes/put", tail_digest.as_str(), tail);

    // A large body that does not have the claimed digest is refused and leaves nothing behind.
    let claimed = Algorithm::Sha256.digest_bytes(b"something else");
    let r = c
        .post(format!(
            "{base}/v2/shapes/liar/blobs/uploads/?digest={claimed}"
        ))
        .body(data[..40 << 20].to_vec())
        .send()
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["errors"][0]["code"], "DIGEST_INVALID");
    let r = c
        .head(format!("{base}/v2/shapes/liar/blobs/{claimed}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(
        !s3.objects_dir("shapes/blobs/sha256")
            .join(&claimed.hex()[..2])
            .join(claimed.hex())
            .exists(),
        "nothing was published under the claimed digest"
    );

    // A chunk whose body breaks off midway is not kept: the session stays where it was.
    let r = c
        .post(format!("{base}/v2/shapes/broken/blobs/uploads/"))
        .send()
        .unwrap();
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    {
        // 20 MiB announced, 10 MiB sent (more than one multipart part), then the client stops
        // sending.
        use std::io::{Read, Write};
        let mut socket = std::net::TcpStream::connect(&server.addr).unwrap();
        write!(
            socket,
            "PATCH {location} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\ncontent-range: 0-{}\r\n\r\n",
            server.addr,
            20 << 20,
            (20 << 20) - 1
        )
        .unwrap();
        socket.write_all(&data[..10 << 20]).unwrap();
        socket.shutdown(std::net::Shutdown::Write).unwrap();
        // The server has finished with the request once it answers and closes the connection:
        // only then can the session be checked for what the broken chunk left.
        socket
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let mut answer = Vec::new();
        socket
            .read_to_end(&mut answer)
            .expect("the server answers a broken chunk and closes the connection");
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 400") && answer.contains("BLOB_UPLOAD_INVALID"),
            "a chunk that breaks off is refused: {answer}"
        );
    }
    let r = c.get(format!("{base}{location}")).send().unwrap();
    assert_eq!(
        r.headers()["range"],
        "0-0",
        "nothing of the failed chunk is kept"
    );
    let r = c.delete(format!("{base}{location}")).send().unwrap();
    assert_eq!(r.status(), 204);

    // Every finished or cancelled session removed its objects.
    let uploads = s3.objects_dir("shapes/uploads");
    let left: Vec<_> = walk(&uploads);
    assert!(left.is_empty(), "session objects left behind: {left:?}");
    // And every blob object holds exactly the bytes its name says.
    for path in walk(&s3.objects_dir("shapes/blobs/sha256")) {
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            Algorithm::Sha256.digest_bytes(&bytes).hex(),
            path.file_name().unwrap().to_string_lossy()
        );
    }
}

/// Regular files under `dir`, recursively; s3s-fs keeps its own bookkeeping in dot-files.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else if !path.file_name().unwrap().to_string_lossy().starts_with('.') {
            out.push(path);
        }
    }
    out
}

#[test]
fn redirected_blob_reads_go_to_the_bucket_and_keep_ranges() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = serve_s3(
        &s3,
        &dir.path().join("data"),
        "redirect",
        &["--redirect-blobs"],
    );
    let base = server.url();
    let c = client();
    let data = pseudo_random(3 << 20, 5);
    let digest = push_blob(&c, &base, "redirect/x", &data);

    let no_follow = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_follow
        .get(format!("{base}/v2/redirect/x/blobs/{digest}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 307);
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    assert!(location.starts_with(&s3.endpoint()), "{location}");
    assert!(location.contains("X-Amz-Signature="), "{location}");
    // HEAD is answered by the registry itself.
    let r = no_follow
        .head(format!("{base}/v2/redirect/x/blobs/{digest}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], (3 << 20).to_string());

    // A client that follows redirects gets the bytes from the bucket, and its range is honoured.
    let r = c
        .get(format!("{base}/v2/redirect/x/blobs/{digest}"))
        .header("range", "bytes=1000-1999")
        .send()
        .unwrap();
    assert_eq!(r.status(), 206);
    assert!(r.bytes().unwrap().as_ref() == &data[1000..2000]);
    // A tampered signature is refused by the bucket.
    let (head, sig) = location.split_once("X-Amz-Signature=").unwrap();
    let flipped = if sig.starts_with('0') { "1" } else { "0" };
    let forged = format!("{head}X-Amz-Signature={flipped}{}", &sig[1..]);
    assert_eq!(reqwest::blocking::get(forged).unwrap().status(), 403);
    // An unknown blob is still a 404 from the registry, not a redirect to nothing.
    let r = no_follow
        .get(format!(
            "{base}/v2/redirect/x/blobs/{}",
            Algorithm::Sha256.digest_bytes(b"nope")
        ))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);

    // vial pull follows the redirects and verifies what it gets.
    let home = dir.path().join("home");
    let src = home.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("w.bin"), pseudo_random(5 << 20, 8)).unwrap();
    push_json(
        &home,
        &src,
        &format!("{}/weights/redirected", server.addr),
        &["--tag", "v1"],
    );
    let out = home.join("out");
    vial_ok(
        &home,
        &[
            "pull",
            &format!("{}/weights/redirected:v1", server.addr),
            out.to_str().unwrap(),
        ],
    );
    assert_same_tree(&src, &out);
}

#[test]
fn two_replicas_over_postgres_and_one_bucket_behave_as_one_registry() {
    let Some(s3) = S3Server::start() else { return };
    let Some(pg) = PgCluster::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let url = pg.database("replicas");
    let a = serve_s3(
        &s3,
        &dir.path().join("a"),
        "shared",
        &["--metadata-url", &url],
    );
    let b = serve_s3(
        &s3,
        &dir.path().join("b"),
        "shared",
        &["--metadata-url", &url],
    );
    crate::backends::replicas_behave_as_one(&a, &b, dir.path());
}

#[test]
fn pushes_fail_with_503_while_the_object_store_is_down_and_succeed_after() {
    let Some(mut s3) = S3Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = serve_s3(&s3, &dir.path().join("data"), "outage", &[]);
    let base = server.url();
    let c = client();
    let before = push_blob(&c, &base, "outage/x", b"stored before the outage");

    s3.stop();
    let data = pseudo_random(1 << 20, 3);
    let digest = Algorithm::Sha256.digest_bytes(&data);
    let push = || {
        c.post(format!("{base}/v2/outage/x/blobs/uploads/?digest={digest}"))
            .body(data.clone())
            .send()
            .unwrap()
    };
    let r = push();
    assert_eq!(r.status(), 503, "a push while the bucket is unreachable");
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["errors"][0]["code"], "UNAVAILABLE");
    let r = c
        .get(format!("{base}/v2/outage/x/blobs/{before}"))
        .send()
        .unwrap();
    assert_eq!(
        r.status(),
        503,
        "a read fails clearly, never with wrong or missing bytes"
    );
    assert_eq!(
        c.get(format!("{base}/readyz")).send().unwrap().status(),
        503
    );
    // Nothing of the failed push is visible.
    let r = c
        .head(format!("{base}/v2/outage/x/blobs/{digest}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);

    s3.start_again();
    assert_eq!(
        push().status(),
        201,
        "the same push succeeds once the bucket is back"
    );
    assert_eq!(
        c.get(format!("{base}/readyz")).send().unwrap().status(),
        200
    );
    let r = c
        .get(format!("{base}/v2/outage/x/blobs/{before}"))
        .send()
        .unwrap();
    assert_eq!(r.bytes().unwrap().as_ref(), b"stored before the outage");
    let r = c
        .get(format!("{base}/v2/outage/x/blobs/{digest}"))
        .send()
        .unwrap();
    assert!(r.bytes().unwrap().as_ref() == data.as_slice());
}

#[test]
fn uploads_abandoned_by_a_killed_replica_are_swept() {
    // s3s-fs cannot list multipart uploads, so this path runs against moto.
    let Some(moto) = Moto::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "--blob-url".to_owned(),
            format!("s3://{BUCKET}/swept"),
            "--metadata-url".to_owned(),
            format!("sqlite://{}/metadata.db", data.display()),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let env = crate::support::s3::aws_env(&moto.endpoint());
    let server = Server::start_with(&data, &args(&[]), &env);

    // A first chunk of 1 MiB arrives whole: it is an object under the session's prefix. Then a
    // chunk of 40 MiB of which only 20 arrive before the replica is killed: it was being streamed
    // into a multipart upload, which nobody will complete or abort.
    let c = client();
    let r = c
        .post(format!("{}/v2/swept/x/blobs/uploads/", server.url()))
        .send()
        .unwrap();
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    let session = format!("swept/uploads/{}/", location.rsplit('/').next().unwrap());
    let first = 1 << 20;
    let r = c
        .patch(format!("{}{location}", server.url()))
        .header("content-range", format!("0-{}", first - 1))
        .body(vec![7u8; first])
        .send()
        .unwrap();
    assert_eq!(r.status(), 202);
    let bucket = crate::support::s3::Bucket::new(&moto.endpoint(), BUCKET);
    let kept = bucket.keys(&session);
    assert_eq!(kept.len(), 1, "the first chunk's object: {kept:?}");
    let mut socket = std::net::TcpStream::connect(&server.addr).unwrap();
    use std::io::Write;
    write!(
        socket,
        "PATCH {location} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\ncontent-range: {first}-{}\r\n\r\n",
        server.addr,
        40 << 20,
        first + (40 << 20) - 1
    )
    .unwrap();
    socket.write_all(&vec![7u8; 20 << 20]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while moto.multipart_uploads().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no multipart upload started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    server.kill_hard();
    drop(socket);
    assert_eq!(
        moto.multipart_uploads().len(),
        1,
        "the killed replica left its upload"
    );

    // A replica whose janitor considers anything older than a second abandoned cleans it up: the
    // session's objects and the multipart upload both go.
    let _server = Server::start_with(
        &data,
        &args(&["--upload-ttl", "1s", "--janitor-interval", "1s"]),
        &env,
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !moto.multipart_uploads().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned multipart upload was not swept: {:?}",
            moto.multipart_uploads()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The stale session goes too (perhaps a tick later: moto dates uploads to the second).
    loop {
        let r = c
            .get(format!("{}{location}", _server.url()))
            .send()
            .unwrap();
        if r.status() == 404 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stale session is still there"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Its objects went before its record did: nothing is left under its prefix.
    let left = bucket.keys(&session);
    assert!(left.is_empty(), "the swept session left {left:?}");
}

/// `vial_s3_requests_total{method="PUT"}` from the registry's /metrics.
fn s3_puts(server: &Server) -> u64 {
    s3_requests(server, "PUT").expect("vial_s3_requests_total{method=\"PUT\"} in /metrics")
}

/// `vial_s3_requests_total{method=METHOD}` from the registry's /metrics, if it has counted one.
fn s3_requests(server: &Server, method: &str) -> Option<u64> {
    let text = reqwest::blocking::get(format!("{}/metrics", server.url()))
        .unwrap()
        .text()
        .unwrap();
    let prefix = format!("vial_s3_requests_total{{method=\"{method}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

/// A pull of many small files asks for their chunks in tree order, not in the order their pack
/// holds them: the registry gathers them in a few ranged GETs, not one per chunk.
#[test]
fn small_chunks_asked_out_of_pack_order_cost_a_few_gets_not_one_each() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = serve_s3(&s3, &dir.path().join("data"), "gather", &[]);
    let chunks = OutOfPackOrder::send(&server.url(), "gather/chunks");
    let before = s3_requests(&server, "GET").unwrap_or(0);
    let asked = chunks.read_and_check(&server.url(), "gather/chunks");
    let after = s3_requests(&server, "GET").expect("S3 GETs counted in /metrics");
    let gets = after - before;
    // Two packs, the bulk read cut in two windows by the large chunk asked on its own: a ranged
    // GET per pack and window, one for the large chunk and one for each of the 30 blobs stored
    // whole. One GET per chunk would be 432.
    assert!(
        (31..=38).contains(&gets),
        "a bulk read of {asked} small chunks out of pack order cost {gets} S3 GETs"
    );
}

#[test]
fn a_push_stores_new_chunks_in_full_packs_one_put_each() {
    let Some(s3) = S3Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = serve_s3(&s3, &dir.path().join("data"), "packs", &[]);
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // 192 MiB of new data in 48 files: packs span files, however the hashers batch them.
    for i in 0..48u64 {
        std::fs::write(
            src.join(format!("shard-{i}.bin")),
            pseudo_random(4 << 20, 40 + i),
        )
        .unwrap();
    }
    let home = dir.path().join("home");
    let before = s3_puts(&server);
    let report = push_json(
        &home,
        &src,
        &format!("{}/packs/model", server.addr),
        &["--tag", "v1"],
    );
    let puts = s3_puts(&server) - before;
    let chunks = report["chunks_uploaded"].as_u64().unwrap();
    assert!(chunks > 40, "the push sent {chunks} chunks");
    // Packs of up to 64 MiB stop short of it by less than one chunk, so 192 MiB fills at most 4;
    // the seal adds its few small objects (index, manifests, config). Packs cut at every pause of
    // the hashers would cost a PUT for each.
    assert!(
        puts <= 4 + 6,
        "pushing 192 MiB of new chunks cost {puts} S3 PUTs (budget: 32 per GiB)"
    );
    let out = dir.path().join("out");
    vial_ok(
        &home,
        &[
            "pull",
            &format!("{}/packs/model:v1", server.addr),
            out.to_str().unwrap(),
        ],
    );
    assert_same_tree(&src, &out);
}
