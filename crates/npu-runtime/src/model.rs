//! A target package: `config.json` + `model.q4nx`, checked tensor by tensor.

use std::path::{Path, PathBuf};

use q4nx_format::{Container, Dtype, Q4Kind, Q4Matrix, TensorView};
use serde_json::Value;

use crate::error::{Result, TargetError};

/// Model families the runtime runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama (and SmolLM): no q/k norms.
    Llama,
    /// Qwen3: per-head RMSNorm on q and k before rope.
    Qwen3,
    /// Gemma 3 (text, `gemma3_text`): QK-norm, four norms per layer with `(1 + w)`
    /// gains, GeGLU (tanh GELU), the embedding scaled by √hidden, interleaved
    /// sliding-window and global layers with their own rope bases.
    Gemma3,
}

/// The MLP's activation of the gate projection (times the up projection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (`silu`): SwiGLU, Llama's and Qwen3's.
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`): GeGLU, Gemma's.
    GeluTanh,
}

/// What sets a family's forward apart from Llama's, read from the config. The default is
/// Llama's (and Qwen3's): no window, one rope base, `1/√head_dim`, no embedding scale,
/// plain gains, SiLU.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchVariant {
    /// Positions a sliding-window layer sees (itself and the `w - 1` before it).
    pub sliding_window: Option<usize>,
    /// Per layer, whether it attends through the window (empty: no layer does).
    pub sliding_layers: Vec<bool>,
    /// The rope base of the sliding-window layers (`rope_local_base_freq`); the global
    /// layers use `rope_theta`.
    pub rope_local_theta: Option<f64>,
    /// The attention score scale (`query_pre_attn_scalar^-0.5`; `head_dim^-0.5` when
    /// absent).
    pub attention_scale: Option<f32>,
    /// The factor the embedding rows are multiplied by (Gemma: √hidden, as f32).
    pub embed_scale: Option<f32>,
    /// RMSNorm gains are stored as `w` and applied as `1 + w` (Gemma); the `+1` is folded
    /// into the f32 gains at load, which is exactly transformers' `1.0 + w.float()`.
    pub norm_plus_one: bool,
    /// The MLP activation.
    pub activation: Activation,
}

impl Default for ArchVariant {
    fn default() -> ArchVariant {
        ArchVariant {
            sliding_window: None,
            sliding_layers: Vec::new(),
            rope_local_theta: None,
            attention_scale: None,
            embed_scale: None,
            norm_plus_one: false,
            activation: Activation::Silu,
        }
    }
}

/// The geometry and hyper-parameters of a target model.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetConfig {
    /// Architecture family, from `model_type`.
    pub family: Family,
    /// Vocabulary size: rows of the embedding and of the head.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// Decoder layers (`num_hidden_layers`).
    pub num_layers: usize,
    /// Query heads (`num_attention_heads`).
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention); `num_heads` when the config omits it.
    pub num_kv_heads: usize,
    /// Width of one head (`hidden_size / num_heads` unless given); always even, for rope.
    pub head_dim: usize,
    /// Rope base frequency (10000 when absent).
    pub rope_theta: f64,
    /// RMSNorm epsilon (`rms_norm_eps`, 1e-6 when absent).
    pub rms_eps: f32,
    /// Context length in positions (`max_position_embeddings`, 4096 when absent).
    pub max_positions: usize,
    /// Whether the head shares the embedding's weights.
    pub tie_word_embeddings: bool,
    /// Beginning-of-sequence token, if the config names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (the config gives one or a list; empty when absent).
    pub eos_token_ids: Vec<u32>,
    /// The chat template (Jinja source), if the config carries one.
    pub chat_template: Option<String>,
    /// The package's `lm_head.weight` tiles were re-quantized from a higher-precision
    /// tied embedding (`q4nx_lm_head_source: "requantized"`, written by onebit convert).
    pub lm_head_requantized: bool,
    /// The family's departures from Llama's forward (defaults for Llama and Qwen3).
    pub variant: ArchVariant,
}

impl TargetConfig {
    /// Reads and checks the `config.json` of the package directory `dir` (what
    /// [`TargetPackage::open`] does first; the tensors are not looked at).
    pub fn read(dir: &Path) -> Result<TargetConfig> {
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|e| TargetError::Io {
            path: config_path.display().to_string(),
            message: e.to_string(),
        })?;
        let json: Value = serde_json::from_str(&text).map_err(|e| TargetError::Config {
            path: config_path.display().to_string(),
            key: "(file)".into(),
            problem: format!("is not valid JSON: {e}"),
        })?;
        TargetConfig::from_json(&config_path, &json)
    }

    /// Reads a Hugging Face style `config.json`.
    pub fn from_json(path: &Path, v: &Value) -> Result<TargetConfig> {
        let p = path.display().to_string();
        let bad = |key: &str, problem: String| TargetError::Config {
            path: p.clone(),
            key: key.into(),
            problem,
        };
        let uint = |key: &str| -> Result<usize> {
            match v.get(key) {
                Some(x) => x
                    .as_u64()
                    .filter(|&n| n > 0 && n <= 1 << 24)
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(key, format!("is {x}, not a positive integer up to 2^24"))),
                None => Err(bad(key, "is missing".into())),
            }
        };
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let family = match model_type {
            "llama" => Family::Llama,
            "qwen3" => Family::Qwen3,
            "gemma3_text" => Family::Gemma3,
            other => {
                return Err(bad(
                    "model_type",
                    format!("is '{other}'; supported target families are 'llama', 'qwen3' and 'gemma3_text'"),
                ))
            }
        };
        if let Some(scaling) = v.get("rope_scaling").filter(|s| !s.is_null()) {
            let kind = scaling
                .get("rope_type")
                .or(scaling.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            if kind != "default" {
                return Err(bad(
                    "rope_scaling",
                    format!("type '{kind}' is not supported yet"),
                ));
            }
        }
        let hidden = uint("hidden_size")?;
        let heads = uint("num_attention_heads")?;
        let kv_heads = match v.get("num_key_value_heads") {
            Some(_) => uint("num_key_value_heads")?,
            None => heads,
        };
        if heads % kv_heads != 0 {
            return Err(bad(
                "num_key_value_heads",
                format!("{kv_heads} does not divide num_attention_heads {heads}"),
            ));
        }
        let head_dim = match v.get("head_dim") {
            Some(_) => uint("head_dim")?,
            None => hidden / heads,
        };
        if head_dim % 2 != 0 {
            return Err(bad(
                "head_dim",
                format!("{head_dim} is odd; rope needs an even head dimension"),
            ));
        }
        // transformers 5 writes `rope_parameters`, per layer type where layers differ
        // (Gemma 3: `full_attention` is the global base).
        let rope_parameters = v.get("rope_parameters");
        let rope_theta = v
            .get("rope_theta")
            .or_else(|| rope_parameters.and_then(|r| r.get("rope_theta")))
            .or_else(|| {
                rope_parameters
                    .and_then(|r| r.get("full_attention"))
                    .and_then(|r| r.get("rope_theta"))
            })
            .and_then(Value::as_f64)
            .unwrap_or(10000.0);
        if let Some(Value::Object(params)) = rope_parameters {
            // The rope types of the layer types (or of the one entry): only plain rope.
            for (key, entry) in params {
                let kind = match entry {
                    Value::Object(_) => entry.get("rope_type").and_then(Value::as_str),
                    _ if key == "rope_type" => entry.as_str(),
                    _ => continue,
                };
                if let Some(kind) = kind.filter(|k| *k != "default") {
                    return Err(bad(
                        "rope_parameters",
                        format!("rope type '{kind}' is not supported yet"),
                    ));
                }
            }
        }
        let rms_eps = v
            .get("rms_norm_eps")
            .and_then(Value::as_f64)
            .unwrap_or(1e-6) as f32;
        let eos_token_ids = match v.get("eos_token_id") {
            Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_u64)
                .map(|x| x as u32)
                .collect(),
            _ => Vec::new(),
        };
        let num_layers = uint("num_hidden_layers")?;
        let variant = match family {
            Family::Gemma3 => gemma3_variant(v, num_layers, hidden, &bad)?,
            Family::Llama | Family::Qwen3 => {
                for key in ["hidden_act", "hidden_activation"] {
                    if let Some(act) = v.get(key).filter(|a| !a.is_null()) {
                        if act.as_str() != Some("silu") {
                            return Err(bad(
                                key,
                                format!("is {act}; a {model_type} model runs SiLU ('silu')"),
                            ));
                        }
                    }
                }
                ArchVariant::default()
            }
        };
        Ok(TargetConfig {
            family,
            variant,
            vocab_size: uint("vocab_size")?,
            hidden_size: hidden,
            intermediate_size: uint("intermediate_size")?,
            num_layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            rope_theta,
            rms_eps,
            max_positions: v
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .unwrap_or(4096) as usize,
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            bos_token_id: v
                .get("bos_token_id")
                .and_then(Value::as_u64)
                .map(|x| x as u32),
            eos_token_ids,
            lm_head_requantized: v.get("q4nx_lm_head_source").and_then(Value::as_str)
                == Some("requantized"),
            chat_template: v
                .get("chat_template")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    /// The positions layer `l` sees when it is a sliding-window layer (`None`: every
    /// position up to its own).
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        match self.variant.sliding_layers.get(layer) {
            Some(true) => self.variant.sliding_window,
            _ => None,
        }
    }

    /// The rope base of layer `l`: the local base on a sliding-window layer that has
    /// one, `rope_theta` otherwise.
    pub fn rope_theta_of(&self, layer: usize) -> f64 {
        match (self.window_of(layer), self.variant.rope_local_theta) {
            (Some(_), Some(local)) => local,
            _ => self.rope_theta,
        }
    }

    /// The attention score scale: `query_pre_attn_scalar^-0.5` where the config gives
    /// it, `head_dim^-0.5` otherwise.
    pub fn attention_scale(&self) -> f32 {
        self.variant
            .attention_scale
            .unwrap_or_else(|| 1.0 / (self.head_dim as f32).sqrt())
    }

    /// Query width (`num_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    /// Key/value width (`num_kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Bytes of q4 tiles for a `rows × cols` matrix as a pass reads them: rows padded to
    /// 32, 5/8 of a byte a weight (4-bit codes, a BF16 scale and min per 32).
    pub fn tile_bytes(rows: usize, cols: usize) -> usize {
        rows.div_ceil(32)
            .saturating_mul(32)
            .saturating_mul(cols)
            .saturating_mul(5)
            / 8
    }

    /// Bytes of every layer's projection tiles (what a pass reads besides the head).
    pub fn layer_tile_bytes(&self) -> usize {
        let (h, tiles) = (self.hidden_size, TargetConfig::tile_bytes);
        let per_layer = tiles(self.q_dim(), h)
            + 2 * tiles(self.kv_dim(), h)
            + tiles(h, self.q_dim())
            + 2 * tiles(self.intermediate_size, h)
            + tiles(h, self.intermediate_size);
        per_layer.saturating_mul(self.num_layers)
    }

    /// Whether an int8 copy of the embedding (1.125 bytes a weight) would outweigh the
    /// layers' tiles: then the head is most of a decode pass's bytes, and the screened
    /// head reads about half of them (Gemma 3 270M: 189 MB against 63 MB of layers;
    /// SmolLM2-135M: 32 MB against 66 MB).
    pub fn int8_head_outweighs_the_layers(&self) -> bool {
        self.vocab_size
            .saturating_mul(self.hidden_size)
            .saturating_mul(9)
            / 8
            > self.layer_tile_bytes()
    }
}

