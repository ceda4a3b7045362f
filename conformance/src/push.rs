//! Push checks: monolithic, single-POST and chunked blob uploads, out-of-order chunks, upload
//! status and cancellation, digest verification, cross-repository mounts and non-sha256 digests.

use reqwest::header::CONTENT_TYPE;
use reqwest::{Method, Url};
use vial_core::{Algorithm, Digest};

use crate::check::{fail, pass, pass_with, require, skip, Problem, Recorder, Slot};
use crate::client::{add_query, Client, Response};
use crate::expect;
use crate::fixtures::{random_bytes, unknown_digest, upload, Blob, Ctx};
use crate::parse::{parse_decimal, parse_upload_range};

/// Default chunk size; a larger `OCI-Chunk-Min-Length` replaces it.
const CHUNK: usize = 4096;
/// The largest `OCI-Chunk-Min-Length` the suite will honour (it keeps whole blobs in memory).
const MAX_CHUNK: usize = 64 << 20;

pub(crate) async fn run(ctx: &Ctx<'_>, rec: &mut Recorder) {
    let repo = ctx.repo("push");
    post_then_put(ctx, rec, &repo).await;
    single_post(ctx, rec, &repo).await;
    let chunk = chunked(ctx, rec, &repo).await;
    chunked_close_without_body(ctx, rec, &repo, chunk).await;
    out_of_order(ctx, rec, &repo, chunk).await;
    cancel(ctx, rec, &repo).await;
    digest_mismatch(ctx, rec, &repo).await;
    mount(ctx, rec).await;
    algorithm(ctx, rec, &repo, Algorithm::Sha512).await;
    algorithm(ctx, rec, &repo, Algorithm::Blake3).await;
    empty_blob(ctx, rec, &repo).await;
}

// ---- helpers --------------------------------------------------------------------------------

/// `POST /blobs/uploads/` with `Content-Length: 0`; requires 202 and returns the response and the
/// resolved session URL.
async fn start(
    client: &Client,
    repo: &str,
    query: &[(&str, &str)],
) -> Result<(Response, Url), Problem> {
    let resp = client.post_upload(repo, query).await?;
    expect::status(&resp, 202)?;
    let url = client.resolve(expect::location(&resp)?)?;
    Ok((resp, url))
}

/// `PATCH` one chunk that starts at byte `start` of the blob.
async fn patch(
    client: &Client,
    url: &Url,
    start: usize,
    chunk: &[u8],
) -> Result<Response, Problem> {
    let end = (start + chunk.len()).saturating_sub(1);
    client
        .send(
            client
                .request(Method::PATCH, url.clone())
                .header(CONTENT_TYPE, "application/octet-stream")
                .header("Content-Range", format!("{start}-{end}"))
                .body(chunk.to_vec()),
        )
        .await
}

/// Requires an upload-progress answer (`expected` status, `Range: 0-<end>`, `Location`) and
/// returns the next session URL.
fn progress(client: &Client, resp: &Response, expected: u16, end: usize) -> Result<Url, Problem> {
    expect::status(resp, expected)?;
    let range = expect::header(resp, "Range")?;
    match parse_upload_range(range) {
        Some((0, e)) if e == end as u64 => {}
        _ => {
            return fail(format!(
                "Range is {range:?}, expected \"0-{end}\" ({})",
                resp.describe()
            ))
        }
    }
    client.resolve(expect::location(resp)?)
}

/// The closing `PUT <location>?digest=`, with the final chunk (starting at `start`) if given.
async fn close(
    client: &Client,
    url: &Url,
    digest: &str,
    last: Option<(usize, &[u8])>,
) -> Result<Response, Problem> {
    let mut url = url.clone();
    add_query(&mut url, &[("digest", digest)]);
    let mut request = client.request(Method::PUT, url);
    request = match last {
        Some((start, chunk)) if !chunk.is_empty() => request
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(
                "Content-Range",
                format!("{start}-{}", start + chunk.len() - 1),
            )
            .body(chunk.to_vec()),
        _ => request.header("Content-Length", "0").body(Vec::new()),
    };
    client.send(request).await
}

