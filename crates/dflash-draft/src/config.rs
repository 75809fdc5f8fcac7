//! `config.json` of an NPU DFlash draft package, and the container scalars that must
//! repeat it.

use serde_json::Value;

use crate::error::{DraftError, Result};

/// The architecture name a DFlash (1) draft declares.
pub const ARCHITECTURE: &str = "DFlashDraftModel";
/// The DFlash 2 architecture (grouped dynamic convolutions, soft-capped logits and a
/// candidate selector on the DFlash backbone; see [`Dflash2`]).
pub const ARCHITECTURE_V2: &str = "DFlash2DraftModel";
/// The weight file of a package unless `config.json` names another (`weights`).
pub const DEFAULT_WEIGHTS: &str = "dflash_weight.q4nx";

/// Hyper-parameters and geometry of a draft.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftConfig {
    /// Draft decoder layers.
    pub num_layers: usize,
    /// Width of the draft's hidden state (the target's).
    pub hidden_size: usize,
    /// Width of each layer's MLP.
    pub intermediate_size: usize,
    /// Attention (query) heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention).
    pub num_kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Positions per draft block: the anchor token plus `block_size - 1` drafts.
    pub block_size: usize,
    /// The token filling the block's not-yet-drafted positions.
    pub mask_token_id: u32,
    /// The target layers whose hidden states are tapped as context, in order.
    pub target_layer_ids: Vec<usize>,
    /// Attention window over context positions; `None` is unlimited.
    pub sliding_window: Option<usize>,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Multiplies the block's token embeddings (1 when the package does not scale).
    pub embedding_scale: f32,
    /// The vocabulary the draft was trained for, when the config states it.
    pub vocab_size: Option<usize>,
    /// Positions the draft's rope was trained for (its position budget).
    pub max_position_embeddings: usize,
    /// The weight file, relative to the package.
    pub weights: String,
    /// DFlash 2's additions; `None` for a DFlash (1) draft.
    pub v2: Option<Dflash2>,
}

/// What a DFlash 2 draft adds to the DFlash backbone, as its `config.json` keys spell
/// them (z-lab's `dflash_config` values, which the importer lifts to the top level).
#[derive(Clone, Debug, PartialEq)]
pub struct Dflash2 {
    /// Taps of each grouped dynamic convolution (`conv_kernel_size`): tap `t` of block
    /// row `i` reads block row `i - t`.
    pub conv_kernel_size: usize,
    /// Channels sharing one dynamic coefficient (`conv_group_size`).
    pub conv_group_size: usize,
    /// Rank of the selector's pairwise term (`selector_rank`).
    pub selector_rank: usize,
    /// Unary candidates per position the selector rescores (`selector_top_k`).
    pub selector_top_k: usize,
    /// `final_logit_softcapping`; `None` (or 0 in the source) applies no cap.
    pub final_logit_softcapping: Option<f32>,
    /// `output_multiplier`: scales the head's logits before the cap (1 when absent).
    pub output_multiplier: f32,
}

impl Dflash2 {
    /// Channel groups of a hidden row: `hidden / conv_group_size`.
    pub fn conv_groups(&self, hidden: usize) -> usize {
        hidden / self.conv_group_size
    }

    /// Rows of a `kernel_projection`: two coefficient sets (the sublayer's input and its
    /// output) of `conv_kernel_size` taps per group.
    pub fn kernel_projection_rows(&self, hidden: usize) -> usize {
        2 * self.conv_kernel_size * self.conv_groups(hidden)
    }

    /// The unary logit of a head logit: `tanh(l · m / cap) · cap` (or `l · m` uncapped).
    pub fn unary(&self, logit: f32) -> f32 {
        let scaled = logit * self.output_multiplier;
        match self.final_logit_softcapping {
            Some(cap) => (scaled / cap).tanh() * cap,
            None => scaled,
        }
    }
}

/// The shortest decimal that reads back as the same f32 (1e-6, not 9.99999997e-7).
fn shortest(v: f32) -> f64 {
    format!("{v}").parse().unwrap_or(v as f64)
}

/// How a scalar tensor is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalarKind {
    /// `I64 [n]` integers.
    Ints,
    /// `F32 [1]`.
    Float,
}