/// Gemma 3's departures from Llama, each key checked by name: the window and which
/// layers slide (`layer_types`, else every `sliding_window_pattern`-th layer global), the
/// local rope base, `query_pre_attn_scalar`, GELU-tanh; soft-capping (null in Gemma 3)
/// is refused, as the forward has none.
fn gemma3_variant(
    v: &Value,
    num_layers: usize,
    hidden: usize,
    bad: &dyn Fn(&str, String) -> TargetError,
) -> Result<ArchVariant> {
    let window = match v.get("sliding_window") {
        Some(w) => w
            .as_u64()
            .filter(|&w| w > 0 && w <= 1 << 24)
            .map(|w| w as usize)
            .ok_or_else(|| {
                bad(
                    "sliding_window",
                    format!("is {w}, not a positive integer up to 2^24"),
                )
            })?,
        None => {
            return Err(bad(
                "sliding_window",
                "is missing (Gemma 3 needs its window)".into(),
            ))
        }
    };
    let sliding_layers: Vec<bool> = match (v.get("layer_types"), v.get("sliding_window_pattern")) {
        (Some(types), _) => {
            let types = types
                .as_array()
                .ok_or_else(|| bad("layer_types", format!("is {types}, not a list")))?;
            if types.len() != num_layers {
                return Err(bad(
                    "layer_types",
                    format!("has {} entries for {num_layers} layers", types.len()),
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(bad(
                        "layer_types",
                        format!("holds {t}; known: 'sliding_attention', 'full_attention'"),
                    )),
                })
                .collect::<Result<_>>()?
        }
        (None, Some(p)) => {
            let p = p.as_u64().filter(|&p| p > 0).ok_or_else(|| {
                bad(
                    "sliding_window_pattern",
                    format!("is {p}, not a positive integer"),
                )
            })?;
            (0..num_layers as u64).map(|i| (i + 1) % p != 0).collect()
        }
        (None, None) => {
            return Err(bad(
                "layer_types",
                "is missing, and so is sliding_window_pattern (which layers slide?)".into(),
            ))
        }
    };
    for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if let Some(cap) = v.get(key).filter(|c| !c.is_null()) {
            return Err(bad(
                key,
                format!("is {cap}; logit soft-capping is not implemented (Gemma 3 sets none)"),
            ));
        }
    }
    let act = v
        .get("hidden_activation")
        .filter(|a| !a.is_null())
        .or_else(|| v.get("hidden_act"));
    match act.and_then(Value::as_str) {
        None | Some("gelu_pytorch_tanh") => {}
        Some(other) => {
            return Err(bad(
                "hidden_activation",
                format!("is '{other}'; a Gemma 3 model runs 'gelu_pytorch_tanh'"),
            ))
        }
    }
    let local_key = v.get("rope_local_base_freq").or_else(|| {
        v.get("rope_parameters")
            .and_then(|r| r.get("sliding_attention"))
            .and_then(|r| r.get("rope_theta"))
    });
    let local = match local_key {
        None => 10000.0,
        Some(b) => b
            .as_f64()
            .filter(|b| b.is_finite() && *b > 0.0)
            .ok_or_else(|| {
                bad(
                    "rope_local_base_freq",
                    format!("is {b}, not a positive number"),
                )
            })?,
    };
    let attention_scale = match v.get("query_pre_attn_scalar") {
        None => None,
        Some(s) => {
            let s = s
                .as_f64()
                .filter(|s| s.is_finite() && *s > 0.0)
                .ok_or_else(|| {
                    bad(
                        "query_pre_attn_scalar",
                        format!("is {s}, not a positive number"),
                    )
                })?;
            // transformers: `scaling = query_pre_attn_scalar ** -0.5` (a Python float),
            // used in f32.
            Some(s.powf(-0.5) as f32)
        }
    };
    Ok(ArchVariant {
        sliding_window: Some(window),
        sliding_layers,
        rope_local_theta: Some(local),
        attention_scale,
        // transformers: `hidden_size ** 0.5` cast to the weights' dtype (f32 here).
        embed_scale: Some((hidden as f64).sqrt() as f32),
        norm_plus_one: true,
        activation: Activation::GeluTanh,
    })
}

