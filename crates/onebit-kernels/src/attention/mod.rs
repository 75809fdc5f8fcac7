//! The attention family: causal softmax attention of query rows over a [`KvLayer`], with
//! grouped-query heads, at every [`KvType`].
//!
//! # The bits
//! For one query row and one query head, with `len` visible positions (row `i` of a pass
//! starting at position `p0` sees `0..=p0 + i`; in a sliding-window layer only the last
//! `w` of them, [`attention_window`]), the result is fixed by these steps:
//! 1. `q' = q · (scale · log2 e)` (one f32 multiply per element; the softmax then works
//!    in base 2).
//! 2. The positions are cut into key blocks of [`BLOCK`] (a constant). For each block
//!    `b` holding a visible position, in [`reference::block_partial_from`] (positions
//!    before the window's start or past the row's own are invisible):
//!    - `s_t = fma-chain over d = 0..head_dim of q'[d] · k_t[d]` (one accumulator per
//!      position, starting at 0, `d` in order), times the key scale at q8;
//!    - `m_b = max_t s_t + 0.0` (the `+ 0.0` makes a zero maximum `+0`);
//!    - `p_t = exp2(s_t - m_b)` by [`exp2`], one polynomial everyone shares;
//!    - `l_b` = sixteen lane sums (lane `j` adds `p_t` for `t ≡ j mod 16` in order,
//!      invisible positions adding 0), then the tree `j + j⊕8, ⊕4, ⊕2, ⊕1`;
//!    - `acc_b[d] = fma-chain over t of w_t · v_t[d]`, `w_t = p_t` (times the value
//!      scale at q8).
//! 3. The partials are combined in block order by [`combine`]: the running
//!    `(M, L, A)` starts as block 0's, then for each next block `M' = max(M, m_b)`,
//!    `a = exp2(M - M')`, `c = exp2(m_b - M')`, `L = L·a + l_b·c`, `A[d] = A[d]·a +
//!    acc_b[d]·c` (separate multiplies and adds, no FMA); the output is `A[d] / L`.
//!
//! Decode (few rows, long context) computes the partials of many blocks in parallel
//! (kv heads × block ranges) and combines them afterwards; prefill and verify (many rows)
//! run each row's blocks in turn, combining as they go (an online softmax). Both are the
//! same partials combined in the same order, so the bits do not depend on the number of
//! rows in a pass, on how the work is split, or on the thread count. Each kv head's keys
//! and values are read once for all the query heads that share it.
//!
//! The SIMD variants ([`variant_name`]) compute the scores sixteen (AVX-512) or eight
//! (AVX2) positions at a time, one accumulator per position, and the value sums sixteen
//! or eight dimensions at a time, one accumulator per dimension: the reference's
//! operations, lane for lane. They need `head_dim % 16 == 0`; other head sizes run the
//! reference.

pub mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::isa::Isa;
use crate::kv::{KvHeadView, KvLayer};
pub use crate::kv::{KvType, BLOCK};

/// Lanes of a block's exp sum.
pub const LANES: usize = 16;

/// Below this, [`exp2`] is 0.
pub const EXP2_MIN: f32 = -125.0;
const ROUND_MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
const LN2: f32 = std::f32::consts::LN_2;
/// `exp(t) ≈ 1 + t + t²·P(t)` on `|t| ≤ ln2 / 2` (Cephes `expf`'s coefficients).
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `2^x` for `x ≤ 0` by one fixed sequence of f32 operations, the same in every variant:
/// `x` clamped to [`EXP2_MIN`], `n = round(x)` (ties to even), `t = (x - n) · ln 2`,
/// `y = fma(P(t), t², t) + 1` with `P` by Horner's rule in FMAs, then `y · 2^n`; 0 below
/// `EXP2_MIN`. Relative error against `f64` at most 1.2e-7 on `[-125, 0]` (measured
/// 8.0e-8 by `tests/attention.rs`: `exp2_is_within_its_stated_error`).
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let xc = if x < EXP2_MIN { EXP2_MIN } else { x };
    let n = (xc + ROUND_MAGIC) - ROUND_MAGIC;
    let t = (xc - n) * LN2;
    let mut p = P[0];
    for &c in &P[1..] {
        p = p.mul_add(t, c);
    }
    let y = p.mul_add(t * t, t) + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < EXP2_MIN {
        0.0
    } else {
        y * scale
    }
}