/// The six container scalars and the config key each must equal. Their names in
/// FastFlowLM's packages are not public: this table is the one place to adopt them.
pub const SCALARS: [(&str, &str, ScalarKind); 6] = [
    ("dflash.block_size", "block_size", ScalarKind::Ints),
    ("dflash.sliding_window", "sliding_window", ScalarKind::Ints),
    (
        "dflash.target_layer_ids",
        "target_layer_ids",
        ScalarKind::Ints,
    ),
    (
        "dflash.embedding_scale",
        "embedding_scale",
        ScalarKind::Float,
    ),
    ("dflash.rope_theta", "rope_theta", ScalarKind::Float),
    ("dflash.rms_eps", "rms_norm_eps", ScalarKind::Float),
];

impl DraftConfig {
    /// The value the config gives for a scalar of [`SCALARS`] (integers as i64,
    /// floats as f32 bits widened; `sliding_window` none as 0).
    pub fn scalar_value(&self, key: &str) -> Vec<f64> {
        match key {
            "block_size" => vec![self.block_size as f64],
            "sliding_window" => vec![self.sliding_window.unwrap_or(0) as f64],
            "target_layer_ids" => self.target_layer_ids.iter().map(|&l| l as f64).collect(),
            "embedding_scale" => vec![self.embedding_scale as f64],
            "rope_theta" => vec![self.rope_theta as f64],
            "rms_norm_eps" => vec![self.rms_norm_eps as f64],
            _ => Vec::new(),
        }
    }

    /// Width of one context (tap) row: `taps * hidden`.
    pub fn context_width(&self) -> usize {
        self.target_layer_ids.len() * self.hidden_size
    }

