//! DFlash 2: the tensors it adds to a DFlash draft, their checks, and its arithmetic —
//! the grouped dynamic convolutions around each sublayer, the soft-capped unary logits
//! and the candidate selector.
//!
//! # The equations, as verified against the public reference
//!
//! Source: z-lab/dflash `dflash/model.py` at commit 07ebd93 (`GroupedDynamicCausalConv`,
//! `_grouped_dynamic_convolve`, `CandidateSelector.select`, `DFlashDraftModel.compute_logits`,
//! `DFlash2DraftModel`, `Qwen3DFlashDecoderLayer.forward`, `dflash_generate`), cross-read
//! with Qualcomm's port (`QEfficient` `GroupedDynamicCausalConv.prepare/finish`,
//! `CandidateSelector.select`, `compute_logits`), which agrees on every point below.
//! `xtask/scripts/dflash2_reference.py` runs that module on a random draft and
//! `tests/dflash2_reference.rs` checks this code against what it wrote.
//!
//! **Convolution.** Each decoder layer has an `attention_conv` and an `mlp_conv`, each
//! `base_kernel [2, K, H]` (a learned coefficient per *channel* and tap, one set for the
//! sublayer's input, one for its output) and `kernel_projection [2·K·G, H]` (no bias,
//! `G = H / conv_group_size`). Around a sublayer `f` with (RMS-normed) input `u`:
//!
//! ```text
//! dyn[i]   = kernel_projection · u[i], viewed [2][K][G]       (from the INPUT u, both sets)
//! conv_s(z)[i][c] = Σ_{t<K, i-t≥0} (base[s][t][c] · z[i-t][c] + dyn[i][s][t][c / gs] · z[i-t][c])
//! v = conv_0(u);   out = conv_1(f(v))                         (the residual adds `out`)
//! ```
//!
//! Rows are block rows (`i = 0` the anchor); a tap before the block start reads zero,
//! and the dynamic coefficient is the *output* row's (`dyn[i]`, not `dyn[i-t]`). The
//! "identity at tap 0" is not in the forward: it is how the base kernel is initialised
//! (training), so the forward uses `base_kernel` as stored. The attention's block keys,
//! values and queries are projections of `v`; the context keys are unchanged. Summation
//! order follows the reference: per tap, the base product, then the dynamic product.
//!
//! **Unary logits.** `head(h)` is the target's output head; then
//! `l · output_multiplier`, and when `final_logit_softcapping > 0`,
//! `tanh(l·m / cap) · cap` (multiplier first, then the cap).
//!
//! **Selector** (`CandidateSelector.select`, greedy): per drafted row `p` (block rows
//! `1..`), the `selector_top_k` largest unary logits and their tokens;
//! `proj[p] = hidden_projection · h[p]` (rank `R`, no bias); walking from the anchor
//! token `prev`, `score_j = unary_j + Σ_r (predecessor_codebook[prev][r] · proj[p][r]) ·
//! successor_codebook[cand_j][r]`, the pick is the first maximum, and it becomes `prev`
//! for row `p + 1`. The walk reads only earlier picks, so scoring the first `k` rows
//! gives the first `k` picks of the whole block.
//!
//! **Config.** z-lab reads each key from `dflash_config` first, then the top level:
//! `conv_kernel_size`, `conv_group_size`, `selector_rank`, `selector_top_k`,
//! `final_logit_softcapping`, `output_multiplier`, `block_size`, `mask_token_id`,
//! `target_layer_ids`, `input_embedding_scale`; `sliding_window` and `layer_types` at the
//! top level. A layer is causal inside the block when `is_causal` says so, or, absent
//! that key, when it is a `sliding_attention` layer; the published drafts set
//! `is_causal: false` (this forward's non-causal block), and a causal one is refused.

use half::bf16;
use q4nx_format::{Dtype, TensorView};

use crate::config::{Dflash2, DraftConfig};
use crate::error::{DraftError, Result};
use crate::package::DraftModel;

/// The two sublayers a convolution wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sublayer {
    /// The attention sublayer (`attention_conv`).
    Attention,
    /// The MLP sublayer (`mlp_conv`).
    Mlp,
}

/// A tensor DFlash 2 adds to a DFlash package (all BF16, stored as the source holds them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum V2Tensor {
    /// `base_kernel [2, K, H]` of a layer's convolution.
    ConvBase(usize, Sublayer),
    /// `kernel_projection.weight [2·K·G, H]` of a layer's convolution.
    ConvProjection(usize, Sublayer),
    /// `candidate_selector.hidden_projection.weight [R, H]`.
    SelectorProjection,
    /// `candidate_selector.predecessor_codebook [vocab, R]`.
    PredecessorCodebook,
    /// `candidate_selector.successor_codebook [vocab, R]`.
    SuccessorCodebook,
}

