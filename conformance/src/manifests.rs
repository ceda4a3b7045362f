//! Manifest checks: push by tag and by digest, the `tag` query parameter, GET and HEAD by either
//! reference, rejection of invalid or mismatched manifests, image indexes, a large manifest, and
//! manifests whose `subject` does not exist.

use std::collections::BTreeMap;

use reqwest::Method;
use vial_core::manifest::Descriptor;
use vial_core::media::{OCI_INDEX, OCI_MANIFEST};

use crate::check::{fail, pass, require, skip, Problem, Recorder, Slot};
use crate::client::{Client, Response};
use crate::expect;
use crate::fixtures::{
    descriptor, empty_config, ensure_empty_config, image_index, image_manifest, push,
    unique_annotations, unknown_digest, upload, Blob, Ctx, ImageParts, Manifest, LAYER_MEDIA_TYPE,
};

/// The size the large-manifest check reaches: 5 MiB, above the 4 MiB the specification asks
/// registries to accept, because vial promises more for model repositories with many files.
const LARGE: usize = 5 << 20;

pub(crate) async fn run(ctx: &Ctx<'_>, rec: &mut Recorder) {
    let client = &ctx.client;
    let repo = ctx.repo("manifest");
    let layer = Blob::random(4096);
    let prepared = async {
        ensure_empty_config(client, &repo).await?;
        upload(client, &repo, &layer).await?;
        Ok::<_, Problem>(())
    }
    .await;
    let setup = Slot::from_setup("upload config and layer blobs", prepared);
    let image = || {
        image_manifest(
            empty_config(),
            vec![layer.descriptor(LAYER_MEDIA_TYPE)],
            ImageParts {
                annotations: unique_annotations(),
                ..ImageParts::default()
            },
        )
    };

    let mut tagged: Slot<Manifest> = Slot::new("manifest.push-by-tag");
    rec.run(
        "manifest.push-by-tag",
        "PUT /v2/<name>/manifests/<tag> answers 201 with a pullable Location and Docker-Content-Digest = sha256 of the bytes",
        async {
            tagged.poison("manifest.push-by-tag");
            setup.get()?;
            let m = image()?;
            let resp = push(client, &repo, "v1", &m).await?;
            expect::digest_header(&resp, &m.digest)?;
            let location = client.resolve(expect::location(&resp)?)?;
            let got = client
                .send(client.request(Method::GET, location).header("Accept", OCI_MANIFEST))
                .await?;
            expect::status(&got, 200)?;
            expect::body(&got, &m.bytes)?;
            tagged.put(m);
            pass()
        },
    )
    .await;

    let mut by_digest: Slot<Manifest> = Slot::new("manifest.push-by-digest");
    rec.run(
        "manifest.push-by-digest",
        "PUT /v2/<name>/manifests/<digest> answers 201 with Location and the same Docker-Content-Digest",
        async {
            by_digest.poison("manifest.push-by-digest");
            setup.get()?;
            let m = image()?;
            let resp = push(client, &repo, m.digest.as_str(), &m).await?;
            expect::location(&resp)?;
            expect::digest_header(&resp, &m.digest)?;
            by_digest.put(m);
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.push-tag-params",
        "PUT /v2/<name>/manifests/<digest>?tag=a&tag=b answers 201; when OCI-Tag is returned, both tags resolve",
        async {
            setup.get()?;
            let m = image()?;
            let (a, b) = ("multi-a", "multi-b");
            let resp = client
                .put_manifest(&repo, m.digest.as_str(), OCI_MANIFEST, m.bytes.clone(), &[("tag", a), ("tag", b)])
                .await?;
            expect::status(&resp, 201)?;
            expect::digest_header(&resp, &m.digest)?;
            let echoed: Vec<String> = resp
                .header_all("OCI-Tag")
                .iter()
                .flat_map(|v| v.split(','))
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect();
            if echoed.is_empty() {
                return skip("no OCI-Tag header: the registry does not apply tag query parameters (optional)");
            }
            for tag in [a, b] {
                require!(echoed.iter().any(|t| t == tag), "OCI-Tag lists {echoed:?}, missing {tag:?}");
                let got = client.manifest(Method::GET, &repo, tag).await?;
                served(&got, &m)?;
            }
            pass()
        },
    )
    .await;

    for (id, description, by_tag) in [
        (
            "manifest.get-by-tag",
            "GET by tag answers 200 with the pushed bytes, Content-Type = mediaType and the right Docker-Content-Digest",
            true,
        ),
        (
            "manifest.get-by-digest",
            "GET by digest answers 200 with the pushed bytes, Content-Type = mediaType and the right Docker-Content-Digest",
            false,
        ),
    ] {
        rec.run(id, description, async {
            let m = tagged.get()?;
            let reference = if by_tag { "v1".to_owned() } else { m.digest.to_string() };
            let got = client.manifest(Method::GET, &repo, &reference).await?;
            served(&got, m)?;
            pass()
        })
        .await;
    }

    rec.run(
        "manifest.head",
        "HEAD by tag and by digest answers 200 with Content-Length, Content-Type and Docker-Content-Digest and no body",
        async {
            let m = tagged.get()?;
            for reference in ["v1".to_owned(), m.digest.to_string()] {
                let got = client.manifest(Method::HEAD, &repo, &reference).await?;
                expect::status(&got, 200)?;
                expect::no_body(&got)?;
                expect::content_length(&got, m.bytes.len())?;
                expect::content_type(&got, &m.media_type)?;
                expect::digest_header(&got, &m.digest)?;
            }
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.get-unknown-tag-404",
        "GET of a tag that does not exist answers 404 MANIFEST_UNKNOWN",
        async {
            setup.get()?;
            let got = client.manifest(Method::GET, &repo, "no-such-tag").await?;
            expect::error(&got, 404, &["MANIFEST_UNKNOWN"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.get-unknown-digest-404",
        "GET of a digest that names no manifest answers 404 MANIFEST_UNKNOWN",
        async {
            setup.get()?;
            let got = client
                .manifest(Method::GET, &repo, unknown_digest().as_str())
                .await?;
            expect::error(&got, 404, &["MANIFEST_UNKNOWN"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.head-unknown-404",
        "HEAD of a tag that does not exist answers 404 with no body",
        async {
            setup.get()?;
            let got = client.manifest(Method::HEAD, &repo, "no-such-tag").await?;
            expect::status(&got, 404)?;
            expect::no_body(&got)?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.invalid-reference-404",
        "GET and HEAD of a reference that is neither a tag nor a digest (.INVALID_MANIFEST_NAME) answer 404, GET with MANIFEST_UNKNOWN",
        async {
            setup.get()?;
            let got = client
                .manifest(Method::GET, &repo, ".INVALID_MANIFEST_NAME")
                .await?;
            expect::error(&got, 404, &["MANIFEST_UNKNOWN"])?;
            let head = client
                .manifest(Method::HEAD, &repo, ".INVALID_MANIFEST_NAME")
                .await?;
            expect::status(&head, 404)?;
            expect::no_body(&head)?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.layer-size-mismatch-400",
        "a manifest that declares a layer smaller than the blob is refused with 400 MANIFEST_INVALID",
        async {
            setup.get()?;
            let wrong = descriptor(LAYER_MEDIA_TYPE, layer.digest.clone(), 5);
            let m = image_manifest(empty_config(), vec![wrong], ImageParts::default())?;
            let resp = client
                .put_manifest(&repo, "undersized", OCI_MANIFEST, m.bytes.clone(), &[])
                .await?;
            if resp.is_success() {
                return fail(format!(
                    "the registry accepted a layer declared as 5 bytes for a blob of {} ({}); the spec leaves it open, vial must refuse",
                    layer.bytes.len(),
                    resp.status
                ));
            }
            expect::error(&resp, 400, &["MANIFEST_INVALID"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.index-sparse",
        "an image index whose child manifests are not in the repository (a partial multi-platform copy) answers 201 and reads back",
        async {
            setup.get()?;
            let mut child = descriptor(OCI_MANIFEST, unknown_digest(), 527);
            child.platform = Some(serde_json::json!({"architecture": "arm64", "os": "linux"}));
            let index = image_index(vec![child], unique_annotations())?;
            let resp = push(client, &repo, "sparse", &index).await?;
            expect::digest_header(&resp, &index.digest)?;
            let got = client.manifest(Method::GET, &repo, "sparse").await?;
            served(&got, &index)?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.blob-unknown-400",
        "a manifest whose layer is not in the repository is refused with 400 MANIFEST_BLOB_UNKNOWN",
        async {
            setup.get()?;
            let missing = descriptor(LAYER_MEDIA_TYPE, unknown_digest(), 1234);
            let m = image_manifest(empty_config(), vec![missing], ImageParts::default())?;
            let resp = client
                .put_manifest(&repo, "dangling", OCI_MANIFEST, m.bytes.clone(), &[])
                .await?;
            if resp.is_success() {
                return fail(format!(
                    "the registry accepted a manifest referencing a missing blob ({}); the spec allows this, vial must refuse",
                    resp.status
                ));
            }
            expect::error(&resp, 400, &["MANIFEST_BLOB_UNKNOWN"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.invalid-json-400",
        "a manifest body that is not valid JSON is refused with 400 MANIFEST_INVALID",
        async {
            setup.get()?;
            let body = br#"{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": {"#;
            let resp = client
                .put_manifest(&repo, "broken", OCI_MANIFEST, body.to_vec(), &[])
                .await?;
            expect::error(&resp, 400, &["MANIFEST_INVALID"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.digest-mismatch-400",
        "PUT by a digest that does not match the body is refused with 400 DIGEST_INVALID",
        async {
            setup.get()?;
            let m = image()?;
            let wrong = unknown_digest();
            let resp = client
                .put_manifest(&repo, wrong.as_str(), OCI_MANIFEST, m.bytes.clone(), &[])
                .await?;
            expect::error(&resp, 400, &["DIGEST_INVALID"])?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.index",
        "an image index referencing pushed manifests answers 201 and reads back with Content-Type image index",
        async {
            let first = tagged.get()?;
            let second = by_digest.get()?;
            let index = image_index(vec![first.descriptor(), second.descriptor()], unique_annotations())?;
            let resp = push(client, &repo, "index", &index).await?;
            expect::digest_header(&resp, &index.digest)?;
            let got = client.manifest(Method::GET, &repo, "index").await?;
            served(&got, &index)?;
            expect::content_type(&got, OCI_INDEX)?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.tag-moves",
        "pushing a different manifest to an existing tag moves the tag to it",
        async {
            let first = tagged.get()?;
            let second = by_digest.get()?;
            push(client, &repo, "moving", first).await?;
            push(client, &repo, "moving", second).await?;
            let got = client.manifest(Method::GET, &repo, "moving").await?;
            served(&got, second)?;
            let old = client
                .manifest(Method::GET, &repo, first.digest.as_str())
                .await?;
            expect::status(&old, 200)?;
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.large-5MiB",
        "a 5 MiB image manifest (thousands of layers) answers 201 and reads back intact (a vial expectation: the spec asks registries to accept at least 4 MiB)",
        async {
            setup.get()?;
            let m = large_manifest(&layer)?;
            let resp = client
                .put_manifest(&repo, "large", OCI_MANIFEST, m.bytes.clone(), &[])
                .await?;
            expect::status(&resp, 201)?;
            expect::digest_header(&resp, &m.digest)?;
            let got = client.manifest(Method::GET, &repo, "large").await?;
            served(&got, &m)?;
            pass()
        },
    )
    .await;

    subject(ctx, rec, &repo, &setup).await;
}

/// Requires a manifest GET to serve exactly `m` with its media type and digest.
fn served(got: &Response, m: &Manifest) -> Result<(), Problem> {
    expect::status(got, 200)?;
    expect::body(got, &m.bytes)?;
    expect::content_type(got, &m.media_type)?;
    expect::digest_header(got, &m.digest)?;
    Ok(())
}

/// An image manifest of at least [`LARGE`] bytes: one layer blob listed many times, each entry
/// titled like a file of a sharded model.
fn large_manifest(layer: &Blob) -> Result<Manifest, Problem> {
    let entry = |i: usize| {
        let mut d = layer.descriptor(LAYER_MEDIA_TYPE);
        let mut notes = BTreeMap::new();
        notes.insert(
            "org.opencontainers.image.title".to_owned(),
            format!("weights/model-{i:06}-of-999999.safetensors"),
        );
        d.annotations = Some(notes);
        d
    };
    let per_entry = serde_json::to_vec(&entry(0))
        .map(|v| v.len() + 1)
        .unwrap_or(200);
    let mut count = LARGE / per_entry + 16;
    for _ in 0..4 {
        let layers: Vec<Descriptor> = (0..count).map(entry).collect();
        let m = image_manifest(
            empty_config(),
            layers,
            ImageParts {
                annotations: unique_annotations(),
                ..ImageParts::default()
            },
        )?;
        if m.bytes.len() >= LARGE {
            return Ok(m);
        }
        count += count / 10 + 1;
    }
    fail("could not build a manifest of 5 MiB")
}

async fn subject(ctx: &Ctx<'_>, rec: &mut Recorder, repo: &str, setup: &Slot<()>) {
    let client: &Client = &ctx.client;
    let absent = descriptor(OCI_MANIFEST, unknown_digest(), 1234);
    let mut response: Slot<Response> = Slot::new("manifest.subject-missing-accepted");

    rec.run(
        "manifest.subject-missing-accepted",
        "a manifest whose subject does not exist in the repository is accepted (201)",
        async {
            response.poison("manifest.subject-missing-accepted");
            setup.get()?;
            let m = image_manifest(
                empty_config(),
                Vec::new(),
                ImageParts {
                    artifact_type: Some("application/vnd.vial.conformance.orphan.v1".to_owned()),
                    subject: Some(absent.clone()),
                    annotations: unique_annotations(),
                },
            )?;
            let resp = push(client, repo, m.digest.as_str(), &m).await?;
            expect::digest_header(&resp, &m.digest)?;
            response.put(resp);
            pass()
        },
    )
    .await;

    rec.run(
        "manifest.subject-header",
        "the 201 for a manifest with a subject carries OCI-Subject: <subject digest>",
        async {
            let resp = response.get()?;
            match resp.header("OCI-Subject") {
                Some(v) if v.trim() == absent.digest.as_str() => pass(),
                Some(v) => fail(format!("OCI-Subject is {v:?}, expected {}", absent.digest)),
                None => fail("no OCI-Subject header: the registry does not process subject (no referrers API support)"),
            }
        },
    )
    .await;
}
