//! The ORAS Python SDK pushes and pulls files and directories through vial, and vial seals what it
//! pushed into volumes that mount, pull and dedup like volumes `vial push` wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::model::{bert_like, write_safetensors};
use crate::support::mount::{fuse_available, Mount};
use crate::support::vial::{assert_same_tree, push_json, vial, vial_ok};
use crate::support::{oci::pseudo_random, oras_python, run, Server};

const SCRIPT: &str = r#"
import sys, oras.client
mode, host, target, workdir, outdir = sys.argv[1:6]
client = oras.client.OrasClient(hostname=host, insecure=True)
import os
os.chdir(workdir)
if mode == "files":
    files = sorted(f for f in os.listdir(".") if os.path.isfile(f))
    client.push(target=target, files=files)
else:
    client.push(target=target, files=["model"])
print(client.get_tags(target.rsplit(":", 1)[0]))
client.pull(target=target, outdir=outdir)
"#;

fn write_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("model/nested")).unwrap();
    std::fs::write(dir.join("config.json"), br#"{"hidden_size": 64}"#).unwrap();
    std::fs::write(dir.join("model.safetensors"), pseudo_random(3 << 20, 11)).unwrap();
    std::fs::write(dir.join("empty.txt"), b"").unwrap();
    std::fs::write(dir.join("model/weights.bin"), pseudo_random(1 << 20, 12)).unwrap();
    std::fs::write(dir.join("model/nested/tokenizer.json"), b"{\"vocab\": {}}").unwrap();
}

#[test]
fn oras_sdk_pushes_and_pulls_files_one_layer_each() {
    let Some(python) = oras_python() else { return };
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    write_tree(work.path());
    let out = work.path().join("out");
    run(Command::new(&python)
        .args(["-c", SCRIPT, "files", &server.addr])
        .arg(format!("{}/oras/files:v1", server.addr))
        .arg(work.path())
        .arg(&out));
    for name in ["config.json", "model.safetensors", "empty.txt"] {
        assert_eq!(
            std::fs::read(out.join(name)).unwrap(),
            std::fs::read(work.path().join(name)).unwrap(),
            "{name} differs after an ORAS round trip"
        );
    }
    // One layer per file, in the order pushed, each naming its file and holding its bytes.
    let manifest = manifest(&server, "oras/files", "v1");
    let layers = manifest["layers"].as_array().unwrap();
    let names = ["config.json", "empty.txt", "model.safetensors"];
    assert_eq!(layers.len(), names.len(), "{manifest}");
    for (layer, name) in layers.iter().zip(names) {
        let bytes = std::fs::read(work.path().join(name)).unwrap();
        assert_eq!(
            layer["mediaType"], "application/vnd.oci.image.layer.v1.tar",
            "{layer}"
        );
        assert_eq!(
            layer["annotations"]["org.opencontainers.image.title"], name,
            "{layer}"
        );
        assert_eq!(
            layer["digest"],
            vial_core::Algorithm::Sha256.digest_bytes(&bytes).as_str(),
            "{layer}"
        );
        assert_eq!(layer["size"], bytes.len(), "{layer}");
    }
}

/// The image manifest `reference` names in `repo`.
fn manifest(server: &Server, repo: &str, reference: &str) -> serde_json::Value {
    let r = reqwest::blocking::Client::new()
        .get(format!("{}/v2/{repo}/manifests/{reference}", server.url()))
        .header("accept", vial_core::media::OCI_MANIFEST)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "{repo}:{reference}");
    r.json().unwrap()
}