impl V2Tensor {
    /// Every DFlash 2 tensor of a draft with `layers` layers.
    pub fn all(layers: usize) -> Vec<V2Tensor> {
        let mut out = Vec::new();
        for l in 0..layers {
            for s in [Sublayer::Attention, Sublayer::Mlp] {
                out.extend([V2Tensor::ConvBase(l, s), V2Tensor::ConvProjection(l, s)]);
            }
        }
        out.extend([
            V2Tensor::SelectorProjection,
            V2Tensor::PredecessorCodebook,
            V2Tensor::SuccessorCodebook,
        ]);
        out
    }

    /// The tensor's name in a z-lab checkpoint.
    pub fn source_name(self) -> String {
        let conv = |s: Sublayer| match s {
            Sublayer::Attention => "attention_conv",
            Sublayer::Mlp => "mlp_conv",
        };
        match self {
            V2Tensor::ConvBase(l, s) => format!("layers.{l}.{}.base_kernel", conv(s)),
            V2Tensor::ConvProjection(l, s) => {
                format!("layers.{l}.{}.kernel_projection.weight", conv(s))
            }
            V2Tensor::SelectorProjection => "candidate_selector.hidden_projection.weight".into(),
            V2Tensor::PredecessorCodebook => "candidate_selector.predecessor_codebook".into(),
            V2Tensor::SuccessorCodebook => "candidate_selector.successor_codebook".into(),
        }
    }

    /// The tensor's name in a package (`model.` + the source name, as every draft tensor).
    pub fn tensor_name(self) -> String {
        format!("model.{}", self.source_name())
    }

    /// The shape `config` requires (`None` for a DFlash (1) config, or one without a
    /// vocabulary for the codebooks).
    pub fn shape(self, c: &DraftConfig) -> Option<Vec<usize>> {
        let d = c.v2.as_ref()?;
        let h = c.hidden_size;
        Some(match self {
            V2Tensor::ConvBase(..) => vec![2, d.conv_kernel_size, h],
            V2Tensor::ConvProjection(..) => vec![d.kernel_projection_rows(h), h],
            V2Tensor::SelectorProjection => vec![d.selector_rank, h],
            V2Tensor::PredecessorCodebook | V2Tensor::SuccessorCodebook => {
                vec![c.vocab_size?, d.selector_rank]
            }
        })
    }
}

impl DraftModel {
    /// The checked view of a DFlash 2 tensor (BF16, the config's shape).
    pub fn v2_tensor(&self, which: V2Tensor) -> Result<TensorView<'_>> {
        let name = which.tensor_name();
        let shape = which
            .shape(&self.config)
            .ok_or_else(|| DraftError::Tensor {
                path: self.weights_path().into(),
                tensor: name.clone(),
                problem: "belongs to DFlash 2, but config.json declares a DFlash (1) draft".into(),
            })?;
        let t = self.container().tensor(&name)?;
        let bad = |problem: String| DraftError::Tensor {
            path: self.weights_path().into(),
            tensor: name.clone(),
            problem,
        };
        if t.dtype != Dtype::BF16 {
            return Err(bad(format!("has dtype {}, expected BF16", t.dtype)));
        }
        if t.shape != shape {
            return Err(bad(format!("has shape {:?}, expected {shape:?}", t.shape)));
        }
        Ok(t)
    }

    /// Checks every DFlash 2 tensor (dtype, shape, every value finite) and returns their
    /// names; nothing for a DFlash (1) draft.
    pub(crate) fn check_v2(&self) -> Result<Vec<String>> {
        if self.config.v2.is_none() {
            return Ok(Vec::new());
        }
        let mut names = Vec::new();
        for which in V2Tensor::all(self.config.num_layers) {
            let t = self.v2_tensor(which)?;
            // A bf16 is not finite when its exponent bits are all ones.
            if let Some(i) = t
                .bytes
                .chunks_exact(2)
                .position(|p| u16::from_le_bytes([p[0], p[1]]) & 0x7f80 == 0x7f80)
            {
                return Err(DraftError::Tensor {
                    path: self.weights_path().into(),
                    tensor: which.tensor_name(),
                    problem: format!("holds a non-finite value at element {i}"),
                });
            }
            names.push(which.tensor_name());
        }
        Ok(names)
    }

    /// Decodes a DFlash 2 tensor to f32 (row-major, the stored shape).
    pub fn decode_v2(&self, which: V2Tensor) -> Result<Vec<f32>> {
        Ok(self.v2_tensor(which)?.to_f32()?)
    }
}

