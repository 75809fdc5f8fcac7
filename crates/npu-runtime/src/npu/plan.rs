//! The dispatch plan: every kernel invocation of one forward pass, with every buffer
//! binding, built from the model geometry alone.
//!
//! A pass of `n ≤ max_rows` tokens at position `p` runs [`DispatchPlan::steps`] in
//! order with the pass arguments `(rows = n, position = p)`; nothing else changes
//! between passes. The order and the per-layer sequence are exactly the CPU
//! backend's, which is what lets the simulated device reproduce its bits.

use crate::model::HeadKind;
use crate::model::TargetConfig;

/// Index of a buffer in [`DispatchPlan::buffers`].
pub type BufferId = usize;

/// What a buffer holds, which decides how a device places it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferRole {
    /// Packed model weights, written once at load.
    Weights,
    /// Per-pass scratch rows (`max_rows × width`).
    Activations,
    /// Keys or values of one layer, kept across passes and rolled back by `truncate`.
    KvCache,
    /// Host → device each pass (token ids).
    Input,
    /// Device → host each pass (logits, final hidden rows, tap rows).
    Output,
}

/// Element type of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// Opaque bytes (q4 tiles, BF16 tables, token ids as u32 LE).
    Bytes,
    /// f32 values.
    F32,
}

/// One buffer of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    /// Name for people and errors (`layer3.q_proj`, `logits`, ...).
    pub name: String,
    /// Size in bytes (tile and embedding buffers padded to [`PAGE`]).
    pub bytes: usize,
    /// What it holds, which decides where a device places it.
    pub role: BufferRole,
    /// How its bytes are read.
    pub elem: Elem,
    /// For weight buffers: where the packed bytes come from.
    pub source: Option<WeightSource>,
}

/// The projections of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Projection {
    /// Query projection (`q_proj`).
    Q,
    /// Key projection (`k_proj`).
    K,
    /// Value projection (`v_proj`).
    V,
    /// Attention output projection (`o_proj`).
    O,
    /// MLP gate projection (`gate_proj`).
    Gate,
    /// MLP up projection (`up_proj`).
    Up,
    /// MLP down projection (`down_proj`).
    Down,
}

/// The norms of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// RMSNorm before attention (`input_layernorm`).
    Input,
    /// RMSNorm before the MLP (`post_attention_layernorm`).
    Post,
    /// Qwen3's per-head query norm (`q_norm`).
    Query,
    /// Qwen3's per-head key norm (`k_norm`).
    Key,
}

/// The package data a weight buffer is packed from (see [`super::pack`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightSource {
    /// A projection's q4 tiles, byte for byte, padded to a page.
    Tiles {
        /// Layer index.
        layer: usize,
        /// Which projection of the layer.
        projection: Projection,
    },
    /// `lm_head.weight` tiles.
    HeadTiles,
    /// The BF16 embedding table (lookup, and head of tied models).
    Embedding,
    /// A norm gain widened to f32.
    Gain {
        /// Layer index.
        layer: usize,
        /// Which norm of the layer.
        norm: Norm,
    },
    /// The final norm gain as f32.
    FinalNorm,
    /// Rope cos then sin tables for every position of the context (f32).
    RopeTable,
}

