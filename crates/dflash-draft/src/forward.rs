//! The DFlash draft forward (z-lab `DFlashDraftModel.forward`), on the target
//! runtime's CPU kernels.
//!
//! - Context: each committed position's tap row (the target's tap layers, concatenated
//!   in `target_layer_ids` order) is fused, `c = hidden_norm(fc · tap_row)`.
//! - [`DraftKvCache`]: per draft layer, the context keys `rope(k_norm(k_proj(c)))` and
//!   values `v_proj(c)` of committed positions only, in the target's KV layout
//!   (`onebit_kernels::kv`, f32 by default). Block keys and values are never kept: they
//!   are appended for the round's pass and truncated away before it returns.
//! - Block: `[last token, mask, ...]` (`block_size` tokens at positions `pos ..`),
//!   embedded with the target's embedding (a hook) times `embedding_scale`; per layer
//!   `x += o(attn(rms(x)))`, `x += mlp(rms(x))` where attention is **not causal**: every
//!   block query sees every context key (within the sliding window) and all block keys;
//!   queries are `rope(q_norm(q_proj(h)))`. Output `norm(x)`; rows `1..` are scored by
//!   a hook (the target's head + argmax), or, for a DFlash 2 draft, by its selector
//!   over the hook's head logits (soft-capped), walked from the anchor token.
//! - DFlash 2 wraps each sublayer in a grouped dynamic convolution over the block's rows
//!   (its input before, its output after; the equations are in `v2.rs`).
//!
//! [`draft_forward`] computes from scratch over all committed rows;
//! [`draft_forward_cached`] folds only new rows into a cache. Every kernel computes a row
//! the same way whatever the batch, so the two agree bit for bit.
//!
//! Arithmetic ([`DraftPrecision`]): the projections run in the `q8` integer family by
//! default (repacked at [`DraftModel::weights`], one int8 level of activations), or
//! in the `q4 × f32` family ([`DraftPrecision::F32`], the reference the z-lab trace
//! tests use). The draft only steers proposals — verification decides the text — so
//! its arithmetic changes which tokens are proposed, never which are emitted. At `q8`
//! the block's attention runs in the target's attention family
//! ([`kernels::attention::attention_visible`]: every block row sees the whole context and
//! block, sixteen positions at a time); at `f32`, and wherever a sliding window cuts the
//! context, it runs [`kernels::attend`], a query at a time. A round
//! runs inside [`DraftHooks::install`] (the target's thread team) and keeps its rope
//! tables in the cache, grown with the positions.

use onebit_kernels::kv::{KvCache, KvLayer, KvType};
use onebit_kernels::q8::{self, Levels, PackedQ4, QuantizedRows};
use onebit_kernels::{self as kernels, dense, matmul, Isa};
use q4nx_format::Q4Matrix;

use crate::config::DraftConfig;
use crate::error::{DraftError, Result};
use crate::package::{DraftModel, Gain, Projection};
use crate::v2::{self, ConvWeights, Selection, SelectorWeights, Sublayer, V2Tensor};

/// What the draft borrows from the target.
pub trait DraftHooks {
    /// The target's embedding rows of `tokens` (`tokens.len() x hidden`).
    fn embed(&self, tokens: &[u32]) -> Vec<f32>;
    /// Turns final-normed drafted rows (`n x hidden`) into tokens.
    fn pick(&self, hidden: &[f32], n: usize) -> Vec<u32>;
    /// The head's logits of final-normed drafted rows (`n x vocab`), the same head
    /// [`DraftHooks::pick`] picks from: what a DFlash 2 draft's selector rescores. `None`
    /// (the default) when the hooks offer only picks; a DFlash 2 round then fails by name.
    fn logits(&self, _hidden: &[f32], _n: usize) -> Option<Vec<f32>> {
        None
    }
    /// Runs `f` where the round's parallel loops should run: the target's thread team,
    /// so the round does not wake a second pool beside the one the passes spin on.
    /// The default runs `f` here (on a team already installed, else rayon's pool).
    fn install(&self, f: &mut dyn FnMut()) {
        f()
    }
}

/// The arithmetic of the draft's projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftPrecision {
    /// f32 activations times q4 weights: the reference (z-lab trace tests).
    F32,
    /// Activations quantized to one int8 level per row and 32-column group, times the
    /// q4 weights repacked at load (`onebit_kernels::q8`): the default, about a
    /// quarter of the f32 family's multiply work.
    Q8,
}

