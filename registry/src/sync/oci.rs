//! Syncing from another registry: a vial volume is mirrored with its digest unchanged; a file
//! artifact (ORAS, ModelPack, Docker model) is mirrored too, tagged, and sealed into a volume.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use vial_client::auth::Credentials;
use vial_client::copy::{walk, Graph};
use vial_client::{ClientError, Registry, RegistryOptions};
use vial_core::manifest::ImageManifest;
use vial_core::volume::{Blob, VolumeIndex};
use vial_core::{media, Digest, Reference, Target};

use super::attempt::{published, Run};
use super::spec::{SyncError, SyncSpec};
use crate::config::SyncSource;
use crate::seal::seal;
use crate::service::publish::{commit_manifest, Publish};
use crate::storage::{ByteStream, Presence, StorageError, VerifyFuture};

/// Blobs copied at once.
const PARALLEL_BLOBS: usize = 8;
/// How often progress is recorded while blobs are copied.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What the source's root manifest is.
enum Kind {
    Volume,
    Artifact,
}

pub(super) async fn sync(
    run: &Run,
    spec: &SyncSpec,
    reference: &Reference,
    entry: &SyncSource,
) -> Result<Digest, SyncError> {
    let password = entry
        .password
        .as_ref()
        .map(|p| {
            p.reveal()
                .map_err(|e| SyncError::Invalid(format!("the sync source's password: {e}")))
        })
        .transpose()?;
    let credentials = match (&entry.username, password) {
        (Some(username), Some(password)) => Some(Credentials {
            username: username.clone(),
            password,
        }),
        (None, None) => None,
        _ => {
            return Err(SyncError::Invalid(
                "the sync source names only one of username and password".into(),
            ))
        }
    };
    if spec.plain_http && credentials.is_some() && !entry.plain_http {
        return Err(SyncError::Invalid(format!(
            "{} has credentials configured: the registry sends them over plain HTTP only if its [[sync-sources]] entry says plain-http = true",
            spec.source
        )));
    }
    let src = Registry::new(
        reference.registry(),
        &RegistryOptions {
            plain_http: spec.plain_http || entry.plain_http,
            credentials,
            ..RegistryOptions::default()
        },
    )
    .map_err(client_error)?;
    let repo = reference.repo();

    // The first attempt pins the digest the tag named; later attempts copy that digest.
    let pinned = run.progress().pinned.clone();
    let target = match &pinned {
        Some(pinned) => Target::Digest(
            Digest::parse(pinned)
                .map_err(|e| SyncError::Invalid(format!("pinned digest {pinned:?}: {e}")))?,
        ),
        None => reference.target(),
    };
    let root = src
        .get_manifest(repo, &target)
        .await
        .map_err(client_error)?
        .ok_or_else(|| SyncError::Invalid(format!("{} does not exist", spec.source)))?;
    run.progress().pinned = Some(root.digest.to_string());
    let kind = classify(&root.media_type, &root.bytes).map_err(|why| {
        SyncError::Invalid(format!(
            "{} is neither a vial volume nor a file artifact vial can seal: {why}",
            spec.source
        ))
    })?;
    let Graph {
        levels,
        blobs,
        sizes,
    } = walk(&src, repo, root.clone()).await.map_err(client_error)?;

    // Blobs the registry holds already (here or in another repository) are linked, not copied.
    let mut present = Vec::new();
    for batch in blobs.chunks(4096) {
        present.extend(
            run.service
                .blob_rows()
                // Only what this repository holds: linking another repository's blob because a
                // source manifest names its digest would hand it to whoever may push here.
                .link_present_blobs(run.repo(), batch, Presence::Touch)
                .await?,
        );
    }
    let present: std::collections::HashSet<Digest> = present.into_iter().collect();
    let size = |d: &Digest| sizes.get(d).copied().unwrap_or(0);
    {
        let mut p = run.progress();
        p.files_total = blobs.len() as u64;
        p.bytes_total = blobs.iter().map(size).sum();
        p.files_done = present.len() as u64;
        p.bytes_done = present.iter().map(size).sum();
    }
    run.save_progress().await?;
    tracing::info!(
        job = %run.job.id,
        source = %spec.source,
        digest = %root.digest,
        blobs = blobs.len(),
        present = present.len(),
        "sync: mirroring from a registry"
    );

    let missing: Vec<Digest> = blobs
        .iter()
        .filter(|d| !present.contains(*d))
        .cloned()
        .collect();
    // Each copy records progress itself, at most once a second: nothing may wait on the database
    // outside the futures being polled (see `Run`).
    let saved = Mutex::new(Instant::now());
    let copies: Vec<_> = missing
        .into_iter()
        .map(|digest| {
            let (saved, src) = (&saved, &src);
            async move {
                let bytes = copy_blob(src, repo, &run.service, run.repo(), &digest).await?;
                {
                    let mut p = run.progress();
                    p.files_done += 1;
                    p.bytes_done += bytes;
                    p.bytes_read += bytes;
                }
                let due = {
                    let mut last = saved
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let due = last.elapsed() >= PROGRESS_EVERY;
                    if due {
                        *last = Instant::now();
                    }
                    due
                };
                if due {
                    run.save_progress().await?;
                }
                Ok::<_, SyncError>(())
            }
        })
        .collect();
    futures_util::stream::iter(copies)
        .buffer_unordered(PARALLEL_BLOBS)
        .try_collect::<Vec<()>>()
        .await?;
    run.save_progress().await?;

    // Manifests deepest first, the root last with the tag: nothing is visible until all is here.
    for level in levels.iter().skip(1).rev() {
        for m in level {
            commit_manifest(
                &run.service,
                run.repo(),
                &m.media_type,
                &Blob {
                    digest: m.digest.clone(),
                    bytes: m.bytes.to_vec(),
                },
                &Publish::default(),
            )
            .await?;
        }
    }
    // A cancel (or a takeover) that came in meanwhile stops the job before it publishes.
    run.save_progress().await?;
    published(
        commit_manifest(
            &run.service,
            run.repo(),
            &root.media_type,
            &Blob {
                digest: root.digest.clone(),
                bytes: root.bytes.to_vec(),
            },
            &run.publish,
        )
        .await,
        &root.digest,
    )?;
    match kind {
        Kind::Volume => Ok(root.digest),
        Kind::Artifact => Ok(seal(&run.service, run.repo(), &root.digest).await?),
    }
}

