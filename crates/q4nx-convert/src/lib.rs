//! # q4nx-convert
//!
//! Model conversion into Q4NX packages, kept out of the pure format crate
//! (`q4nx-format`, which knows no model architecture): the GGUF reader ([`gguf`]),
//! ggml's block codecs ([`ggml`]), the Hugging Face safetensors converter ([`hf`]),
//! the tokenizer writer ([`tokenizer`]) and the GGUF converter below.
//!
//! GGUF → Q4NX, following FastFlowLM's converter (`FLM_Q4NX_Converter`, commit dd0993c)
//! rule for rule, so the `model.q4nx` it writes is byte-identical to the reference's:
//!
//! - `token_embd` is dequantized (gguf-py arithmetic) and stored dense BF16;
//! - Q4_1 projections are re-tiled with their f16 `d`/`m` rounded to bf16; Q4_0 ones
//!   become signed-nibble tiles (`m = 0`);
//! - F32/F16/BF16 vectors (norms, `rope_freqs`) are stored as BF16;
//! - every other type is dequantized, rounded through bf16 and re-quantized with
//!   gguf-py's Q4_1 quantizer, then tiled;
//! - a GGUF without `output.weight` gets `lm_head.weight` tiled from the embedding's
//!   own blocks;
//! - Llama q/k rows are un-permuted from ggml's rope order per head
//!   (`(g p q) -> (g q p)` with `p = rope_dim / 2`, `q = 2`); Qwen3 needs none.
//!
//! Gemma 3 (no FastFlowLM reference output to match here): transformers' names, the
//! norm gains stored as transformers' `w` (the GGUF holds llama.cpp's `1 + w`), every
//! non-Q4 projection re-quantized (reported), the sliding-window geometry and Gemma's
//! published chat template in the config (see `docs/formats.md`).
//!
//! Two deliberate departures, reported in [`ConvertReport::differences`]: Q8_0 tensors are
//! re-quantized like every other non-Q4 type (the reference packs their int8 values
//! as if they were 4-bit codes), and 2-D float projections become tiles (the reference
//! stores them dense, which its runtime cannot use as projections).

#![warn(missing_docs)]

pub mod ggml;
pub mod gguf;
pub mod hf;
pub mod tokenizer;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use half::{bf16, f16};
use rayon::prelude::*;
use thiserror::Error;

use crate::ggml::Q4_1Block;
use crate::gguf::{GgmlType, GgufFile, GgufTensorInfo};
use q4nx_format::{
    ContainerWriter, Dtype, FormatError, Q4Group, TileBuilder, GROUP_COLS, TILE_BYTES,
};

/// Why a conversion was refused. Messages start `convert: <path>: `.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// Architecture '`arch`' is not supported (supported: llama, qwen3, gemma3).
    #[error(
        "convert: {path}: architecture '{arch}' is not supported (supported: llama, qwen3, gemma3)"
    )]
    UnsupportedArchitecture {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The architecture named.
        arch: String,
    },
    /// Metadata key '`key`' `problem`.
    #[error("convert: {path}: metadata key '{key}' {problem}")]
    Metadata {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The key concerned.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Tensor '`tensor`' has no place in a `arch` package.
    #[error("convert: {path}: tensor '{tensor}' has no place in a {arch} package")]
    UnknownTensor {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// The architecture named.
        arch: String,
    },
    /// Tensor '`tensor`': `problem`.
    #[error("convert: {path}: tensor '{tensor}': {problem}")]
    Tensor {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Missing tensor '`tensor`'.
    #[error("convert: {path}: missing tensor '{tensor}'")]
    MissingTensor {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
    },
    /// The GGUF file was refused.
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// Writing the container was refused.
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// Model families the converter knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama (and Llama-like, e.g. SmolLM2).
    Llama,
    /// Qwen3.
    Qwen3,
    /// Gemma 3 (text): four norms per layer, QK-norm, `(1 + w)` RMSNorm gains,
    /// interleaved sliding-window layers.
    Gemma3,
}

impl Family {
    /// From `general.architecture`.
    pub fn from_gguf(arch: &str) -> Option<Family> {
        match arch {
            "llama" => Some(Family::Llama),
            "qwen3" => Some(Family::Qwen3),
            "gemma3" => Some(Family::Gemma3),
            _ => None,
        }
    }
    /// The GGUF architecture name.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen3 => "qwen3",
            Family::Gemma3 => "gemma3",
        }
    }
}