    /// Reads and checks an NPU draft package's `config.json` value.
    pub fn from_json(path: &str, v: &Value) -> Result<DraftConfig> {
        let bad = |key: &str, problem: String| DraftError::Config {
            path: path.into(),
            key: key.into(),
            problem,
        };
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let arch = v
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .unwrap_or("");
        let is_v2 = match (model_type, arch) {
            ("dflash", ARCHITECTURE) => false,
            ("dflash2", ARCHITECTURE_V2) => true,
            ("dflash" | "dflash2", _) => {
                let want = if model_type == "dflash" {
                    ARCHITECTURE
                } else {
                    ARCHITECTURE_V2
                };
                return Err(bad(
                    "architectures",
                    format!("[0] is '{arch}', not '{want}' (model_type '{model_type}')"),
                ));
            }
            _ => {
                return Err(bad(
                    "model_type",
                    format!("is '{model_type}', not 'dflash' or 'dflash2'"),
                ))
            }
        };
        let uint = |key: &str| -> Result<usize> {
            match v.get(key) {
                None | Some(Value::Null) => Err(bad(key, "is missing".into())),
                Some(x) => x
                    .as_u64()
                    .filter(|&n| n <= 1 << 24)
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(key, format!("is {x}, not an integer up to 2^24"))),
            }
        };
        let positive = |key: &str| -> Result<usize> {
            let n = uint(key)?;
            if n == 0 {
                return Err(bad(key, "is 0".into()));
            }
            Ok(n)
        };
        let float = |key: &str, default: f32| -> Result<f32> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x
                    .as_f64()
                    .filter(|f| f.is_finite())
                    .map(|f| f as f32)
                    .ok_or_else(|| bad(key, format!("is {x}, not a finite number"))),
            }
        };
        let hidden = positive("hidden_size")?;
        let heads = positive("num_attention_heads")?;
        let kv_heads = positive("num_key_value_heads")?;
        let head_dim = match v.get("head_dim") {
            None | Some(Value::Null) => hidden / heads,
            Some(_) => positive("head_dim")?,
        };
        if heads % kv_heads != 0 {
            return Err(bad(
                "num_key_value_heads",
                format!("{kv_heads} does not divide num_attention_heads {heads}"),
            ));
        }
        if hidden % 32 != 0 {
            return Err(bad(
                "hidden_size",
                format!("{hidden} is not a multiple of 32, so the fusion matrix has no [hidden/32, taps*hidden, 32] layout"),
            ));
        }
        let intermediate = positive("intermediate_size")?;
        for (key, k) in [("hidden_size", hidden), ("intermediate_size", intermediate)] {
            if k % 32 != 0 {
                return Err(bad(
                    key,
                    format!("{k} is not a multiple of 32 (q4_1 groups)"),
                ));
            }
        }
        if (heads * head_dim) % 32 != 0 {
            return Err(bad(
                "head_dim",
                format!("{heads} heads x {head_dim} is not a multiple of 32 (q4_1 groups)"),
            ));
        }
        let mask_token_id = match v.get("mask_token_id") {
            Some(x) => x
                .as_u64()
                .filter(|&n| n <= u32::MAX as u64)
                .map(|n| n as u32)
                .ok_or_else(|| {
                    bad(
                        "mask_token_id",
                        format!("is {x}; no usable 'mask_token_id'"),
                    )
                })?,
            None => {
                return Err(bad(
                    "mask_token_id",
                    "is missing; no usable 'mask_token_id' (it is never defaulted)".into(),
                ))
            }
        };
        let vocab_size = match v.get("vocab_size") {
            None | Some(Value::Null) => None,
            Some(_) => Some(positive("vocab_size")?),
        };
        if let Some(vocab) = vocab_size {
            if mask_token_id as usize >= vocab {
                return Err(bad(
                    "mask_token_id",
                    format!("{mask_token_id} is not below vocab_size {vocab}"),
                ));
            }
        }
        let taps = match v.get("target_layer_ids") {
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_u64()
                        .filter(|&n| n <= 1 << 16)
                        .map(|n| n as usize)
                        .ok_or_else(|| {
                            bad(
                                "target_layer_ids",
                                format!("[{i}] is {x}, not a layer index"),
                            )
                        })
                })
                .collect::<Result<Vec<_>>>()?,
            Some(x) => {
                return Err(bad(
                    "target_layer_ids",
                    format!("is {x}, not a non-empty array"),
                ))
            }
            None => return Err(bad("target_layer_ids", "is missing".into())),
        };
        if let Some(i) = (1..taps.len()).find(|&i| taps[i] <= taps[i - 1]) {
            return Err(bad(
                "target_layer_ids",
                format!("is not strictly increasing at {i} ({:?})", taps),
            ));
        }
        let max_positions = match v.get("max_position_embeddings") {
            None | Some(Value::Null) => 4096,
            Some(_) => positive("max_position_embeddings")?,
        };
        let block_size = uint("block_size")?;
        if block_size < 2 {
            return Err(bad("block_size", format!("{block_size} drafts nothing (a block is the last token plus at least one mask)")));
        }
        if block_size > max_positions {
            return Err(bad(
                "block_size",
                format!("{block_size} exceeds the draft's position budget (max_position_embeddings {max_positions})"),
            ));
        }
        let sliding_window = match v.get("sliding_window") {
            None | Some(Value::Null) => None,
            Some(_) => match uint("sliding_window")? {
                0 => None,
                w => Some(w),
            },
        };
        let weights = match v.get("weights") {
            None | Some(Value::Null) => DEFAULT_WEIGHTS.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(x) => return Err(bad("weights", format!("is {x}, not a file name"))),
        };
        let v2 = match is_v2 {
            false => None,
            true => Some(Dflash2::from_json(
                path,
                v,
                hidden,
                block_size,
                vocab_size,
                sliding_window,
            )?),
        };
        Ok(DraftConfig {
            num_layers: positive("num_hidden_layers")?,
            hidden_size: hidden,
            intermediate_size: intermediate,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            block_size,
            mask_token_id,
            target_layer_ids: taps,
            sliding_window,
            rope_theta: float("rope_theta", 10000.0)?,
            rms_norm_eps: float("rms_norm_eps", 1e-6)?,
            embedding_scale: float("embedding_scale", 1.0)?,
            vocab_size,
            max_position_embeddings: max_positions,
            weights,
            v2,
        })
    }

    /// The config as the JSON an NPU package carries.
    pub fn to_json(&self) -> Value {
        let (arch, model_type) = match self.v2 {
            None => (ARCHITECTURE, "dflash"),
            Some(_) => (ARCHITECTURE_V2, "dflash2"),
        };
        let mut v = serde_json::json!({
            "architectures": [arch],
            "model_type": model_type,
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "block_size": self.block_size,
            "mask_token_id": self.mask_token_id,
            "target_layer_ids": self.target_layer_ids,
            "sliding_window": self.sliding_window,
            "rope_theta": shortest(self.rope_theta),
            "rms_norm_eps": shortest(self.rms_norm_eps),
            "embedding_scale": shortest(self.embedding_scale),
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
        });
        if let Some(d) = &self.v2 {
            v["conv_kernel_size"] = d.conv_kernel_size.into();
            v["conv_group_size"] = d.conv_group_size.into();
            v["selector_rank"] = d.selector_rank.into();
            v["selector_top_k"] = d.selector_top_k.into();
            v["final_logit_softcapping"] = d.final_logit_softcapping.map(shortest).into();
            v["output_multiplier"] = shortest(d.output_multiplier).into();
        }
        v
    }
}