/// One kernel invocation. Buffer fields name what the kernel reads and writes;
/// `rows` (the pass's token count) and `position` come with each pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `out[i] = bf16 → f32 of table[tokens[i]]`.
    Embed {
        /// The BF16 embedding table.
        table: BufferId,
        /// Token ids of the pass (u32 LE).
        tokens: BufferId,
        /// Embedded rows (`rows × hidden` f32).
        out: BufferId,
    },
    /// Row-wise RMSNorm of `x` (width = gain length) into `out`.
    RmsNorm {
        /// Input rows.
        x: BufferId,
        /// Gain (`width` f32 values).
        gain: BufferId,
        /// Normalized rows.
        out: BufferId,
        /// Row width in elements.
        width: usize,
    },
    /// `out = x · Wᵀ` over q4 tiles (`w_rows × w_cols`).
    MatMulQ4 {
        /// The packed q4 tiles.
        weight: BufferId,
        /// Weight rows: the output width.
        w_rows: usize,
        /// Weight columns: the input width.
        w_cols: usize,
        /// Input rows (`rows × w_cols`).
        x: BufferId,
        /// Output rows (`rows × w_rows`).
        out: BufferId,
    },
    /// `out = x · Tᵀ` over a BF16 table (`w_rows × w_cols`): the tied head.
    MatMulBf16 {
        /// The BF16 table (the embedding).
        table: BufferId,
        /// Table rows: the output width (the vocabulary).
        w_rows: usize,
        /// Table columns: the input width (hidden).
        w_cols: usize,
        /// Input rows (`rows × w_cols`).
        x: BufferId,
        /// Output rows (`rows × w_rows`).
        out: BufferId,
    },
    /// Per-head RMSNorm (with `gain`) then rope at positions `position..`, in place.
    NormRope {
        /// Query or key rows (`heads × head_dim` each), rotated in place.
        x: BufferId,
        /// Heads per row.
        heads: usize,
        /// Per-head RMSNorm gain (Qwen3); `None` skips the norm.
        gain: Option<BufferId>,
        /// The rope cos/sin table.
        rope: BufferId,
    },
    /// Writes the pass's key and value rows at positions `position..` of a layer's cache.
    KvAppend {
        /// The pass's key rows.
        k: BufferId,
        /// The pass's value rows.
        v: BufferId,
        /// The layer's key cache.
        keys: BufferId,
        /// The layer's value cache.
        values: BufferId,
    },
    /// Causal attention of the pass's query rows over the cache (rows see `..=position + i`).
    Attention {
        /// Query rows, after rope.
        q: BufferId,
        /// The layer's key cache.
        keys: BufferId,
        /// The layer's value cache.
        values: BufferId,
        /// Attention output rows (`rows × q_dim`).
        out: BufferId,
    },
    /// `x += y`.
    Add {
        /// Rows updated in place.
        x: BufferId,
        /// Rows added to `x`.
        y: BufferId,
        /// Row width in elements.
        width: usize,
    },
    /// `gate = silu(gate) * up`.
    SwiGlu {
        /// Gate rows, overwritten with the result.
        gate: BufferId,
        /// Up-projection rows.
        up: BufferId,
        /// Row width in elements (the intermediate size).
        width: usize,
    },
    /// Copies rows of `from` into tap slot `slot` of the tap rows buffer `to`.
    TapCopy {
        /// Rows to copy: the residual stream, or the final-normed rows for the last layer.
        from: BufferId,
        /// The tap rows buffer (`rows × taps × hidden`).
        to: BufferId,
        /// Which tap the rows fill (index into [`PlanOptions::taps`]).
        slot: usize,
    },
}

/// Every kind of op, in a fixed order (manifest keys, comparison table rows).
pub const OP_KINDS: [&str; 10] = [
    "embed",
    "rms_norm",
    "matmul_q4",
    "matmul_bf16",
    "norm_rope",
    "kv_append",
    "attention",
    "add",
    "swiglu",
    "tap_copy",
];