/// Values of one softmax partial (or running state) of one query head: `[m, l, acc..]`.
pub fn partial_len(head_dim: usize) -> usize {
    head_dim + 2
}

/// Folds block partial `part` into the running state `state` (both `[m, l, acc..]`),
/// by the rule in the module documentation.
#[inline(always)]
pub fn combine(state: &mut [f32], part: &[f32]) {
    let (m0, m1) = (state[0], part[0]);
    let m = if m1 > m0 { m1 } else { m0 };
    let a = exp2(m0 - m);
    let c = exp2(m1 - m);
    state[0] = m;
    for (s, &p) in state[1..].iter_mut().zip(&part[1..]) {
        *s = *s * a + p * c;
    }
}

/// The output of a running state: `acc[d] / l`.
#[inline(always)]
fn finish(state: &[f32], out: &mut [f32]) {
    let l = state[1];
    for (o, &a) in out.iter_mut().zip(&state[2..]) {
        *o = a / l;
    }
}

/// A block kernel: partials of `group` query heads (`queries`, prescaled, `group ×
/// head_dim`) over block `block` of `view`, of which the first `visible` positions count,
/// into `out` (`group × partial_len`).
/// `unsafe`: a variant may need CPU features; [`kernels`] hands out only variants the
/// `Isa` token (built by detection) allows, which is the safety argument of every call.
type BlockFn = unsafe fn(&KvHeadView<'_>, usize, usize, &[f32], usize, &mut [f32]);
/// A combine (the same bits everywhere; compiled with hardware FMA where there is one).
type CombineFn = unsafe fn(&mut [f32], &[f32]);

/// The variants `isa` selects. Calling them is sound: each needs only features in `isa`.
struct Kernels {
    block: BlockFn,
    combine: CombineFn,
}

fn kernels(isa: Isa, head_dim: usize) -> Kernels {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        let combine: CombineFn = x86::combine_fma;
        if head_dim.is_multiple_of(16) {
            let block: BlockFn = if isa.avx512() {
                x86::block_avx512
            } else {
                x86::block_avx2
            };
            return Kernels { block, combine };
        }
        return Kernels {
            block: reference::block_partial,
            combine,
        };
    }
    let _ = (isa, head_dim);
    Kernels {
        block: reference::block_partial,
        combine,
    }
}

/// The name of the variant this family runs under `isa` (for reports).
pub fn variant_name(isa: Isa) -> &'static str {
    if isa.avx512() {
        "avx512"
    } else if isa.avx2() {
        "avx2"
    } else {
        "scalar"
    }
}

/// How a call spreads its work (the bits are the same for every choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Chosen from the rows, kv heads, context and threads.
    Auto,
    /// One task per (row, kv head), its blocks in turn (online softmax).
    Rows,
    /// One task per (row, kv head, range of `per` blocks), partials combined afterwards.
    Blocks {
        /// Blocks per task (at least 1).
        per: usize,
    },
}

/// Causal attention of `n` query rows at positions `p0..p0 + n` over `layer` (which
/// holds at least `p0 + n` positions): `queries` and `out` are `n × num_heads ×
/// head_dim`; query head `h` reads kv head `h / (num_heads / kv_heads)`.
///
/// # Panics
/// If the shapes do not match or the layer holds fewer than `p0 + n` positions.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    isa: Isa,
    layer: &KvLayer,
    queries: &[f32],
    n: usize,
    p0: usize,
    num_heads: usize,
    scale: f32,
    out: &mut [f32],
) {
    attention_split(
        isa,
        layer,
        queries,
        n,
        p0,
        num_heads,
        scale,
        out,
        Split::Auto,
    )
}

/// [`attention`] with an explicit work split (tests show every split gives the same bits).
#[allow(clippy::too_many_arguments)]
pub fn attention_split(
    isa: Isa,
    layer: &KvLayer,
    queries: &[f32],
    n: usize,
    p0: usize,
    num_heads: usize,
    scale: f32,
    out: &mut [f32],
    split: Split,
) {
    attention_window(
        isa, layer, queries, n, p0, num_heads, scale, None, out, split,
    )
}

