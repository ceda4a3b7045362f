//! Error-reporting checks: invalid repository names and tags, unknown upload sessions and
//! unsupported digest algorithms, each answered with the right status and a JSON error body.
//! (Every other check that expects a 4xx also checks the error body, through `expect::error`.)

use reqwest::header::CONTENT_TYPE;
use reqwest::Method;
use vial_core::media::OCI_MANIFEST;

use crate::check::{fail, pass, warn, Problem, Recorder, Slot, Verdict};
use crate::client::{add_query, Response};
use crate::expect;
use crate::fixtures::{push_image, random_bytes, Blob, Ctx, Image};

pub(crate) async fn run(ctx: &Ctx<'_>, rec: &mut Recorder) {
    let client = &ctx.client;
    let repo = ctx.repo("errors");
    let ns = ctx.config.namespace.trim_matches('/').to_owned();
    let prefix = if ns.is_empty() {
        String::new()
    } else {
        format!("{ns}/")
    };
    let setup: Slot<Image> = Slot::from_setup(
        "push an image so the repository exists",
        push_image(client, &repo, Some("base"), 200).await,
    );

    rec.run(
        "errors.name-invalid-uppercase",
        "a repository name with uppercase letters answers 400 NAME_INVALID with an error body (404 is a warning)",
        async {
            let resp = client.get(&format!("/v2/{prefix}UPPER/tags/list")).await?;
            invalid_name(&resp)
        },
    )
    .await;

    rec.run(
        "errors.name-invalid-dots",
        "a repository name with \"..\" answers 400 NAME_INVALID with an error body (404 is a warning)",
        async {
            let resp = client.get(&format!("/v2/{prefix}a..b/manifests/x")).await?;
            invalid_name(&resp)
        },
    )
    .await;

    for (id, description, tag) in [
        (
            "errors.tag-invalid",
            "PUT of a manifest to the tag \".bad\" answers 400 TAG_INVALID or MANIFEST_INVALID",
            ".bad".to_owned(),
        ),
        (
            "errors.tag-too-long",
            "PUT of a manifest to a 129-character tag answers 400 TAG_INVALID or MANIFEST_INVALID",
            "t".repeat(129),
        ),
    ] {
        rec.run(id, description, async {
            let image = setup.get()?;
            let resp = client
                .put_manifest(&repo, &tag, OCI_MANIFEST, image.manifest.bytes.clone(), &[])
                .await?;
            if resp.is_success() {
                return fail(format!(
                    "the registry accepted the tag {tag:?} ({})",
                    resp.status
                ));
            }
            expect::error(&resp, 400, &["TAG_INVALID", "MANIFEST_INVALID"])?;
            pass()
        })
        .await;
    }

    let unknown_session = format!("/v2/{repo}/blobs/uploads/{}", uuid::Uuid::new_v4());
    rec.run(
        "errors.upload-unknown-patch",
        "PATCH to an upload session that does not exist answers 404 BLOB_UPLOAD_UNKNOWN",
        async {
            setup.get()?;
            let url = client.url(&unknown_session)?;
            let resp = client
                .send(
                    client
                        .request(Method::PATCH, url)
                        .header(CONTENT_TYPE, "application/octet-stream")
                        .header("Content-Range", "0-9")
                        .body(random_bytes(10)),
                )
                .await?;
            expect::error(&resp, 404, &["BLOB_UPLOAD_UNKNOWN"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "errors.upload-unknown-put",
        "PUT ?digest= to an upload session that does not exist answers 404 BLOB_UPLOAD_UNKNOWN",
        async {
            setup.get()?;
            let blob = Blob::random(10);
            let mut url = client.url(&unknown_session)?;
            add_query(&mut url, &[("digest", blob.digest.as_str())]);
            let resp = client
                .send(
                    client
                        .request(Method::PUT, url)
                        .header(CONTENT_TYPE, "application/octet-stream")
                        .body(blob.bytes.clone()),
                )
                .await?;
            expect::error(&resp, 404, &["BLOB_UPLOAD_UNKNOWN"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "errors.upload-unknown-get",
        "GET of an upload session that does not exist answers 404 BLOB_UPLOAD_UNKNOWN",
        async {
            setup.get()?;
            let resp = client.get(&unknown_session).await?;
            expect::error(&resp, 404, &["BLOB_UPLOAD_UNKNOWN"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "errors.digest-unsupported-md5",
        "closing an upload with an md5: digest answers 400 DIGEST_INVALID or UNSUPPORTED",
        async {
            setup.get()?;
            let started = client.post_upload(&repo, &[]).await?;
            expect::status(&started, 202)?;
            let session = client.resolve(expect::location(&started)?)?;
            let body = random_bytes(32);
            let md5ish = format!("md5:{}", hex::encode(body.get(..16).unwrap_or_default()));
            let mut url = session.clone();
            add_query(&mut url, &[("digest", &md5ish)]);
            let resp = client
                .send(
                    client
                        .request(Method::PUT, url)
                        .header(CONTENT_TYPE, "application/octet-stream")
                        .body(body),
                )
                .await?;
            let _ = client.send(client.request(Method::DELETE, session)).await;
            if resp.is_success() {
                return fail(format!(
                    "the registry accepted the digest {md5ish} ({})",
                    resp.status
                ));
            }
            expect::error(&resp, 400, &["DIGEST_INVALID", "UNSUPPORTED"])?;
            pass()
        },
    )
    .await;
}

/// 400 NAME_INVALID passes; a 404 with an error body passes with a note; anything else fails.
fn invalid_name(resp: &Response) -> Verdict {
    match resp.status {
        400 => {
            expect::error_body(resp, &["NAME_INVALID"])?;
            pass()
        }
        404 => {
            let code = expect::error_body(resp, &[])?;
            warn(format!("answered 404 {code}; 400 NAME_INVALID is expected"))
        }
        _ => Err(Problem::Fail(format!(
            "expected 400 NAME_INVALID, got {}",
            resp.describe()
        ))),
    }
}
