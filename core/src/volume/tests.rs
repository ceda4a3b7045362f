//! Tests of the volume format: determinism, hostile trees, and manifest sizes at scale.

use super::*;
use crate::chunking::DEFAULT_PARAMS;

fn chunk(i: u64, size: u64) -> ChunkRef {
    ChunkRef {
        digest: Algorithm::Sha256.digest_bytes(&i.to_le_bytes()),
        size,
    }
}

/// One way of adding an entry to a builder.
type Op = Box<dyn Fn(&mut TreeBuilder)>;

fn sample(order: &[usize]) -> Tree {
    let mut b = TreeBuilder::new(ChunkingInfo::v1(DEFAULT_PARAMS));
    let ops: Vec<Op> = vec![
        Box::new(|b| {
            b.add_file(
                "model/a.safetensors",
                0o600,
                vec![chunk(1, 10), chunk(2, 5)],
            )
            .unwrap()
        }),
        Box::new(|b| b.add_file("model/b.bin", 0o700, vec![chunk(2, 5)]).unwrap()),
        Box::new(|b| b.add_file("README", 0o644, vec![]).unwrap()),
        Box::new(|b| b.add_dir("empty/dir").unwrap()),
        Box::new(|b| b.add_symlink("latest", "model/a.safetensors").unwrap()),
        Box::new(|b| {
            b.add_file("ünïcode/名前.json", 0o644, vec![chunk(3, 7)])
                .unwrap()
        }),
    ];
    for &i in order {
        ops[i](&mut b);
    }
    b.finish().unwrap()
}

#[test]
fn the_same_content_in_any_order_gives_the_same_version_digest() {
    let a = build_layout(&sample(&[0, 1, 2, 3, 4, 5]));
    let b = build_layout(&sample(&[5, 3, 1, 4, 0, 2]));
    assert_eq!(a.index.digest, b.index.digest);
    assert_eq!(a.tree.bytes, b.tree.bytes);
}

#[test]
fn builder_normalises_modes_adds_parents_and_shares_chunks() {
    let t = sample(&[0, 1, 2, 3, 4, 5]);
    let paths: Vec<&str> = t.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "README",
            "empty",
            "empty/dir",
            "latest",
            "model",
            "model/a.safetensors",
            "model/b.bin",
            "ünïcode",
            "ünïcode/名前.json"
        ]
    );
    assert_eq!(t.chunks.len(), 3, "chunk 2 is shared and listed once");
    let modes: Vec<u32> = t
        .entries
        .iter()
        .filter_map(|e| match e.kind {
            EntryKind::File { mode, .. } => Some(mode),
            _ => None,
        })
        .collect();
    assert_eq!(modes, [0o644, 0o644, 0o755, 0o644]);
    let round = Tree::from_parts(&t.to_json(), t.chunks.clone()).unwrap();
    assert_eq!(round, t);
    // The tree blob carries no per-chunk data: the part manifests do.
    assert!(!String::from_utf8(t.to_json()).unwrap().contains("sha256:"));
    let layout = build_layout(&t);
    let from_parts: Vec<ChunkRef> = layout
        .parts
        .iter()
        .flat_map(|p| chunks_from_part(&p.bytes).unwrap())
        .collect();
    assert_eq!(from_parts, t.chunks);
}

#[test]
fn hostile_paths_are_refused_by_the_builder() {
    let mut b = TreeBuilder::new(ChunkingInfo::v1(DEFAULT_PARAMS));
    for bad in [
        "",
        "/etc/passwd",
        "a/../../b",
        "./a",
        "a//b",
        "a/",
        "nul\0byte",
        &"x".repeat(300),
    ] {
        assert!(b.add_file(bad, 0o644, vec![]).is_err(), "{bad:?} accepted");
    }
    b.add_file("a", 0o644, vec![]).unwrap();
    assert!(matches!(b.add_dir("a"), Err(TreeError::Duplicate(_))));
}

fn tampered(edit: impl Fn(&mut serde_json::Value)) -> Result<Tree, TreeError> {
    let tree = sample(&[0, 1, 2, 3, 4, 5]);
    let mut v: serde_json::Value = serde_json::from_slice(&tree.to_json()).unwrap();
    edit(&mut v);
    Tree::from_parts(&serde_json::to_vec(&v).unwrap(), tree.chunks)
}