impl Op {
    /// The op's kind: the key a kernel manifest maps to a kernel.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Embed { .. } => "embed",
            Op::RmsNorm { .. } => "rms_norm",
            Op::MatMulQ4 { .. } => "matmul_q4",
            Op::MatMulBf16 { .. } => "matmul_bf16",
            Op::NormRope { .. } => "norm_rope",
            Op::KvAppend { .. } => "kv_append",
            Op::Attention { .. } => "attention",
            Op::Add { .. } => "add",
            Op::SwiGlu { .. } => "swiglu",
            Op::TapCopy { .. } => "tap_copy",
        }
    }

    /// The buffers bound to this op, by argument name.
    pub fn buffers(&self) -> Vec<(&'static str, BufferId)> {
        match *self {
            Op::Embed { table, tokens, out } => {
                vec![("table", table), ("tokens", tokens), ("out", out)]
            }
            Op::RmsNorm { x, gain, out, .. } => vec![("x", x), ("gain", gain), ("out", out)],
            Op::MatMulQ4 { weight, x, out, .. } => vec![("weight", weight), ("x", x), ("out", out)],
            Op::MatMulBf16 { table, x, out, .. } => vec![("table", table), ("x", x), ("out", out)],
            Op::NormRope { x, gain, rope, .. } => {
                let mut b = vec![("x", x), ("rope", rope)];
                if let Some(g) = gain {
                    b.push(("gain", g));
                }
                b
            }
            Op::KvAppend { k, v, keys, values } => {
                vec![("k", k), ("v", v), ("keys", keys), ("values", values)]
            }
            Op::Attention {
                q,
                keys,
                values,
                out,
            } => {
                vec![("q", q), ("keys", keys), ("values", values), ("out", out)]
            }
            Op::Add { x, y, .. } => vec![("x", x), ("y", y)],
            Op::SwiGlu { gate, up, .. } => vec![("gate", gate), ("up", up)],
            Op::TapCopy { from, to, .. } => vec![("from", from), ("to", to)],
        }
    }

    /// The scalar arguments of this op for a pass, by name.
    pub fn scalars(&self, geometry: &Geometry, pass: PassArgs) -> Vec<(&'static str, u64)> {
        let mut s = vec![
            ("rows", pass.rows as u64),
            ("position", pass.position as u64),
        ];
        let g = geometry;
        match *self {
            Op::RmsNorm { width, .. } | Op::Add { width, .. } | Op::SwiGlu { width, .. } => {
                s.push(("width", width as u64))
            }
            Op::MatMulQ4 { w_rows, w_cols, .. } | Op::MatMulBf16 { w_rows, w_cols, .. } => {
                s.push(("n", w_rows as u64));
                s.push(("k", w_cols as u64));
            }
            Op::NormRope { heads, gain, .. } => {
                s.push(("heads", heads as u64));
                s.push(("head_dim", g.head_dim as u64));
                s.push(("has_gain", gain.is_some() as u64));
            }
            Op::KvAppend { .. } | Op::Attention { .. } => {
                s.push(("heads", g.num_heads as u64));
                s.push(("kv_heads", g.num_kv_heads as u64));
                s.push(("head_dim", g.head_dim as u64));
                s.push(("capacity", g.capacity as u64));
            }
            Op::TapCopy { slot, .. } => {
                s.push(("slot", slot as u64));
                s.push(("width", g.hidden as u64));
                s.push(("taps", g.taps as u64));
            }
            Op::Embed { .. } => s.push(("width", g.hidden as u64)),
        }
        s
    }

    /// The buffer this op writes.
    pub fn output(&self) -> BufferId {
        match *self {
            Op::Embed { out, .. }
            | Op::RmsNorm { out, .. }
            | Op::MatMulQ4 { out, .. }
            | Op::MatMulBf16 { out, .. }
            | Op::Attention { out, .. } => out,
            Op::NormRope { x, .. } | Op::Add { x, .. } => x,
            Op::KvAppend { keys, .. } => keys,
            Op::SwiGlu { gate, .. } => gate,
            Op::TapCopy { to, .. } => to,
        }
    }
}

/// The per-pass arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassArgs {
    /// Tokens in this pass (`1..=max_rows`).
    pub rows: usize,
    /// Position of the first token.
    pub position: usize,
}

/// What kernels need to know about the model beyond their buffers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Geometry {
    /// Width of the residual stream.
    pub hidden: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Vocabulary size: logits per row.
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Positions the KV buffers hold.
    pub capacity: usize,
    /// Rows one pass can carry.
    pub max_rows: usize,
    /// Tap layers in the tap rows buffer.
    pub taps: usize,
}

/// One step: an op and where it sits in the model (for plans printed to people).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The layer it belongs to; `None` for the embedding, final norm and head.
    pub layer: Option<usize>,
    /// Short name for people (`q_proj`, `kv append`, `residual`, ...).
    pub label: &'static str,
    /// The kernel invocation.
    pub op: Op,
}

/// Choices that shape the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// Where the logits come from: the q4 head tiles or the BF16 embedding.
    pub head: HeadKind,
    /// Rows per pass; longer passes run in chunks (same bits: kernels are batch invariant).
    pub max_rows: usize,
    /// KV positions to allocate (at most the model's max positions).
    pub context: usize,
    /// Tapped layers, in sink order.
    pub taps: Vec<usize>,
}

impl PlanOptions {
    /// Defaults for a model: its head default, 16 rows, its whole context, no taps.
    pub fn for_model(config: &TargetConfig) -> PlanOptions {
        PlanOptions {
            head: HeadKind::default_for(config, crate::Precision::F32),
            max_rows: 16,
            context: config.max_positions,
            taps: Vec::new(),
        }
    }
}