/// One layer's projections repacked for the `q8` family: k and v stacked (context rows
/// need only those), gate and up stacked.
struct PackedLayer {
    q: PackedQ4,
    kv: PackedQ4,
    o: PackedQ4,
    gate_up: PackedQ4,
    down: PackedQ4,
}

struct LayerViews<'a> {
    q: Q4Matrix<'a>,
    k: Q4Matrix<'a>,
    v: Q4Matrix<'a>,
    o: Q4Matrix<'a>,
    gate: Q4Matrix<'a>,
    up: Q4Matrix<'a>,
    down: Q4Matrix<'a>,
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    /// DFlash 2's convolutions around attention and MLP (`None` for DFlash 1).
    conv: Option<[ConvWeights<'a>; 2]>,
}

/// The draft's weights ready for the forward: tile views into the mapped file and the
/// (small) gains widened to f32.
pub struct DraftWeights<'a> {
    /// The draft's configuration.
    pub config: DraftConfig,
    layers: Vec<LayerViews<'a>>,
    /// The projections repacked for `q8` (empty at `F32`).
    packed: Vec<PackedLayer>,
    fc: &'a [u8],
    hidden_norm: Vec<f32>,
    final_norm: Vec<f32>,
    /// DFlash 2's candidate selector (`None` for DFlash 1).
    selector: Option<SelectorWeights<'a>>,
    kernel: Isa,
}

impl DraftModel {
    /// The weights for [`draft_forward`], with the fastest kernel this CPU has, at the
    /// default precision ([`DraftPrecision::Q8`]; [`DraftPrecision::F32`] when a
    /// projection's K is not a multiple of 32, which the integer family needs).
    pub fn weights(&self) -> Result<DraftWeights<'_>> {
        self.weights_at(Isa::detect(), DraftPrecision::Q8)
    }

    /// The reference weights: the f32 family ([`DraftPrecision::F32`]), fastest kernel.
    pub fn reference_weights(&self) -> Result<DraftWeights<'_>> {
        self.weights_at(Isa::detect(), DraftPrecision::F32)
    }

    /// The weights with an explicit matmul kernel, at [`DraftPrecision::F32`].
    pub fn weights_with(&self, kernel: Isa) -> Result<DraftWeights<'_>> {
        self.weights_at(kernel, DraftPrecision::F32)
    }

    /// The weights with an explicit kernel and precision (the `q8` projections are
    /// repacked here, once; the same size as the tiles).
    pub fn weights_at(&self, kernel: Isa, precision: DraftPrecision) -> Result<DraftWeights<'_>> {
        let mut layers = Vec::with_capacity(self.config.num_layers);
        let is_v2 = self.config.v2.is_some();
        let conv = |l: usize, s: Sublayer| -> Result<ConvWeights<'_>> {
            Ok(ConvWeights {
                base: self.decode_v2(V2Tensor::ConvBase(l, s))?,
                projection: self.v2_tensor(V2Tensor::ConvProjection(l, s))?.bytes,
            })
        };
        for l in 0..self.config.num_layers {
            layers.push(LayerViews {
                conv: match is_v2 {
                    false => None,
                    true => Some([conv(l, Sublayer::Attention)?, conv(l, Sublayer::Mlp)?]),
                },
                q: self.projection(l, Projection::Q)?,
                k: self.projection(l, Projection::K)?,
                v: self.projection(l, Projection::V)?,
                o: self.projection(l, Projection::O)?,
                gate: self.projection(l, Projection::Gate)?,
                up: self.projection(l, Projection::Up)?,
                down: self.projection(l, Projection::Down)?,
                input_norm: self.decode_gain(Gain::Input(l))?,
                post_norm: self.decode_gain(Gain::PostAttention(l))?,
                q_norm: self.decode_gain(Gain::QNorm(l))?,
                k_norm: self.decode_gain(Gain::KNorm(l))?,
            });
        }
        let integer = precision == DraftPrecision::Q8
            && layers.iter().all(|l| {
                [&l.q, &l.k, &l.o, &l.gate, &l.down]
                    .iter()
                    .all(|m| m.cols() % q8::GROUP == 0)
            });
        let packed = match integer {
            false => Vec::new(),
            // Every layer in one buffer, so the projections share huge pages.
            true => PackedQ4::stack_layers(&layers, |l| {
                [
                    vec![&l.q],
                    vec![&l.k, &l.v],
                    vec![&l.o],
                    vec![&l.gate, &l.up],
                    vec![&l.down],
                ]
            })
            .into_iter()
            .map(|[q, kv, o, gate_up, down]| PackedLayer {
                q,
                kv,
                o,
                gate_up,
                down,
            })
            .collect(),
        };
        Ok(DraftWeights {
            config: self.config.clone(),
            layers,
            packed,
            fc: self.fusion_stored()?,
            hidden_norm: self.decode_gain(Gain::Hidden)?,
            final_norm: self.decode_gain(Gain::Final)?,
            selector: match is_v2 {
                false => None,
                true => Some(SelectorWeights {
                    projection: self.v2_tensor(V2Tensor::SelectorProjection)?.bytes,
                    predecessor: self.v2_tensor(V2Tensor::PredecessorCodebook)?.bytes,
                    successor: self.v2_tensor(V2Tensor::SuccessorCodebook)?.bytes,
                }),
            },
            kernel,
        })
    }
}

