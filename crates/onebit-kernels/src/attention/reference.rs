//! The scalar definition of the attention family's bits: one block partial at a time,
//! by the steps in the family's documentation. Every SIMD variant is tested equal to it.

use super::{exp2, partial_len, LANES};
use crate::kv::{KvHeadView, BLOCK};

/// The fixed reduction of a block's `p_t` into `l`: sixteen lane sums in position order,
/// then the tree `j + j⊕8, ⊕4, ⊕2, ⊕1`.
pub fn lane_sum(p: &[f32; BLOCK]) -> f32 {
    let mut acc = [0f32; LANES];
    for chunk in p.chunks_exact(LANES) {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += v;
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] += acc[j + width];
        }
    }
    acc[0]
}

/// The score of prescaled query `q` against position `t`: an FMA chain over the
/// dimensions in order, times the key scale at q8.
pub fn score(view: &KvHeadView<'_>, q: &[f32], t: usize) -> f32 {
    let mut s = 0f32;
    for (d, &qd) in q.iter().enumerate() {
        s = qd.mul_add(view.key(t, d), s);
    }
    if view.key_scales.is_empty() {
        s
    } else {
        s * view.key_scales[t]
    }
}

/// Partials `[m, l, acc..]` of `group` query heads (`queries`: `group × head_dim`,
/// prescaled by `scale · log2 e`) over block `block`, of which the first `visible`
/// positions count, into `out` (`group × (head_dim + 2)`).
pub fn block_partial(
    view: &KvHeadView<'_>,
    block: usize,
    visible: usize,
    queries: &[f32],
    group: usize,
    out: &mut [f32],
) {
    block_partial_from(view, block, 0, visible, queries, group, out)
}

/// [`block_partial`] where only positions `from..visible` of the block count (a
/// sliding window that starts inside the block): the positions before `from` are
/// invisible exactly as those past `visible` are (score `-inf`, weight 0, adding 0 to
/// their lane), so with `from == 0` this is [`block_partial`] itself.
pub fn block_partial_from(
    view: &KvHeadView<'_>,
    block: usize,
    from: usize,
    visible: usize,
    queries: &[f32],
    group: usize,
    out: &mut [f32],
) {
    let hd = view.head_dim;
    let t0 = block * BLOCK;
    assert!((1..=BLOCK).contains(&visible) && t0 + visible <= view.len && from < visible);
    for g in 0..group {
        let q = &queries[g * hd..(g + 1) * hd];
        let mut s = [f32::NEG_INFINITY; BLOCK];
        for (j, sj) in s.iter_mut().enumerate().take(visible).skip(from) {
            *sj = score(view, q, t0 + j);
        }
        let mut m = f32::NEG_INFINITY;
        for &sj in &s[from..visible] {
            if sj > m {
                m = sj;
            }
        }
        m += 0.0;
        let mut p = [0f32; BLOCK];
        for (pj, &sj) in p.iter_mut().zip(&s).take(visible).skip(from) {
            *pj = exp2(sj - m);
        }
        let part = &mut out[g * partial_len(hd)..(g + 1) * partial_len(hd)];
        part[0] = m;
        part[1] = lane_sum(&p);
        let acc = &mut part[2..];
        acc.fill(0.0);
        for (j, &pj) in p.iter().enumerate().take(visible).skip(from) {
            let t = t0 + j;
            let w = if view.value_scales.is_empty() {
                pj
            } else {
                pj * view.value_scales[t]
            };
            for (d, a) in acc.iter_mut().enumerate() {
                *a = w.mul_add(view.value(t, d), *a);
            }
        }
    }
}