/// A vial volume, or an artifact that sealing will take; anything else is refused before a byte
/// is copied.
fn classify(media_type: &str, bytes: &[u8]) -> Result<Kind, String> {
    match media_type {
        media::OCI_INDEX => VolumeIndex::parse(bytes)
            .map(|_| Kind::Volume)
            .map_err(|e| e.to_string()),
        media::OCI_MANIFEST | media::DOCKER_MANIFEST => {
            let manifest: ImageManifest =
                serde_json::from_slice(bytes).map_err(|e| format!("invalid manifest: {e}"))?;
            vial_oras_compat::recognize(&manifest)
                .map(|_| Kind::Artifact)
                .map_err(|e| e.to_string())
        }
        other => Err(format!("its media type is {other:?}")),
    }
}

/// Streams one blob from the source into the blob store, verified against its digest, and links
/// it to `dest`. Returns its size.
async fn copy_blob(
    src: &Registry,
    repo: &vial_core::RepoName,
    service: &Arc<crate::service::Service>,
    dest: &vial_core::RepoName,
    digest: &Digest,
) -> Result<u64, SyncError> {
    let stream = src
        .get_blob_stream(repo, digest)
        .await
        .map_err(client_error)?;
    let hasher = Arc::new(Mutex::new(Some(digest.algorithm().hasher())));
    let feed = Arc::clone(&hasher);
    let body: ByteStream = Box::pin(stream.map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        if let Ok(mut h) = feed.lock() {
            if let Some(h) = h.as_mut() {
                h.update(&chunk);
            }
        }
        Ok(chunk)
    }));
    let expected = digest.clone();
    let verify: VerifyFuture = Box::pin(async move {
        let actual = hasher
            .lock()
            .ok()
            .and_then(|mut h| h.take())
            .map(|h| h.finish());
        actual.as_ref() == Some(&expected)
    });
    match service.put_streamed_blob(dest, digest, body, verify).await {
        Ok(Some(size)) => Ok(size),
        Ok(None) => Err(SyncError::source(
            format!("the source sent bytes that are not blob {digest}"),
            true,
        )),
        Err(StorageError::BodyFailed(e)) => Err(SyncError::source(
            format!("downloading blob {digest} failed midway: {e}"),
            true,
        )),
        Err(e) => Err(e.into()),
    }
}

fn client_error(e: ClientError) -> SyncError {
    SyncError::source(vial_core::error_chain(&e), e.is_transient())
}
