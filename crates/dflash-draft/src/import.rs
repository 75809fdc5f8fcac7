//! Importing a z-lab (Hugging Face) DFlash draft as an NPU package.
//!
//! z-lab layout: `config.json` with `architectures ["DFlashDraftModel"]`, top-level
//! `block_size`, `dflash_config {mask_token_id, target_layer_ids}` and the usual Qwen3
//! keys; `model.safetensors` with `fc.weight [H, taps*H]` (row-major), `hidden_norm`,
//! `norm` and `layers.N.*` — no embedding and no head (the draft uses the target's).

use std::path::Path;

use q4nx_format::Container;
use serde_json::Value;

use crate::builder::PackageBuilder;
use crate::config::{DraftConfig, ARCHITECTURE};
use crate::error::{DraftError, Result};
use crate::package::{load_draft, Gain, Projection, TargetShape};

/// What an import did: tensors written and the largest change any value suffered.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImportReport {
    /// Tensors written to the package.
    pub tensors: usize,
    /// Largest |decoded - source| over projection weights (0 for q4_1-representable drafts).
    pub max_projection_error: f32,
    /// Largest |decoded - source| over norm gains (bf16 rounding).
    pub max_gain_error: f32,
    /// Largest |decoded - source| over the fusion matrix (bf16 rounding).
    pub max_fusion_error: f32,
    /// The package's inventory line (as `onebit inspect` prints it).
    pub inventory: String,
}

fn max_error(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The z-lab config rewritten as an NPU package config (validated by [`DraftConfig::from_json`]).
fn npu_config(path: &str, src: &Value, target: Option<&TargetShape>) -> Result<DraftConfig> {
    let arch = src
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .unwrap_or("");
    if arch != ARCHITECTURE {
        return Err(DraftError::Config {
            path: path.into(),
            key: "architectures".into(),
            problem: format!("[0] is '{arch}', not '{ARCHITECTURE}' (not a z-lab DFlash draft)"),
        });
    }
    let mut v = src.clone();
    let obj = v.as_object_mut().ok_or_else(|| DraftError::Config {
        path: path.into(),
        key: "(file)".into(),
        problem: "is not a JSON object".into(),
    })?;
    let dflash = obj.get("dflash_config").cloned().unwrap_or(Value::Null);
    for key in ["mask_token_id", "target_layer_ids"] {
        match dflash.get(key).or_else(|| src.get(key)) {
            Some(x) => {
                obj.insert(key.into(), x.clone());
            }
            None => {
                obj.remove(key);
            }
        }
    }
    obj.insert("model_type".into(), Value::from("dflash"));
    if obj.get("vocab_size").is_none_or(Value::is_null) {
        if let Some(t) = target {
            obj.insert("vocab_size".into(), Value::from(t.vocab_size));
        }
    }
    obj.remove("weights");
    DraftConfig::from_json(path, &v)
}

/// Imports `src_dir` into `out_dir`; with a target, also checks the pairing.
pub fn import_zlab(
    src_dir: &Path,
    out_dir: &Path,
    target: Option<&TargetShape>,
) -> Result<ImportReport> {
    let config_path = src_dir.join("config.json");
    let label = config_path.display().to_string();
    let text = std::fs::read_to_string(&config_path).map_err(|e| DraftError::Io {
        path: label.clone(),
        message: e.to_string(),
    })?;
    let src: Value = serde_json::from_str(&text).map_err(|e| DraftError::Config {
        path: label.clone(),
        key: "(file)".into(),
        problem: format!("is not valid JSON: {e}"),
    })?;
    let config = npu_config(&label, &src, target)?;
    let weights = Container::open(src_dir.join("model.safetensors"))?;
    let mut used: Vec<String> = Vec::new();
    let mut read = |name: String, shape: &[usize]| -> Result<Vec<f32>> {
        let t = weights.tensor(&name)?;
        t.expect_shape(shape)?;
        used.push(name);
        Ok(t.to_f32()?)
    };
    let mut builder = PackageBuilder::new(config.clone());
    let mut sources: Vec<(String, Vec<f32>)> = Vec::new();
    for layer in 0..config.num_layers {
        for which in Projection::ALL {
            let (n, k) = which.shape(&config);
            let hf = which
                .tensor_name(layer)
                .trim_start_matches("model.")
                .to_string();
            let values = read(hf, &[n, k])?;
            builder.projection(layer, which, &values)?;
            sources.push((which.tensor_name(layer), values));
        }
    }
    let mut gains = Vec::new();
    for gain in Gain::all(config.num_layers) {
        let hf = gain.tensor_name().trim_start_matches("model.").to_string();
        let values = read(hf, &[gain.len(&config)])?;
        builder.gain(gain, &values)?;
        gains.push((gain, values));
    }
    let fc = read(
        "fc.weight".into(),
        &[config.hidden_size, config.context_width()],
    )?;
    builder.fusion(&fc)?;
    if let Some(extra) = weights
        .tensors()
        .find(|t| !used.iter().any(|u| u == t.name))
    {
        return Err(DraftError::Tensor {
            path: weights.path().into(),
            tensor: extra.name.into(),
            problem: "has no place in a DFlash draft package".into(),
        });
    }
    builder.write(out_dir, Some(&src))?;

    // Read the package back through the loader and measure what the encoding changed.
    let draft = load_draft(out_dir)?;
    if let Some(t) = target {
        draft.check_target(t)?;
    }
    let mut report = ImportReport {
        tensors: draft.tensor_count(),
        inventory: draft.inventory_line(),
        ..Default::default()
    };
    for (layer, which) in (0..config.num_layers).flat_map(|l| Projection::ALL.map(|p| (l, p))) {
        let source = &sources[layer * 7
            + Projection::ALL
                .iter()
                .position(|&p| p == which)
                .unwrap_or(0)]
        .1;
        report.max_projection_error = report
            .max_projection_error
            .max(max_error(&draft.decode_projection(layer, which)?, source));
    }
    for (gain, values) in gains {
        report.max_gain_error = report
            .max_gain_error
            .max(max_error(&draft.decode_gain(gain)?, &values));
    }
    report.max_fusion_error = max_error(&draft.decode_fusion()?, &fc);
    Ok(report)
}
