//! A model-like checkpoint generator for the push benchmark: HF-style sharded safetensors files of
//! bf16 tensors with transformer shapes, plus config.json, the shard index and a tokenizer.json.
//!
//! Tensor bytes are xorshift noise seeded by (tensor name, content version), so a tensor that a
//! later checkpoint does not touch is byte-identical to the base's. Three next checkpoints are
//! derived from the base (see [`Case`]); for each, "bytes changed" counts:
//! - the bytes of every rewritten or added tensor,
//! - plus `8 + header length` of every safetensors file whose header changed,
//! - plus the whole size of every other file (JSON) that changed.
//!
//! For the base push everything is new, so its "changed" bytes are the whole checkpoint.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::json;

use crate::data::splitmix;

/// Bytes generated and written per `write` call.
const WRITE_BLOCK: usize = 8 << 20;
const BASE_VOCAB: u64 = 32_000;
const HIDDEN_CANDIDATES: [u64; 12] = [
    256, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192,
];
/// Rank of the adapter matrix that case (b) adds.
const ADDED_RANK: u64 = 64;
/// Case (a) rewrites every `A_STRIDE`-th tensor in model order (5%), starting at `A_OFFSET`.
const A_STRIDE: usize = 20;
const A_OFFSET: usize = 7;
/// tokenizer.json grows until it is at least this big.
const TOKENIZER_BYTES: usize = 3_000_000;

/// The transformer's dimensions (Llama-like).
#[derive(Clone, Debug, Serialize)]
pub struct Shape {
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub vocab: u64,
    pub heads: u64,
    /// Bytes of all tensors (bf16).
    pub tensor_bytes: u64,
    pub tensors: usize,
}

impl Shape {
    /// The largest hidden size that still leaves at least `max(2, hidden/128)` layers, then the
    /// vocabulary is grown (from 32000, in multiples of 64) to fill the remainder, so the tensors
    /// total `target` bytes to within one vocabulary row block.
    pub fn for_bytes(target: u64) -> Result<Shape> {
        let params = target / 2;
        let mut best = None;
        for h in HIDDEN_CANDIDATES {
            let i = (h * 8 / 3).div_ceil(256) * 256;
            let per_layer = 4 * h * h + 3 * h * i + 2 * h;
            let fixed = 2 * BASE_VOCAB * h + h;
            if params < fixed + per_layer {
                break;
            }
            let layers = (params - fixed) / per_layer;
            if layers >= (h / 128).max(2) {
                best = Some((h, i, layers, per_layer));
            }
        }
        let Some((h, i, layers, per_layer)) = best else {
            bail!("{target} bytes is too small for a transformer-shaped checkpoint");
        };
        let vocab = ((params - layers * per_layer - h) / (2 * h)) / 64 * 64;
        let mut shape = Shape {
            hidden: h,
            intermediate: i,
            layers,
            vocab,
            heads: if h >= 1024 { h / 128 } else { h / 64 },
            tensor_bytes: 0,
            tensors: 0,
        };
        let all = shape.tensors_in_order();
        shape.tensor_bytes = all.iter().map(|t| t.bytes).sum();
        shape.tensors = all.len();
        Ok(shape)
    }

    /// Every tensor in model (state dict) order.
    pub fn tensors_in_order(&self) -> Vec<TensorDef> {
        let (h, i, v) = (self.hidden, self.intermediate, self.vocab);
        let mut out = vec![TensorDef::new("model.embed_tokens.weight", vec![v, h])];
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            for proj in ["q", "k", "v", "o"] {
                out.push(TensorDef::new(
                    &format!("{p}.self_attn.{proj}_proj.weight"),
                    vec![h, h],
                ));
            }
            out.push(TensorDef::new(
                &format!("{p}.mlp.gate_proj.weight"),
                vec![i, h],
            ));
            out.push(TensorDef::new(
                &format!("{p}.mlp.up_proj.weight"),
                vec![i, h],
            ));
            out.push(TensorDef::new(
                &format!("{p}.mlp.down_proj.weight"),
                vec![h, i],
            ));
            out.push(TensorDef::new(
                &format!("{p}.input_layernorm.weight"),
                vec![h],
            ));
            out.push(TensorDef::new(
                &format!("{p}.post_attention_layernorm.weight"),
                vec![h],
            ));
        }
        out.push(TensorDef::new("model.norm.weight", vec![h]));
        out.push(TensorDef::new("lm_head.weight", vec![v, h]));
        out
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDef {
    pub name: String,
    pub shape: Vec<u64>,
    pub bytes: u64,
}

impl TensorDef {
    fn new(name: &str, shape: Vec<u64>) -> Self {
        let bytes = 2 * shape.iter().product::<u64>();
        TensorDef {
            name: name.to_string(),
            shape,
            bytes,
        }
    }
}

/// A tensor in a shard, with the version its content is generated from.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Placed {
    def: TensorDef,
    version: u32,
}