/// One convolution's weights: the stored base kernel widened, the projection as stored.
pub(crate) struct ConvWeights<'a> {
    /// `[2][K][H]`.
    pub base: Vec<f32>,
    /// `[2·K·G][H]` BF16 bytes.
    pub projection: &'a [u8],
}

/// The selector's weights (BF16 bytes as stored).
pub(crate) struct SelectorWeights<'a> {
    pub projection: &'a [u8],
    pub predecessor: &'a [u8],
    pub successor: &'a [u8],
}

fn bf16_row(bytes: &[u8], row: usize, width: usize) -> impl Iterator<Item = f32> + '_ {
    bytes[row * width * 2..(row + 1) * width * 2]
        .chunks_exact(2)
        .map(|p| bf16::from_le_bytes([p[0], p[1]]).to_f32())
}

/// `conv_s(z)` over `b` block rows of width `h` (see the module docs): tap `t` of row
/// `i` reads row `i - t` (zero before the block start) with coefficient
/// `base[s][t][c] + dynamic[i][s][t][c / group]`.
pub(crate) fn convolve(
    d: &Dflash2,
    base: &[f32],
    dynamic: &[f32],
    set: usize,
    z: &[f32],
    b: usize,
    h: usize,
) -> Vec<f32> {
    let (k, gs) = (d.conv_kernel_size, d.conv_group_size);
    let groups = h / gs;
    let dyn_width = 2 * k * groups;
    let mut out = vec![0f32; b * h];
    for i in 0..b {
        let row = &mut out[i * h..(i + 1) * h];
        for t in 0..k {
            let Some(src) = i.checked_sub(t) else {
                continue;
            };
            let zr = &z[src * h..(src + 1) * h];
            let basev = &base[(set * k + t) * h..(set * k + t + 1) * h];
            let dynv = &dynamic[i * dyn_width + (set * k + t) * groups..][..groups];
            for c in 0..h {
                row[c] += basev[c] * zr[c];
                row[c] += dynv[c / gs] * zr[c];
            }
        }
    }
    out
}

/// What the selector saw and chose for each drafted row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    /// Unary logits of every scored row (`rows x vocab`).
    pub unary: Vec<f32>,
    /// The top-k candidates of each row, by unary logit (highest first, ties by id).
    pub candidates: Vec<Vec<u32>>,
    /// Each candidate's score (unary plus the pairwise term), in `candidates` order.
    pub scores: Vec<Vec<f32>>,
    /// The picks, one per row.
    pub tokens: Vec<u32>,
}

/// Turns head logits (`rows x vocab`) into unary logits in place.
pub(crate) fn unary_logits(d: &Dflash2, logits: &mut [f32]) {
    for l in logits.iter_mut() {
        *l = d.unary(*l);
    }
}

/// The greedy selector walk over `rows` drafted rows: `unary` (`rows x vocab`),
/// `projected` (`rows x rank`, `hidden_projection · h`), from `anchor`.
pub(crate) fn select(
    d: &Dflash2,
    w: &SelectorWeights,
    unary: Vec<f32>,
    projected: &[f32],
    rows: usize,
    anchor: u32,
) -> Selection {
    let vocab = unary.len() / rows.max(1);
    let rank = d.selector_rank;
    let mut sel = Selection::default();
    let mut prev = anchor;
    for p in 0..rows {
        let u = &unary[p * vocab..(p + 1) * vocab];
        let mut order: Vec<u32> = (0..vocab as u32).collect();
        let k = d.selector_top_k.min(vocab);
        let by_logit = |a: &u32, b: &u32| u[*b as usize].total_cmp(&u[*a as usize]).then(a.cmp(b));
        order.select_nth_unstable_by(k - 1, by_logit);
        order.truncate(k);
        order.sort_by(by_logit);
        // The predecessor's code times the row's projection, then one dot per candidate.
        let context: Vec<f32> = bf16_row(w.predecessor, prev as usize, rank)
            .zip(&projected[p * rank..(p + 1) * rank])
            .map(|(a, b)| a * b)
            .collect();
        let scores: Vec<f32> = order
            .iter()
            .map(|&cand| {
                let pair: f32 = bf16_row(w.successor, cand as usize, rank)
                    .zip(&context)
                    .map(|(s, c)| s * c)
                    .sum();
                u[cand as usize] + pair
            })
            .collect();
        let best = (0..scores.len()).fold(0, |b, j| if scores[j] > scores[b] { j } else { b });
        prev = order[best];
        sel.tokens.push(prev);
        sel.candidates.push(order);
        sel.scores.push(scores);
    }
    sel.unary = unary;
    sel
}