/// Requires a completed upload: 201, a Location, and a correct `Docker-Content-Digest` if present.
fn created(resp: &Response, digest: &Digest) -> Result<(), Problem> {
    expect::status(resp, 201)?;
    expect::location(resp)?;
    if resp.header("Docker-Content-Digest").is_some() {
        expect::digest_header(resp, digest)?;
    }
    Ok(())
}

/// Requires the repository to serve exactly `blob`.
async fn serves(client: &Client, repo: &str, blob: &Blob) -> Result<(), Problem> {
    let got = client
        .blob(Method::GET, repo, blob.digest.as_str(), None)
        .await?;
    expect::status(&got, 200)?;
    expect::body(&got, &blob.bytes)
}

/// Best-effort cleanup of an upload session; failures are ignored, as the spec tells clients to.
async fn abandon(client: &Client, url: &Url) {
    let _ = client
        .send(client.request(Method::DELETE, url.clone()))
        .await;
}

// ---- monolithic -----------------------------------------------------------------------------

async fn post_then_put(ctx: &Ctx<'_>, rec: &mut Recorder, repo: &str) {
    let client = &ctx.client;
    let blob = Blob::random(3000);
    let mut session: Slot<Url> = Slot::new("push.post-put.initiate");
    let mut stored: Slot<Url> = Slot::new("push.post-put.complete");

    rec.run(
        "push.post-put.initiate",
        "POST /v2/<name>/blobs/uploads/ answers 202 Accepted with a Location",
        async {
            session.poison("push.post-put.initiate");
            let (_, url) = start(client, repo, &[]).await?;
            session.put(url);
            pass()
        },
    )
    .await;

    rec.run(
        "push.post-put.complete",
        "PUT <location>?digest= with the whole blob answers 201 Created with Location and Docker-Content-Digest",
        async {
            stored.poison("push.post-put.complete");
            let url = session.get()?.clone();
            let resp = close(client, &url, blob.digest.as_str(), Some((0, &blob.bytes))).await?;
            expect::status(&resp, 201)?;
            let location = client.resolve(expect::location(&resp)?)?;
            expect::digest_header(&resp, &blob.digest)?;
            stored.put(location);
            pass()
        },
    )
    .await;

    rec.run(
        "push.post-put.location-pullable",
        "the Location of the 201 is a pullable URL serving the uploaded blob",
        async {
            let url = stored.get()?.clone();
            let resp = client
                .send(client.request_following(Method::GET, url))
                .await?;
            expect::status(&resp, 200)?;
            expect::body(&resp, &blob.bytes)?;
            pass()
        },
    )
    .await;
}

async fn single_post(ctx: &Ctx<'_>, rec: &mut Recorder, repo: &str) {
    let client = &ctx.client;
    rec.run(
        "push.single-post",
        "POST /v2/<name>/blobs/uploads/?digest= with the blob answers 201 Created with a Location",
        async {
            let blob = Blob::random(2500);
            let url = client.url_with(
                &format!("/v2/{repo}/blobs/uploads/"),
                &[("digest", blob.digest.as_str())],
            )?;
            let resp = client
                .send(
                    client
                        .request(Method::POST, url)
                        .header(CONTENT_TYPE, "application/octet-stream")
                        .body(blob.bytes.clone()),
                )
                .await?;
            match resp.status {
                201 => {
                    created(&resp, &blob.digest)?;
                    serves(client, repo, &blob).await?;
                    pass()
                }
                202 => {
                    // The specification's sanctioned answer from a registry without single-POST
                    // support: the client goes on with a PUT. Require that fallback to work.
                    let session = client.resolve(expect::location(&resp)?)?;
                    let done = close(client, &session, blob.digest.as_str(), Some((0, &blob.bytes)))
                        .await?;
                    created(&done, &blob.digest)?;
                    serves(client, repo, &blob).await?;
                    skip("single-POST upload unsupported: the registry answered 202 and the POST-then-PUT fallback worked (allowed by the spec)")
                }
                _ => fail(format!("expected 201 (or 202), got {}", resp.describe())),
            }
        },
    )
    .await;
}