/// Gemma 3's published chat template (the `<start_of_turn>` turns of the instruction-tuned
/// checkpoints' `tokenizer_config.json`; a system turn is folded into the first user
/// turn). A Gemma 3 GGUF without `tokenizer.chat_template` gets this one.
pub const GEMMA3_CHAT_TEMPLATE: &str = include_str!("gemma3_chat_template.jinja");

/// Every `sliding_window_pattern`-th layer of Gemma 3 attends globally, the others through
/// the sliding window (llama.cpp and transformers fix the pattern at 6 for Gemma 3; the
/// GGUF carries no key for it).
pub const GEMMA3_SLIDING_WINDOW_PATTERN: u64 = 6;

/// The rope base of Gemma 3's sliding-window layers (`rope_local_base_freq`; GGUF carries
/// only the global base, and llama.cpp fixes the local one at 10000 as transformers does).
pub const GEMMA3_LOCAL_ROPE_BASE: f64 = 10000.0;

/// How one tensor is turned into Q4NX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Dense BF16 of the dequantized values.
    Embedding,
    /// A 1-D float vector stored as BF16.
    Vector,
    /// A projection stored as q4_1 tiles; `rope_rows` un-permutes llama q/k rows.
    Projection { rope_rows: bool },
}

/// Maps a GGUF tensor name to its Q4NX name and role.
fn map_name(family: Family, name: &str) -> Option<(String, Role)> {
    let proj = Role::Projection { rope_rows: false };
    match name {
        "token_embd.weight" => return Some(("model.embed_tokens.weight".into(), Role::Embedding)),
        "output.weight" => return Some(("lm_head.weight".into(), proj)),
        "output_norm.weight" => return Some(("model.norm.weight".into(), Role::Vector)),
        "rope_freqs.weight" if family == Family::Llama => return Some((name.into(), Role::Vector)),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, local) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let llama_rope = family == Family::Llama;
    let (hf, role) = match local {
        "attn_q.weight" => (
            "self_attn.q_proj.weight",
            Role::Projection {
                rope_rows: llama_rope,
            },
        ),
        "attn_k.weight" => (
            "self_attn.k_proj.weight",
            Role::Projection {
                rope_rows: llama_rope,
            },
        ),
        "attn_v.weight" => ("self_attn.v_proj.weight", proj),
        "attn_output.weight" => ("self_attn.o_proj.weight", proj),
        "ffn_gate.weight" => ("mlp.gate_proj.weight", proj),
        "ffn_up.weight" => ("mlp.up_proj.weight", proj),
        "ffn_down.weight" => ("mlp.down_proj.weight", proj),
        "attn_norm.weight" => ("input_layernorm.weight", Role::Vector),
        // Gemma 3 norms the attention output before the residual add
        // (`post_attention_norm`), then the MLP input (`ffn_norm`, transformers'
        // `pre_feedforward_layernorm`), then the MLP output (`post_ffw_norm`).
        "ffn_norm.weight" if family == Family::Gemma3 => {
            ("pre_feedforward_layernorm.weight", Role::Vector)
        }
        "post_attention_norm.weight" if family == Family::Gemma3 => {
            ("post_attention_layernorm.weight", Role::Vector)
        }
        "post_ffw_norm.weight" if family == Family::Gemma3 => {
            ("post_feedforward_layernorm.weight", Role::Vector)
        }
        "ffn_norm.weight" => ("post_attention_layernorm.weight", Role::Vector),
        "attn_q_norm.weight" if family != Family::Llama => {
            ("self_attn.q_norm.weight", Role::Vector)
        }
        "attn_k_norm.weight" if family != Family::Llama => {
            ("self_attn.k_norm.weight", Role::Vector)
        }
        _ => return None,
    };
    Some((format!("model.layers.{layer}.{hf}"), role))
}

