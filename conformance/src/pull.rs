//! Pull checks for blobs: GET and HEAD, unknown and repository-scoped blobs, byte ranges, and
//! malformed digests in the URL. (Manifest pulls are checked in `manifests`.)

use reqwest::Method;

use crate::check::{fail, pass, pass_with, skip, warn, Problem, Recorder, Slot};
use crate::client::Response;
use crate::expect;
use crate::fixtures::{unknown_digest, upload, Blob, Ctx};
use crate::parse::{parse_content_range, unsatisfied_length};

/// Size of the blob the range checks read from.
const N: usize = 64;

pub(crate) async fn run(ctx: &Ctx<'_>, rec: &mut Recorder) {
    let client = &ctx.client;
    let repo = ctx.repo("pull");
    let blob = Blob::random(N);
    let uploaded = upload(client, &repo, &blob).await.map(|_| ());
    let setup = Slot::from_setup("upload a 64-byte blob", uploaded);

    rec.run(
        "pull.blob.get",
        "GET /v2/<name>/blobs/<digest> answers 200 with the exact bytes, Docker-Content-Digest and Content-Length",
        async {
            setup.get()?;
            let resp = client.blob(Method::GET, &repo, blob.digest.as_str(), None).await?;
            expect::status(&resp, 200)?;
            expect::body(&resp, &blob.bytes)?;
            expect::digest_header(&resp, &blob.digest)?;
            expect::content_length(&resp, N)?;
            pass()
        },
    )
    .await;

    rec.run(
        "pull.blob.head",
        "HEAD /v2/<name>/blobs/<digest> answers 200 with Content-Length and Docker-Content-Digest and no body",
        async {
            setup.get()?;
            let resp = client.blob(Method::HEAD, &repo, blob.digest.as_str(), None).await?;
            expect::status(&resp, 200)?;
            expect::content_length(&resp, N)?;
            expect::digest_header(&resp, &blob.digest)?;
            expect::no_body(&resp)?;
            pass()
        },
    )
    .await;

    rec.run(
        "pull.blob.unknown-404",
        "GET of a blob the repository does not hold answers 404 BLOB_UNKNOWN",
        async {
            setup.get()?;
            let resp = client
                .blob(Method::GET, &repo, unknown_digest().as_str(), None)
                .await?;
            expect::error(&resp, 404, &["BLOB_UNKNOWN"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "pull.blob.head-unknown-404",
        "HEAD of a blob the repository does not hold answers 404",
        async {
            setup.get()?;
            let resp = client
                .blob(Method::HEAD, &repo, unknown_digest().as_str(), None)
                .await?;
            expect::status(&resp, 404)?;
            expect::no_body(&resp)?;
            pass()
        },
    )
    .await;

    rec.run(
        "pull.blob.repo-scoped-404",
        "a blob uploaded to one repository is not served from another (404 BLOB_UNKNOWN)",
        async {
            setup.get()?;
            let other = ctx.repo("pull-other");
            upload(client, &other, &Blob::random(16)).await?;
            let resp = client
                .blob(Method::GET, &other, blob.digest.as_str(), None)
                .await?;
            expect::error(&resp, 404, &["BLOB_UNKNOWN"])?;
            pass()
        },
    )
    .await;

    let ranges: [(&'static str, &'static str, String, usize, usize); 3] = [
        (
            "pull.range.closed",
            "Range: bytes=2-5 answers 206 with Content-Range bytes 2-5/N and exactly those bytes",
            "bytes=2-5".to_owned(),
            2,
            5,
        ),
        (
            "pull.range.open-ended",
            "Range: bytes=3- answers 206 with Content-Range bytes 3-(N-1)/N and the rest of the blob",
            "bytes=3-".to_owned(),
            3,
            N - 1,
        ),
        (
            "pull.range.suffix",
            "Range: bytes=-4 answers 206 with the last 4 bytes and Content-Range bytes (N-4)-(N-1)/N",
            "bytes=-4".to_owned(),
            N - 4,
            N - 1,
        ),
    ];
    for (id, description, header, start, end) in ranges {
        rec.run(id, description, async {
            setup.get()?;
            let resp = client
                .blob(Method::GET, &repo, blob.digest.as_str(), Some(&header))
                .await?;
            partial(&resp, &blob, start, end)
        })
        .await;
    }

    rec.run(
        "pull.range.unsatisfiable-416",
        "a Range wholly beyond the blob (bytes=N+10-N+20) answers 416 Range Not Satisfiable",
        async {
            setup.get()?;
            let header = format!("bytes={}-{}", N + 10, N + 20);
            let request = client.blob_request(Method::GET, &repo, blob.digest.as_str(), Some(&header))?;
            // Only the status matters here, so a malformed body is a remark, not a failure.
            let (resp, body_error) = client.send_lenient(request).await?;
            if resp.status == 200 && resp.body.as_ref() == blob.bytes.as_slice() {
                return skip("Range unsupported: the registry ignored it and sent the whole blob (Range support is a SHOULD)");
            }
            expect::status(&resp, 416)?;
            let mut notes = Vec::new();
            match resp.header("Content-Range") {
                Some(v) if unsatisfied_length(v) == Some(N as u64) => {}
                Some(v) => notes.push(format!("Content-Range on the 416 is {v:?}; RFC 9110 suggests \"bytes */{N}\"")),
                None => notes.push(format!("no Content-Range on the 416; RFC 9110 suggests \"bytes */{N}\"")),
            }
            if let Some(e) = body_error {
                notes.push(format!("the 416 body could not be read: {e}"));
            }
            if notes.is_empty() {
                pass()
            } else {
                pass_with(notes.join("; "))
            }
        },
    )
    .await;

    rec.run(
        "pull.blob.invalid-digest",
        "GET /v2/<name>/blobs/sha256:xyz (malformed digest) answers 400 DIGEST_INVALID",
        async {
            setup.get()?;
            let resp = client.blob(Method::GET, &repo, "sha256:xyz", None).await?;
            if !(400..500).contains(&resp.status) {
                return fail(format!("expected 400, got {}", resp.describe()));
            }
            let code = expect::error_body(&resp, &[])?;
            if resp.status == 400 && code == "DIGEST_INVALID" {
                pass()
            } else {
                warn(format!(
                    "answered {} {code}; 400 DIGEST_INVALID is expected",
                    resp.status
                ))
            }
        },
    )
    .await;
}

/// Checks a `206 Partial Content` answer for bytes `start..=end` of `blob`. A `200` with the whole
/// blob means the registry ignores `Range`, which the specification allows (it is a SHOULD).
fn partial(
    resp: &Response,
    blob: &Blob,
    start: usize,
    end: usize,
) -> Result<Option<String>, Problem> {
    if resp.status == 200 && resp.body.as_ref() == blob.bytes.as_slice() {
        return skip("Range unsupported: the registry sent the whole blob with 200 (Range support is a SHOULD)");
    }
    expect::status(resp, 206)?;
    let value = expect::header(resp, "Content-Range")?;
    match parse_content_range(value) {
        Some(r)
            if r.start == start as u64
                && r.end == end as u64
                && r.total == Some(blob.len() as u64) => {}
        _ => {
            return fail(format!(
                "Content-Range is {value:?}, expected \"bytes {start}-{end}/{}\"",
                blob.len()
            ))
        }
    }
    let want = blob.bytes.get(start..=end).unwrap_or_default();
    expect::body(resp, want)?;
    if resp.header("Content-Length").is_some() {
        expect::content_length(resp, want.len())?;
    }
    pass()
}