#[test]
fn malicious_trees_are_refused_by_readers() {
    // Escaping paths.
    assert!(matches!(
        tampered(|v| v["entries"][0]["path"] = "../evil".into()),
        Err(TreeError::Path { .. })
    ));
    assert!(matches!(
        tampered(|v| v["entries"][0]["path"] = "/abs".into()),
        Err(TreeError::Path { .. })
    ));
    // A file under a symlink would be written through it.
    assert!(tampered(|v| {
        v["entries"].as_array_mut().unwrap().insert(4, serde_json::json!({"path": "latest/x", "type": "file", "mode": 420, "size": 0, "chunks": []}));
    })
    .is_err());
    // Duplicates and disorder.
    assert!(tampered(|v| {
        let first = v["entries"][0].clone();
        v["entries"].as_array_mut().unwrap().insert(0, first);
    })
    .is_err());
    assert!(matches!(
        tampered(|v| v["entries"].as_array_mut().unwrap().reverse()),
        Err(TreeError::Order(_) | TreeError::MissingParent(_))
    ));
    // Sizes that lie and chunk indexes out of range.
    assert!(matches!(
        tampered(|v| v["entries"][5]["size"] = 999.into()),
        Err(TreeError::SizeMismatch { .. })
    ));
    assert!(matches!(
        tampered(|v| v["entries"][5]["chunks"][0] = 99.into()),
        Err(TreeError::ChunkIndex(_))
    ));
    assert!(matches!(
        tampered(|v| v["format"] = 1.into()),
        Err(TreeError::Format(1))
    ));
    assert!(matches!(
        tampered(|v| v["entries"][3]["target"] = "".into()),
        Err(TreeError::SymlinkTarget(_))
    ));
    assert!(matches!(
        Tree::from_parts(b"{\"format\":2", Vec::new()),
        Err(TreeError::Json(_))
    ));
    // Entries that lack what their type needs, or are of no known type; chunk lists that are
    // neither indexes nor [first, count].
    for edit in [
        |v: &mut serde_json::Value| v["entries"][5].as_object_mut().unwrap().remove("chunks"),
        |v: &mut serde_json::Value| v["entries"][5].as_object_mut().unwrap().remove("mode"),
        |v: &mut serde_json::Value| v["entries"][5].as_object_mut().unwrap().remove("size"),
        |v: &mut serde_json::Value| v["entries"][3].as_object_mut().unwrap().remove("target"),
        |v: &mut serde_json::Value| v["entries"][0].as_object_mut().unwrap().remove("type"),
        |v: &mut serde_json::Value| v["entries"][0].as_object_mut().unwrap().remove("path"),
    ] {
        assert!(
            matches!(tampered(|v| drop(edit(v))), Err(TreeError::Json(_))),
            "an entry without a field it needs was accepted"
        );
    }
    for (field, bad) in [
        ("type", serde_json::json!("fifo")),
        ("chunks", serde_json::json!([[0, 1, 2]])),
        ("chunks", serde_json::json!([[0]])),
        ("chunks", serde_json::json!([-1])),
        ("chunks", serde_json::json!([4294967296u64])),
        ("chunks", serde_json::json!([1.5])),
        ("chunks", serde_json::json!(["0"])),
        ("mode", serde_json::json!(null)),
    ] {
        assert!(
            matches!(
                tampered(|v| v["entries"][5][field] = bad.clone()),
                Err(TreeError::Json(_))
            ),
            "{field}: {bad} accepted"
        );
    }
}

