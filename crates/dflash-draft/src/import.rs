//! Importing a z-lab (Hugging Face) DFlash draft as an NPU package.
//!
//! z-lab layout: `config.json` with `architectures ["DFlashDraftModel"]`, top-level
//! `block_size`, `dflash_config {mask_token_id, target_layer_ids}` and the usual Qwen3
//! keys; `model.safetensors` with `fc.weight [H, taps*H]` (row-major), `hidden_norm`,
//! `norm` and `layers.N.*` — no embedding and no head (the draft uses the target's).
//!
//! A DFlash 2 draft (`architectures ["DFlash2DraftModel"]`) keeps its draft keys in
//! `dflash_config` (`block_size`, `conv_kernel_size`, `conv_group_size`, `selector_rank`,
//! `selector_top_k`, `final_logit_softcapping`, `output_multiplier`,
//! `input_embedding_scale`, ...; z-lab reads `dflash_config` first, then the top level)
//! and adds per layer `attention_conv` / `mlp_conv` (`base_kernel`,
//! `kernel_projection.weight`) and `candidate_selector.{hidden_projection.weight,
//! predecessor_codebook, successor_codebook}`, all copied as BF16.

use std::path::Path;

use q4nx_format::Container;
use serde_json::Value;

use crate::builder::PackageBuilder;
use crate::config::{DraftConfig, ARCHITECTURE, ARCHITECTURE_V2};
use crate::error::{DraftError, Result};
use crate::package::{load_draft, Gain, Projection, TargetShape};
use crate::v2::V2Tensor;

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
    /// Largest |decoded - source| over DFlash 2's convolutions and selector (bf16
    /// rounding; 0 for a DFlash (1) draft and for BF16 sources).
    pub max_v2_error: f32,
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
    let is_v2 = arch == ARCHITECTURE_V2;
    if arch != ARCHITECTURE && !is_v2 {
        return Err(DraftError::Config {
            path: path.into(),
            key: "architectures".into(),
            problem: format!(
                "[0] is '{arch}', not '{ARCHITECTURE}' or '{ARCHITECTURE_V2}' (not a z-lab DFlash draft)"
            ),
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
    if is_v2 {
        lift_v2_keys(path, src, obj, &dflash)?;
    }
    obj.insert(
        "model_type".into(),
        Value::from(if is_v2 { "dflash2" } else { "dflash" }),
    );
    if obj.get("vocab_size").is_none_or(Value::is_null) {
        if let Some(t) = target {
            obj.insert("vocab_size".into(), Value::from(t.vocab_size));
        }
    }
    obj.remove("weights");
    DraftConfig::from_json(path, &v)
}

/// DFlash 2's keys as z-lab reads them (`dflash_config` first, then the top level), and
/// its attention pattern reduced to what this forward runs (refused by name otherwise).
fn lift_v2_keys(
    path: &str,
    src: &Value,
    obj: &mut serde_json::Map<String, Value>,
    dflash: &Value,
) -> Result<()> {
    let bad = |key: &str, problem: String| DraftError::Config {
        path: path.into(),
        key: key.into(),
        problem,
    };
    for key in [
        "block_size",
        "conv_kernel_size",
        "conv_group_size",
        "selector_rank",
        "selector_top_k",
        "final_logit_softcapping",
        "output_multiplier",
    ] {
        if let Some(x) = dflash.get(key).or_else(|| src.get(key)) {
            obj.insert(key.into(), x.clone());
        }
    }
    if let Some(x) = dflash
        .get("input_embedding_scale")
        .or_else(|| src.get("input_embedding_scale"))
    {
        obj.insert("embedding_scale".into(), x.clone());
    }
    // Per layer: `sliding_attention` layers take `sliding_window` and are causal inside
    // the block unless `is_causal` says otherwise; `full_attention` layers neither.
    let types: Vec<String> = match src.get("layer_types") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some(s @ ("sliding_attention" | "full_attention")) => Ok(s.to_string()),
                _ => Err(bad(
                    "layer_types",
                    format!("[{i}] is {t}, not 'sliding_attention' or 'full_attention'"),
                )),
            })
            .collect::<Result<_>>()?,
        Some(x) => return Err(bad("layer_types", format!("is {x}, not an array"))),
    };
    let sliding = types.iter().filter(|t| *t == "sliding_attention").count();
    if sliding != 0 && sliding != types.len() {
        return Err(bad(
            "layer_types",
            format!("mixes sliding and full attention ({types:?}); one window for every layer is supported"),
        ));
    }
    let causal = match src.get("is_causal") {
        None | Some(Value::Null) => sliding > 0,
        Some(Value::Bool(b)) => *b,
        Some(x) => return Err(bad("is_causal", format!("is {x}, not true or false"))),
    };
    if causal {
        return Err(bad(
            "is_causal",
            "makes the block causal (set, or implied by sliding_attention layers); this forward's block is non-causal, as the published drafts' (`is_causal: false`)".into(),
        ));
    }
    if sliding == 0 {
        obj.remove("sliding_window");
    }
    Ok(())
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
    let mut v2_sources = Vec::new();
    for which in V2Tensor::all(config.num_layers) {
        let Some(shape) = which.shape(&config) else {
            break;
        };
        let values = read(which.source_name(), &shape)?;
        builder.v2_tensor(which, &values)?;
        v2_sources.push((which, values));
    }
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
    for (which, values) in v2_sources {
        report.max_v2_error = report
            .max_v2_error
            .max(max_error(&draft.decode_v2(which)?, &values));
    }
    Ok(report)
}
