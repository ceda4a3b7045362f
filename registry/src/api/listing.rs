//! Content discovery: tag lists, the catalog and the referrers API, with `n`/`last` pagination.

use axum::response::Response;
use serde::Serialize;
use vial_core::manifest::Descriptor;
use vial_core::{media, Digest, RepoName};

use crate::error::{ApiError, ErrorCode};
use crate::http::{json_listing, set_header, Request};
use crate::service::Service;

/// Largest page a listing returns, whatever `n` asks for; more come through the `Link` header.
const MAX_PAGE: u32 = 1000;

fn page_size(req: &Request) -> Result<u32, ApiError> {
    match req.query.get("n") {
        None => Ok(MAX_PAGE),
        Some(n) => n
            .parse::<u64>()
            .map(|n| n.min(u64::from(MAX_PAGE)) as u32)
            .map_err(|_| {
                ApiError::bad_request(ErrorCode::Unsupported, format!("invalid page size n={n:?}"))
            }),
    }
}

fn link(path: &str, n: u32, last: Option<&String>) -> Option<String> {
    last.map(|last| {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("n", &n.to_string())
            .append_pair("last", last)
            .finish();
        format!("<{path}?{query}>; rel=\"next\"")
    })
}

pub(super) async fn tags(
    state: &Service,
    repo: &RepoName,
    req: &Request,
) -> Result<Response, ApiError> {
    let n = page_size(req)?;
    let page = state
        .tags()
        .list_tags(repo, req.query.get("last"), n)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(
                ErrorCode::NameUnknown,
                format!("repository {repo} is not known"),
            )
        })?;
    #[derive(Serialize)]
    struct TagList<'a> {
        name: &'a str,
        tags: &'a [String],
    }
    let mut response = json_listing(
        &TagList {
            name: repo.as_str(),
            tags: &page.items,
        },
        "application/json",
    );
    if page.more {
        if let Some(l) = link(&format!("/v2/{repo}/tags/list"), n, page.items.last()) {
            set_header(&mut response, "link", &l);
        }
    }
    Ok(response)
}

pub(super) async fn catalog(state: &Service, req: &Request) -> Result<Response, ApiError> {
    let n = page_size(req)?;
    let page = state
        .manifests()
        .list_repositories(req.query.get("last"), n)
        .await?;
    #[derive(Serialize)]
    struct Catalog<'a> {
        repositories: &'a [String],
    }
    let mut response = json_listing(
        &Catalog {
            repositories: &page.items,
        },
        "application/json",
    );
    if page.more {
        if let Some(l) = link("/v2/_catalog", n, page.items.last()) {
            set_header(&mut response, "link", &l);
        }
    }
    Ok(response)
}

pub(super) async fn referrers(
    state: &Service,
    repo: &RepoName,
    subject: &Digest,
    req: &Request,
) -> Result<Response, ApiError> {
    let artifact_type = req.query.get("artifactType");
    let manifests = state
        .manifests()
        .referrers(repo, subject, artifact_type)
        .await?;
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Index<'a> {
        schema_version: u32,
        media_type: &'static str,
        manifests: &'a [Descriptor],
    }
    let index = Index {
        schema_version: 2,
        media_type: media::OCI_INDEX,
        manifests: &manifests,
    };
    let mut response = json_listing(&index, media::OCI_INDEX);
    if artifact_type.is_some() {
        set_header(&mut response, "oci-filters-applied", "artifactType");
    }
    Ok(response)
}