#[test]
fn oras_sdk_pushes_and_pulls_a_directory_as_one_archive() {
    let Some(python) = oras_python() else { return };
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    write_tree(work.path());
    let out = work.path().join("out");
    run(Command::new(&python)
        .args(["-c", SCRIPT, "dir", &server.addr])
        .arg(format!("{}/oras/dir:v1", server.addr))
        .arg(work.path())
        .arg(&out));
    for name in ["model/weights.bin", "model/nested/tokenizer.json"] {
        assert_eq!(
            std::fs::read(out.join(name)).unwrap(),
            std::fs::read(work.path().join(name)).unwrap(),
            "{name} differs after an ORAS directory round trip"
        );
    }
    // The directory went up as one gzipped tar layer, named for it.
    let manifest = manifest(&server, "oras/dir", "v1");
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(
        layers[0]["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip",
        "{manifest}"
    );
    assert_eq!(
        layers[0]["annotations"]["org.opencontainers.image.title"], "model",
        "{manifest}"
    );
}

/// Pushes with the ORAS Python SDK, the way its users do. Modes: `files` (every top-level file,
/// one layer each), `dir` (the `model` directory, which the SDK tars and gzips), `tar` (`model` as
/// a plain tar marked for unpacking, as the oras CLI marks directories), `evil` (a tar+gzip whose
/// entry climbs out with `..`).
const PUSH: &str = r#"
import io, json, os, sys, tarfile, oras.client
mode, host, target, workdir = sys.argv[1:5]
client = oras.client.OrasClient(hostname=host, insecure=True)
os.chdir(workdir)
if mode == "files":
    client.push(target=target, files=sorted(f for f in os.listdir(".") if os.path.isfile(f)))
elif mode == "dir":
    client.push(target=target, files=["model"])
elif mode == "tar":
    with tarfile.open("/tmp/vial-oras-%d.tar" % os.getpid(), "w") as t:
        t.add("model")
    os.rename("/tmp/vial-oras-%d.tar" % os.getpid(), "model.tar")
    with open("../annotations.json", "w") as f:
        json.dump({"model.tar": {"io.deis.oras.content.unpack": "true"}}, f)
    client.push(target=target, files=["model.tar:application/vnd.oci.image.layer.v1.tar"],
                annotation_file="../annotations.json")
elif mode == "evil":
    with tarfile.open("evil.tar.gz", "w:gz") as t:
        info = tarfile.TarInfo("../escaped")
        info.size = 4
        t.addfile(info, io.BytesIO(b"evil"))
    client.push(target=target, files=["evil.tar.gz:application/vnd.oci.image.layer.v1.tar+gzip"])
"#;

fn oras_push(python: &Path, server: &Server, mode: &str, reference: &str, workdir: &Path) {
    run(Command::new(python)
        .args(["-c", PUSH, mode, &server.addr])
        .arg(format!("{}/{reference}", server.addr))
        .arg(workdir));
}

/// The registry's seal counters: layers read, layers reused, bytes read.
fn seal_metrics(server: &Server) -> (u64, u64, u64) {
    let text = reqwest::blocking::get(format!("{}/metrics", server.url()))
        .unwrap()
        .text()
        .unwrap();
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} missing from /metrics"))
    };
    (
        value("vial_seal_layers_total{layer=\"read\"}"),
        value("vial_seal_layers_total{layer=\"reused\"}"),
        value("vial_seal_bytes_read_total"),
    )
}

/// `vial seal --json`, parsed.
fn seal(home: &Path, reference: &str) -> serde_json::Value {
    serde_json::from_str(&vial_ok(home, &["seal", reference, "--json"])).expect("seal --json")
}

/// The digest a tag points at, and the referrers of that manifest with the given artifact type.
fn referrers(server: &Server, repo: &str, tag: &str, artifact_type: &str) -> Vec<String> {
    let http = reqwest::blocking::Client::new();
    let head = http
        .head(format!("{}/v2/{repo}/manifests/{tag}", server.url()))
        .header("accept", vial_core::media::OCI_MANIFEST)
        .send()
        .unwrap();
    let digest = head.headers()["docker-content-digest"]
        .to_str()
        .unwrap()
        .to_owned();
    let index: serde_json::Value = http
        .get(format!(
            "{}/v2/{repo}/referrers/{digest}?artifactType={artifact_type}",
            server.url()
        ))
        .send()
        .unwrap()
        .json()
        .unwrap();
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["artifactType"] == artifact_type)
        .map(|m| m["digest"].as_str().unwrap().to_owned())
        .collect()
}