/// The whole plan: buffers, steps, and the buffers the host reads after a pass.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchPlan {
    /// The model geometry kernels receive.
    pub geometry: Geometry,
    /// Every buffer, indexed by [`BufferId`].
    pub buffers: Vec<BufferSpec>,
    /// The ops of one pass, in order.
    pub steps: Vec<Step>,
    /// Input: the pass's token ids.
    pub tokens: BufferId,
    /// Output: logits (`rows × vocab`).
    pub logits: BufferId,
    /// Output: final-normed hidden rows (`rows × hidden`).
    pub final_hidden: BufferId,
    /// Output: tap rows (`rows × taps × hidden`), when taps were asked for.
    pub tap_rows: Option<BufferId>,
    /// Per layer: the keys and values buffers.
    pub kv: Vec<(BufferId, BufferId)>,
    /// The options the plan was built with.
    pub options: PlanOptions,
}

struct Builder {
    buffers: Vec<BufferSpec>,
    steps: Vec<Step>,
}

impl Builder {
    fn buffer(&mut self, name: String, bytes: usize, role: BufferRole, elem: Elem) -> BufferId {
        self.buffers.push(BufferSpec {
            name,
            bytes,
            role,
            elem,
            source: None,
        });
        self.buffers.len() - 1
    }
    fn weight(&mut self, name: String, bytes: usize, elem: Elem, source: WeightSource) -> BufferId {
        let id = self.buffer(name, bytes, BufferRole::Weights, elem);
        self.buffers[id].source = Some(source);
        id
    }
    fn step(&mut self, layer: Option<usize>, label: &'static str, op: Op) {
        self.steps.push(Step { layer, label, op });
    }
}

/// Device buffers are allocated in whole pages; weight buffers are padded to this.
pub const PAGE: usize = 4096;

/// Bytes of a q4 tile grid of `rows × cols`, padded to a page.
pub fn packed_tile_bytes(rows: usize, cols: usize) -> usize {
    let grid = q4nx_format::TileGrid { rows, cols };
    grid.byte_len().unwrap_or(0).div_ceil(PAGE) * PAGE
}