/// The tensors of one decoder layer.
pub struct LayerWeights<'a> {
    /// RMSNorm gain before attention (`hidden` values).
    pub input_norm: Vec<f32>,
    /// RMSNorm gain before the MLP (`hidden` values): Llama's and Qwen3's
    /// `post_attention_layernorm`, Gemma's `pre_feedforward_layernorm`.
    pub post_norm: Vec<f32>,
    /// Gemma's norm of the attention output before the residual add
    /// (`post_attention_layernorm`); `None` for Llama and Qwen3.
    pub post_attn_norm: Option<Vec<f32>>,
    /// Gemma's norm of the MLP output before the residual add
    /// (`post_feedforward_layernorm`); `None` for Llama and Qwen3.
    pub post_ffn_norm: Option<Vec<f32>>,
    /// Qwen3's per-head query RMSNorm gain (`head_dim` values); `None` for Llama.
    pub q_norm: Option<Vec<f32>>,
    /// Qwen3's per-head key RMSNorm gain (`head_dim` values); `None` for Llama.
    pub k_norm: Option<Vec<f32>>,
    /// Query projection (`q_dim × hidden`).
    pub q: Q4Matrix<'a>,
    /// Key projection (`kv_dim × hidden`).
    pub k: Q4Matrix<'a>,
    /// Value projection (`kv_dim × hidden`).
    pub v: Q4Matrix<'a>,
    /// Attention output projection (`hidden × q_dim`).
    pub o: Q4Matrix<'a>,
    /// MLP gate projection (`intermediate × hidden`).
    pub gate: Q4Matrix<'a>,
    /// MLP up projection (`intermediate × hidden`).
    pub up: Q4Matrix<'a>,
    /// MLP down projection (`hidden × intermediate`).
    pub down: Q4Matrix<'a>,
}