/// The digests of a sealed volume's chunks, in order: the layers of its chunk manifests.
fn chunk_digests(server: &Server, repo: &str, volume: &str) -> Vec<String> {
    let http = reqwest::blocking::Client::new();
    let get = |digest: &str| -> serde_json::Value {
        http.get(format!("{}/v2/{repo}/manifests/{digest}", server.url()))
            .header(
                "accept",
                "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json",
            )
            .send()
            .unwrap()
            .json()
            .unwrap()
    };
    let index = get(volume);
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["artifactType"] == "application/vnd.vial.chunks.v1")
        .flat_map(|m| {
            get(m["digest"].as_str().unwrap())["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["digest"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Reads a sealed artifact back both ways: `vial pull` always, `vial mount` where FUSE exists.
fn read_back(home: &Path, reference: &str, name: &str) -> Vec<PathBuf> {
    let pulled = home.join(format!("pulled-{name}"));
    vial_ok(home, &["pull", reference, pulled.to_str().unwrap()]);
    let mut views = vec![pulled];
    if fuse_available() {
        let mount = Mount::new(home, reference, &format!("mnt-{name}"), &[]);
        let copy = home.join(format!("mounted-{name}"));
        run(Command::new("cp").arg("-a").arg(&mount.path).arg(&copy));
        std::fs::remove_file(copy.join(".vial-stats")).ok();
        views.push(copy);
    } else {
        eprintln!("SKIP mount half: no FUSE here");
    }
    views
}

#[test]
fn oras_files_directories_and_tarballs_are_sealed_and_read_back_byte_for_byte() {
    let Some(python) = oras_python() else { return };
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let work = home.path().join("work");
    write_tree(&work);
    write_safetensors(&work.join("model.safetensors"), &bert_like(2, 5));

    oras_push(&python, &server, "files", "oras/files:v1", &work);
    oras_push(&python, &server, "dir", "oras/dir:v1", &work);
    oras_push(&python, &server, "tar", "oras/tar:v1", &work);

    let files = seal(home.path(), &format!("{}/oras/files:v1", server.addr));
    assert_eq!(files["files"], 3, "{files}");
    let dir = seal(home.path(), &format!("{}/oras/dir:v1", server.addr));
    assert_eq!(dir["files"], 2, "the directory's two files: {dir}");
    let tar = seal(home.path(), &format!("{}/oras/tar:v1", server.addr));
    assert_eq!(tar["files"], 2, "{tar}");
    // Without --json, stdout is the volume's pinned reference alone; stderr names the artifact.
    let out = vial(
        home.path(),
        &["seal", &format!("{}/oras/tar:v1", server.addr)],
    );
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        tar["reference"].as_str().unwrap()
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("artifact {}/oras/tar@", server.addr))
            && said.contains("the volume's pinned reference"),
        "{said}"
    );
    // The same directory packed two ways seals to the same tree, so the same chunks.
    let dir_chunks = chunk_digests(&server, "oras/dir", dir["volume"].as_str().unwrap());
    let tar_chunks = chunk_digests(&server, "oras/tar", tar["volume"].as_str().unwrap());
    assert!(!dir_chunks.is_empty());
    assert_eq!(dir_chunks, tar_chunks);
    assert_eq!(dir["chunks"], dir_chunks.len(), "{dir}");

    // The original artifacts lead to their volumes through the referrers API.
    for (repo, sealed) in [
        ("oras/files", &files),
        ("oras/dir", &dir),
        ("oras/tar", &tar),
    ] {
        assert_eq!(
            referrers(&server, repo, "v1", vial_core::volume::VOLUME_ARTIFACT_TYPE),
            vec![sealed["volume"].as_str().unwrap().to_owned()],
            "{repo}"
        );
    }

    // A chunk cut from an ORAS file layer is served as a range of that layer, Range requests too:
    // the first chunk of the files volume is all of config.json (the first path in the tree).
    let http = reqwest::blocking::Client::new();
    let get = |path: String| {
        http.get(format!("{}/v2/oras/files/{path}", server.url()))
            .header("accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json")
            .send()
            .unwrap()
    };
    let index: serde_json::Value = get(format!("manifests/{}", files["volume"].as_str().unwrap()))
        .json()
        .unwrap();
    let part = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["artifactType"] == "application/vnd.vial.chunks.v1")
        .unwrap();
    let part: serde_json::Value = get(format!("manifests/{}", part["digest"].as_str().unwrap()))
        .json()
        .unwrap();
    let chunk = part["layers"][0]["digest"].as_str().unwrap().to_owned();
    let config = std::fs::read(work.join("config.json")).unwrap();
    assert_eq!(
        get(format!("blobs/{chunk}")).bytes().unwrap().as_ref(),
        &config[..]
    );
    let ranged = http
        .get(format!("{}/v2/oras/files/blobs/{chunk}", server.url()))
        .header("range", "bytes=3-8")
        .send()
        .unwrap();
    assert_eq!(ranged.status(), 206);
    assert_eq!(ranged.bytes().unwrap().as_ref(), &config[3..9]);

    // Reading through the original reference gives the pushed bytes.
    let expected_files = home.path().join("expected-files");
    std::fs::create_dir_all(&expected_files).unwrap();
    for f in ["config.json", "empty.txt", "model.safetensors"] {
        std::fs::copy(work.join(f), expected_files.join(f)).unwrap();
    }
    for view in read_back(
        home.path(),
        &format!("{}/oras/files:v1", server.addr),
        "files",
    ) {
        assert_same_tree(&view, &expected_files);
    }
    for name in ["dir", "tar"] {
        for view in read_back(
            home.path(),
            &format!("{}/oras/{name}:v1", server.addr),
            name,
        ) {
            assert_same_tree(&view.join("model"), &work.join("model"));
        }
    }
}

