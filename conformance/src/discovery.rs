//! Content discovery checks: tag listing (order, `n`, `last`, `Link` pagination), the referrers API
//! (descriptors, `artifactType` filtering, unknown and invalid digests), and `/v2/_catalog`.

use std::collections::BTreeMap;

use serde::Deserialize;
use vial_core::manifest::{Descriptor, ImageIndex};
use vial_core::media::OCI_INDEX;

use crate::check::{fail, pass, pass_with, require, skip, warn, Problem, Recorder, Slot};
use crate::client::{Client, Response};
use crate::expect;
use crate::fixtures::{
    empty_config, image_manifest, push, push_image, unique_annotations, unknown_digest, upload,
    Blob, Ctx, ImageParts, Manifest, EMPTY_JSON, LAYER_MEDIA_TYPE,
};
use crate::parse::{is_ascii_sorted, is_case_insensitive_sorted, link_next};

/// Tags pushed in this (unsorted) order.
const TAGS: [&str; 5] = ["b", "a", "c", "a1", "B"];

pub(crate) async fn run(ctx: &Ctx<'_>, rec: &mut Recorder) {
    let tags_repo = tags(ctx, rec).await;
    let refs_repo = referrers(ctx, rec).await;
    catalog(ctx, rec, &[tags_repo, refs_repo]).await;
}

#[derive(Debug, Deserialize)]
struct TagList {
    name: String,
    tags: Option<Vec<String>>,
}

/// Reads a tags/list (or any JSON) answer, requiring 200.
fn tag_list(resp: &Response) -> Result<TagList, Problem> {
    expect::status(resp, 200)?;
    serde_json::from_slice(&resp.body).or_else(|e| {
        fail(format!(
            "{} is not {{\"name\":…,\"tags\":[…]}}: {e}",
            resp.describe()
        ))
    })
}

async fn list(client: &Client, repo: &str, query: &[(&str, &str)]) -> Result<Response, Problem> {
    let url = client.url_with(&format!("/v2/{repo}/tags/list"), query)?;
    client.get_url(url).await
}

