//! Hugging Face safetensors model directory → Q4NX, for users who start from HF
//! checkpoints (and for the DFlash reference fixture's target).
//!
//! Llama/Qwen3/Gemma 3 (`gemma3_text`) names are already FastFlowLM's; Gemma's norm gains
//! stay transformers' `w` (the runtime multiplies by `1 + w`). Every 2-D projection becomes q4_1 tiles
//! with the tile rule (lossless when the weights are q4_1-representable, within half a
//! step otherwise); the embedding and 1-D tensors (norms) become BF16; a tied model
//! gets `lm_head.weight` tiled from the embedding, as the GGUF path does.

use std::path::Path;

use serde_json::Value;

use crate::ConvertError;
use q4nx_format::{encode_q4_1, Container, ContainerWriter, Dtype, TILE_BYTES};

/// Converts `dir` (`config.json` + `model.safetensors`). Returns the writer, the
/// config to write beside it, and the number of tensors.
pub fn convert_hf_dir(dir: &Path) -> Result<(ContainerWriter, Value, usize), ConvertError> {
    let config_path = dir.join("config.json");
    let label = config_path.display().to_string();
    let meta = |problem: String| ConvertError::Metadata {
        path: label.clone(),
        key: "(file)".into(),
        problem,
    };
    let text =
        std::fs::read_to_string(&config_path).map_err(|e| meta(format!("cannot be read: {e}")))?;
    let config: Value =
        serde_json::from_str(&text).map_err(|e| meta(format!("is not valid JSON: {e}")))?;
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !matches!(model_type.as_str(), "llama" | "qwen3" | "gemma3_text") {
        return Err(ConvertError::UnsupportedArchitecture {
            path: label,
            arch: model_type.clone(),
        });
    }
    let weights_path = dir.join("model.safetensors");
    if !weights_path.exists() {
        let sharded = dir.join("model.safetensors.index.json").exists();
        return Err(ConvertError::Metadata {
            path: dir.display().to_string(),
            key: "model.safetensors".into(),
            problem: if sharded {
                "is sharded (model.safetensors.index.json); merge the shards first".into()
            } else {
                "is missing".into()
            },
        });
    }
    let weights = Container::open(&weights_path)?;
    let mut writer = ContainerWriter::new();
    let mut count = 0;
    let mut has_head = false;
    for t in weights.tensors() {
        let values = t.to_f32()?;
        let is_projection = t.shape.len() == 2 && t.name != "model.embed_tokens.weight";
        let ok_name = t.name == "lm_head.weight"
            || t.name == "model.norm.weight"
            || t.name == "model.embed_tokens.weight"
            || t.name.starts_with("model.layers.");
        if !ok_name {
            return Err(ConvertError::UnknownTensor {
                path: weights.path().into(),
                tensor: t.name.into(),
                arch: model_type.clone(),
            });
        }
        has_head |= t.name == "lm_head.weight";
        if is_projection {
            let (n, k) = (t.shape[0], t.shape[1]);
            if k % 32 != 0 {
                return Err(ConvertError::Tensor {
                    path: weights.path().into(),
                    tensor: t.name.into(),
                    problem: format!("{k} columns are not whole groups of 32"),
                });
            }
            let tiles = encode_q4_1(&values, n, k)?;
            writer.add(
                t.name,
                Dtype::I8,
                &[tiles.len() / TILE_BYTES, TILE_BYTES],
                tiles,
            )?;
        } else {
            writer.add_bf16(t.name, t.shape, &values)?;
        }
        count += 1;
    }
    if !has_head {
        let embed = weights.tensor("model.embed_tokens.weight")?;
        let (n, k) = (embed.shape[0], embed.shape[1]);
        let tiles = encode_q4_1(&embed.to_f32()?, n, k)?;
        writer.add(
            "lm_head.weight",
            Dtype::I8,
            &[tiles.len() / TILE_BYTES, TILE_BYTES],
            tiles,
        )?;
        count += 1;
    }
    let gemma = model_type == "gemma3_text";
    let mut config = config;
    if gemma && !has_head {
        // Gemma's head is its embedding; the tiles above are a lossy 4-bit copy of it, so
        // the runtime scores with the BF16 embedding (or its int8 copy) instead, as it
        // does for a GGUF whose tied head was re-quantized.
        if let Some(obj) = config.as_object_mut() {
            obj.insert("q4nx_lm_head_source".into(), Value::from("requantized"));
        }
    }
    Ok((writer, config, count))
}