/// The model's tensors as checked views: projections stay q4_1 tiles in the mapped
/// file; norm gains (a few KB) are widened to f32 once.
pub struct TargetWeights<'a> {
    /// The BF16 embedding table (`vocab × hidden`), read in place from the mapped file.
    pub embed: TensorView<'a>,
    /// RMSNorm gain after the last layer (`hidden` values).
    pub final_norm: Vec<f32>,
    /// The head's q4_1 tiles (`vocab × hidden`).
    pub lm_head: Q4Matrix<'a>,
    /// Per-layer tensors, in layer order.
    pub layers: Vec<LayerWeights<'a>>,
}

impl TargetWeights<'_> {
    /// Embedding rows of `tokens` (`tokens.len() × hidden`), widened from BF16.
    pub fn embed_rows(&self, config: &TargetConfig, tokens: &[u32]) -> Result<Vec<f32>> {
        let h = config.hidden_size;
        let mut out = Vec::with_capacity(tokens.len() * h);
        for &t in tokens {
            if t as usize >= config.vocab_size {
                return Err(TargetError::TokenOutOfRange {
                    token: t,
                    vocab: config.vocab_size,
                });
            }
            let row = &self.embed.bytes[t as usize * h * 2..(t as usize + 1) * h * 2];
            let widened = row
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32());
            match config.variant.embed_scale {
                // Gemma scales the rows by √hidden (one f32 multiply, as transformers).
                Some(scale) => out.extend(widened.map(|v| v * scale)),
                None => out.extend(widened),
            }
        }
        Ok(out)
    }

    /// Logits of final-normed hidden rows (`n × hidden` → `n × vocab`) with `head`.
    pub fn head_logits(
        &self,
        config: &TargetConfig,
        head: HeadKind,
        hidden: &[f32],
        n: usize,
        kernel: crate::kernels::Isa,
    ) -> Vec<f32> {
        let (v, h) = (config.vocab_size, config.hidden_size);
        let mut y = vec![0f32; n * v];
        match head {
            HeadKind::Tiles => crate::kernels::matmul(&self.lm_head, hidden, n, &mut y, kernel),
            HeadKind::Embedding | HeadKind::EmbeddingInt8 | HeadKind::Screened => {
                crate::kernels::dense::matmul_bf16(
                    self.embed.bytes,
                    v,
                    h,
                    hidden,
                    n,
                    &mut y,
                    kernel,
                )
            }
        }
        y
    }
}

