#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};

use super::*;

const EMPTY: &str = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";

fn digest(n: u8) -> String {
    format!("sha256:{}", format!("{n:02x}").repeat(32))
}

fn layer(n: u8, media_type: &str, annotations: Value) -> Value {
    json!({"mediaType": media_type, "digest": digest(n), "size": 10, "annotations": annotations})
}

fn manifest(config_type: &str, layers: Vec<Value>) -> ImageManifest {
    serde_json::from_value(json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": config_type, "digest": EMPTY, "size": 2},
        "layers": layers,
    }))
    .unwrap()
}

fn paths(a: &Artifact) -> Vec<(&str, Packing)> {
    a.layers
        .iter()
        .map(|l| (l.path.as_str(), l.packing))
        .collect()
}

#[test]
fn oras_files_and_a_directory_archive() {
    let m = manifest(
        "application/vnd.oci.empty.v1+json",
        vec![
            layer(
                1,
                "application/vnd.oci.image.layer.v1.tar",
                json!({ANNOTATION_TITLE: "model.safetensors"}),
            ),
            layer(
                2,
                "application/vnd.oci.image.layer.v1.tar",
                json!({ANNOTATION_TITLE: "config.json"}),
            ),
            layer(
                3,
                "application/vnd.oci.image.layer.v1.tar+gzip",
                json!({ANNOTATION_TITLE: "tokenizer", ANNOTATION_ORAS_UNPACK: "true"}),
            ),
            // The ORAS Python SDK's directory: no unpack mark, only the exact media type.
            layer(
                4,
                "application/vnd.oci.image.layer.v1.tar+gzip",
                json!({ANNOTATION_TITLE: "model"}),
            ),
            layer(
                5,
                "application/x-tar+gzip",
                json!({ANNOTATION_TITLE: "data.tar.gz"}),
            ),
        ],
    );
    let a = recognize(&m).unwrap();
    assert_eq!(a.kind, Kind::Oras);
    // Without the unpack mark (or the SDK's directory type) a layer is a file, whatever its
    // media type says.
    assert_eq!(
        paths(&a),
        vec![
            ("model.safetensors", Packing::Raw),
            ("config.json", Packing::Raw),
            ("tokenizer", Packing::TarGzip),
            ("model", Packing::TarGzip),
            ("data.tar.gz", Packing::Raw),
        ]
    );
}

#[test]
fn modelpack_paths_and_packings() {
    let m = manifest(
        "application/vnd.cncf.model.config.v1+json",
        vec![
            layer(
                1,
                "application/vnd.cncf.model.weight.v1.raw",
                json!({ANNOTATION_MODELPACK_FILEPATH: "weights/model-00001.safetensors"}),
            ),
            layer(
                2,
                "application/vnd.cncf.model.weight.config.v1.tar",
                json!({ANNOTATION_MODELPACK_FILEPATH: "./config.json"}),
            ),
            layer(
                3,
                "application/vnd.cncf.model.doc.v1.tar+gzip",
                json!({ANNOTATION_MODELPACK_FILEPATH: "docs"}),
            ),
            layer(
                4,
                "application/vnd.cnai.model.code.v1.tar+zstd",
                json!({ANNOTATION_CNAI_FILEPATH: "src//run.py"}),
            ),
        ],
    );
    let a = recognize(&m).unwrap();
    assert_eq!(a.kind, Kind::ModelPack);
    assert_eq!(
        paths(&a),
        vec![
            ("weights/model-00001.safetensors", Packing::Raw),
            ("config.json", Packing::Tar),
            ("docs", Packing::TarGzip),
            ("src/run.py", Packing::TarZstd),
        ]
    );
}

#[test]
fn docker_model_artifacts_are_named_by_type_when_unannotated() {
    let m = manifest(
        "application/vnd.docker.ai.model.config.v0.1+json",
        vec![
            layer(1, "application/vnd.docker.ai.gguf.v3", json!({})),
            layer(2, "application/vnd.docker.ai.gguf.v3", json!({})),
            layer(3, "application/vnd.docker.ai.license", json!({})),
            layer(
                4,
                "application/vnd.docker.ai.dir.tar",
                json!({ANNOTATION_MODELPACK_FILEPATH: "text_encoder"}),
            ),
        ],
    );
    let a = recognize(&m).unwrap();
    assert_eq!(a.kind, Kind::DockerModel);
    assert_eq!(
        paths(&a),
        vec![
            ("model.gguf", Packing::Raw),
            ("model-1.gguf", Packing::Raw),
            ("LICENSE", Packing::Raw),
            ("text_encoder", Packing::Tar),
        ]
    );
}

#[test]
fn paths_that_leave_the_volume_are_refused() {
    for bad in [
        "../etc/passwd",
        "/etc/passwd",
        "a/../../b",
        "a\\b",
        "",
        "./",
    ] {
        assert_eq!(safe_path(bad), None, "{bad:?}");
        let m = manifest(
            "application/vnd.oci.empty.v1+json",
            vec![layer(
                1,
                "application/octet-stream",
                json!({ANNOTATION_TITLE: bad}),
            )],
        );
        assert!(
            matches!(recognize(&m), Err(NotAnArtifact::UnsafePath { .. })),
            "{bad:?}"
        );
    }
    assert_eq!(safe_path("a/./b//c").as_deref(), Some("a/b/c"));
}

#[test]
fn images_volumes_and_ambiguous_artifacts_are_not_file_artifacts() {
    // An ordinary image: layers without names.
    let image = manifest(
        "application/vnd.oci.image.config.v1+json",
        vec![layer(
            1,
            "application/vnd.oci.image.layer.v1.tar+gzip",
            json!({}),
        )],
    );
    assert!(matches!(
        recognize(&image),
        Err(NotAnArtifact::UnnamedLayer(_))
    ));
    // Two layers claiming one path.
    let twice = manifest(
        "application/vnd.oci.empty.v1+json",
        vec![
            layer(
                1,
                "application/octet-stream",
                json!({ANNOTATION_TITLE: "a.bin"}),
            ),
            layer(
                2,
                "application/octet-stream",
                json!({ANNOTATION_TITLE: "./a.bin"}),
            ),
        ],
    );
    assert_eq!(
        recognize(&twice),
        Err(NotAnArtifact::DuplicatePath("a.bin".into()))
    );
    // vial's own manifests.
    let mut volume = manifest(
        "application/vnd.oci.empty.v1+json",
        vec![layer(1, "x", json!({ANNOTATION_TITLE: "a"}))],
    );
    volume.artifact_type = Some("application/vnd.vial.tree.v1".into());
    assert_eq!(recognize(&volume), Err(NotAnArtifact::AlreadyAVolume));
    assert_eq!(
        recognize(&manifest("application/vnd.oci.empty.v1+json", vec![])),
        Err(NotAnArtifact::Empty)
    );
}