/// What a conversion did.
#[derive(Clone, Debug, Default)]
pub struct ConvertReport {
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub bytes: usize,
    /// Where and why the output differs from FastFlowLM's converter.
    pub differences: Vec<String>,
}

/// One converted tensor, ready for the writer.
struct Converted {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// A GGUF opened for conversion: family, geometry and the tensor plan.
pub struct GgufConverter<'a> {
    file: &'a GgufFile,
    /// The model family, from `general.architecture`.
    pub family: Family,
    /// Half the rope dimension: the `p` of the llama row un-permutation.
    rope_half: usize,
}

impl<'a> GgufConverter<'a> {
    /// Checks the architecture and the metadata the conversion needs.
    pub fn new(file: &'a GgufFile) -> Result<GgufConverter<'a>, ConvertError> {
        let path = file.path().to_string();
        let g = &file.gguf;
        let arch = g
            .metadata_value("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| ConvertError::Metadata {
                path: path.clone(),
                key: "general.architecture".into(),
                problem: "is missing or not a string".into(),
            })?;
        let family =
            Family::from_gguf(arch).ok_or_else(|| ConvertError::UnsupportedArchitecture {
                path: path.clone(),
                arch: arch.into(),
            })?;
        let key_u64 = |key: &str| {
            g.metadata_value(&format!("{arch}.{key}"))
                .and_then(|v| v.as_u64())
        };
        let rope_half = match family {
            // Qwen3 and Gemma 3 GGUFs keep transformers' rotate-half row order.
            Family::Qwen3 | Family::Gemma3 => 0,
            Family::Llama => {
                let heads = key_u64("attention.head_count");
                let hidden = key_u64("embedding_length");
                let rope_dim = key_u64("rope.dimension_count").or(match (hidden, heads) {
                    (Some(h), Some(n)) if n > 0 => Some(h / n),
                    _ => None,
                });
                match rope_dim {
                    Some(d) if d >= 2 && d % 2 == 0 && d <= 1 << 16 => d as usize / 2,
                    other => {
                        return Err(ConvertError::Metadata {
                            path,
                            key: format!("{arch}.rope.dimension_count"),
                            problem: format!(
                                "gives rope dimension {other:?}, not a positive even number"
                            ),
                        })
                    }
                }
            }
        };
        Ok(GgufConverter {
            file,
            family,
            rope_half,
        })
    }

    fn err(&self, tensor: &str, problem: String) -> ConvertError {
        ConvertError::Tensor {
            path: self.file.path().into(),
            tensor: tensor.into(),
            problem,
        }
    }