impl DraftWeights<'_> {
    /// The arithmetic of the projections.
    pub fn precision(&self) -> DraftPrecision {
        if self.packed.is_empty() {
            DraftPrecision::F32
        } else {
            DraftPrecision::Q8
        }
    }

    fn project(&self, w: &Q4Matrix, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * w.rows()];
        matmul(w, x, n, &mut y, self.kernel);
        y
    }

    /// `q8` outputs of the (stacked) `w` over rows already quantized, one per part.
    fn project_q8(&self, w: &PackedQ4, x: &QuantizedRows, parts: usize) -> Vec<Vec<f32>> {
        let y = q8::matmul_q4_levels(w, x, Levels::One, self.kernel);
        let (n, stride) = (x.rows(), w.stride());
        if parts == 1 && w.part(0).len() == stride {
            return vec![y];
        }
        (0..parts)
            .map(|p| {
                let range = w.part(p);
                let mut out = Vec::with_capacity(n * range.len());
                for i in 0..n {
                    out.extend_from_slice(&y[i * stride + range.start..i * stride + range.end]);
                }
                out
            })
            .collect()
    }

    /// `w · x` for a row-major BF16 `w` of `rows x hidden`, over `n` rows (the `dense`
    /// family: every row computed the same way whatever `n`).
    fn project_bf16(&self, w: &[u8], rows: usize, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * rows];
        dense::matmul_bf16(w, rows, self.config.hidden_size, x, n, &mut y, self.kernel);
        y
    }

    /// Keys (before norm and rope) and values of `n` rows of `x` for layer `l`.
    fn kv(&self, l: usize, x: &[f32], xq: &mut QuantizedRows, n: usize) -> (Vec<f32>, Vec<f32>) {
        let layer = &self.layers[l];
        match self.packed.get(l) {
            Some(p) => {
                xq.quantize_from(x, n, self.config.hidden_size);
                let mut kv = self.project_q8(&p.kv, xq, 2);
                let v = kv.pop().expect("two parts");
                let k = kv.pop().expect("two parts");
                (k, v)
            }
            None => (self.project(&layer.k, x, n), self.project(&layer.v, x, n)),
        }
    }
}

/// `hidden_norm(fc · tap_row)` for `n` tap rows (`n x taps*hidden` → `n x hidden`).
pub fn fuse_context(w: &DraftWeights, tap_rows: &[f32], n: usize) -> Vec<f32> {
    let c = &w.config;
    let (h, width) = (c.hidden_size, c.context_width());
    let mut fused = vec![0f32; n * h];
    dense::matmul_bf16_block_columns(w.fc, h, width, tap_rows, n, &mut fused, w.kernel);
    let mut out = vec![0f32; n * h];
    kernels::rms_norm(&fused, &w.hidden_norm, c.rms_norm_eps, &mut out);
    out
}

