//! docs/format.md is normative, so the format versions it states are held to the code here: a
//! change of `FORMAT_VERSION` or `READABLE_FORMATS` that leaves the document behind fails a test.
//!
//! Each test reads one specific statement of the document (the title, the annotation's value, the
//! validation rule, the tree blob example) and compares it with what the code writes or accepts,
//! so a stray digit elsewhere in the document can neither satisfy nor break them.

use std::path::Path;

use vial_core::volume::{
    build_layout, image_layer_media_type, ChunkRef, ChunkingInfo, Tree, TreeBuilder, TreeError,
    VolumeIndex, ANNOTATION_FORMAT, FORMAT_VERSION, READABLE_FORMATS,
};
use vial_core::Algorithm;

fn doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/format.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The text between the first `start` and the next `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let rest = text
        .split_once(start)
        .unwrap_or_else(|| panic!("docs/format.md no longer says {start:?}"))
        .1;
    rest.split_once(end)
        .unwrap_or_else(|| panic!("nothing ends {start:?} with {end:?} in docs/format.md"))
        .0
}

fn number(text: &str, what: &str) -> u32 {
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{what} in docs/format.md is {text:?}, not a number"))
}

/// A list written as prose: `2, 3 or 4`, `2, 3 and 4`, `2 or 3`, `4`.
fn number_list(text: &str, what: &str) -> Vec<u32> {
    text.replace(" or ", ", ")
        .replace(" and ", ", ")
        .split(", ")
        .map(|n| number(n, what))
        .collect()
}

/// A small tree built the way `vial push` builds one, in the format this code writes.
fn fresh_tree() -> Tree {
    let mut b = TreeBuilder::new(chunking());
    let chunk = ChunkRef {
        digest: Algorithm::Sha256.digest_bytes(b"weights"),
        size: 7,
    };
    b.add_file("model/weights.bin", 0o644, vec![chunk])
        .unwrap_or_else(|e| panic!("cannot build a tree: {e}"));
    b.finish()
        .unwrap_or_else(|e| panic!("cannot build a tree: {e}"))
}

fn chunking() -> ChunkingInfo {
    ChunkingInfo {
        algorithm: "fastcdc2020+safetensors-v1".to_owned(),
        min: 524_288,
        avg: 2_097_152,
        max: 8_388_608,
    }
}

#[test]
fn the_title_names_the_format_this_code_writes() {
    let doc = doc();
    let title = doc.lines().next().unwrap_or_default();
    let version = title
        .strip_prefix("# The vial volume format, version ")
        .unwrap_or_else(|| panic!("unexpected title {title:?}"));
    assert_eq!(number(version, "the title's version"), FORMAT_VERSION);
}

#[test]
fn the_format_annotation_the_doc_states_is_the_one_a_writer_sets() {
    let doc = doc();
    let sentence = between(&doc, "`dev.vial.volume.format` is `", "`");
    let row = between(&doc, "| `dev.vial.volume.format` | format version, `", "`");
    let written = build_layout(&fresh_tree());
    let index = VolumeIndex::parse(&written.index.bytes)
        .unwrap_or_else(|e| panic!("cannot parse the index just built: {e}"));
    let annotation = index
        .annotation(ANNOTATION_FORMAT)
        .unwrap_or_else(|| panic!("the index carries no {ANNOTATION_FORMAT}"));
    assert_eq!(annotation, FORMAT_VERSION.to_string());
    assert_eq!(sentence, annotation, "the annotations' introduction");
    assert_eq!(row, annotation, "the annotations table");
}

#[test]
fn the_image_layer_media_type_the_doc_states_is_the_one_a_writer_sets() {
    let doc = doc();
    let row = between(&doc, "| image-shaped manifest layer mediaType | `", "`");
    assert_eq!(row, image_layer_media_type(FORMAT_VERSION));
    let written = build_layout(&fresh_tree());
    for image in &written.images {
        let manifest: serde_json::Value = serde_json::from_slice(&image.bytes)
            .unwrap_or_else(|e| panic!("cannot parse an image manifest just built: {e}"));
        assert_eq!(manifest["layers"][0]["mediaType"], row);
    }
}

#[test]
fn the_formats_a_reader_must_accept_are_the_ones_this_code_reads() {
    let doc = doc();
    let validation = between(&doc, "**Validation.**", "\n\n");
    let accepted = number_list(
        between(validation, "`format` is ", ";"),
        "the validation rule's format",
    );
    assert_eq!(accepted, READABLE_FORMATS, "the validation rule");
    // "(vial reads 2, 3 and 4 and writes 4)" in the section on versioning.
    let (reads, writes) = between(&doc, "(vial reads ", ")")
        .split_once(" and writes ")
        .unwrap_or_else(|| panic!("the versioning section no longer says what vial writes"));
    assert_eq!(
        number_list(reads, "the formats vial reads"),
        READABLE_FORMATS,
        "the versioning section"
    );
    assert_eq!(number(writes, "the format vial writes"), FORMAT_VERSION);

    // The list is what the reader does, not only what a constant says.
    let blob = |format: u32| {
        format!(
            r#"{{"format":{format},"chunking":{{"algorithm":"x","min":1,"avg":2,"max":4}},"entries":[{{"path":"f","type":"file","mode":420,"size":0,"chunks":[]}}]}}"#
        )
    };
    let newest = accepted.iter().copied().max().unwrap_or_default();
    for format in 0..=newest + 1 {
        let read = Tree::from_parts(blob(format).as_bytes(), Vec::new());
        if accepted.contains(&format) {
            assert!(read.is_ok(), "format {format}: {read:?}");
        } else {
            assert_eq!(read, Err(TreeError::Format(format)), "format {format}");
        }
    }
}

#[test]
fn the_tree_blob_example_is_what_this_code_writes() {
    let doc = doc();
    let section = between(&doc, "## The tree blob", "\n## ");
    let example = between(section, "```json\n", "\n```");
    // The example is laid out for reading; its strings hold no whitespace, so removing all of it
    // gives the compact JSON a writer emits.
    let compact: String = example.chars().filter(|c| !c.is_whitespace()).collect();
    let parsed = |text: &str| {
        serde_json::from_str::<serde_json::Value>(text)
            .unwrap_or_else(|e| panic!("the tree blob example is not JSON: {e}"))
    };
    assert_eq!(
        parsed(&compact),
        parsed(example),
        "whitespace inside a string"
    );
    // Seven chunks whose sizes add up to the example's file sizes: config.json is chunk 0,
    // a.safetensors chunks 1-4, b.safetensors chunks 2, 3, 5 and 6.
    let sizes = [
        712, 2_359_296, 2_359_296, 2_359_296, 2_359_296, 1_835_008, 1_835_008,
    ];
    let table = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| ChunkRef {
            digest: Algorithm::Sha256.digest_bytes(&[i as u8]),
            size,
        })
        .collect();
    let tree = Tree::from_parts(compact.as_bytes(), table)
        .unwrap_or_else(|e| panic!("the tree blob example does not read: {e}"));
    assert_eq!(tree.format, FORMAT_VERSION);
    assert_eq!(
        String::from_utf8_lossy(&tree.to_json()),
        compact,
        "the example is not the canonical serialisation"
    );
}