    /// Converts every tensor; `progress(done, total)` is called as tensors finish
    /// (from worker threads). Returns the writer holding the package's tensors.
    pub fn convert(
        &self,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<(ContainerWriter, ConvertReport), ConvertError> {
        let g = &self.file.gguf;
        let mut plan: Vec<(&GgufTensorInfo, String, Role)> = Vec::new();
        for t in &g.tensors {
            let (name, role) =
                map_name(self.family, &t.name).ok_or_else(|| ConvertError::UnknownTensor {
                    path: self.file.path().into(),
                    tensor: t.name.clone(),
                    arch: self.family.gguf_name().into(),
                })?;
            plan.push((t, name, role));
        }
        let embed = g
            .tensor("token_embd.weight")
            .ok_or_else(|| ConvertError::MissingTensor {
                path: self.file.path().into(),
                tensor: "token_embd.weight".into(),
            })?;
        if g.tensor("output.weight").is_none() {
            plan.push((
                embed,
                "lm_head.weight".into(),
                Role::Projection { rope_rows: false },
            ));
        }
        let total = plan.len();
        let done = AtomicUsize::new(0);
        let results: Vec<Result<(Converted, Option<String>), ConvertError>> = plan
            .par_iter()
            .map(|(info, name, role)| {
                let r = self.convert_one(info, name, *role);
                progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
                r
            })
            .collect();
        let mut writer = ContainerWriter::new();
        let mut report = ConvertReport::default();
        let mut differences = Vec::new();
        for r in results {
            let (c, difference) = r?;
            report.tensors += 1;
            report.bytes += c.data.len();
            differences.extend(difference);
            writer.add(c.name, c.dtype, &c.shape, c.data)?;
        }
        report.differences = group_differences(differences);
        Ok((writer, report))
    }

    fn convert_one(
        &self,
        info: &GgufTensorInfo,
        name: &str,
        role: Role,
    ) -> Result<(Converted, Option<String>), ConvertError> {
        let bytes = self.file.data(info);
        let dequant = || {
            ggml::dequantize(info.ggml_type, bytes).ok_or_else(|| {
                self.err(
                    &info.name,
                    format!(
                        "type {} cannot be dequantized by this converter",
                        info.ggml_type
                    ),
                )
            })
        };
        match role {
            Role::Embedding | Role::Vector => {
                if role == Role::Vector && info.dims.len() != 1 {
                    return Err(self.err(
                        &info.name,
                        format!("expected a vector, found dims {:?}", info.dims),
                    ));
                }
                if role == Role::Vector
                    && !matches!(
                        info.ggml_type,
                        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
                    )
                {
                    return Err(self.err(
                        &info.name,
                        format!("a norm stored as {} is not supported", info.ggml_type),
                    ));
                }
                let mut values = dequant()?;
                let mut difference = None;
                if self.family == Family::Gemma3 && role == Role::Vector {
                    // llama.cpp's converter stores Gemma's RMSNorm gains as `1 + w`
                    // (its graph multiplies by the gain as is); the package holds
                    // transformers' `w`, as a Hugging Face import does, and the runtime
                    // multiplies by `1 + w`. The GGUF's `1 + w` came from bf16 `w` and
                    // is exact in f32, so subtracting 1 gives `w` back exactly.
                    for v in &mut values {
                        *v -= 1.0;
                    }
                    difference = Some(format!(
                        "{name}: Gemma norm gain stored as transformers' w (the GGUF holds 1 + w)"
                    ));
                }
                let data = values
                    .iter()
                    .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                    .collect();
                Ok((
                    Converted {
                        name: name.into(),
                        dtype: Dtype::BF16,
                        shape: info.shape(),
                        data,
                    },
                    difference,
                ))
            }
            Role::Projection { rope_rows } => {
                if info.dims.len() != 2 {
                    return Err(self.err(
                        &info.name,
                        format!("expected a matrix, found dims {:?}", info.dims),
                    ));
                }
                let (rows, cols) = (info.rows(), info.cols());
                if cols % GROUP_COLS != 0 {
                    return Err(self.err(
                        &info.name,
                        format!("{cols} columns are not whole groups of {GROUP_COLS}"),
                    ));
                }
                let (groups, difference) = self.projection_groups(info, name, bytes, rows, cols)?;
                let row_of = |hf_row: usize| -> usize {
                    if !rope_rows {
                        return hf_row;
                    }
                    // HF row (g, q, p) sits at ggml row (g, p, q).
                    let head = 2 * self.rope_half;
                    let (g, r) = (hf_row / head, hf_row % head);
                    let (q, p) = (r / self.rope_half, r % self.rope_half);
                    g * head + p * 2 + q
                };
                if rope_rows && rows % (2 * self.rope_half) != 0 {
                    return Err(self.err(
                        &info.name,
                        format!(
                            "{rows} rows are not whole heads of rope dimension {}",
                            2 * self.rope_half
                        ),
                    ));
                }
                let per_row = cols / GROUP_COLS;
                let mut builder = TileBuilder::new(rows, cols)?;
                for hf_row in 0..rows {
                    let src = row_of(hf_row);
                    for gi in 0..per_row {
                        builder.set_group(hf_row, gi, &groups[src * per_row + gi]);
                    }
                }
                let data = builder.finish();
                Ok((
                    Converted {
                        name: name.into(),
                        dtype: Dtype::I8,
                        shape: vec![data.len() / TILE_BYTES, TILE_BYTES],
                        data,
                    },
                    difference,
                ))
            }
        }
    }

    /// The tile groups of a projection, row-major, in ggml row order.
    fn projection_groups(
        &self,
        info: &GgufTensorInfo,
        name: &str,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<(Vec<Q4Group>, Option<String>), ConvertError> {
        let to_bf16 = |h: f16| bf16::from_f32(h.to_f32());
        let from_q4_1 = |b: &Q4_1Block| Q4Group {
            d: to_bf16(b.d),
            m: to_bf16(b.m),
            q: b.q,
        };
        Ok(match info.ggml_type {
            GgmlType::Q4_1 => (
                bytes.chunks_exact(20).map(|b| from_q4_1(&Q4_1Block::from_bytes(b))).collect(),
                None,
            ),
            GgmlType::Q4_0 => (
                bytes
                    .chunks_exact(18)
                    .map(|b| {
                        let (d, q) = ggml::q4_0_block(b);
                        Q4Group {
                            d: to_bf16(d),
                            m: bf16::ZERO,
                            q: q.map(|v| (v as u8) & 0x0f),
                        }
                    })
                    .collect(),
                Some(format!(
                    "{name}: Q4_0 source, stored as signed-nibble tiles (read them with Q4Kind::Q4_0)"
                )),
            ),
            other => {
                let values = ggml::dequantize(other, bytes)
                    .ok_or_else(|| self.err(&info.name, format!("type {other} cannot be dequantized by this converter")))?;
                debug_assert_eq!(values.len(), rows * cols);
                let groups = values
                    .chunks_exact(GROUP_COLS)
                    .map(|chunk| {
                        let mut block = [0f32; GROUP_COLS];
                        for (b, &v) in block.iter_mut().zip(chunk) {
                            *b = bf16::from_f32(v).to_f32();
                        }
                        from_q4_1(&ggml::quantize_q4_1_block(&block))
                    })
                    .collect();
                let difference = match other {
                    GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K if self.family == Family::Gemma3 => Some(format!(
                        "{name}: {other} source re-quantized to Q4_1 tiles"
                    )),
                    GgmlType::Q8_0 => Some(format!(
                        "{name}: Q8_0 source re-quantized to Q4_1 (the reference packs Q8_0 int8 values as 4-bit codes, which is wrong)"
                    )),
                    GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Some(format!(
                        "{name}: {other} projection quantized to Q4_1 tiles (the reference stores it dense BF16)"
                    )),
                    _ => None,
                };
                (groups, difference)
            }
        })
    }

    /// The GGUF's metadata as a Hugging Face style `config.json` object.
    pub fn hf_config(&self) -> Result<serde_json::Value, ConvertError> {
        use serde_json::{json, Value};
        let g = &self.file.gguf;
        let arch = self.family.gguf_name();
        let path = self.file.path();
        let get = |key: &str| g.metadata_value(&format!("{arch}.{key}"));
        let need_u64 = |key: &str| -> Result<u64, ConvertError> {
            get(key)
                .and_then(|v| v.as_u64())
                .ok_or_else(|| ConvertError::Metadata {
                    path: path.into(),
                    key: format!("{arch}.{key}"),
                    problem: "is missing or not an unsigned integer".into(),
                })
        };
        let hidden = need_u64("embedding_length")?;
        let heads = need_u64("attention.head_count")?;
        if heads == 0 {
            return Err(ConvertError::Metadata {
                path: path.into(),
                key: format!("{arch}.attention.head_count"),
                problem: "is 0".into(),
            });
        }
        let kv_heads = get("attention.head_count_kv")
            .and_then(|v| v.as_u64())
            .unwrap_or(heads);
        let head_dim = get("attention.key_length")
            .and_then(|v| v.as_u64())
            .unwrap_or(hidden / heads);
        let tokens = g
            .metadata_value("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array());
        let embed = g.tensor("token_embd.weight");
        let vocab = tokens
            .map(|t| t.len() as u64)
            .or_else(|| get("vocab_size").and_then(|v| v.as_u64()))
            .or_else(|| embed.map(|e| e.rows() as u64))
            .unwrap_or(0);
        let tied = g.tensor("output.weight").is_none();
        let mut config = json!({
            "architectures": [match self.family { Family::Llama => "LlamaForCausalLM", Family::Qwen3 => "Qwen3ForCausalLM", Family::Gemma3 => "Gemma3ForCausalLM" }],
            "model_type": match self.family { Family::Gemma3 => "gemma3_text", _ => arch },
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": need_u64("feed_forward_length")?,
            "num_hidden_layers": need_u64("block_count")?,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": get("context_length").and_then(|v| v.as_u64()).unwrap_or(2048),
            "rms_norm_eps": get("attention.layer_norm_rms_epsilon").and_then(|v| v.as_f64()).map(round_f32).unwrap_or(1e-6),
            "rope_theta": get("rope.freq_base").and_then(|v| v.as_f64()).map(round_f32).unwrap_or(10000.0),
            "tie_word_embeddings": tied,
        });
        let obj = config.as_object_mut().expect("json! object");
        for (key, hf) in [
            ("tokenizer.ggml.bos_token_id", "bos_token_id"),
            ("tokenizer.ggml.eos_token_id", "eos_token_id"),
            ("tokenizer.ggml.padding_token_id", "pad_token_id"),
        ] {
            if let Some(id) = g.metadata_value(key).and_then(|v| v.as_u64()) {
                obj.insert(hf.into(), Value::from(id));
            }
        }
        // A tied head tiled from a non-Q4 embedding is a lossy 4-bit copy of it; say so,
        // so a runtime can prefer the BF16 embedding (onebit does).
        if tied && embed.is_some_and(|e| !matches!(e.ggml_type, GgmlType::Q4_0 | GgmlType::Q4_1)) {
            obj.insert("q4nx_lm_head_source".into(), Value::from("requantized"));
        }
        if self.family == Family::Gemma3 {
            // An instruction-tuned Gemma ends its turn with `<end_of_turn>`, which its
            // generation config lists beside EOS; the GGUF names only EOS.
            let end_of_turn =
                tokens.and_then(|t| t.iter().position(|v| v.as_str() == Some("<end_of_turn>")));
            if let (Some(turn), Some(eos)) =
                (end_of_turn, obj.get("eos_token_id").and_then(Value::as_u64))
            {
                if turn as u64 != eos {
                    obj.insert("eos_token_id".into(), json!([eos, turn]));
                }
            }
            let layers = need_u64("block_count")?;
            let window = need_u64("attention.sliding_window")?;
            // Layer i slides unless (i + 1) is a multiple of the pattern (transformers'
            // `layer_types`; llama.cpp's swa pattern 6 for Gemma 3).
            let layer_types: Vec<&str> = (0..layers)
                .map(|i| match (i + 1) % GEMMA3_SLIDING_WINDOW_PATTERN {
                    0 => "full_attention",
                    _ => "sliding_attention",
                })
                .collect();
            for (key, value) in [
                ("hidden_activation", json!("gelu_pytorch_tanh")),
                ("hidden_act", json!("gelu_pytorch_tanh")),
                ("sliding_window", json!(window)),
                (
                    "sliding_window_pattern",
                    json!(GEMMA3_SLIDING_WINDOW_PATTERN),
                ),
                ("layer_types", json!(layer_types)),
                ("rope_local_base_freq", json!(GEMMA3_LOCAL_ROPE_BASE)),
                // The attention scale is query_pre_attn_scalar^-0.5: llama.cpp scales by
                // 1/sqrt(key_length) for every Gemma 3 but the 27B, which no GGUF key
                // tells apart; the key length is what the published configs give.
                ("query_pre_attn_scalar", json!(head_dim)),
                ("final_logit_softcapping", Value::Null),
                ("attn_logit_softcapping", Value::Null),
            ] {
                obj.insert(key.into(), value);
            }
        }
        if let Some(t) = g
            .metadata_value("tokenizer.chat_template")
            .and_then(|v| v.as_str())
        {
            obj.insert("chat_template".into(), Value::from(t));
        } else if self.family == Family::Gemma3 {
            obj.insert("chat_template".into(), Value::from(GEMMA3_CHAT_TEMPLATE));
            // Read by `onebit convert`, which says on stderr that the template is the
            // family's published one, not the file's.
            obj.insert(
                "q4nx_chat_template_source".into(),
                Value::from("Gemma 3 published template"),
            );
        }
        let mut source = BTreeMap::new();
        if let Some(n) = g.metadata_value("general.name").and_then(|v| v.as_str()) {
            source.insert("general.name", n.to_string());
        }
        source.insert("converter", format!("onebit {}", env!("CARGO_PKG_VERSION")));
        obj.insert(
            "q4nx_source".into(),
            serde_json::to_value(source).expect("strings"),
        );
        Ok(config)
    }
}

/// Per-tensor differences (`"name: reason"`) with one reason shared by more than three
/// tensors become one line (`"N tensors (first, second, ...): reason"`), so a model whose
/// every projection was re-quantized reports it once, not a hundred times.
fn group_differences(lines: Vec<String>) -> Vec<String> {
    let mut by_reason: Vec<(String, Vec<String>)> = Vec::new();
    for line in lines {
        let (name, reason) = match line.split_once(": ") {
            Some((n, r)) => (n.to_string(), r.to_string()),
            None => (String::new(), line),
        };
        match by_reason.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, names)) => names.push(name),
            None => by_reason.push((reason, vec![name])),
        }
    }
    let mut out = Vec::new();
    for (reason, names) in by_reason {
        if names.len() > 3 {
            out.push(format!(
                "{} tensors ({}, {}, ...): {reason}",
                names.len(),
                names[0],
                names[1]
            ));
        } else {
            out.extend(names.into_iter().map(|n| match n.is_empty() {
                true => reason.clone(),
                false => format!("{n}: {reason}"),
            }));
        }
    }
    out
}