/// Rope cos/sin per position (`[pos][head_dim / 2]`), grown on demand: a function of
/// the position only, so growing it never changes a value already there.
#[derive(Clone, Debug, Default)]
struct RopeTables {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTables {
    /// Makes sure positions `0..end` are in the tables.
    fn ensure(&mut self, c: &DraftConfig, end: usize) {
        let half = (c.head_dim / 2).max(1);
        for p in self.cos.len() / half..end {
            let (a, b) = kernels::rope_table(c.rope_theta as f64, c.head_dim, p);
            self.cos.extend(a);
            self.sin.extend(b);
        }
    }
}

/// Context keys and values of committed positions, per draft layer, in the KV layout
/// the target's CPU backend uses ([`KvCache`]: per kv head, keys in 64-position blocks
/// and values row-major, at a [`KvType`]; f32 by default, exact), and the rope tables
/// they were made with.
#[derive(Clone, Debug)]
pub struct DraftKvCache {
    kv: KvCache,
    len: usize,
    rope: RopeTables,
}

/// Equal when they hold the same positions' keys and values at the same [`KvType`] (the
/// rope tables are a function of the position, whatever length they have grown to).
impl PartialEq for DraftKvCache {
    fn eq(&self, other: &DraftKvCache) -> bool {
        self.len == other.len && self.kv == other.kv
    }
}

impl DraftKvCache {
    /// An empty cache for `config`, storing f32 keys and values (the draft's results are
    /// those of exact storage).
    pub fn new(config: &DraftConfig) -> DraftKvCache {
        DraftKvCache::with_kv_type(config, KvType::F32)
    }

    /// An empty cache for the weights' arithmetic: at [`DraftPrecision::Q8`] bf16 keys
    /// and values (half the bytes a round's attention reads over the context, as the
    /// target's default cache), at [`DraftPrecision::F32`] exact f32 storage (the
    /// reference). [`draft_forward`] and the speculative loop's head both use it.
    pub fn for_weights(w: &DraftWeights<'_>) -> DraftKvCache {
        let kv_type = match w.precision() {
            DraftPrecision::Q8 => KvType::Bf16,
            DraftPrecision::F32 => KvType::F32,
        };
        DraftKvCache::with_kv_type(&w.config, kv_type)
    }

    /// An empty cache for `config` storing keys and values at `kv_type` (converted once,
    /// as each position is folded in, by the target's rules).
    pub fn with_kv_type(config: &DraftConfig, kv_type: KvType) -> DraftKvCache {
        DraftKvCache {
            kv: KvCache::new(
                kv_type,
                config.num_layers,
                config.num_kv_heads,
                config.head_dim,
            ),
            len: 0,
            rope: RopeTables::default(),
        }
    }

    /// Committed positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The storage type of the keys and values.
    pub fn kv_type(&self) -> KvType {
        self.kv.kv_type()
    }

    /// The keys and values of draft layer `l` (committed positions only).
    pub fn layer(&self, l: usize) -> &KvLayer {
        self.kv.layer(l)
    }

    /// Bytes the keys and values hold.
    pub fn byte_len(&self) -> usize {
        self.kv.byte_len()
    }

    /// Keeps the first `len` positions (no-op past [`DraftKvCache::len`]); the cache
    /// then equals one that was only ever given those positions.
    pub fn truncate(&mut self, len: usize) {
        self.kv.truncate(len);
        self.len = self.len.min(len);
    }

    /// Folds `n` new committed tap rows in, at positions `len() .. len() + n`.
    pub fn fold(&mut self, w: &DraftWeights, tap_rows: &[f32], n: usize) -> Result<()> {
        let c = &w.config;
        if tap_rows.len() != n * c.context_width() {
            return Err(DraftError::Tensor {
                path: "<forward>".into(),
                tensor: "tap rows".into(),
                problem: format!(
                    "{} values are not {n} rows of {}",
                    tap_rows.len(),
                    c.context_width()
                ),
            });
        }
        if n == 0 {
            return Ok(());
        }
        let fused = fuse_context(w, tap_rows, n);
        self.rope.ensure(c, self.len + n);
        let start = self.len;
        let mut xq = QuantizedRows::default();
        for l in 0..w.layers.len() {
            let (k, v) = w.kv(l, &fused, &mut xq, n);
            self.append_kv(w, l, k, &v, n, start);
        }
        self.len += n;
        Ok(())
    }