#[test]
fn a_checkpoint_pushed_with_oras_dedups_against_its_last_seal_and_against_vial_push() {
    let Some(python) = oras_python() else { return };
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let work = home.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mut tensors = bert_like(4, 1);
    write_safetensors(&work.join("model.safetensors"), &tensors);
    std::fs::write(work.join("config.json"), br#"{"layers": 4}"#).unwrap();
    oras_push(&python, &server, "files", "oras/ckpt:step-1", &work);
    let v1 = seal(home.path(), &format!("{}/oras/ckpt:step-1", server.addr));

    // Fine-tuning rewrites one projection and leaves the rest of the file byte-identical.
    let changed = tensors
        .iter()
        .position(|t| t.0.contains("attention"))
        .unwrap();
    tensors[changed].2 += 1000;
    let changed_bytes = (tensors[changed].1 * 2) as u64;
    write_safetensors(&work.join("model.safetensors"), &tensors);
    let before = seal_metrics(&server);
    oras_push(&python, &server, "files", "oras/ckpt:step-2", &work);
    let v2 = seal(home.path(), &format!("{}/oras/ckpt:step-2", server.addr));
    assert_ne!(v1["volume"], v2["volume"]);
    // Only the changed file's layer was read again; config.json's blob was sealed before.
    let after = seal_metrics(&server);
    let size = std::fs::metadata(work.join("model.safetensors"))
        .unwrap()
        .len();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        (1, 1, size),
        "layers read, layers reused, bytes read by the second seal"
    );

    let diff: serde_json::Value = serde_json::from_str(&vial_ok(
        home.path(),
        &[
            "diff",
            v1["reference"].as_str().unwrap(),
            v2["reference"].as_str().unwrap(),
            "--json",
        ],
    ))
    .unwrap();
    let fetch = diff["diff"]["bytes_to_fetch"].as_u64().unwrap();
    let total = v2["bytes"].as_u64().unwrap();
    assert!(
        fetch <= changed_bytes + (2 << 20) && fetch < total / 2,
        "a node holding step-1 should fetch about the changed tensor ({changed_bytes} B), not {fetch} of {total} B"
    );

    // `vial push` of the same checkpoint finds every chunk already in the registry.
    let report = push_json(
        home.path(),
        &work,
        &format!("{}/weights/ckpt", server.addr),
        &[],
    );
    assert_eq!(report["chunks_uploaded"], 0, "{report}");
    assert_eq!(report["bytes_uploaded"], 0, "{report}");
}

