//! The DFlash draft forward (z-lab `DFlashDraftModel.forward`), on the target
//! runtime's CPU kernels.
//!
//! - Context: each committed position's tap row (the target's tap layers, concatenated
//!   in `target_layer_ids` order) is fused, `c = hidden_norm(fc · tap_row)`.
//! - [`DraftKvCache`]: per draft layer, the context keys `rope(k_norm(k_proj(c)))` and
//!   values `v_proj(c)` of committed positions only. Block keys and values are never
//!   kept: they are recomputed every round.
//! - Block: `[last token, mask, ...]` (`block_size` tokens at positions `pos ..`),
//!   embedded with the target's embedding (a hook) times `embedding_scale`; per layer
//!   `x += o(attn(rms(x)))`, `x += mlp(rms(x))` where attention is **not causal**: every
//!   block query sees every context key (within the sliding window) and all block keys;
//!   queries are `rope(q_norm(q_proj(h)))`. Output `norm(x)`; rows `1..` are scored by
//!   a hook (the target's head + argmax, or a DFlash 2 selector).
//!
//! [`draft_forward`] computes from scratch over all committed rows;
//! [`draft_forward_cached`] folds only new rows into a cache. Every kernel computes a row
//! the same way whatever the batch, so the two agree bit for bit.

use onebit_kernels::{self as kernels, dense, matmul, Isa};
use q4nx_format::Q4Matrix;
use rayon::prelude::*;

use crate::config::DraftConfig;
use crate::error::{DraftError, Result};
use crate::package::{DraftModel, Gain, Projection};

/// What the draft borrows from the target.
pub trait DraftHooks {
    /// The target's embedding rows of `tokens` (`tokens.len() x hidden`).
    fn embed(&self, tokens: &[u32]) -> Vec<f32>;
    /// Turns final-normed drafted rows (`n x hidden`) into tokens.
    fn pick(&self, hidden: &[f32], n: usize) -> Vec<u32>;
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
}

/// The draft's weights ready for the forward: tile views into the mapped file and the
/// (small) gains widened to f32.
pub struct DraftWeights<'a> {
    /// The draft's configuration.
    pub config: DraftConfig,
    layers: Vec<LayerViews<'a>>,
    fc: &'a [u8],
    hidden_norm: Vec<f32>,
    final_norm: Vec<f32>,
    kernel: Isa,
}

impl DraftModel {
    /// The weights for [`draft_forward`], with the fastest kernel this CPU has.
    pub fn weights(&self) -> Result<DraftWeights<'_>> {
        self.weights_with(Isa::detect())
    }

    /// The weights with an explicit matmul kernel.
    pub fn weights_with(&self, kernel: Isa) -> Result<DraftWeights<'_>> {
        let mut layers = Vec::with_capacity(self.config.num_layers);
        for l in 0..self.config.num_layers {
            layers.push(LayerViews {
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
        Ok(DraftWeights {
            config: self.config.clone(),
            layers,
            fc: self.fusion_stored()?,
            hidden_norm: self.decode_gain(Gain::Hidden)?,
            final_norm: self.decode_gain(Gain::Final)?,
            kernel,
        })
    }
}

impl DraftWeights<'_> {
    fn project(&self, w: &Q4Matrix, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * w.rows()];
        matmul(w, x, n, &mut y, self.kernel);
        y
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

/// Rope tables for positions `0..end`.
fn rope_tables(c: &DraftConfig, end: usize) -> (Vec<f32>, Vec<f32>) {
    let mut cos = Vec::with_capacity(end * c.head_dim / 2);
    let mut sin = Vec::with_capacity(end * c.head_dim / 2);
    for p in 0..end {
        let (a, b) = kernels::rope_table(c.rope_theta as f64, c.head_dim, p);
        cos.extend(a);
        sin.extend(b);
    }
    (cos, sin)
}

/// Context keys and values of committed positions, per draft layer and kv head
/// (`[layer][kv_head] -> positions x head_dim`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftKvCache {
    keys: Vec<Vec<Vec<f32>>>,
    values: Vec<Vec<Vec<f32>>>,
    len: usize,
}