// ---- chunked --------------------------------------------------------------------------------

/// Runs the main chunked flow and returns the chunk size it settled on.
async fn chunked(ctx: &Ctx<'_>, rec: &mut Recorder, repo: &str) -> usize {
    let client = &ctx.client;
    let mut session: Slot<Url> = Slot::new("push.chunked.initiate");
    let mut min_length: Option<String> = None;

    rec.run(
        "push.chunked.initiate",
        "POST /v2/<name>/blobs/uploads/ with Content-Length: 0 answers 202 Accepted with a Location",
        async {
            session.poison("push.chunked.initiate");
            let (resp, url) = start(client, repo, &[]).await?;
            min_length = resp.header("OCI-Chunk-Min-Length").map(str::to_owned);
            session.put(url);
            pass()
        },
    )
    .await;

    let min = min_length
        .as_deref()
        .and_then(|v| parse_decimal(v.trim()))
        .and_then(|v| usize::try_from(v).ok())
        .unwrap_or(0);
    let chunk = min.clamp(CHUNK, MAX_CHUNK);

    rec.run(
        "push.chunked.min-length",
        "OCI-Chunk-Min-Length, if the POST sends it, is a positive integer",
        async {
            session.get()?;
            match min_length.as_deref() {
                None => pass_with("header absent (it is optional)"),
                Some(v) => match parse_decimal(v.trim()) {
                    Some(n) if n > 0 => pass_with(format!("OCI-Chunk-Min-Length: {n}")),
                    _ => fail(format!(
                        "OCI-Chunk-Min-Length is {v:?}, not a positive integer"
                    )),
                },
            }
        },
    )
    .await;

    let blob = Blob::random(chunk * 2 + chunk / 2 + 17);
    let first = blob.bytes.get(..chunk).unwrap_or_default();
    let second = blob.bytes.get(chunk..chunk * 2).unwrap_or_default();
    let rest = blob.bytes.get(chunk * 2..).unwrap_or_default();

    rec.run(
        "push.chunked.first-patch",
        "PATCH with Content-Range 0-(n-1) answers 202 with Range: 0-(n-1) and a Location",
        async {
            let url = session.take("push.chunked.first-patch")?;
            let resp = patch(client, &url, 0, first).await?;
            session.put(progress(client, &resp, 202, chunk - 1)?);
            pass()
        },
    )
    .await;

    rec.run(
        "push.chunked.second-patch",
        "a PATCH continuing at the current offset answers 202 with the cumulative Range",
        async {
            let url = session.take("push.chunked.second-patch")?;
            let resp = patch(client, &url, chunk, second).await?;
            session.put(progress(client, &resp, 202, chunk * 2 - 1)?);
            pass()
        },
    )
    .await;

    rec.run(
        "push.chunked.status",
        "GET on the upload session answers 204 No Content with Range and Location",
        async {
            let url = session.take("push.chunked.status")?;
            let resp = client.get_url(url).await?;
            session.put(progress(client, &resp, 204, chunk * 2 - 1)?);
            pass()
        },
    )
    .await;

    let mut closed = false;
    rec.run(
        "push.chunked.close-with-chunk",
        "the closing PUT ?digest= carrying the last chunk answers 201 Created with a Location",
        async {
            let url = session.take("push.chunked.close-with-chunk")?;
            let resp = close(client, &url, blob.digest.as_str(), Some((chunk * 2, rest))).await?;
            created(&resp, &blob.digest)?;
            closed = true;
            pass()
        },
    )
    .await;

    rec.run(
        "push.chunked.content",
        "the blob assembled from chunks reads back byte for byte",
        async {
            require!(
                closed,
                "not reached: depends on push.chunked.close-with-chunk, which failed"
            );
            serves(client, repo, &blob).await?;
            pass()
        },
    )
    .await;
    chunk
}