/// Causal attention as [`attention_split`], but with `window = Some(w)` row `i` (at
/// position `p = p0 + i`) sees only the last `w` positions up to itself,
/// `p + 1 - w ..= p` (a sliding-window layer: transformers' mask keeps key `k` for
/// query `q` when `q - w < k <= q`). `None` is plain causal attention. A row's bits
/// depend on its query and the positions it sees alone, as for every other row.
///
/// # Panics
/// If the shapes do not match, `w` is 0, or the layer holds fewer than `p0 + n` positions.
#[allow(clippy::too_many_arguments)]
pub fn attention_window(
    isa: Isa,
    layer: &KvLayer,
    queries: &[f32],
    n: usize,
    p0: usize,
    num_heads: usize,
    scale: f32,
    window: Option<usize>,
    out: &mut [f32],
    split: Split,
) {
    assert!(
        layer.len() >= p0 + n,
        "attention: the layer holds {} positions, the pass needs {}",
        layer.len(),
        p0 + n
    );
    assert!(window != Some(0), "attention: a window of 0 positions");
    let span = |i: usize| window_span(p0 + i + 1, window);
    attention_span(isa, layer, queries, n, &span, num_heads, scale, out, split)
}

/// The positions `start..end` a row at position `end - 1` sees through `window`.
fn window_span(end: usize, window: Option<usize>) -> (usize, usize) {
    (window.map_or(0, |w| end.saturating_sub(w)), end)
}

/// The key blocks of a row seeing `start..end`: `start / BLOCK .. ceil(end / BLOCK)`.
fn blocks_of((start, end): (usize, usize)) -> (usize, usize) {
    (start / BLOCK, end.div_ceil(BLOCK))
}

/// Block `b`'s partial for a row seeing `start..end`: positions
/// `max(start, b·BLOCK) .. min(end, (b+1)·BLOCK)` count. A block whose first counted
/// position is not its first (a window starting inside it) runs
/// [`reference::block_partial_from`]; every variant equals it where the cut is 0.
#[allow(clippy::too_many_arguments)]
fn span_partial(
    k: &Kernels,
    view: &KvHeadView<'_>,
    b: usize,
    (start, end): (usize, usize),
    q: &[f32],
    group: usize,
    dst: &mut [f32],
) {
    let vis = (end - b * BLOCK).min(BLOCK);
    let from = start.saturating_sub(b * BLOCK);
    if from == 0 {
        // SAFETY: `kernels` chose variants the detected `isa` allows.
        unsafe { (k.block)(view, b, vis, q, group, dst) };
    } else {
        reference::block_partial_from(view, b, from, vis, q, group, dst);
    }
}

/// One row's query heads of one kv head over the positions `span` (`start..end`), block
/// after block from the first with the partials combined as they come (online softmax),
/// into `out` (`group × head_dim`). The task of [`Split::Rows`] and of
/// [`attention_many`].
fn row_head_online(
    k: &Kernels,
    view: &KvHeadView<'_>,
    span: (usize, usize),
    q: &[f32],
    group: usize,
    hd: usize,
    out: &mut [f32],
) {
    let pl = partial_len(hd);
    let mut state = vec![0f32; group * pl];
    let mut part = vec![0f32; group * pl];
    let (b0, b1) = blocks_of(span);
    for b in b0..b1 {
        let dst = if b == b0 { &mut state } else { &mut part };
        span_partial(k, view, b, span, q, group, dst);
        if b > b0 {
            for (s, p) in state.chunks_exact_mut(pl).zip(part.chunks_exact(pl)) {
                // SAFETY: as above.
                unsafe { (k.combine)(s, p) };
            }
        }
    }
    for (s, o) in state.chunks_exact(pl).zip(out.chunks_exact_mut(hd)) {
        finish(s, o);
    }
}

/// One sequence's query rows in [`attention_many`]: rows `rows` of the queries, at
/// positions `p0..`, over the sequence's own `layer`.
pub struct SequenceRows<'a> {
    /// The sequence's cache of this layer (holding at least `p0 + rows.len()` positions).
    pub layer: &'a KvLayer,
    /// Its rows among all the queries.
    pub rows: std::ops::Range<usize>,
    /// The position of its first row.
    pub p0: usize,
    /// A sliding-window layer's window ([`attention_window`]); `None`: causal.
    pub window: Option<usize>,
}