/// A package on disk: its config and its mapped container.
pub struct TargetPackage {
    /// The package folder.
    pub dir: PathBuf,
    /// The parsed `config.json`.
    pub config: TargetConfig,
    /// The mapped `model.q4nx`.
    pub container: Container,
}

impl TargetPackage {
    /// Reads `config.json` and maps `model.q4nx`; [`TargetPackage::weights`] checks the tensors.
    pub fn open(dir: impl AsRef<Path>) -> Result<TargetPackage> {
        let dir = dir.as_ref().to_path_buf();
        let config = TargetConfig::read(&dir)?;
        let container = Container::open(dir.join("model.q4nx"))?;
        let package = TargetPackage {
            dir,
            config,
            container,
        };
        package.weights()?;
        Ok(package)
    }

    /// Every tensor the architecture needs, checked against the config; unknown
    /// tensors are refused (a package for another architecture).
    pub fn weights(&self) -> Result<TargetWeights<'_>> {
        let c = &self.container;
        let cfg = &self.config;
        let path = c.path();
        let mut used: Vec<String> = Vec::new();
        let mut tensor = |name: String| -> Result<TensorView<'_>> {
            used.push(name.clone());
            Ok(c.tensor(&name)?)
        };
        let plus_one = cfg.variant.norm_plus_one;
        let gain = |t: TensorView<'_>, len: usize| -> Result<Vec<f32>> {
            t.expect_dtype(Dtype::BF16)?;
            t.expect_shape(&[len])?;
            let mut g = t.to_f32()?;
            if plus_one {
                // Gemma's RMSNorm multiplies by `1 + w` computed in f32; adding the 1
                // here once gives the very same f32 gain.
                for v in &mut g {
                    *v += 1.0;
                }
            }
            Ok(g)
        };
        fn proj<'c>(path: &str, t: TensorView<'c>, n: usize, k: usize) -> Result<Q4Matrix<'c>> {
            if !k.is_multiple_of(32) {
                return Err(TargetError::Tensor {
                    path: path.into(),
                    tensor: t.name.into(),
                    problem: format!("input width {k} is not a multiple of 32"),
                });
            }
            Ok(Q4Matrix::from_tensor(&t, n, k, Q4Kind::Q4_1)?)
        }
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let embed = tensor("model.embed_tokens.weight".into())?;
        embed.expect_dtype(Dtype::BF16)?;
        embed.expect_shape(&[cfg.vocab_size, h])?;
        let final_norm = gain(tensor("model.norm.weight".into())?, h)?;
        let lm_head = proj(path, tensor("lm_head.weight".into())?, cfg.vocab_size, h)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            let (q_norm, k_norm) = match cfg.family {
                Family::Qwen3 | Family::Gemma3 => (
                    Some(gain(tensor(p("self_attn.q_norm.weight"))?, cfg.head_dim)?),
                    Some(gain(tensor(p("self_attn.k_norm.weight"))?, cfg.head_dim)?),
                ),
                Family::Llama => (None, None),
            };
            let input_norm = gain(tensor(p("input_layernorm.weight"))?, h)?;
            let (post_norm, post_attn_norm, post_ffn_norm) = match cfg.family {
                Family::Gemma3 => (
                    gain(tensor(p("pre_feedforward_layernorm.weight"))?, h)?,
                    Some(gain(tensor(p("post_attention_layernorm.weight"))?, h)?),
                    Some(gain(tensor(p("post_feedforward_layernorm.weight"))?, h)?),
                ),
                Family::Llama | Family::Qwen3 => (
                    gain(tensor(p("post_attention_layernorm.weight"))?, h)?,
                    None,
                    None,
                ),
            };
            layers.push(LayerWeights {
                input_norm,
                post_norm,
                post_attn_norm,
                post_ffn_norm,
                q_norm,
                k_norm,
                q: proj(path, tensor(p("self_attn.q_proj.weight"))?, cfg.q_dim(), h)?,
                k: proj(path, tensor(p("self_attn.k_proj.weight"))?, cfg.kv_dim(), h)?,
                v: proj(path, tensor(p("self_attn.v_proj.weight"))?, cfg.kv_dim(), h)?,
                o: proj(path, tensor(p("self_attn.o_proj.weight"))?, h, cfg.q_dim())?,
                gate: proj(path, tensor(p("mlp.gate_proj.weight"))?, inter, h)?,
                up: proj(path, tensor(p("mlp.up_proj.weight"))?, inter, h)?,
                down: proj(path, tensor(p("mlp.down_proj.weight"))?, h, inter)?,
            });
        }
        if let Some(extra) = c.tensors().find(|t| !used.iter().any(|u| u == t.name)) {
            return Err(TargetError::Tensor {
                path: path.into(),
                tensor: extra.name.into(),
                problem: format!(
                    "is not part of a {}-layer {:?} model (a package for another architecture?)",
                    cfg.num_layers, cfg.family
                ),
            });
        }
        Ok(TargetWeights {
            embed,
            final_norm,
            lm_head,
            layers,
        })
    }
}

