//! Content management checks: deleting manifests by digest, deleting tags, deleting blobs, and
//! deleting things that do not exist.

use reqwest::Method;

use crate::check::{fail, pass, skip, Problem, Recorder, Slot};
use crate::client::Response;
use crate::expect;
use crate::fixtures::{push_image, unknown_digest, upload, Blob, Ctx, Image};

pub(crate) async fn run(ctx: &Ctx<'_>, rec: &mut Recorder) {
    let client = &ctx.client;
    let repo = ctx.repo("manage");

    // ---- manifest by digest
    let doomed = Slot::from_setup(
        "push an image tagged \"doomed\"",
        push_image(client, &repo, Some("doomed"), 300).await,
    );
    let mut deleted = false;
    rec.run(
        "management.manifest.delete-by-digest",
        "DELETE /v2/<name>/manifests/<digest> answers 202 Accepted",
        async {
            let image = doomed.get()?;
            let resp = client
                .delete(&format!("/v2/{repo}/manifests/{}", image.manifest.digest))
                .await?;
            accepted(&resp, "manifest deletion")?;
            deleted = true;
            pass()
        },
    )
    .await;

    rec.run(
        "management.manifest.gone-after-delete",
        "after the delete, GET by that digest and by a tag that pointed at it answer 404",
        async {
            let image = doomed.get()?;
            if !deleted {
                return skip("not reached: the manifest was not deleted");
            }
            let by_digest = client
                .manifest(Method::GET, &repo, image.manifest.digest.as_str())
                .await?;
            expect::error(&by_digest, 404, &["MANIFEST_UNKNOWN"])?;
            let by_tag = client.manifest(Method::GET, &repo, "doomed").await?;
            expect::error(&by_tag, 404, &["MANIFEST_UNKNOWN"])?;
            pass()
        },
    )
    .await;

    // ---- tag
    let tagged: Slot<Image> = Slot::from_setup(
        "push an image tagged \"drop\"",
        push_image(client, &repo, Some("drop"), 300).await,
    );
    let mut untagged = false;
    rec.run(
        "management.tag.delete",
        "DELETE /v2/<name>/manifests/<tag> answers 202 Accepted",
        async {
            tagged.get()?;
            let resp = client.delete(&format!("/v2/{repo}/manifests/drop")).await?;
            accepted(&resp, "tag deletion")?;
            untagged = true;
            pass()
        },
    )
    .await;

    rec.run(
        "management.tag.gone",
        "after the tag is deleted, GET by the tag answers 404 MANIFEST_UNKNOWN",
        async {
            tagged.get()?;
            if !untagged {
                return skip("not reached: the tag was not deleted");
            }
            let resp = client.manifest(Method::GET, &repo, "drop").await?;
            expect::error(&resp, 404, &["MANIFEST_UNKNOWN"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "management.tag.digest-survives",
        "after the tag is deleted, the manifest is still served by digest",
        async {
            let image = tagged.get()?;
            if !untagged {
                return skip("not reached: the tag was not deleted");
            }
            let resp = client
                .manifest(Method::GET, &repo, image.manifest.digest.as_str())
                .await?;
            expect::status(&resp, 200)?;
            expect::body(&resp, &image.manifest.bytes)?;
            pass()
        },
    )
    .await;

    // ---- blob
    let blob = Blob::random(700);
    let stored = Slot::from_setup(
        "upload a blob",
        upload(client, &repo, &blob).await.map(|_| ()),
    );
    let mut blob_deleted = false;
    rec.run(
        "management.blob.delete",
        "DELETE /v2/<name>/blobs/<digest> answers 202 Accepted",
        async {
            stored.get()?;
            let resp = client
                .delete(&format!("/v2/{repo}/blobs/{}", blob.digest))
                .await?;
            accepted(&resp, "blob deletion")?;
            blob_deleted = true;
            pass()
        },
    )
    .await;

    rec.run(
        "management.blob.gone",
        "after the delete, GET of the blob answers 404 BLOB_UNKNOWN and HEAD answers 404",
        async {
            stored.get()?;
            if !blob_deleted {
                return skip("not reached: the blob was not deleted");
            }
            let resp = client
                .blob(Method::GET, &repo, blob.digest.as_str(), None)
                .await?;
            expect::error(&resp, 404, &["BLOB_UNKNOWN"])?;
            let head = client
                .blob(Method::HEAD, &repo, blob.digest.as_str(), None)
                .await?;
            expect::status(&head, 404)?;
            pass()
        },
    )
    .await;

    // ---- unknown content
    rec.run(
        "management.manifest.delete-unknown-404",
        "DELETE of a manifest digest the repository does not hold answers 404 MANIFEST_UNKNOWN",
        async {
            let resp = client
                .delete(&format!("/v2/{repo}/manifests/{}", unknown_digest()))
                .await?;
            not_found(&resp, "MANIFEST_UNKNOWN")
        },
    )
    .await;

    rec.run(
        "management.blob.delete-unknown-404",
        "DELETE of a blob the repository does not hold answers 404 BLOB_UNKNOWN",
        async {
            let resp = client
                .delete(&format!("/v2/{repo}/blobs/{}", unknown_digest()))
                .await?;
            not_found(&resp, "BLOB_UNKNOWN")
        },
    )
    .await;
}

/// Requires `202 Accepted`; `400` or `405` (deletion disabled, which the spec allows) skips.
fn accepted(resp: &Response, what: &str) -> Result<(), Problem> {
    match resp.status {
        202 => Ok(()),
        400 | 405 => skip(format!(
            "{what} is disabled on this registry ({}), which the spec allows",
            resp.describe()
        )),
        _ => fail(format!("expected 202, got {}", resp.describe())),
    }
}

/// Requires `404` with `code`; `405` (deletion disabled) skips.
fn not_found(resp: &Response, code: &str) -> Result<Option<String>, Problem> {
    if resp.status == 405 {
        return skip(format!(
            "deletion is disabled on this registry ({})",
            resp.describe()
        ));
    }
    expect::error(resp, 404, &[code])?;
    pass()
}