#[test]
fn a_seal_queued_where_jobs_do_not_run_survives_a_restart_and_runs_after_it() {
    let Some(python) = oras_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let home = dir.path().join("home");
    let work = dir.path().join("work");
    write_tree(&work);

    let server = Server::start_on(&data, &["--run-jobs", "false"]);
    oras_push(&python, &server, "files", "oras/later:v1", &work);
    let digest = reqwest::blocking::Client::new()
        .head(format!("{}/v2/oras/later/manifests/v1", server.url()))
        .header("accept", vial_core::media::OCI_MANIFEST)
        .send()
        .unwrap()
        .headers()["docker-content-digest"]
        .to_str()
        .unwrap()
        .to_owned();
    let status: serde_json::Value = reqwest::blocking::get(format!(
        "{}/v2/oras/later/_vial/seal/{digest}",
        server.url()
    ))
    .unwrap()
    .json()
    .unwrap();
    assert_eq!(
        status["state"], "queued",
        "the push queued a seal: {status}"
    );
    assert!(server.stop().success());

    let server = Server::start_on(&data, &[]);
    let sealed = seal(&home, &format!("{}/oras/later:v1", server.addr));
    assert_eq!(sealed["artifact"], digest.as_str());
    let pulled = home.join("pulled");
    vial_ok(
        &home,
        &[
            "pull",
            &format!("{}/oras/later:v1", server.addr),
            pulled.to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read(pulled.join("model.safetensors")).unwrap(),
        std::fs::read(work.join("model.safetensors")).unwrap()
    );
}

#[test]
fn an_archive_that_climbs_out_of_the_volume_is_refused_with_a_clear_error() {
    let Some(python) = oras_python() else { return };
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let work = home.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    oras_push(&python, &server, "evil", "oras/evil:v1", &work);
    let reference = format!("{}/oras/evil:v1", server.addr);
    for args in [
        vec!["seal", reference.as_str()],
        vec![
            "pull",
            reference.as_str(),
            home.path().join("out").to_str().unwrap(),
        ],
    ] {
        let out = vial(home.path(), &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            stderr.contains("could not seal") && stderr.contains("leaves the volume"),
            "{args:?} should say why: {stderr}"
        );
    }
    assert!(!home.path().join("escaped").exists());
    assert!(!home.path().join("out").join("escaped").exists());
}

/// Pushes `layers` (media type, annotations, bytes) and a manifest over them with `config_type`.
fn push_artifact(
    server: &Server,
    repo: &str,
    tag: &str,
    config_type: &str,
    layers: &[(&str, serde_json::Value, Vec<u8>)],
) {
    let http = reqwest::blocking::Client::new();
    let base = server.url();
    let config = crate::support::push_blob(&http, &base, repo, b"{}");
    let descriptors: Vec<_> = layers
        .iter()
        .map(|(media_type, annotations, bytes)| {
            let digest = crate::support::push_blob(&http, &base, repo, bytes);
            serde_json::json!({"mediaType": media_type, "digest": digest, "size": bytes.len(), "annotations": annotations})
        })
        .collect();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": vial_core::media::OCI_MANIFEST,
        "config": {"mediaType": config_type, "digest": config, "size": 2},
        "layers": descriptors,
    });
    let r = http
        .put(format!("{base}/v2/{repo}/manifests/{tag}"))
        .header("content-type", vial_core::media::OCI_MANIFEST)
        .body(serde_json::to_vec(&manifest).unwrap())
        .send()
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().unwrap_or_default());
}