/// Causal [`attention`] of several sequences' rows in one parallel region (a pass
/// shared by several sessions): `sequences` cover the query rows `0..n` in order, each
/// over its own layer. A row's bits are those [`attention`] gives it alone (every split
/// gives the same bits); one sequence runs [`attention`] itself.
///
/// # Panics
/// If the sequences do not cover the rows in order, their layers' shapes differ, or a
/// layer holds fewer positions than its rows need.
pub fn attention_many(
    isa: Isa,
    sequences: &[SequenceRows<'_>],
    queries: &[f32],
    num_heads: usize,
    scale: f32,
    out: &mut [f32],
) {
    let Some(first) = sequences.first() else {
        return;
    };
    let (kvh, hd) = (first.layer.kv_heads(), first.layer.head_dim());
    let width = num_heads * hd;
    if let [one] = sequences {
        let rows = one.rows.clone();
        let (q, o) = (
            &queries[rows.start * width..rows.end * width],
            &mut out[rows.start * width..rows.end * width],
        );
        return attention_window(
            isa,
            one.layer,
            q,
            rows.len(),
            one.p0,
            num_heads,
            scale,
            one.window,
            o,
            Split::Auto,
        );
    }
    let mut owner = Vec::new();
    for (j, s) in sequences.iter().enumerate() {
        assert_eq!(
            s.rows.start,
            owner.len(),
            "attention: sequences out of order"
        );
        assert!(
            s.layer.kv_heads() == kvh && s.layer.head_dim() == hd,
            "attention: sequences of different shapes"
        );
        assert!(
            s.layer.len() >= s.p0 + s.rows.len(),
            "attention: a layer holds {} positions, its rows need {}",
            s.layer.len(),
            s.p0 + s.rows.len()
        );
        assert!(s.window != Some(0), "attention: a window of 0 positions");
        owner.resize(s.rows.end, j);
    }
    let n = owner.len();
    assert!(
        kvh > 0 && num_heads.is_multiple_of(kvh),
        "attention: {num_heads} heads over {kvh} kv heads"
    );
    assert_eq!(queries.len(), n * width, "attention: queries shape");
    assert_eq!(out.len(), n * width, "attention: output shape");
    let group = num_heads / kvh;
    let factor = scale * std::f32::consts::LOG2_E;
    let q: Vec<f32> = queries.iter().map(|&v| v * factor).collect();
    let k = kernels(isa, hd);
    let views: Vec<Vec<KvHeadView<'_>>> = sequences
        .iter()
        .map(|s| (0..kvh).map(|h| s.layer.head(h)).collect())
        .collect();
    crate::team::for_each_chunk(out, group * hd, |idx, o| {
        let (i, kh) = (idx / kvh, idx % kvh);
        let j = owner[i];
        let s = &sequences[j];
        let span = window_span(s.p0 + (i - s.rows.start) + 1, s.window);
        let at = (i * num_heads + kh * group) * hd;
        row_head_online(
            &k,
            &views[j][kh],
            span,
            &q[at..at + group * hd],
            group,
            hd,
            o,
        );
    });
}

/// Attention of `n` query rows where row `i` sees positions `0..visible(i)` of `layer`
/// (at least 1, at most `layer.len()`): the causal pass of [`attention_split`] is
/// `visible(i) = p0 + i + 1`; a DFlash draft block, whose rows all see the whole block,
/// is `visible(i) = layer.len()`. The bits of a row depend on its query and its visible
/// positions alone, as stated in the module documentation.
///
/// # Panics
/// If the shapes do not match or a row's visible count is 0 or past the layer's end.
#[allow(clippy::too_many_arguments)]
pub fn attention_visible(
    isa: Isa,
    layer: &KvLayer,
    queries: &[f32],
    n: usize,
    visible: &(dyn Fn(usize) -> usize + Sync),
    num_heads: usize,
    scale: f32,
    out: &mut [f32],
    split: Split,
) {
    let span = |i: usize| (0, visible(i));
    attention_span(isa, layer, queries, n, &span, num_heads, scale, out, split)
}

/// Attention of `n` query rows where row `i` sees positions `start..end` of `layer`,
/// `(start, end) = span(i)` (`start < end <= layer.len()`). Its key blocks are those
/// from `start / BLOCK` to the one holding `end - 1`, combined in order from the first;
/// in the first block only the positions from `start` on count
/// ([`reference::block_partial_from`], which equals every variant where it starts at
/// the block's first position).
///
/// # Panics
/// If the shapes do not match or a row's span is empty or past the layer's end.
#[allow(clippy::too_many_arguments)]
pub fn attention_span(
    isa: Isa,
    layer: &KvLayer,
    queries: &[f32],
    n: usize,
    span: &(dyn Fn(usize) -> (usize, usize) + Sync),
    num_heads: usize,
    scale: f32,
    out: &mut [f32],
    split: Split,
) {
    let (kvh, hd) = (layer.kv_heads(), layer.head_dim());
    assert!(
        kvh > 0 && num_heads.is_multiple_of(kvh),
        "attention: {num_heads} heads over {kvh} kv heads"
    );
    assert_eq!(
        queries.len(),
        n * num_heads * hd,
        "attention: queries shape"
    );
    assert_eq!(out.len(), n * num_heads * hd, "attention: output shape");
    for i in 0..n {
        let (start, end) = span(i);
        assert!(
            start < end && end <= layer.len(),
            "attention: row {i} sees {} positions ({start}..{end}) of a layer of {}",
            end.saturating_sub(start),
            layer.len()
        );
    }
    if n == 0 {
        return;
    }
    let group = num_heads / kvh;
    let factor = scale * std::f32::consts::LOG2_E;
    let q: Vec<f32> = queries.iter().map(|&v| v * factor).collect();
    let k = kernels(isa, hd);
    let pl = partial_len(hd);
    let max_blocks = (0..n)
        .map(|i| {
            let (b0, b1) = blocks_of(span(i));
            b1 - b0
        })
        .max()
        .unwrap_or(1);
    let split = match split {
        Split::Auto => {
            let threads = crate::team::current_threads();
            if n * kvh >= 4 * threads || max_blocks < 2 {
                Split::Rows
            } else {
                let chunks = (4 * threads).div_ceil(n * kvh).min(max_blocks);
                Split::Blocks {
                    per: max_blocks.div_ceil(chunks),
                }
            }
        }
        s => s,
    };
    let views: Vec<KvHeadView<'_>> = (0..kvh).map(|h| layer.head(h)).collect();
    let qs = |i: usize, kh: usize| {
        let at = (i * num_heads + kh * group) * hd;
        &q[at..at + group * hd]
    };
    match split {
        Split::Auto | Split::Rows => {
            crate::team::for_each_chunk(out, group * hd, |idx, o| {
                let (i, kh) = (idx / kvh, idx % kvh);
                row_head_online(&k, &views[kh], span(i), qs(i, kh), group, hd, o);
            });
        }
        Split::Blocks { per } => {
            let per = per.max(1);
            let chunks = max_blocks.div_ceil(per);
            let task_len = per * group * pl;
            let mut scratch = vec![0f32; n * kvh * chunks * task_len];
            crate::team::for_each_chunk(&mut scratch, task_len, |idx, dst| {
                let (row_head, c) = (idx / chunks, idx % chunks);
                let (i, kh) = (row_head / kvh, row_head % kvh);
                let (b0, b1) = blocks_of(span(i));
                // Task c holds the row's blocks b0 + c·per .. (relative indices).
                for (j, r) in (c * per..((c + 1) * per).min(b1 - b0)).enumerate() {
                    let part = &mut dst[j * group * pl..(j + 1) * group * pl];
                    span_partial(&k, &views[kh], b0 + r, span(i), qs(i, kh), group, part);
                }
            });
            let per_row_head = chunks * task_len;
            crate::team::for_each_chunk(out, group * hd, |idx, o| {
                let i = idx / kvh;
                let (b0, b1) = blocks_of(span(i));
                let blocks = b1 - b0;
                let parts = &scratch[idx * per_row_head..(idx + 1) * per_row_head];
                let at = |b: usize, g: usize| (b * group + g) * pl;
                for (g, o) in o.chunks_exact_mut(hd).enumerate() {
                    let mut state = parts[at(0, g)..at(0, g) + pl].to_vec();
                    for b in 1..blocks {
                        // SAFETY: `kernels` chose variants the detected `isa` allows.
                        unsafe { (k.combine)(&mut state, &parts[at(b, g)..at(b, g) + pl]) };
                    }
                    finish(&state, o);
                }
            });
        }
    }
}
