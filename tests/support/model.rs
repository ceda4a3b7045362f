//! Writes small safetensors checkpoints for tests: a JSON header, then bf16 tensors end to end.

use std::path::Path;

use super::oci::pseudo_random;

/// A tensor: name, element count and content seed (same seed, same bytes).
pub type TensorSpec = (String, usize, u64);

/// Writes a safetensors file with bf16 tensors in the given order.
pub fn write_safetensors(path: &Path, tensors: &[TensorSpec]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0usize;
    for (name, elements, _) in tensors {
        let len = elements * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": [elements], "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut json = serde_json::to_vec(&header).unwrap();
    while !(8 + json.len()).is_multiple_of(8) {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    for (_, elements, seed) in tensors {
        bytes.extend_from_slice(&pseudo_random(elements * 2, *seed));
    }
    std::fs::write(path, bytes).unwrap();
}

/// A small BERT-like layer stack: embeddings, then per layer two 1.5 KB norms, a 590 KB square
/// projection and a 2.4 MB feed-forward matrix.
pub fn bert_like(layers: usize, seed: u64) -> Vec<TensorSpec> {
    let mut t = vec![("embeddings.word".to_string(), 3_000_000, seed)];
    for l in 0..layers {
        let s = seed + 100 * (l as u64 + 1);
        t.push((format!("layer.{l}.norm.weight"), 384, s + 1));
        t.push((format!("layer.{l}.norm.bias"), 384, s + 2));
        t.push((format!("layer.{l}.attention.weight"), 384 * 384 * 2, s + 3));
        t.push((format!("layer.{l}.ffn.weight"), 384 * 1536 * 2, s + 4));
    }
    t
}