/// The checkpoints of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    Base,
    /// 5% of the tensors (every 20th in model order: mixed sizes) rewritten with new content.
    Rewrite5,
    /// One new tensor inserted after the first tensor of the middle shard's data.
    AddTensor,
    /// LoRA-style merge: q_proj and v_proj of every layer rewritten (half of q, k, v, o).
    LoraMerge,
    /// Round `n` of a training run: round `n` rewrites every `A_STRIDE`-th tensor starting at
    /// `n % A_STRIDE`, on top of rounds `1..n`, so each round changes 5% of the tensors (by count)
    /// of the one before.
    Round(u32),
}

impl Case {
    pub const ALL: [Case; 4] = [Case::Base, Case::Rewrite5, Case::AddTensor, Case::LoraMerge];

    /// Also the tag each client pushes.
    pub fn tag(self) -> &'static str {
        match self {
            Case::Base => "base",
            Case::Rewrite5 => "a",
            Case::AddTensor => "b",
            Case::LoraMerge => "c",
            Case::Round(_) => "round",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Case::Base => "first push (base)",
            Case::Rewrite5 => "(a) 5% of tensors rewritten",
            Case::AddTensor => "(b) one tensor added",
            Case::LoraMerge => "(c) LoRA merge (q,v rewritten)",
            Case::Round(_) => "a training round (5% of tensors rewritten since the last)",
        }
    }
}

/// What one generated checkpoint holds and how it differs from the base.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Generated {
    pub case: String,
    pub description: String,
    pub files: usize,
    /// Bytes of all files.
    pub bytes: u64,
    /// Bytes of rewritten or added tensors.
    pub changed_tensor_bytes: u64,
    pub changed_tensors: usize,
    /// `8 + header length` of every safetensors file whose header changed.
    pub changed_header_bytes: u64,
    /// Whole size of every other file that changed.
    pub changed_other_bytes: u64,
    /// The sum of the three above (for the base: `bytes`).
    pub changed_bytes: u64,
    /// Files that differ from the base, and their whole size (what a whole-file client re-uploads).
    pub files_differing: usize,
    pub bytes_differing: u64,
    /// Time to write the differing files (the others are hard links to the base's).
    pub seconds: f64,
}

enum Content {
    Shard {
        header: Vec<u8>,
        tensors: Vec<Placed>,
    },
    Bytes(Vec<u8>),
}

impl Content {
    fn len(&self) -> u64 {
        match self {
            Content::Shard { header, tensors } => {
                header.len() as u64 + tensors.iter().map(|t| t.def.bytes).sum::<u64>()
            }
            Content::Bytes(b) => b.len() as u64,
        }
    }
}

struct FilePlan {
    name: String,
    content: Content,
}

/// Generates checkpoints in directories; keeps the base's plan to derive and compare the others.
pub struct Generator {
    pub shape: Shape,
    shards: Vec<Vec<Placed>>,
    base: Vec<FilePlan>,
    tokenizer: Vec<u8>,
    config: Vec<u8>,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

impl Generator {
    pub fn new(target_bytes: u64, shards: usize) -> Result<Self> {
        if shards == 0 {
            bail!("--shards must be at least 1");
        }
        let shape = Shape::for_bytes(target_bytes)?;
        let all = shape.tensors_in_order();
        // Shards of roughly equal size in model order, as save_pretrained cuts them; within a
        // shard the data (and header) are sorted by name, as the safetensors library writes them.
        let target = shape.tensor_bytes as f64 / shards as f64;
        let mut split: Vec<Vec<Placed>> = vec![Vec::new(); shards];
        let mut cum = 0u64;
        for def in all {
            let mid = cum as f64 + def.bytes as f64 / 2.0;
            let s = ((mid / target) as usize).min(shards - 1);
            cum += def.bytes;
            split[s].push(Placed { def, version: 0 });
        }
        if let Some(s) = split.iter().position(Vec::is_empty) {
            bail!("shard {} would be empty: use fewer --shards", s + 1);
        }
        for shard in &mut split {
            shard.sort_by(|a, b| a.def.name.cmp(&b.def.name));
        }
        let tokenizer = tokenizer_json(shape.vocab);
        let config = config_json(&shape)?;
        let mut g = Generator {
            shape,
            shards: split,
            base: Vec::new(),
            tokenizer,
            config,
        };
        g.base = g.plan(Case::Base)?;
        Ok(g)
    }