impl Dflash2 {
    /// Reads and checks the DFlash 2 keys of a package config (the backbone's already
    /// checked values passed in).
    fn from_json(
        path: &str,
        v: &Value,
        hidden: usize,
        block_size: usize,
        vocab_size: Option<usize>,
        sliding_window: Option<usize>,
    ) -> Result<Dflash2> {
        let bad = |key: &str, problem: String| DraftError::Config {
            path: path.into(),
            key: key.into(),
            problem,
        };
        let positive = |key: &str| -> Result<usize> {
            match v.get(key) {
                None | Some(Value::Null) => {
                    Err(bad(key, "is missing (a DFlash 2 draft needs it)".into()))
                }
                Some(x) => x
                    .as_u64()
                    .filter(|&n| (1..=1 << 24).contains(&n))
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(key, format!("is {x}, not an integer in 1..=2^24"))),
            }
        };
        let kernel = positive("conv_kernel_size")?;
        if kernel > block_size {
            return Err(bad(
                "conv_kernel_size",
                format!("{kernel} exceeds block_size {block_size} (taps past the block start read only zeros)"),
            ));
        }
        let group = positive("conv_group_size")?;
        if !hidden.is_multiple_of(group) {
            return Err(bad(
                "conv_group_size",
                format!("{group} does not divide hidden_size {hidden}"),
            ));
        }
        let rank = positive("selector_rank")?;
        let top_k = positive("selector_top_k")?;
        let vocab = vocab_size.ok_or_else(|| {
            bad(
                "vocab_size",
                "is missing; a DFlash 2 draft's selector codebooks have one row per token".into(),
            )
        })?;
        if top_k > vocab {
            return Err(bad(
                "selector_top_k",
                format!("{top_k} exceeds vocab_size {vocab}"),
            ));
        }
        let float = |key: &str| -> Result<Option<f32>> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_f64()
                    .filter(|f| f.is_finite() && f.abs() < 1e30)
                    .map(|f| Some(f as f32))
                    .ok_or_else(|| bad(key, format!("is {x}, not a finite number"))),
            }
        };
        let final_logit_softcapping = match float("final_logit_softcapping")? {
            Some(cap) if cap < 0.0 => {
                return Err(bad(
                    "final_logit_softcapping",
                    format!("is {cap}; a cap is positive (0 or null: none)"),
                ))
            }
            Some(cap) if cap > 0.0 => Some(cap),
            _ => None,
        };
        let output_multiplier = float("output_multiplier")?.unwrap_or(1.0);
        if output_multiplier == 0.0 {
            return Err(bad(
                "output_multiplier",
                "is 0: every unary logit would be 0".into(),
            ));
        }
        if let Some(window) = sliding_window {
            // z-lab's non-causal window also hides block keys more than `window - 1`
            // ahead of a query; this forward shows a row every block key.
            if window < block_size {
                return Err(bad(
                    "sliding_window",
                    format!("{window} is smaller than block_size {block_size}: block rows would not all see each other"),
                ));
            }
        }
        Ok(Dflash2 {
            conv_kernel_size: kernel,
            conv_group_size: group,
            selector_rank: rank,
            selector_top_k: top_k,
            final_logit_softcapping,
            output_multiplier,
        })
    }
}