async fn tags(ctx: &Ctx<'_>, rec: &mut Recorder) -> String {
    let client = &ctx.client;
    let repo = ctx.repo("tags");
    let prepared = async {
        let first = TAGS.first().copied().unwrap_or("b");
        let image = push_image(client, &repo, Some(first), 256).await?;
        for tag in TAGS.iter().skip(1) {
            push(client, &repo, tag, &image.manifest).await?;
        }
        Ok::<_, Problem>(())
    }
    .await;
    let setup = Slot::from_setup("push one manifest under five tags", prepared);
    let mut expected: Vec<String> = TAGS.iter().map(|t| (*t).to_owned()).collect();
    expected.sort();
    // The order the registry uses; the ASCII order until the registry shows its own.
    let mut order = expected.clone();

    rec.run(
        "discovery.tags.list",
        "GET /v2/<name>/tags/list answers 200 with {\"name\":<name>,\"tags\":[every tag]}",
        async {
            setup.get()?;
            let got = tag_list(&list(client, &repo, &[]).await?)?;
            require!(
                got.name == repo,
                "name is {:?}, expected {repo:?}",
                got.name
            );
            let mut tags = got.tags.unwrap_or_default();
            tags.sort();
            require!(tags == expected, "tags are {tags:?}, expected {expected:?}");
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.tags.sorted",
        "tags come back in lexical order (ASCII or case-insensitive), not push order",
        async {
            setup.get()?;
            let tags = tag_list(&list(client, &repo, &[]).await?)?
                .tags
                .unwrap_or_default();
            if is_ascii_sorted(&tags) {
                return pass();
            }
            if is_case_insensitive_sorted(&tags) {
                order = tags.clone();
                return pass_with(format!("case-insensitive order {tags:?}"));
            }
            fail(format!("tags are not sorted: {tags:?}"))
        },
    )
    .await;

    let mut link: Option<String> = None;
    rec.run(
        "discovery.tags.n-limit",
        "?n=2 answers exactly the first 2 tags in order",
        async {
            setup.get()?;
            let resp = list(client, &repo, &[("n", "2")]).await?;
            let tags = tag_list(&resp)?.tags.unwrap_or_default();
            link = resp.header("Link").map(str::to_owned);
            let want = order.get(..2).unwrap_or_default();
            require!(tags == want, "?n=2 gave {tags:?}, expected {want:?}");
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.tags.link-next",
        "the ?n=2 answer carries Link: <…>; rel=\"next\" leading to the tags after the last one returned",
        async {
            setup.get()?;
            let Some(value) = link.as_deref() else {
                return skip("no Link header on the ?n=2 answer (the spec makes it optional)");
            };
            let Some(target) = link_next(value) else {
                return fail(format!("Link header {value:?} has no rel=\"next\" link"));
            };
            let url = client.resolve(&target)?;
            let tags = tag_list(&client.get_url(url).await?)?.tags.unwrap_or_default();
            let want = order.get(2..4).unwrap_or_default();
            require!(tags == want, "following Link {target:?} gave {tags:?}, expected {want:?}");
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.tags.last",
        "?n=2&last=<second tag> answers the next 2 tags after it",
        async {
            setup.get()?;
            let last = order.get(1).cloned().unwrap_or_default();
            let tags = tag_list(&list(client, &repo, &[("n", "2"), ("last", &last)]).await?)?
                .tags
                .unwrap_or_default();
            let want = order.get(2..4).unwrap_or_default();
            require!(
                tags == want,
                "?n=2&last={last} gave {tags:?}, expected {want:?}"
            );
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.tags.last-only",
        "?last=<tag> without n answers every tag after it",
        async {
            setup.get()?;
            let last = order.get(2).cloned().unwrap_or_default();
            let tags = tag_list(&list(client, &repo, &[("last", &last)]).await?)?
                .tags
                .unwrap_or_default();
            let want = order.get(3..).unwrap_or_default();
            require!(
                tags == want,
                "?last={last} gave {tags:?}, expected {want:?}"
            );
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.tags.n-zero",
        "?n=0 answers an empty tag list and no Link header",
        async {
            setup.get()?;
            let resp = list(client, &repo, &[("n", "0")]).await?;
            let got = tag_list(&resp)?;
            require!(
                got.tags.as_ref().is_some_and(Vec::is_empty),
                "?n=0 gave tags {:?}, expected []",
                got.tags
            );
            require!(
                resp.header("Link").is_none(),
                "?n=0 answer carries Link {:?}",
                resp.header("Link")
            );
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.tags.unknown-repo-404",
        "tags/list of a repository that does not exist answers 404 NAME_UNKNOWN",
        async {
            let missing = ctx.repo("never-pushed");
            let resp = list(client, &missing, &[]).await?;
            expect::error(&resp, 404, &["NAME_UNKNOWN"])?;
            pass()
        },
    )
    .await;
    repo
}

// ---- referrers --------------------------------------------------------------------------------

const SBOM_TYPE: &str = "application/vnd.vial.conformance.sbom.v1";
const SIGNATURE_CONFIG_TYPE: &str = "application/vnd.vial.conformance.signature.v1+json";

/// The subject and the three manifests that refer to it.
struct Referrers {
    subject: Manifest,
    /// Image manifest with an explicit `artifactType`.
    sbom: Manifest,
    /// Image manifest without `artifactType`: its config media type stands in.
    signature: Manifest,
    /// Image index with a subject and no `artifactType`.
    index: Manifest,
}

fn kind(name: &str) -> BTreeMap<String, String> {
    let mut notes = unique_annotations();
    notes.insert("org.vial.conformance.kind".to_owned(), name.to_owned());
    notes
}

async fn push_referrers(client: &Client, repo: &str) -> Result<Referrers, Problem> {
    let subject = push_image(client, repo, Some("subject"), 512)
        .await?
        .manifest;
    let payload = Blob::random(300);
    upload(client, repo, &payload).await?;
    let sbom = image_manifest(
        empty_config(),
        vec![payload.descriptor(LAYER_MEDIA_TYPE)],
        ImageParts {
            artifact_type: Some(SBOM_TYPE.to_owned()),
            subject: Some(subject.descriptor()),
            annotations: kind("sbom"),
        },
    )?;
    let signature = image_manifest(
        Blob::new(EMPTY_JSON.to_vec()).descriptor(SIGNATURE_CONFIG_TYPE),
        vec![empty_config()],
        ImageParts {
            artifact_type: None,
            subject: Some(subject.descriptor()),
            annotations: kind("signature"),
        },
    )?;
    let index = ImageIndex {
        schema_version: 2,
        media_type: Some(OCI_INDEX.to_owned()),
        artifact_type: None,
        manifests: vec![sbom.descriptor()],
        subject: Some(subject.descriptor()),
        annotations: Some(kind("bundle")),
    };
    let index = serde_json::to_vec(&index)
        .map(|b| Manifest::from_bytes(OCI_INDEX, b))
        .or_else(|e| fail(format!("cannot serialise an index: {e}")))?;
    for m in [&sbom, &signature, &index] {
        push(client, repo, m.digest.as_str(), m).await?;
    }
    Ok(Referrers {
        subject,
        sbom,
        signature,
        index,
    })
}

/// Reads a referrers answer: 200, image-index Content-Type, an image index body.
fn referrers_index(resp: &Response) -> Result<ImageIndex, Problem> {
    expect::status(resp, 200)?;
    expect::content_type(resp, OCI_INDEX)?;
    let index: ImageIndex = serde_json::from_slice(&resp.body)
        .or_else(|e| fail(format!("{} is not an image index: {e}", resp.describe())))?;
    require!(
        index.schema_version == 2,
        "schemaVersion is {}",
        index.schema_version
    );
    if let Some(mt) = &index.media_type {
        require!(mt == OCI_INDEX, "mediaType is {mt:?}, expected {OCI_INDEX}");
    }
    Ok(index)
}

async fn referrers_of(
    client: &Client,
    repo: &str,
    digest: &str,
    query: &[(&str, &str)],
) -> Result<Response, Problem> {
    let url = client.url_with(&format!("/v2/{repo}/referrers/{digest}"), query)?;
    client.get_url(url).await
}

fn find<'a>(list: &'a [Descriptor], m: &Manifest) -> Result<&'a Descriptor, Problem> {
    match list.iter().find(|d| d.digest == m.digest) {
        Some(d) => Ok(d),
        None => fail(format!("referrers list lacks {}", m.digest)),
    }
}

/// Requires a referrers descriptor to describe `m` as the spec says it must.
fn describes(d: &Descriptor, m: &Manifest, artifact_type: Option<&str>) -> Result<(), Problem> {
    require!(
        d.media_type == m.media_type,
        "{}: mediaType {:?}, expected {:?}",
        m.digest,
        d.media_type,
        m.media_type
    );
    require!(
        d.size == m.bytes.len() as u64,
        "{}: size {}, expected {}",
        m.digest,
        d.size,
        m.bytes.len()
    );
    require!(
        d.artifact_type.as_deref() == artifact_type,
        "{}: artifactType {:?}, expected {:?}",
        m.digest,
        d.artifact_type,
        artifact_type
    );
    let value: serde_json::Value = serde_json::from_slice(&m.bytes).unwrap_or_default();
    let want: Option<BTreeMap<String, String>> =
        serde_json::from_value(value["annotations"].clone()).unwrap_or_default();
    require!(
        d.annotations == want,
        "{}: annotations {:?}, expected {:?}",
        m.digest,
        d.annotations,
        want
    );
    Ok(())
}

async fn referrers(ctx: &Ctx<'_>, rec: &mut Recorder) -> String {
    let client = &ctx.client;
    let repo = ctx.repo("referrers");
    let setup = Slot::from_setup(
        "push a subject and three referrers",
        push_referrers(client, &repo).await,
    );

    rec.run(
        "discovery.referrers.list",
        "GET /v2/<name>/referrers/<digest> answers 200, Content-Type image index, listing every referrer",
        async {
            let r = setup.get()?;
            let resp = referrers_of(client, &repo, r.subject.digest.as_str(), &[]).await?;
            let index = referrers_index(&resp)?;
            for m in [&r.sbom, &r.signature, &r.index] {
                find(&index.manifests, m)?;
            }
            require!(index.manifests.len() == 3, "expected 3 referrers, got {}", index.manifests.len());
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.referrers.descriptors",
        "each referrer's descriptor has mediaType, size, artifactType (or config mediaType) and the manifest's annotations",
        async {
            let r = setup.get()?;
            let resp = referrers_of(client, &repo, r.subject.digest.as_str(), &[]).await?;
            let index = referrers_index(&resp)?;
            describes(find(&index.manifests, &r.sbom)?, &r.sbom, Some(SBOM_TYPE))?;
            describes(find(&index.manifests, &r.signature)?, &r.signature, Some(SIGNATURE_CONFIG_TYPE))?;
            describes(find(&index.manifests, &r.index)?, &r.index, None)?;
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.referrers.filter",
        "?artifactType=X answers only referrers of type X and OCI-Filters-Applied: artifactType",
        async {
            let r = setup.get()?;
            let resp =
                referrers_of(client, &repo, r.subject.digest.as_str(), &[("artifactType", SBOM_TYPE)]).await?;
            let index = referrers_index(&resp)?;
            find(&index.manifests, &r.sbom)?;
            let applied = resp
                .header_all("OCI-Filters-Applied")
                .iter()
                .flat_map(|v| v.split(','))
                .any(|f| f.trim() == "artifactType");
            if !applied {
                return skip("no OCI-Filters-Applied: artifactType; the registry did not filter (filtering is a SHOULD)");
            }
            let others: Vec<String> = index
                .manifests
                .iter()
                .filter(|d| d.artifact_type.as_deref() != Some(SBOM_TYPE))
                .map(|d| d.digest.to_string())
                .collect();
            require!(others.is_empty(), "filtered list still holds {others:?}");
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.referrers.unknown-digest",
        "referrers of a digest nothing refers to answers 200 with an empty image index",
        async {
            setup.get()?;
            let resp = referrers_of(client, &repo, unknown_digest().as_str(), &[]).await?;
            let index = referrers_index(&resp)?;
            require!(
                index.manifests.is_empty(),
                "expected no referrers, got {}",
                index.manifests.len()
            );
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.referrers.invalid-digest-400",
        "referrers of a malformed digest (sha256:xyz) answers 400 with an error body",
        async {
            setup.get()?;
            let resp = referrers_of(client, &repo, "sha256:xyz", &[]).await?;
            expect::status(&resp, 400)?;
            let code = expect::error_body(&resp, &[])?;
            if code == "DIGEST_INVALID" {
                pass()
            } else {
                warn(format!(
                    "400 with error code {code}; DIGEST_INVALID is expected"
                ))
            }
        },
    )
    .await;
    repo
}

// ---- catalog ----------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct Catalog {
    repositories: Option<Vec<String>>,
}

fn catalog_page(resp: &Response) -> Result<(Vec<String>, Option<String>), Problem> {
    expect::status(resp, 200)?;
    let page: Catalog = serde_json::from_slice(&resp.body).or_else(|e| {
        fail(format!(
            "{} is not {{\"repositories\":[…]}}: {e}",
            resp.describe()
        ))
    })?;
    let next = resp.header("Link").and_then(link_next);
    Ok((page.repositories.unwrap_or_default(), next))
}

async fn catalog(ctx: &Ctx<'_>, rec: &mut Recorder, repos: &[String]) {
    let client = &ctx.client;
    rec.run(
        "discovery.catalog",
        "GET /v2/_catalog lists the repositories this run pushed (a Docker registry API, not in the OCI spec)",
        async {
            let mut seen = Vec::new();
            let mut url = client.url_with("/v2/_catalog", &[("n", "1000")])?;
            for _ in 0..100 {
                let (page, next) = catalog_page(&client.get_url(url.clone()).await?)?;
                seen.extend(page);
                match next {
                    Some(target) => url = client.resolve(&target)?,
                    None => break,
                }
            }
            let missing: Vec<&String> = repos.iter().filter(|r| !seen.contains(r)).collect();
            require!(missing.is_empty(), "catalog lacks {missing:?}");
            pass()
        },
    )
    .await;

    rec.run(
        "discovery.catalog.paginate",
        "GET /v2/_catalog?n=1 answers one repository and a Link rel=\"next\" to the following one",
        async {
            let url = client.url_with("/v2/_catalog", &[("n", "1")])?;
            let (first, next) = catalog_page(&client.get_url(url).await?)?;
            require!(first.len() == 1, "?n=1 gave {} repositories", first.len());
            let Some(target) = next else {
                return fail(
                    "no Link rel=\"next\" on ?n=1 although the registry holds several repositories",
                );
            };
            let (second, _) = catalog_page(&client.get_url(client.resolve(&target)?).await?)?;
            require!(
                second.len() == 1,
                "the next page gave {} repositories",
                second.len()
            );
            require!(
                second.first() > first.first(),
                "the next page gave {second:?} after {first:?}"
            );
            pass()
        },
    )
    .await;
}