    fn shard_name(&self, i: usize) -> String {
        format!("model-{:05}-of-{:05}.safetensors", i + 1, self.shards.len())
    }

    /// The files of a case, in memory except for tensor data.
    fn plan(&self, case: Case) -> Result<Vec<FilePlan>> {
        let mut shards = self.shards.clone();
        match case {
            Case::Base => {}
            Case::Rewrite5 => {
                let order: Vec<String> = self
                    .shape
                    .tensors_in_order()
                    .into_iter()
                    .map(|t| t.name)
                    .collect();
                let chosen: std::collections::HashSet<&str> = order
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i % A_STRIDE == A_OFFSET % A_STRIDE)
                    .map(|(_, n)| n.as_str())
                    .collect();
                for t in shards.iter_mut().flatten() {
                    if chosen.contains(t.def.name.as_str()) {
                        t.version = 1;
                    }
                }
            }
            Case::AddTensor => {
                let k = shards.len() / 2;
                let shard = &mut shards[k];
                let layer = shard
                    .first()
                    .and_then(|t| t.def.name.strip_prefix("model.layers."))
                    .and_then(|r| r.split('.').next())
                    .unwrap_or("0")
                    .to_string();
                let def = TensorDef::new(
                    &format!("model.layers.{layer}.self_attn.q_proj.lora_A.weight"),
                    vec![ADDED_RANK, self.shape.hidden],
                );
                shard.insert(1.min(shard.len()), Placed { def, version: 0 });
            }
            Case::Round(n) => {
                let order: HashMap<String, usize> = self
                    .shape
                    .tensors_in_order()
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| (t.name, i))
                    .collect();
                for t in shards.iter_mut().flatten() {
                    let i = order.get(&t.def.name).copied().unwrap_or(0);
                    t.version = round_version(i, n);
                }
            }
            Case::LoraMerge => {
                for t in shards.iter_mut().flatten() {
                    if t.def.name.ends_with("self_attn.q_proj.weight")
                        || t.def.name.ends_with("self_attn.v_proj.weight")
                    {
                        t.version = 2;
                    }
                }
            }
        }
        let mut files = Vec::new();
        let mut weight_map = serde_json::Map::new();
        let mut total = 0u64;
        let mut names: Vec<(String, String)> = Vec::new();
        for (i, tensors) in shards.into_iter().enumerate() {
            let name = self.shard_name(i);
            for t in &tensors {
                total += t.def.bytes;
                names.push((t.def.name.clone(), name.clone()));
            }
            files.push(FilePlan {
                name,
                content: Content::Shard {
                    header: safetensors_header(&tensors)?,
                    tensors,
                },
            });
        }
        names.sort();
        for (tensor, file) in names {
            weight_map.insert(tensor, file.into());
        }
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        files.push(FilePlan {
            name: "model.safetensors.index.json".into(),
            content: Content::Bytes(serde_json::to_vec_pretty(&index)?),
        });
        files.push(FilePlan {
            name: "config.json".into(),
            content: Content::Bytes(self.config.clone()),
        });
        files.push(FilePlan {
            name: "tokenizer.json".into(),
            content: Content::Bytes(self.tokenizer.clone()),
        });
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(files)
    }

    /// How `case` differs from the base, without writing anything.
    pub fn summary(&self, case: Case) -> Result<Generated> {
        let plan = self.plan(case)?;
        Ok(self.compare(case, &plan).0)
    }

    /// The summary of `case`, and which of its files differ from the base's.
    fn compare<'a>(&self, case: Case, plan: &'a [FilePlan]) -> (Generated, Vec<&'a FilePlan>) {
        let base: HashMap<&str, &FilePlan> =
            self.base.iter().map(|f| (f.name.as_str(), f)).collect();
        let mut g = Generated {
            case: case.tag().into(),
            description: case.label().into(),
            files: plan.len(),
            ..Generated::default()
        };
        let mut differing = Vec::new();
        for f in plan {
            g.bytes += f.content.len();
            let old = base.get(f.name.as_str()).map(|b| &b.content);
            let same = match (&f.content, old) {
                (Content::Bytes(new), Some(Content::Bytes(old))) => new == old,
                (
                    Content::Shard { header, tensors },
                    Some(Content::Shard {
                        header: oh,
                        tensors: ot,
                    }),
                ) => header == oh && tensors == ot,
                _ => false,
            };
            if case != Case::Base && same {
                continue;
            }
            g.files_differing += 1;
            g.bytes_differing += f.content.len();
            match (&f.content, old) {
                (Content::Bytes(b), _) => g.changed_other_bytes += b.len() as u64,
                (Content::Shard { header, tensors }, old) => {
                    let (old_header, old_tensors): (&[u8], Vec<&Placed>) = match old {
                        Some(Content::Shard { header, tensors }) => {
                            (header, tensors.iter().collect())
                        }
                        _ => (&[], Vec::new()),
                    };
                    if header.as_slice() != old_header {
                        g.changed_header_bytes += header.len() as u64;
                    }
                    for t in tensors {
                        let kept = old_tensors
                            .iter()
                            .any(|o| o.def == t.def && o.version == t.version);
                        if !kept {
                            g.changed_tensors += 1;
                            g.changed_tensor_bytes += t.def.bytes;
                        }
                    }
                }
            }
            differing.push(f);
        }
        g.changed_bytes = if case == Case::Base {
            g.bytes
        } else {
            g.changed_tensor_bytes + g.changed_header_bytes + g.changed_other_bytes
        };
        (g, differing)
    }

    /// Writes `case` into `dir` (created). Files identical to the base's are hard-linked from
    /// `base_dir` rather than written again.
    pub fn write(&self, case: Case, dir: &Path, base_dir: &Path) -> Result<Generated> {
        let started = std::time::Instant::now();
        fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
        let plan = self.plan(case)?;
        let (mut g, to_write) = self.compare(case, &plan);
        for f in &plan {
            if !to_write.iter().any(|w| w.name == f.name) {
                link_or_copy(&base_dir.join(&f.name), &dir.join(&f.name))?;
            }
        }
        // Two writers: generation is CPU-bound and the machine may have only two cores.
        let threads = 2.min(to_write.len()).max(1);
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let mine: Vec<&&FilePlan> = to_write.iter().skip(t).step_by(threads).collect();
                    scope.spawn(move || -> Result<()> {
                        for f in mine {
                            write_file(&dir.join(&f.name), &f.content)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("writer thread panicked")))
                })
                .collect()
        });
        for r in results {
            r?;
        }
        g.seconds = started.elapsed().as_secs_f64();
        Ok(g)
    }
}

fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    if fs::hard_link(from, to).is_err() {
        fs::copy(from, to)
            .with_context(|| format!("could not copy {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

/// The 8-byte length and the JSON header, padded with spaces to a multiple of 8, for tensors laid
/// out end to end in the given order.
fn safetensors_header(tensors: &[Placed]) -> Result<Vec<u8>> {
    let mut json = String::from(r#"{"__metadata__":{"format":"pt"}"#);
    let mut offset = 0u64;
    for t in tensors {
        let shape: Vec<String> = t.def.shape.iter().map(u64::to_string).collect();
        write!(
            json,
            r#","{}":{{"dtype":"BF16","shape":[{}],"data_offsets":[{},{}]}}"#,
            t.def.name,
            shape.join(","),
            offset,
            offset + t.def.bytes
        )?;
        offset += t.def.bytes;
    }
    json.push('}');
    while json.len() % 8 != 0 {
        json.push(' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    Ok(out)
}

/// The content version of tensor `i` (model order) after `round` rounds: how many rounds
/// `1..=round` rewrote it.
fn round_version(i: usize, round: u32) -> u32 {
    (1..=round)
        .filter(|r| *r as usize % A_STRIDE == i % A_STRIDE)
        .count() as u32
}

impl Generator {
    /// Bytes of the tensors round `round` rewrites (what changed since round `round - 1`).
    pub fn round_changed_bytes(&self, round: u32) -> u64 {
        self.shape
            .tensors_in_order()
            .iter()
            .enumerate()
            .filter(|(i, _)| round_version(*i, round) != round_version(*i, round.saturating_sub(1)))
            .map(|(_, t)| t.bytes)
            .sum()
    }
}

/// FNV-1a of the name, mixed with the version: the seed of a tensor's content.
fn seed(name: &str, version: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ (u64::from(version) << 56) ^ u64::from(version)
}

/// A xorshift64 byte stream that can be read in pieces of any length.
struct Noise {
    x: u64,
    pending: [u8; 8],
    pending_len: usize,
}

impl Noise {
    fn new(seed: u64) -> Self {
        Noise {
            x: splitmix(seed),
            pending: [0; 8],
            pending_len: 0,
        }
    }

    fn step(&mut self) -> u64 {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        self.x
    }

    fn fill(&mut self, buf: &mut [u8]) {
        let take = self.pending_len.min(buf.len());
        let from = 8 - self.pending_len;
        buf[..take].copy_from_slice(&self.pending[from..from + take]);
        self.pending_len -= take;
        let mut words = buf[take..].chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.step().to_le_bytes());
        }
        let tail = words.into_remainder();
        if !tail.is_empty() {
            self.pending = self.step().to_le_bytes();
            tail.copy_from_slice(&self.pending[..tail.len()]);
            self.pending_len = 8 - tail.len();
        }
    }
}

fn write_file(path: &Path, content: &Content) -> Result<()> {
    let mut f =
        File::create(path).with_context(|| format!("could not create {}", path.display()))?;
    match content {
        Content::Bytes(b) => f.write_all(b)?,
        Content::Shard { header, tensors } => {
            let mut buf = vec![0u8; WRITE_BLOCK];
            let mut used = 0;
            let mut pending: &[u8] = header;
            let mut next = tensors.iter();
            let mut current: Option<(Noise, u64)> = None;
            loop {
                if !pending.is_empty() {
                    let n = pending.len().min(WRITE_BLOCK - used);
                    buf[used..used + n].copy_from_slice(&pending[..n]);
                    pending = &pending[n..];
                    used += n;
                } else if let Some((noise, left)) = &mut current {
                    let n = (*left).min((WRITE_BLOCK - used) as u64) as usize;
                    noise.fill(&mut buf[used..used + n]);
                    *left -= n as u64;
                    used += n;
                    if *left == 0 {
                        current = None;
                    }
                } else if let Some(t) = next.next() {
                    current = Some((Noise::new(seed(&t.def.name, t.version)), t.def.bytes));
                } else {
                    break;
                }
                if used == WRITE_BLOCK {
                    f.write_all(&buf)?;
                    used = 0;
                }
            }
            f.write_all(&buf[..used])?;
        }
    }
    f.flush()?;
    Ok(())
}

fn config_json(s: &Shape) -> Result<Vec<u8>> {
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.heads,
        "vocab_size": s.vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.44.0",
    });
    Ok(serde_json::to_vec_pretty(&config)?)
}

/// A BPE-shaped tokenizer.json of at least [`TOKENIZER_BYTES`]: a vocabulary of pseudo-random
/// lowercase tokens, then merges.
fn tokenizer_json(vocab: u64) -> Vec<u8> {
    let mut noise = Noise::new(0x0070_6b65_6e00);
    let mut word = |min: u64| {
        let mut b = [0u8; 8];
        noise.fill(&mut b);
        let r = u64::from_le_bytes(b);
        let len = (min + r % 8) as usize;
        (0..len)
            .map(|i| char::from(b'a' + ((r >> (i * 5)) % 26) as u8))
            .collect::<String>()
    };
    let mut out = String::from(
        "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],\"model\":{\"type\":\"BPE\",\"vocab\":{",
    );
    for id in 0..vocab {
        let sep = if id == 0 { "" } else { "," };
        let _ = write!(out, "{sep}\"{}{id}\":{id}", word(1));
    }
    out.push_str("},\"merges\":[");
    let mut first = true;
    while out.len() < TOKENIZER_BYTES {
        let sep = if first { "" } else { "," };
        first = false;
        let (a, b) = (word(2), word(2));
        let _ = write!(out, "{sep}\"{a} {b}\"");
    }
    out.push_str("]}}");
    out.into_bytes()
}

/// Sets every file's mtime under `dir` to `secs` seconds ago, so vial's local index trusts them
/// (it re-reads files modified within a second of its last write, as git does).
pub fn backdate(dir: &Path, secs: u64) -> Result<()> {
    let when = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            File::open(entry.path())?.set_modified(when)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_fill_the_target() {
        for gib in [0.25, 1.0, 4.0, 16.0] {
            let target = (gib * (1u64 << 30) as f64) as u64;
            let s = Shape::for_bytes(target).unwrap();
            assert!(s.tensor_bytes <= target, "{s:?}");
            assert!(s.tensor_bytes as f64 > target as f64 * 0.99, "{s:?}");
            assert!(s.layers >= 2);
        }
        // The shape bench/README.md quotes for the default size.
        let s = Shape::for_bytes(4 << 30).unwrap();
        assert_eq!(
            (s.hidden, s.intermediate, s.layers, s.vocab),
            (2560, 6912, 25, 32192)
        );
    }

    #[test]
    fn each_training_round_rewrites_a_twentieth_of_the_tensors_of_the_one_before() {
        let g = Generator::new(64 << 20, 4).unwrap();
        let tensors = g.shape.tensors_in_order().len();
        for round in 1..=25u32 {
            let changed = (0..tensors)
                .filter(|i| round_version(*i, round) != round_version(*i, round - 1))
                .count();
            // Every 20th tensor, starting at round % 20.
            let expected = (0..tensors)
                .filter(|i| i % A_STRIDE == round as usize % A_STRIDE)
                .count();
            assert_eq!(changed, expected, "round {round}");
            assert!(g.round_changed_bytes(round) > 0);
        }
        assert_eq!(g.round_changed_bytes(0), 0);
    }

    #[test]
    fn noise_is_the_same_in_any_pieces() {
        let mut whole = vec![0u8; 1000];
        Noise::new(5).fill(&mut whole);
        let mut pieces = vec![0u8; 1000];
        let mut n = Noise::new(5);
        let mut at = 0;
        for len in [3, 8, 13, 1, 500, 475] {
            n.fill(&mut pieces[at..at + len]);
            at += len;
        }
        assert_eq!(whole, pieces);
    }

    #[test]
    fn cases_differ_as_described() {
        let dir = std::env::temp_dir().join(format!("vial-ckpt-test-{}", std::process::id()));
        let g = Generator::new(64 << 20, 2).unwrap();
        let base = g
            .write(Case::Base, &dir.join("base"), &dir.join("base"))
            .unwrap();
        assert_eq!(base.changed_bytes, base.bytes);
        let shard = |c: &str, i: usize| fs::read(dir.join(c).join(g.shard_name(i))).unwrap();
        let b0 = shard("base", 0);
        let n = u64::from_le_bytes(b0[..8].try_into().unwrap()) as usize;
        assert_eq!((8 + n) % 8, 0);
        let spans = vial_core::safetensors::parse_header(&b0[8..8 + n], b0.len() as u64).unwrap();
        assert_eq!(spans.last().unwrap().end, b0.len() as u64);

        let b = g
            .write(Case::AddTensor, &dir.join("b"), &dir.join("base"))
            .unwrap();
        assert_eq!(b.changed_tensors, 1);
        assert_eq!(b.changed_tensor_bytes, ADDED_RANK * g.shape.hidden * 2);
        assert!(b.changed_header_bytes > 0 && b.changed_other_bytes > 0);
        assert_eq!(shard("b", 0), b0);

        let a = g
            .write(Case::Rewrite5, &dir.join("a"), &dir.join("base"))
            .unwrap();
        assert_eq!(a.changed_header_bytes, 0);
        let expected = (g.shape.tensors + A_STRIDE - 1 - A_OFFSET) / A_STRIDE;
        assert_eq!(a.changed_tensors, expected);
        let c = g
            .write(Case::LoraMerge, &dir.join("c"), &dir.join("base"))
            .unwrap();
        assert_eq!(c.changed_tensors as u64, 2 * g.shape.layers);
        assert_eq!(
            c.changed_tensor_bytes,
            4 * g.shape.layers * g.shape.hidden.pow(2)
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