/// GGUF stores f32; print the shortest decimal that reads back as the same f32
/// (1e-5, not 9.999999747378752e-06).
fn round_f32(v: f64) -> f64 {
    let s = format!("{}", v as f32);
    s.parse().unwrap_or(v)
}

/// Entry points for the fuzz harness (`cargo xtask fuzz gguf`) and the property tests.
#[doc(hidden)]
pub mod fuzzing {
    /// Parses `bytes` as GGUF and, if accepted, dequantizes every tensor it can.
    pub fn exercise_gguf(bytes: &[u8]) -> bool {
        let Ok(g) = crate::gguf::Gguf::parse("fuzz", bytes) else {
            return false;
        };
        for t in &g.tensors {
            let data = &bytes[t.range.clone()];
            if let Some(values) = crate::ggml::dequantize(t.ggml_type, data) {
                assert_eq!(values.len() as u64, t.dims.iter().product::<u64>());
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_names_map_to_transformers_four_norms() {
        let name = |n: &str| map_name(Family::Gemma3, n).map(|(hf, _)| hf);
        assert_eq!(
            name("blk.3.ffn_norm.weight").as_deref(),
            Some("model.layers.3.pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            name("blk.3.post_attention_norm.weight").as_deref(),
            Some("model.layers.3.post_attention_layernorm.weight")
        );
        assert_eq!(
            name("blk.3.post_ffw_norm.weight").as_deref(),
            Some("model.layers.3.post_feedforward_layernorm.weight")
        );
        assert_eq!(
            name("blk.0.attn_k_norm.weight").as_deref(),
            Some("model.layers.0.self_attn.k_norm.weight")
        );
        // Gemma's q/k rows keep transformers' order; Llama's are un-permuted.
        assert_eq!(
            map_name(Family::Gemma3, "blk.0.attn_q.weight").map(|(_, r)| r),
            Some(Role::Projection { rope_rows: false })
        );
        // Llama has no post-attention or post-MLP norm.
        assert!(name("blk.0.post_ffw_norm.weight").is_some());
        assert!(map_name(Family::Llama, "blk.0.post_ffw_norm.weight").is_none());
        assert_eq!(
            map_name(Family::Llama, "blk.0.ffn_norm.weight")
                .map(|(hf, _)| hf)
                .as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
    }

    #[test]
    fn differences_shared_by_many_tensors_are_one_line() {
        let lines: Vec<String> = (0..5)
            .map(|i| format!("t{i}: Q5_0 source re-quantized"))
            .chain(["x: other".to_string()])
            .collect();
        assert_eq!(
            group_differences(lines),
            vec![
                "5 tensors (t0, t1, ...): Q5_0 source re-quantized".to_string(),
                "x: other".to_string()
            ]
        );
    }
}