    /// Keys `rope(k_norm(k))` and values `v` of `n` rows at positions `pos ..`,
    /// appended per kv head of layer `l`. Context rows and block rows go through this
    /// one path (and [`DraftWeights::kv`]), so their keys are computed identically.
    fn append_kv(
        &mut self,
        w: &DraftWeights,
        l: usize,
        mut k: Vec<f32>,
        v: &[f32],
        n: usize,
        pos: usize,
    ) {
        let c = &w.config;
        let hd = c.head_dim;
        kernels::norm_and_rope(
            &mut k,
            c.num_kv_heads,
            hd,
            Some(&w.layers[l].k_norm),
            c.rms_norm_eps,
            pos,
            &self.rope.cos,
            &self.rope.sin,
        );
        // Rows of `num_kv_heads · head_dim`, kv head `kh` at `kh · head_dim`: the
        // layout `KvLayer::append` takes.
        self.kv.layer_mut(l).append(&k, v, n);
    }
}

/// One drafted block.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftOutput {
    /// Final-normed hidden rows of the whole block (`block_size x hidden`).
    pub hidden: Vec<f32>,
    /// The residual stream after each draft layer (`block_size x hidden` each).
    pub layer_outputs: Vec<Vec<f32>>,
    /// Picks for block rows `1..=picks` (`1..block_size` unless fewer were asked for,
    /// [`draft_block`]): row `i` drafts the token at `pos + i`.
    pub tokens: Vec<u32>,
    /// A DFlash 2 draft's selector: its unary logits, candidates and scores per pick.
    pub selection: Option<Selection>,
}

fn check_block(c: &DraftConfig, block: &[u32], pos: usize, cache_len: usize) -> Result<()> {
    if block.len() != c.block_size {
        return Err(DraftError::Tensor {
            path: "<forward>".into(),
            tensor: "block".into(),
            problem: format!("has {} tokens; block_size is {}", block.len(), c.block_size),
        });
    }
    if pos != cache_len {
        return Err(DraftError::Tensor {
            path: "<forward>".into(),
            tensor: "block".into(),
            problem: format!("drafting at position {pos} over {cache_len} committed rows"),
        });
    }
    Ok(())
}

/// The draft block's attention a query at a time by [`kernels::attend`] (the `f32`
/// reference, and the path for a sliding window that cuts the context): block row `i`
/// of `q` (`num_heads` heads) sees positions `first(i)..total` of `layer`.
#[allow(clippy::too_many_arguments)]
fn attend_rows(
    isa: Isa,
    layer: &KvLayer,
    q: &[f32],
    num_heads: usize,
    first: &(dyn Fn(usize) -> usize + Sync),
    total: usize,
    scale: f32,
    attn: &mut [f32],
) {
    let hd = layer.head_dim();
    let (qd, group) = (num_heads * hd, num_heads / layer.kv_heads());
    // Each kv head's keys and values from the first row's window start on, as the
    // row-major f32 rows `attend` reads (read once per kv head through its view; f32
    // values are the store itself).
    let from = first(0);
    let rows: Vec<_> = (0..layer.kv_heads())
        .map(|kh| {
            let view = layer.head(kh);
            let mut keys = Vec::new();
            view.keys_rows_into(from..total, &mut keys);
            (keys, view.values_rows(from..total))
        })
        .collect();
    // One task per (block row, head): each writes its own head_dim slice.
    kernels::team::for_each_chunk(attn, hd, |idx, out| {
        let scores = &mut Vec::new();
        let (i, head) = (idx / num_heads, idx % num_heads);
        let (keys, values) = &rows[head / group];
        let skip = (first(i) - from) * hd;
        kernels::attend(
            isa,
            &q[i * qd + head * hd..i * qd + (head + 1) * hd],
            &keys[skip..],
            &values[skip..],
            total - first(i),
            scale,
            scores,
            out,
        );
    });
}