impl DispatchPlan {
    /// Builds the plan of one forward pass of `config` with `options`.
    pub fn build(config: &TargetConfig, options: &PlanOptions) -> crate::Result<DispatchPlan> {
        let c = config;
        if c.family == crate::Family::Gemma3 {
            // The plan has no ops for Gemma's extra norms, GeGLU or sliding windows yet.
            return Err(crate::TargetError::Unsupported(
                "npu plan: the gemma3 family runs on the CPU backend only (no NPU ops for its sliding windows, post-norms and GeGLU yet)".into(),
            ));
        }
        if options.max_rows == 0 {
            return Err(crate::TargetError::Unsupported(
                "npu plan: max_rows must be at least 1".into(),
            ));
        }
        if options.context == 0 || options.context > c.max_positions {
            return Err(crate::TargetError::Unsupported(format!(
                "npu plan: context {} must be within 1..={} (max_position_embeddings)",
                options.context, c.max_positions
            )));
        }
        if let Some(&bad) = options.taps.iter().find(|&&l| l >= c.num_layers) {
            return Err(crate::TargetError::TapLayer {
                layer: bad,
                layers: c.num_layers,
            });
        }
        let (h, hd, rows) = (c.hidden_size, c.head_dim, options.max_rows);
        let f32_rows = |width: usize| rows * width * 4;
        let geometry = Geometry {
            hidden: h,
            head_dim: hd,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            vocab: c.vocab_size,
            rms_eps: c.rms_eps,
            capacity: options.context,
            max_rows: rows,
            taps: options.taps.len(),
        };
        let mut b = Builder {
            buffers: Vec::new(),
            steps: Vec::new(),
        };
        use BufferRole::*;
        let embed_bytes = (c.vocab_size * h * 2).div_ceil(PAGE) * PAGE;
        let table = b.weight(
            "embedding".into(),
            embed_bytes,
            Elem::Bytes,
            WeightSource::Embedding,
        );
        let rope = b.weight(
            "rope".into(),
            options.context * hd * 4,
            Elem::F32,
            WeightSource::RopeTable,
        );
        let tokens = b.buffer("tokens".into(), rows * 4, Input, Elem::Bytes);
        let x = b.buffer("x".into(), f32_rows(h), Activations, Elem::F32);
        let normed = b.buffer("normed".into(), f32_rows(h), Activations, Elem::F32);
        let q = b.buffer("q".into(), f32_rows(c.q_dim()), Activations, Elem::F32);
        let k = b.buffer("k".into(), f32_rows(c.kv_dim()), Activations, Elem::F32);
        let v = b.buffer("v".into(), f32_rows(c.kv_dim()), Activations, Elem::F32);
        let attn = b.buffer("attn".into(), f32_rows(c.q_dim()), Activations, Elem::F32);
        let proj = b.buffer("proj".into(), f32_rows(h), Activations, Elem::F32);
        let gate = b.buffer(
            "gate".into(),
            f32_rows(c.intermediate_size),
            Activations,
            Elem::F32,
        );
        let up = b.buffer(
            "up".into(),
            f32_rows(c.intermediate_size),
            Activations,
            Elem::F32,
        );
        let final_hidden = b.buffer("final_hidden".into(), f32_rows(h), Output, Elem::F32);
        let logits = b.buffer("logits".into(), f32_rows(c.vocab_size), Output, Elem::F32);
        let tap_rows = (!options.taps.is_empty()).then(|| {
            b.buffer(
                "tap_rows".into(),
                f32_rows(h * options.taps.len()),
                Output,
                Elem::F32,
            )
        });
        let kv_bytes = c.num_kv_heads * options.context * hd * 4;
        b.step(
            None,
            "embed",
            Op::Embed {
                table,
                tokens,
                out: x,
            },
        );
        let last = c.num_layers - 1;
        let mut kv = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let gain = |b: &mut Builder, norm: Norm, label: &str, width: usize| {
                b.weight(
                    format!("layer{l}.{label}"),
                    width * 4,
                    Elem::F32,
                    WeightSource::Gain { layer: l, norm },
                )
            };
            let tiles =
                |b: &mut Builder, projection: Projection, label: &str, n: usize, kk: usize| {
                    b.weight(
                        format!("layer{l}.{label}"),
                        packed_tile_bytes(n, kk),
                        Elem::Bytes,
                        WeightSource::Tiles {
                            layer: l,
                            projection,
                        },
                    )
                };
            let input_norm = gain(&mut b, Norm::Input, "input_norm", h);
            let post_norm = gain(&mut b, Norm::Post, "post_norm", h);
            let (q_norm, k_norm) = if c.family == crate::Family::Qwen3 {
                let qn = gain(&mut b, Norm::Query, "q_norm", hd);
                let kn = gain(&mut b, Norm::Key, "k_norm", hd);
                (Some(qn), Some(kn))
            } else {
                (None, None)
            };
            let wq = tiles(&mut b, Projection::Q, "q_proj", c.q_dim(), h);
            let wk = tiles(&mut b, Projection::K, "k_proj", c.kv_dim(), h);
            let wv = tiles(&mut b, Projection::V, "v_proj", c.kv_dim(), h);
            let wo = tiles(&mut b, Projection::O, "o_proj", h, c.q_dim());
            let wg = tiles(
                &mut b,
                Projection::Gate,
                "gate_proj",
                c.intermediate_size,
                h,
            );
            let wu = tiles(&mut b, Projection::Up, "up_proj", c.intermediate_size, h);
            let wd = tiles(
                &mut b,
                Projection::Down,
                "down_proj",
                h,
                c.intermediate_size,
            );
            let keys = b.buffer(format!("layer{l}.keys"), kv_bytes, KvCache, Elem::F32);
            let values = b.buffer(format!("layer{l}.values"), kv_bytes, KvCache, Elem::F32);
            kv.push((keys, values));
            let at = Some(l);
            let mm = |weight, w_rows, w_cols, x, out| Op::MatMulQ4 {
                weight,
                w_rows,
                w_cols,
                x,
                out,
            };
            b.step(
                at,
                "input norm",
                Op::RmsNorm {
                    x,
                    gain: input_norm,
                    out: normed,
                    width: h,
                },
            );
            b.step(at, "q_proj", mm(wq, c.q_dim(), h, normed, q));
            b.step(at, "k_proj", mm(wk, c.kv_dim(), h, normed, k));
            b.step(at, "v_proj", mm(wv, c.kv_dim(), h, normed, v));
            b.step(
                at,
                "q norm+rope",
                Op::NormRope {
                    x: q,
                    heads: c.num_heads,
                    gain: q_norm,
                    rope,
                },
            );
            b.step(
                at,
                "k norm+rope",
                Op::NormRope {
                    x: k,
                    heads: c.num_kv_heads,
                    gain: k_norm,
                    rope,
                },
            );
            b.step(at, "kv append", Op::KvAppend { k, v, keys, values });
            b.step(
                at,
                "attention",
                Op::Attention {
                    q,
                    keys,
                    values,
                    out: attn,
                },
            );
            b.step(at, "o_proj", mm(wo, h, c.q_dim(), attn, proj));
            b.step(
                at,
                "residual",
                Op::Add {
                    x,
                    y: proj,
                    width: h,
                },
            );
            b.step(
                at,
                "post norm",
                Op::RmsNorm {
                    x,
                    gain: post_norm,
                    out: normed,
                    width: h,
                },
            );
            b.step(
                at,
                "gate_proj",
                mm(wg, c.intermediate_size, h, normed, gate),
            );
            b.step(at, "up_proj", mm(wu, c.intermediate_size, h, normed, up));
            b.step(
                at,
                "swiglu",
                Op::SwiGlu {
                    gate,
                    up,
                    width: c.intermediate_size,
                },
            );
            b.step(at, "down_proj", mm(wd, h, c.intermediate_size, gate, proj));
            b.step(
                at,
                "residual",
                Op::Add {
                    x,
                    y: proj,
                    width: h,
                },
            );
            if let Some(to) = tap_rows {
                for (slot, &tap) in options.taps.iter().enumerate() {
                    if tap == l && l != last {
                        b.step(at, "tap", Op::TapCopy { from: x, to, slot });
                    }
                }
            }
        }
        let final_norm = b.weight(
            "final_norm".into(),
            h * 4,
            Elem::F32,
            WeightSource::FinalNorm,
        );
        b.step(
            None,
            "final norm",
            Op::RmsNorm {
                x,
                gain: final_norm,
                out: final_hidden,
                width: h,
            },
        );
        if let Some(to) = tap_rows {
            for (slot, &tap) in options.taps.iter().enumerate() {
                if tap == last {
                    b.step(
                        Some(last),
                        "tap",
                        Op::TapCopy {
                            from: final_hidden,
                            to,
                            slot,
                        },
                    );
                }
            }
        }
        match options.head {
            HeadKind::Tiles => {
                let head = b.weight(
                    "lm_head".into(),
                    packed_tile_bytes(c.vocab_size, h),
                    Elem::Bytes,
                    WeightSource::HeadTiles,
                );
                b.step(
                    None,
                    "lm_head",
                    Op::MatMulQ4 {
                        weight: head,
                        w_rows: c.vocab_size,
                        w_cols: h,
                        x: final_hidden,
                        out: logits,
                    },
                );
            }
            // `NpuTarget::new` refuses the int8 and screened heads; a plan built for it reads the BF16
            // embedding it was made from.
            HeadKind::Embedding | HeadKind::EmbeddingInt8 | HeadKind::Screened => {
                b.step(
                    None,
                    "lm_head (embedding)",
                    Op::MatMulBf16 {
                        table,
                        w_rows: c.vocab_size,
                        w_cols: h,
                        x: final_hidden,
                        out: logits,
                    },
                );
            }
        }
        Ok(DispatchPlan {
            geometry,
            buffers: b.buffers,
            steps: b.steps,
            tokens,
            logits,
            final_hidden,
            tap_rows,
            kv,
            options: options.clone(),
        })
    }

    /// Bytes of all buffers with `role`.
    pub fn bytes_of(&self, role: BufferRole) -> usize {
        self.buffers
            .iter()
            .filter(|b| b.role == role)
            .map(|b| b.bytes)
            .sum()
    }

    /// How many steps of each op kind, in [`OP_KINDS`] order (kinds that occur only).
    pub fn op_counts(&self) -> Vec<(&'static str, usize)> {
        OP_KINDS
            .iter()
            .map(|&kind| {
                (
                    kind,
                    self.steps.iter().filter(|s| s.op.kind() == kind).count(),
                )
            })
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// A short human summary: steps, op counts, buffer bytes by role.
    pub fn summary(&self) -> String {
        let mb = |b: usize| b as f64 / 1e6;
        let counts: Vec<String> = self
            .op_counts()
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect();
        format!(
            "{} steps per pass ({}); buffers: weights {:.1} MB, KV {:.1} MB ({} positions), activations {:.2} MB, in/out {:.2} MB; up to {} rows per pass",
            self.steps.len(),
            counts.join(", "),
            mb(self.bytes_of(BufferRole::Weights)),
            mb(self.bytes_of(BufferRole::KvCache)),
            self.geometry.capacity,
            mb(self.bytes_of(BufferRole::Activations)),
            mb(self.bytes_of(BufferRole::Input) + self.bytes_of(BufferRole::Output)),
            self.geometry.max_rows
        )
    }
}