impl DraftKvCache {
    /// An empty cache for `config`.
    pub fn new(config: &DraftConfig) -> DraftKvCache {
        DraftKvCache {
            keys: vec![vec![Vec::new(); config.num_kv_heads]; config.num_layers],
            values: vec![vec![Vec::new(); config.num_kv_heads]; config.num_layers],
            len: 0,
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

    /// Keeps the first `len` positions.
    pub fn truncate(&mut self, len: usize, head_dim: usize) {
        for layer in self.keys.iter_mut().chain(self.values.iter_mut()) {
            for head in layer {
                head.truncate(len.min(self.len) * head_dim);
            }
        }
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
        let (cos, sin) = rope_tables(c, self.len + n);
        let start = self.len;
        for (l, layer) in w.layers.iter().enumerate() {
            append_kv(
                w,
                layer,
                &fused,
                n,
                start,
                (&cos, &sin),
                &mut self.keys[l],
                &mut self.values[l],
            );
        }
        self.len += n;
        Ok(())
    }
}

/// Projects `n` rows of `x` (at positions `pos ..`) to keys `rope(k_norm(k_proj(x)))` and
/// values `v_proj(x)`, and appends them per kv head. Context rows and block rows go
/// through this one path, so their keys are computed identically.
#[allow(clippy::too_many_arguments)]
fn append_kv(
    w: &DraftWeights,
    layer: &LayerViews,
    x: &[f32],
    n: usize,
    pos: usize,
    (cos, sin): (&[f32], &[f32]),
    keys: &mut [Vec<f32>],
    values: &mut [Vec<f32>],
) {
    let c = &w.config;
    let hd = c.head_dim;
    let mut k = w.project(&layer.k, x, n);
    let v = w.project(&layer.v, x, n);
    kernels::norm_and_rope(
        &mut k,
        c.num_kv_heads,
        hd,
        Some(&layer.k_norm),
        c.rms_norm_eps,
        pos,
        cos,
        sin,
    );
    for i in 0..n {
        for kh in 0..c.num_kv_heads {
            let at = (i * c.num_kv_heads + kh) * hd;
            keys[kh].extend_from_slice(&k[at..at + hd]);
            values[kh].extend_from_slice(&v[at..at + hd]);
        }
    }
}

/// One drafted block.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftOutput {
    /// Final-normed hidden rows of the whole block (`block_size x hidden`).
    pub hidden: Vec<f32>,
    /// The residual stream after each draft layer (`block_size x hidden` each).
    pub layer_outputs: Vec<Vec<f32>>,
    /// Picks for block rows `1..block_size`: row `i` drafts the token at `pos + i`.
    pub tokens: Vec<u32>,
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

/// Runs the block over a cache holding exactly the committed context. The block's keys
/// and values are appended to the cache for the pass and removed again before it
/// returns, so the cache keeps only committed positions (and no copy of it is made).
fn run_block(
    w: &DraftWeights,
    cache: &mut DraftKvCache,
    block: &[u32],
    pos: usize,
    hooks: &dyn DraftHooks,
) -> DraftOutput {
    let c = &w.config;
    let (h, hd, b) = (c.hidden_size, c.head_dim, block.len());
    let (qd, group) = (c.num_heads * hd, c.num_heads / c.num_kv_heads);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut x = hooks.embed(block);
    if c.embedding_scale != 1.0 {
        for v in x.iter_mut() {
            *v *= c.embedding_scale;
        }
    }
    let (cos, sin) = rope_tables(c, pos + b);
    let mut normed = vec![0f32; b * h];
    let mut layer_outputs = Vec::with_capacity(c.num_layers);
    for (l, layer) in w.layers.iter().enumerate() {
        kernels::rms_norm(&x, &layer.input_norm, c.rms_norm_eps, &mut normed);
        let mut q = w.project(&layer.q, &normed, b);
        kernels::norm_and_rope(
            &mut q,
            c.num_heads,
            hd,
            Some(&layer.q_norm),
            c.rms_norm_eps,
            pos,
            &cos,
            &sin,
        );
        // Keys and values per kv head: committed context, then the whole block.
        append_kv(
            w,
            layer,
            &normed,
            b,
            pos,
            (&cos, &sin),
            &mut cache.keys[l],
            &mut cache.values[l],
        );
        let (keys, values) = (&cache.keys[l], &cache.values[l]);
        let total = cache.len + b;
        let mut attn = vec![0f32; b * qd];
        let cached = cache.len;
        // One task per (block row, head): each writes its own head_dim slice.
        attn.par_chunks_mut(hd)
            .enumerate()
            .for_each_init(Vec::new, |scores, (idx, out)| {
                let (i, head) = (idx / c.num_heads, idx % c.num_heads);
                // Context positions inside the window of this query; block keys always.
                let first = match c.sliding_window {
                    Some(window) => (pos + i + 1).saturating_sub(window).min(cached),
                    None => 0,
                };
                let kh = head / group;
                kernels::attend(
                    &q[i * qd + head * hd..i * qd + (head + 1) * hd],
                    &keys[kh][first * hd..],
                    &values[kh][first * hd..],
                    total - first,
                    scale,
                    scores,
                    out,
                );
            });
        let o = w.project(&layer.o, &attn, b);
        for (xv, ov) in x.iter_mut().zip(&o) {
            *xv += ov;
        }
        kernels::rms_norm(&x, &layer.post_norm, c.rms_norm_eps, &mut normed);
        let mut gate = w.project(&layer.gate, &normed, b);
        let up = w.project(&layer.up, &normed, b);
        kernels::swiglu(&mut gate, &up);
        let down = w.project(&layer.down, &gate, b);
        for (xv, dv) in x.iter_mut().zip(&down) {
            *xv += dv;
        }
        layer_outputs.push(x.clone());
    }
    // Drop the block's keys and values: only committed positions stay cached.
    cache.truncate(cache.len, hd);
    let mut hidden = vec![0f32; b * h];
    kernels::rms_norm(&x, &w.final_norm, c.rms_norm_eps, &mut hidden);
    let tokens = hooks.pick(&hidden[h..], b - 1);
    DraftOutput {
        hidden,
        layer_outputs,
        tokens,
    }
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
    let mut cache = DraftKvCache::new(&w.config);
    cache.fold(w, committed_tap_rows, n_ctx)?;
    check_block(&w.config, block, pos, cache.len())?;
    Ok(run_block(w, &mut cache, block, pos, hooks))
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
    cache.fold(w, new_rows, n_new)?;
    check_block(&w.config, block, pos, cache.len())?;
    Ok(run_block(w, cache, block, pos, hooks))
}