/// Runs the block over a cache holding exactly the committed context. The block's keys
/// and values are appended to the cache for the pass and removed again before it
/// returns, so the cache keeps only committed positions (and no copy of it is made).
fn run_block(
    w: &DraftWeights,
    cache: &mut DraftKvCache,
    block: &[u32],
    pos: usize,
    hooks: &dyn DraftHooks,
    picks: usize,
) -> Result<DraftOutput> {
    let c = &w.config;
    let (h, hd, b) = (c.hidden_size, c.head_dim, block.len());
    let qd = c.num_heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut x = hooks.embed(block);
    if c.embedding_scale != 1.0 {
        for v in x.iter_mut() {
            *v *= c.embedding_scale;
        }
    }
    cache.rope.ensure(c, pos + b);
    let mut normed = vec![0f32; b * h];
    let mut xq = QuantizedRows::default();
    let mut attn = vec![0f32; b * qd];
    let mut layer_outputs = Vec::with_capacity(c.num_layers);
    for (l, layer) in w.layers.iter().enumerate() {
        let packed = w.packed.get(l);
        kernels::rms_norm(&x, &layer.input_norm, c.rms_norm_eps, &mut normed);
        // DFlash 2: the attention's input convolved over the block; the coefficients for
        // its output come from this same input.
        let attention_conv = match (&c.v2, &layer.conv) {
            (Some(d), Some([conv, _])) => {
                let dynamic =
                    w.project_bf16(conv.projection, d.kernel_projection_rows(h), &normed, b);
                normed = v2::convolve(d, &conv.base, &dynamic, 0, &normed, b, h);
                Some((d, conv, dynamic))
            }
            _ => None,
        };
        // Keys and values per kv head: committed context, then the whole block (the
        // block's rows quantized once, for k|v and for q).
        let (k, v) = w.kv(l, &normed, &mut xq, b);
        let mut q = match packed {
            Some(p) => w.project_q8(&p.q, &xq, 1).pop().expect("one part"),
            None => w.project(&layer.q, &normed, b),
        };
        kernels::norm_and_rope(
            &mut q,
            c.num_heads,
            hd,
            Some(&layer.q_norm),
            c.rms_norm_eps,
            pos,
            &cache.rope.cos,
            &cache.rope.sin,
        );
        cache.append_kv(w, l, k, &v, b, pos);
        let total = cache.len + b;
        let cached = cache.len;
        // Context positions inside the window of block row `i`; block keys always.
        let first = |i: usize| match c.sliding_window {
            Some(window) => (pos + i + 1).saturating_sub(window).min(cached),
            None => 0,
        };
        let windowed = (0..b).any(|i| first(i) > 0);
        if packed.is_some() && !windowed {
            // Every row sees positions 0..total: the attention family's blocks.
            kernels::attention::attention_visible(
                w.kernel,
                cache.kv.layer(l),
                &q,
                b,
                &|_| total,
                c.num_heads,
                scale,
                &mut attn,
                kernels::attention::Split::Auto,
            );
        } else {
            attend_rows(
                w.kernel,
                cache.kv.layer(l),
                &q,
                c.num_heads,
                &first,
                total,
                scale,
                &mut attn,
            );
        }
        let mut o = match packed {
            Some(p) => {
                xq.quantize_from(&attn, b, qd);
                w.project_q8(&p.o, &xq, 1).pop().expect("one part")
            }
            None => w.project(&layer.o, &attn, b),
        };
        if let Some((d, conv, dynamic)) = attention_conv {
            o = v2::convolve(d, &conv.base, &dynamic, 1, &o, b, h);
        }
        for (xv, ov) in x.iter_mut().zip(&o) {
            *xv += ov;
        }
        kernels::rms_norm(&x, &layer.post_norm, c.rms_norm_eps, &mut normed);
        let mlp_conv = match (&c.v2, &layer.conv) {
            (Some(d), Some([_, conv])) => {
                let dynamic =
                    w.project_bf16(conv.projection, d.kernel_projection_rows(h), &normed, b);
                normed = v2::convolve(d, &conv.base, &dynamic, 0, &normed, b, h);
                Some((d, conv, dynamic))
            }
            _ => None,
        };
        let mut down = match packed {
            Some(p) => {
                xq.quantize_from(&normed, b, h);
                let mut gate_up = w.project_q8(&p.gate_up, &xq, 2);
                let up = gate_up.pop().expect("two parts");
                let mut gate = gate_up.pop().expect("two parts");
                kernels::swiglu(w.kernel, &mut gate, &up);
                xq.quantize_from(&gate, b, c.intermediate_size);
                w.project_q8(&p.down, &xq, 1).pop().expect("one part")
            }
            None => {
                let mut gate = w.project(&layer.gate, &normed, b);
                let up = w.project(&layer.up, &normed, b);
                kernels::swiglu(w.kernel, &mut gate, &up);
                w.project(&layer.down, &gate, b)
            }
        };
        if let Some((d, conv, dynamic)) = mlp_conv {
            down = v2::convolve(d, &conv.base, &dynamic, 1, &down, b, h);
        }
        for (xv, dv) in x.iter_mut().zip(&down) {
            *xv += dv;
        }
        layer_outputs.push(x.clone());
    }
    // Drop the block's keys and values: only committed positions stay cached.
    cache.truncate(cache.len);
    let mut hidden = vec![0f32; b * h];
    kernels::rms_norm(&x, &w.final_norm, c.rms_norm_eps, &mut hidden);
    let picks = picks.min(b - 1);
    let rows = &hidden[h..(1 + picks) * h];
    let (tokens, selection) = match (&c.v2, &w.selector) {
        _ if picks == 0 => (Vec::new(), None),
        (Some(d), Some(sw)) => {
            let sel = run_selector(w, d, sw, hooks, rows, picks, block[0])?;
            (sel.tokens.clone(), Some(sel))
        }
        _ => (hooks.pick(rows, picks), None),
    };
    Ok(DraftOutput {
        hidden,
        layer_outputs,
        tokens,
        selection,
    })
}