#[test]
fn files_list_their_chunks_as_runs_and_read_back_exactly() {
    let mut b = TreeBuilder::new(ChunkingInfo::v1(DEFAULT_PARAMS));
    let a: Vec<ChunkRef> = (1..=5).map(|i| chunk(i, 4)).collect();
    b.add_file("a", 0o644, a.clone()).unwrap();
    // Shares chunks 1 and 2 of `a`, then has two new ones and repeats its first.
    let bs = vec![
        a[1].clone(),
        a[2].clone(),
        chunk(6, 4),
        chunk(7, 4),
        a[1].clone(),
    ];
    b.add_file("b", 0o644, bs).unwrap();
    b.add_file("c", 0o644, vec![a[4].clone()]).unwrap();
    let tree = b.finish().unwrap();
    let json = String::from_utf8(tree.to_json()).unwrap();
    assert!(json.starts_with(r#"{"format":4,"#), "{json}");
    assert!(
        json.contains(r#""path":"a","type":"file","mode":420,"size":20,"chunks":[[0,5]]"#),
        "{json}"
    );
    assert!(
        json.contains(r#""path":"b","type":"file","mode":420,"size":20,"chunks":[[1,2],[5,2],1]"#),
        "{json}"
    );
    assert!(
        json.contains(r#""path":"c","type":"file","mode":420,"size":4,"chunks":[4]"#),
        "{json}"
    );
    let back = Tree::from_parts(json.as_bytes(), tree.chunks.clone()).unwrap();
    assert_eq!(back, tree);
}

#[test]
fn format_2_trees_are_still_read_and_keep_their_bytes() {
    let chunks: Vec<ChunkRef> = (1..=3).map(|i| chunk(i, 4)).collect();
    let v2 = br#"{"format":2,"chunking":{"algorithm":"fastcdc2020+safetensors-v1","min":524288,"avg":2097152,"max":8388608},"entries":[{"path":"w","type":"file","mode":420,"size":12,"chunks":[0,1,2]}]}"#;
    let tree = Tree::from_parts(v2, chunks.clone()).unwrap();
    assert_eq!(tree.format, 2);
    assert_eq!(
        tree.to_json(),
        v2.to_vec(),
        "a format-2 tree re-serialises to its own bytes"
    );
    let layout = build_layout(&tree);
    let index = VolumeIndex::parse(&layout.index.bytes).unwrap();
    assert_eq!(index.annotation(ANNOTATION_FORMAT), Some("2"));
    // Runs are a format-3 encoding: a format-2 blob using them is refused.
    let runs = String::from_utf8_lossy(v2).replace("[0,1,2]", "[[0,3]]");
    assert!(matches!(
        Tree::from_parts(runs.as_bytes(), chunks),
        Err(TreeError::Runs(_))
    ));
}

#[test]
fn hostile_runs_are_refused_before_anything_is_expanded() {
    let table: Vec<ChunkRef> = (0..1000).map(|i| chunk(i, 1)).collect();
    let tree_with = |entries: String| {
        format!(
            r#"{{"format":3,"chunking":{{"algorithm":"x","min":1,"avg":2,"max":4}},"entries":[{entries}]}}"#
        )
    };
    let file = |path: &str, size: u64, chunks: &str| {
        format!(r#"{{"path":"{path}","type":"file","mode":420,"size":{size},"chunks":{chunks}}}"#)
    };
    for chunks in [
        "[[0,4294967295]]",
        "[[4294967295,2]]",
        "[[999,2]]",
        "[[0,0]]",
        "[1000]",
    ] {
        let json = tree_with(file("f", 0, chunks));
        assert!(
            matches!(
                Tree::from_parts(json.as_bytes(), table.clone()),
                Err(TreeError::ChunkIndex(_))
            ),
            "{chunks} accepted"
        );
    }
    // Many files each naming the whole table: within the table, but past the reference budget.
    let files = (0..20_000)
        .map(|i| file(&format!("f{i:05}"), 1000, "[[0,1000]]"))
        .collect::<Vec<_>>()
        .join(",");
    assert!(matches!(
        Tree::from_parts(tree_with(files).as_bytes(), table),
        Err(TreeError::TooManyChunkRefs)
    ));
}

#[test]
fn parts_grow_with_the_square_root_of_the_table() {
    for (n, low, high) in [
        (1_000usize, 14.0, 40.0),
        (4_000, 25.0, 70.0),
        (600_000, 300.0, 800.0),
    ] {
        let chunks: Vec<ChunkRef> = (0..n as u64).map(|i| chunk(i, 1)).collect();
        let parts = split_parts(&chunks);
        let mean = n as f64 / parts.len() as f64;
        assert!(
            (low..high).contains(&mean),
            "{n} chunks: parts average {mean:.1} chunks"
        );
        assert!(parts.iter().all(|p| p.len() <= PART_MAX));
        assert!(parts[..parts.len() - 1].iter().all(|p| p.len() >= PART_MIN));
    }
}

#[test]
fn a_one_tib_volume_of_100k_files_keeps_every_manifest_under_4_mib() {
    // 100,000 files of 11 MiB + 3 bytes each, in chunks of up to 2 MiB: over 1 TiB, 600,000 chunks.
    let mut b = TreeBuilder::new(ChunkingInfo::v1(DEFAULT_PARAMS));
    let mut n = 0u64;
    for f in 0..100_000u64 {
        let chunks = (0..6)
            .map(|i| {
                n += 1;
                chunk(n, if i < 5 { 2 << 20 } else { (1 << 20) + 3 })
            })
            .collect();
        b.add_file(
            &format!("shard-{:03}/file-{f:06}.bin", f % 1000),
            0o644,
            chunks,
        )
        .unwrap();
    }
    let tree = b.finish().unwrap();
    assert!(tree.total_bytes() >= 1 << 40);
    let layout = build_layout(&tree);
    const LIMIT: usize = 4 * 1024 * 1024;
    assert!(
        layout.index.bytes.len() < LIMIT,
        "index is {} bytes",
        layout.index.bytes.len()
    );
    assert!(layout.tree_manifest.bytes.len() < LIMIT);
    for part in &layout.parts {
        assert!(
            part.bytes.len() < LIMIT,
            "part manifest is {} bytes",
            part.bytes.len()
        );
    }
    let listed: usize = layout
        .parts
        .iter()
        .map(|p| {
            serde_json::from_slice::<ImageManifest>(&p.bytes)
                .unwrap()
                .layers
                .len()
        })
        .sum();
    assert_eq!(
        listed,
        tree.chunks.len(),
        "every chunk is reachable from the index"
    );
    let parsed = VolumeIndex::parse(&layout.index.bytes).unwrap();
    assert_eq!(parsed.tree.as_ref(), Some(&layout.tree.digest));
    assert_eq!(
        parsed.index.manifests.len(),
        layout.parts.len() + 1 + IMAGE_PLATFORMS.len()
    );
    assert_eq!(parsed.parts.len(), layout.parts.len());
}

#[test]
fn the_tree_and_parts_carry_a_platform_no_machine_matches_so_one_platform_pulls_skip_them() {
    let tree = sample(&[0, 1, 2]);
    let layout = build_layout(&tree);
    let index: serde_json::Value = serde_json::from_slice(&layout.index.bytes).unwrap();
    let entries = index["manifests"].as_array().unwrap();
    let others: Vec<&serde_json::Value> = entries
        .iter()
        .filter(|d| d["artifactType"] != IMAGE_ARTIFACT_TYPE)
        .collect();
    assert_eq!(
        others.len(),
        1 + layout.parts.len(),
        "the tree and every part"
    );
    for d in others {
        assert_eq!(
            d["platform"],
            serde_json::json!({"architecture": "unknown", "os": "unknown"}),
            "{d}"
        );
    }
    // Readers find them by artifactType, as before.
    let parsed = VolumeIndex::parse(&layout.index.bytes).unwrap();
    assert_eq!(parsed.parts.len(), layout.parts.len());
    assert_eq!(parsed.tree_manifest.digest, layout.tree_manifest.digest);
}

#[test]
fn a_volume_also_presents_itself_as_a_one_layer_image_per_platform() {
    let tree = sample(&[0, 1, 2]);
    let layout = build_layout(&tree);
    let index: serde_json::Value = serde_json::from_slice(&layout.index.bytes).unwrap();
    let images: Vec<&serde_json::Value> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["artifactType"] == IMAGE_ARTIFACT_TYPE)
        .collect();
    assert_eq!(images.len(), 2);
    for (descriptor, arch) in images.iter().zip(IMAGE_PLATFORMS) {
        assert_eq!(descriptor["platform"]["architecture"], arch);
        assert_eq!(descriptor["platform"]["os"], "linux");
        let manifest = layout
            .images
            .iter()
            .find(|m| m.digest.as_str() == descriptor["digest"])
            .unwrap();
        let m: ImageManifest = serde_json::from_slice(&manifest.bytes).unwrap();
        assert_eq!(m.artifact_type, None, "an ordinary image manifest");
        assert_eq!(m.layers.len(), 1);
        assert_eq!(m.layers[0].digest, layout.tree.digest);
        assert_eq!(m.layers[0].media_type, IMAGE_LAYER_MEDIA_TYPE);
        // containerd 1.7+ counts only these as layers when it unpacks (images.IsLayerType).
        assert!(m.layers[0]
            .media_type
            .starts_with("application/vnd.oci.image.layer."));
        let config = layout
            .image_configs
            .iter()
            .find(|c| c.digest == m.config.digest)
            .unwrap();
        // The exact bytes docs/format.md specifies.
        let expected = format!(
            r#"{{"architecture":"{arch}","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
            layout.tree.digest
        );
        assert_eq!(String::from_utf8_lossy(&config.bytes), expected);
    }
    // Readers of the volume do not see them.
    let parsed = VolumeIndex::parse(&layout.index.bytes).unwrap();
    assert_eq!(parsed.parts.len(), layout.parts.len());
    assert_eq!(parsed.tree_manifest.digest, layout.tree_manifest.digest);
}

#[test]
fn a_format_3_version_keeps_its_image_manifests_and_so_its_digest() {
    let mut tree = sample(&[0, 1, 2]);
    tree.format = 3;
    let layout = build_layout(&tree);
    for image in &layout.images {
        let m: ImageManifest = serde_json::from_slice(&image.bytes).unwrap();
        assert_eq!(
            m.layers[0].media_type, TREE_MEDIA_TYPE,
            "format 3 wrote this"
        );
        assert!(is_tree_layer(&m.layers[0].media_type));
    }
    // The same files as format 4 make another version (the image manifests differ), which is why
    // the format changed.
    let mut four = tree.clone();
    four.format = 4;
    assert_ne!(build_layout(&four).index.digest, layout.index.digest);
    assert!(is_tree_layer(IMAGE_LAYER_MEDIA_TYPE));
    assert!(!is_tree_layer(CHUNK_MEDIA_TYPE));
}

#[test]
fn parts_are_content_defined_so_an_insertion_keeps_most_of_them() {
    let chunks: Vec<ChunkRef> = (0..60_000).map(|i| chunk(i, 1)).collect();
    let a: Vec<Vec<ChunkRef>> = split_parts(&chunks)
        .into_iter()
        .map(<[_]>::to_vec)
        .collect();
    let mut shifted = vec![chunk(1_000_000, 1)];
    shifted.extend(chunks.iter().cloned());
    let b: Vec<Vec<ChunkRef>> = split_parts(&shifted)
        .into_iter()
        .map(<[_]>::to_vec)
        .collect();
    let shared = b.iter().filter(|p| a.contains(p)).count();
    assert!(a.len() > 5);
    assert!(
        shared >= a.len() - 2,
        "only {shared} of {} parts survive an insertion",
        a.len()
    );
}

#[test]
fn a_part_manifest_holds_only_chunks_with_valid_digests() {
    let part = |media_type: &str, digest: &str| {
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.empty.v1+json",
                "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
                "size": 2
            },
            "layers": [{ "mediaType": media_type, "digest": digest, "size": 5 }]
        })
        .to_string()
    };
    let good = "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
    let chunks = chunks_from_part(part(CHUNK_MEDIA_TYPE, good).as_bytes()).unwrap();
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].digest.as_str(), good);
    assert_eq!(chunks[0].size, 5);
    assert!(matches!(
        chunks_from_part(part(TREE_MEDIA_TYPE, good).as_bytes()),
        Err(VolumeError::NotAVolume(_))
    ));
    let upper = good.to_uppercase().replace("SHA256", "sha256");
    assert!(chunks_from_part(part(CHUNK_MEDIA_TYPE, &upper).as_bytes()).is_err());
}