async fn chunked_close_without_body(ctx: &Ctx<'_>, rec: &mut Recorder, repo: &str, chunk: usize) {
    let client = &ctx.client;
    rec.run(
        "push.chunked.close-empty-put",
        "after every chunk is PATCHed, a bodiless closing PUT ?digest= answers 201 and the blob reads back",
        async {
            let blob = Blob::random(chunk + chunk / 3 + 5);
            let first = blob.bytes.get(..chunk).unwrap_or_default();
            let rest = blob.bytes.get(chunk..).unwrap_or_default();
            let (_, url) = start(client, repo, &[]).await?;
            let resp = patch(client, &url, 0, first).await?;
            let url = progress(client, &resp, 202, chunk - 1)?;
            let resp = patch(client, &url, chunk, rest).await?;
            let url = progress(client, &resp, 202, blob.len() - 1)?;
            let resp = close(client, &url, blob.digest.as_str(), None).await?;
            created(&resp, &blob.digest)?;
            serves(client, repo, &blob).await?;
            pass()
        },
    )
    .await;
}

async fn out_of_order(ctx: &Ctx<'_>, rec: &mut Recorder, repo: &str, chunk: usize) {
    let client = &ctx.client;
    let blob = Blob::random(chunk * 2 + 9);
    let first = blob.bytes.get(..chunk).unwrap_or_default();
    let rest = blob.bytes.get(chunk..).unwrap_or_default();
    // A session holding the first chunk.
    let opened = || async {
        let (_, url) = start(client, repo, &[]).await?;
        let resp = patch(client, &url, 0, first).await?;
        progress(client, &resp, 202, chunk - 1)
    };
    let mut session = Slot::from_setup("POST and a first PATCH", opened().await);

    rec.run(
        "push.chunked.out-of-order-416",
        "a PATCH whose Content-Range does not start at the current offset answers 416",
        async {
            // Taken out so that, if the registry wrongly accepts the chunk, the checks that
            // continue this session report that instead of a confusing later error.
            let url = session.take("push.chunked.out-of-order-416")?;
            let skip_ahead = chunk + chunk / 2;
            let resp = patch(client, &url, skip_ahead, rest).await?;
            expect::status(&resp, 416)?;
            expect::error_body(&resp, &[])?;
            session.put(url);
            pass()
        },
    )
    .await;

    rec.run(
        "push.chunked.status-after-416",
        "after a 416 the session survives: GET answers 204 with the unchanged Range",
        async {
            let url = session.take("push.chunked.status-after-416")?;
            let resp = client.get_url(url).await?;
            session.put(progress(client, &resp, 204, chunk - 1)?);
            pass()
        },
    )
    .await;

    rec.run(
        "push.chunked.resume-after-416",
        "the right next chunk after a 416 is accepted and the upload completes intact",
        async {
            let url = session.take("push.chunked.resume-after-416")?;
            let resp = patch(client, &url, chunk, rest).await?;
            let url = progress(client, &resp, 202, blob.len() - 1)?;
            let resp = close(client, &url, blob.digest.as_str(), None).await?;
            created(&resp, &blob.digest)?;
            serves(client, repo, &blob).await?;
            pass()
        },
    )
    .await;
    if let Ok(url) = session.get() {
        abandon(client, url).await;
    }

    let again = Slot::from_setup("POST and a first PATCH", opened().await);
    rec.run(
        "push.chunked.repeated-chunk-416",
        "re-sending an already accepted chunk (Content-Range 0-(n-1) again) answers 416",
        async {
            let url = again.get()?.clone();
            let resp = patch(client, &url, 0, first).await?;
            abandon(client, &url).await;
            expect::status(&resp, 416)?;
            expect::error_body(&resp, &[])?;
            pass()
        },
    )
    .await;
}

// ---- cancellation and verification ------------------------------------------------------------