/// Which weights score hidden rows into logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadKind {
    /// The package's `lm_head.weight` q4_1 tiles (what FastFlowLM's runtime uses).
    Tiles,
    /// The dense BF16 embedding, for tied models: exact where the tiles are a lossy
    /// re-quantization (3x the bytes of the tiles).
    Embedding,
    /// An int8 copy of the BF16 embedding (per-32-column scales, built at load), for
    /// tied models: close to the embedding at 1.1 bytes per weight, run by the `q8`
    /// family.
    EmbeddingInt8,
    /// The screened int8 head (`q8::matmul_screened`): the package's q4 lm_head tiles
    /// for every row, the int8 copy of the embedding for each row's
    /// [`SCREEN_CANDIDATES`] best; for tied vocabularies whose int8 head outweighs the
    /// layers (Gemma 3's 262144 rows), where it reads 56% of the int8 head's bytes.
    Screened,
}

/// Rows per input row whose exact int8 logits the screened head computes (measured on
/// Gemma 3 270M: see docs/speed.md).
pub const SCREEN_CANDIDATES: usize = 256;

impl HeadKind {
    /// The default for a package at a precision: for a tied model whose head tiles were
    /// re-quantized from its embedding, the embedding (its int8 copy at `q8`); the
    /// tiles otherwise.
    pub fn default_for(config: &TargetConfig, precision: Precision) -> HeadKind {
        match (
            config.tie_word_embeddings && config.lm_head_requantized,
            precision,
        ) {
            (true, Precision::F32) => HeadKind::Embedding,
            (true, _) if config.int8_head_outweighs_the_layers() => HeadKind::Screened,
            (true, _) => HeadKind::EmbeddingInt8,
            (false, _) => HeadKind::Tiles,
        }
    }

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            HeadKind::Tiles => "tiles",
            HeadKind::Embedding => "embedding",
            HeadKind::EmbeddingInt8 => "embedding-int8",
            HeadKind::Screened => "screened",
        }
    }
}

/// The arithmetic of the projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// f32 activations times q4 weights ([`crate::kernels::matmul()`]): the exact reference the
    /// fidelity tests use.
    F32,
    /// int8 activations (per row and 32-column group) times q4 weights in integer
    /// arithmetic ([`crate::kernels::q8`]): the fastest verify passes; batch-invariant;
    /// measurably less precise than `F32` (README).
    Q8,
    /// The `q8` kernels over two int8 levels per activation (the second quantizes the
    /// first's residual, ~15-bit activations): indistinguishable from `F32` on
    /// perplexity, KL divergence and top-1 agreement; twice the integer work per row.
    Q8x2,
}

impl Precision {
    /// The default: `Q8x2`.
    pub fn auto() -> Precision {
        Precision::Q8x2
    }

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Q8 => "q8",
            Precision::Q8x2 => "q8x2",
        }
    }

    /// The int8 levels of the integer precisions (`None` at `F32`).
    pub fn levels(self) -> Option<crate::kernels::q8::Levels> {
        match self {
            Precision::F32 => None,
            Precision::Q8 => Some(crate::kernels::q8::Levels::One),
            Precision::Q8x2 => Some(crate::kernels::q8::Levels::Two),
        }
    }
}