#[test]
fn modelpack_and_docker_model_artifacts_read_back_as_their_files() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let weights = pseudo_random(6 << 20, 41);
    let tokenizer = br#"{"vocab": {"a": 1}}"#.to_vec();
    // A ModelPack directory layer: a tar holding the tokenizer under its own path.
    let tar = tar_with(&[("tokenizer/tokenizer.json", &tokenizer)]);
    push_artifact(
        &server,
        "modelpack/m",
        "v1",
        "application/vnd.cncf.model.config.v1+json",
        &[
            (
                "application/vnd.cncf.model.weight.v1.raw",
                serde_json::json!({"org.cncf.model.filepath": "weights/model.safetensors"}),
                weights.clone(),
            ),
            (
                "application/vnd.cncf.model.weight.config.v1.tar",
                serde_json::json!({"org.cncf.model.filepath": "tokenizer"}),
                tar,
            ),
        ],
    );
    let gguf = pseudo_random(3 << 20, 42);
    push_artifact(
        &server,
        "docker/m",
        "v1",
        "application/vnd.docker.ai.model.config.v0.1+json",
        &[
            (
                "application/vnd.docker.ai.gguf.v3",
                serde_json::json!({}),
                gguf.clone(),
            ),
            (
                "application/vnd.docker.ai.license",
                serde_json::json!({}),
                b"MIT".to_vec(),
            ),
        ],
    );

    let views = read_back(
        home.path(),
        &format!("{}/modelpack/m:v1", server.addr),
        "modelpack",
    );
    for view in &views {
        assert_eq!(
            std::fs::read(view.join("weights/model.safetensors")).unwrap(),
            weights
        );
        assert_eq!(
            std::fs::read(view.join("tokenizer/tokenizer.json")).unwrap(),
            tokenizer
        );
    }

    // The next version shares both layers and adds a file: only the new layer is read, and what
    // was read from the shared ones before (the archive's entries too) makes the same files.
    let before = seal_metrics(&server);
    push_artifact(
        &server,
        "modelpack/m",
        "v2",
        "application/vnd.cncf.model.config.v1+json",
        &[
            (
                "application/vnd.cncf.model.weight.v1.raw",
                serde_json::json!({"org.cncf.model.filepath": "weights/model.safetensors"}),
                weights.clone(),
            ),
            (
                "application/vnd.cncf.model.weight.config.v1.tar",
                serde_json::json!({"org.cncf.model.filepath": "tokenizer"}),
                tar_with(&[("tokenizer/tokenizer.json", &tokenizer)]),
            ),
            (
                "application/vnd.cncf.model.doc.v1.raw",
                serde_json::json!({"org.cncf.model.filepath": "README.md"}),
                b"# m\n".to_vec(),
            ),
        ],
    );
    let views = read_back(
        home.path(),
        &format!("{}/modelpack/m:v2", server.addr),
        "modelpack-2",
    );
    let after = seal_metrics(&server);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1, 2),
        "layers read, reused"
    );
    for view in &views {
        assert_eq!(
            std::fs::read(view.join("weights/model.safetensors")).unwrap(),
            weights
        );
        assert_eq!(
            std::fs::read(view.join("tokenizer/tokenizer.json")).unwrap(),
            tokenizer
        );
        assert_eq!(std::fs::read(view.join("README.md")).unwrap(), b"# m\n");
    }
    let views = read_back(
        home.path(),
        &format!("{}/docker/m:v1", server.addr),
        "docker",
    );
    for view in &views {
        assert_eq!(std::fs::read(view.join("model.gguf")).unwrap(), gguf);
        assert_eq!(std::fs::read(view.join("LICENSE")).unwrap(), b"MIT");
    }
}

/// A tar archive of regular files.
fn tar_with(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, bytes) in files {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, path, *bytes).unwrap();
    }
    builder.into_inner().unwrap()
}