async fn cancel(ctx: &Ctx<'_>, rec: &mut Recorder, repo: &str) {
    let client = &ctx.client;
    let mut cancelled: Slot<Url> = Slot::new("push.cancel.delete-204");
    rec.run(
        "push.cancel.delete-204",
        "DELETE on an upload session answers 204 No Content",
        async {
            cancelled.poison("push.cancel.delete-204");
            let (_, url) = start(client, repo, &[]).await?;
            let resp = patch(client, &url, 0, &random_bytes(100)).await?;
            let url = progress(client, &resp, 202, 99)?;
            let resp = client
                .send(
                    client
                        .request(Method::DELETE, url.clone())
                        .header("Content-Length", "0"),
                )
                .await?;
            expect::status(&resp, 204)?;
            cancelled.put(url);
            pass()
        },
    )
    .await;

    rec.run(
        "push.cancel.status-404",
        "GET on a cancelled upload session answers 404 BLOB_UPLOAD_UNKNOWN",
        async {
            let url = cancelled.get()?.clone();
            let resp = client.get_url(url).await?;
            expect::error(&resp, 404, &["BLOB_UPLOAD_UNKNOWN"])?;
            pass()
        },
    )
    .await;
}

async fn digest_mismatch(ctx: &Ctx<'_>, rec: &mut Recorder, repo: &str) {
    let client = &ctx.client;
    rec.run(
        "push.digest-mismatch-400",
        "a closing PUT whose ?digest= does not match the uploaded bytes answers 400 DIGEST_INVALID",
        async {
            let blob = Blob::random(1000);
            let wrong = unknown_digest();
            let (_, url) = start(client, repo, &[]).await?;
            let resp = close(client, &url, wrong.as_str(), Some((0, &blob.bytes))).await?;
            let outcome = expect::error(&resp, 400, &["DIGEST_INVALID"]);
            abandon(client, &url).await;
            outcome?;
            // Neither digest may now name a blob: not the one claimed, and not the one the bytes
            // really have (the upload must not have been stored under its true name either).
            for (what, digest) in [("claimed", &wrong), ("uploaded bytes'", &blob.digest)] {
                let head = client
                    .blob(Method::HEAD, repo, digest.as_str(), None)
                    .await?;
                require!(
                    head.status == 404,
                    "after the rejected PUT, HEAD of the {what} digest {digest} answered {}",
                    head.status
                );
            }
            pass()
        },
    )
    .await;
}

// ---- mounting -------------------------------------------------------------------------------

async fn mount(ctx: &Ctx<'_>, rec: &mut Recorder) {
    let client = &ctx.client;
    let source = ctx.mount_source_repo("mount-src");
    let target = ctx.repo("mount-dst");
    let blob = Blob::random(1500);
    let uploaded = upload(client, &source, &blob).await.map(|_| ());
    let setup = Slot::from_setup("upload to the source repository", uploaded);
    let mut mounted = false;

    rec.run(
        "push.mount.from-other-repo",
        "POST ?mount=<digest>&from=<other repo> answers 201 Created with a Location",
        async {
            setup.get()?;
            let resp = client
                .post_upload(&target, &[("mount", blob.digest.as_str()), ("from", &source)])
                .await?;
            match resp.status {
                201 => {
                    created(&resp, &blob.digest)?;
                    mounted = true;
                    pass()
                }
                202 => {
                    if let Some(loc) = resp.header("Location") {
                        if let Ok(url) = client.resolve(loc) {
                            abandon(client, &url).await;
                        }
                    }
                    skip("the registry declined to mount and opened an upload session instead (202, allowed by the spec)")
                }
                _ => fail(format!("expected 201, got {}", resp.describe())),
            }
        },
    )
    .await;

    rec.run(
        "push.mount.blob-present",
        "a mounted blob is then present in the target repository (HEAD 200 with Content-Length)",
        async {
            if !mounted {
                return skip("not reached: push.mount.from-other-repo did not mount");
            }
            let resp = client
                .blob(Method::HEAD, &target, blob.digest.as_str(), None)
                .await?;
            expect::status(&resp, 200)?;
            expect::content_length(&resp, blob.len())?;
            serves(client, &target, &blob).await?;
            pass()
        },
    )
    .await;

    rec.run(
        "push.mount.missing-source-202",
        "a mount of a blob the source repository lacks falls back to an upload session (202 + Location)",
        async {
            setup.get()?;
            let missing = unknown_digest();
            let resp = client
                .post_upload(&target, &[("mount", missing.as_str()), ("from", &source)])
                .await?;
            if resp.status == 201 {
                return fail("the registry claims to have mounted a blob that does not exist (201)");
            }
            expect::status(&resp, 202)?;
            let url = client.resolve(expect::location(&resp)?)?;
            abandon(client, &url).await;
            pass()
        },
    )
    .await;
}