/// DFlash 2's pick: the hooks' head logits of the drafted rows, soft-capped, rescored
/// by the selector walking from `anchor` (see `v2.rs`).
fn run_selector(
    w: &DraftWeights,
    d: &crate::config::Dflash2,
    sw: &SelectorWeights,
    hooks: &dyn DraftHooks,
    rows: &[f32],
    picks: usize,
    anchor: u32,
) -> Result<Selection> {
    let bad = |problem: String| DraftError::Tensor {
        path: "<forward>".into(),
        tensor: "head logits".into(),
        problem,
    };
    let vocab = w.config.vocab_size.unwrap_or(0);
    let mut logits = hooks.logits(rows, picks).ok_or_else(|| {
        bad("are not offered by the draft hooks; a DFlash 2 selector rescores them".into())
    })?;
    if logits.len() != picks * vocab {
        return Err(bad(format!(
            "have {} values, not {picks} rows of the draft's vocabulary {vocab}",
            logits.len()
        )));
    }
    v2::unary_logits(d, &mut logits);
    let projected = w.project_bf16(sw.projection, d.selector_rank, rows, picks);
    Ok(v2::select(d, sw, logits, &projected, picks, anchor))
}

/// Drafts a block from scratch: all `n_ctx` committed tap rows are fused and folded.
pub fn draft_forward(
    w: &DraftWeights,
    committed_tap_rows: &[f32],
    n_ctx: usize,
    block: &[u32],
    pos: usize,
    hooks: &dyn DraftHooks,
) -> Result<DraftOutput> {
    let mut cache = DraftKvCache::for_weights(w);
    draft_forward_cached(w, &mut cache, committed_tap_rows, n_ctx, block, pos, hooks)
}

/// Drafts a block with a persistent cache: `new_rows` (`n_new` committed tap rows not
/// yet in the cache) are folded first. Equal, bit for bit, to [`draft_forward`] over all
/// committed rows.
pub fn draft_forward_cached(
    w: &DraftWeights,
    cache: &mut DraftKvCache,
    new_rows: &[f32],
    n_new: usize,
    block: &[u32],
    pos: usize,
    hooks: &dyn DraftHooks,
) -> Result<DraftOutput> {
    let picks = w.config.block_size - 1;
    draft_block(w, cache, new_rows, n_new, block, pos, hooks, picks)
}

/// [`draft_forward_cached`] scoring only the first `picks` drafted rows with the hooks'
/// head (the rest of the block runs all the same: its rows attend to each other). A
/// round that verifies k drafts asks for k picks; the head is the round's largest part.
#[allow(clippy::too_many_arguments)]
pub fn draft_block(
    w: &DraftWeights,
    cache: &mut DraftKvCache,
    new_rows: &[f32],
    n_new: usize,
    block: &[u32],
    pos: usize,
    hooks: &dyn DraftHooks,
    picks: usize,
) -> Result<DraftOutput> {
    let mut out = None;
    hooks.install(&mut || {
        out = Some(cache.fold(w, new_rows, n_new).and_then(|()| {
            check_block(&w.config, block, pos, cache.len())?;
            run_block(w, cache, block, pos, hooks, picks)
        }));
    });
    out.expect("install runs the round")
}