// ---- digest algorithms and edge sizes ---------------------------------------------------------

async fn algorithm(ctx: &Ctx<'_>, rec: &mut Recorder, repo: &str, algorithm: Algorithm) {
    let (id, description) = match algorithm {
        Algorithm::Sha512 => (
            "push.digest-algorithm.sha512",
            "an upload opened with ?digest-algorithm=sha512 and closed with a sha512 digest answers 201 and reads back",
        ),
        Algorithm::Blake3 => (
            "push.digest-algorithm.blake3",
            "an upload opened with ?digest-algorithm=blake3 and closed with a blake3 digest answers 201 and reads back",
        ),
        Algorithm::Sha256 => (
            "push.digest-algorithm.sha256",
            "an upload opened with ?digest-algorithm=sha256 answers 201 and reads back",
        ),
    };
    let client = &ctx.client;
    rec.run(id, description, async {
        let blob = Blob::with_algorithm(random_bytes(5000), algorithm);
        let resp = client
            .post_upload(repo, &[("digest-algorithm", algorithm.as_str())])
            .await?;
        if resp.status == 400 {
            let code = expect::error_body(&resp, &[])?;
            return skip(format!(
                "{algorithm} uploads unsupported: POST answered 400 {code}"
            ));
        }
        expect::status(&resp, 202)?;
        let url = client.resolve(expect::location(&resp)?)?;
        let head = blob.bytes.get(..3000).unwrap_or_default();
        let tail = blob.bytes.get(3000..).unwrap_or_default();
        let resp = patch(client, &url, 0, head).await?;
        let url = progress(client, &resp, 202, 2999)?;
        let resp = close(client, &url, blob.digest.as_str(), Some((3000, tail))).await?;
        if resp.status == 400 {
            let code = expect::error_body(&resp, &["DIGEST_INVALID", "UNSUPPORTED"]);
            abandon(client, &url).await;
            let code = code?;
            return skip(format!(
                "{algorithm} digests unsupported: closing PUT answered 400 {code}"
            ));
        }
        expect::status(&resp, 201)?;
        expect::location(&resp)?;
        serves(client, repo, &blob).await?;
        let head = client
            .blob(Method::HEAD, repo, blob.digest.as_str(), None)
            .await?;
        expect::status(&head, 200)?;
        expect::content_length(&head, blob.len())?;
        pass()
    })
    .await;
}

async fn empty_blob(ctx: &Ctx<'_>, rec: &mut Recorder, repo: &str) {
    let client = &ctx.client;
    rec.run(
        "push.empty-blob",
        "a 0-byte blob uploads (201) and reads back empty with Content-Length: 0",
        async {
            let blob = Blob::new(Vec::new());
            let (_, url) = start(client, repo, &[]).await?;
            let resp = close(client, &url, blob.digest.as_str(), None).await?;
            created(&resp, &blob.digest)?;
            let got = client
                .blob(Method::GET, repo, blob.digest.as_str(), None)
                .await?;
            expect::status(&got, 200)?;
            expect::body(&got, &[])?;
            if got.header("Content-Length").is_some() {
                expect::content_length(&got, 0)?;
            }
            let head = client
                .blob(Method::HEAD, repo, blob.digest.as_str(), None)
                .await?;
            expect::status(&head, 200)?;
            expect::content_length(&head, 0)?;
            pass()
        },
    )
    .await;
}
