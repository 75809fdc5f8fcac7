//! x86-64 variants of the attention family. Each performs [`super::reference`]'s
//! operations lane for lane:
//! - scores: one accumulator per position (sixteen or eight positions per register),
//!   `fma(q'[d], k[d], s)` for `d` in order — keys are stored transposed per block, so
//!   one load brings the same dimension of consecutive positions;
//! - the block maximum (order-free), `exp2` by the same polynomial, the exp sum by the
//!   reference's sixteen lanes and tree;
//! - value sums: one accumulator per dimension, `fma(w_t, v_t[d], acc)` for `t` in order.
//!
//! Invisible positions of a partial block are computed and then replaced by `-inf`
//! before the maximum, so their `p` is exactly 0 and adds nothing.

// The kernels index several per-head arrays by the same counter.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{partial_len, EXP2_MIN, LN2, P, ROUND_MAGIC};
use crate::kv::{ElemsRef, KvHeadView, BLOCK};

const F32: u8 = 0;
const BF16: u8 = 1;
const Q8: u8 = 2;
/// Query heads per sweep of a block.
const MAX_G: usize = 4;

/// [`super::combine`] compiled with hardware FMA (the same bits as the software `fmaf`).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn combine_fma(state: &mut [f32], part: &[f32]) {
    super::combine(state, part)
}

/// Raw pointers of one kv head's stores, after the bounds were checked.
#[derive(Clone, Copy)]
struct Raw {
    keys: *const u8,
    values: *const u8,
    key_scales: *const f32,
    value_scales: *const f32,
    hd: usize,
    t0: usize,
    visible: usize,
    /// Whether the cache holds positions past this block (worth prefetching).
    more: bool,
}

fn elems(e: ElemsRef<'_>) -> (u8, *const u8, usize) {
    match e {
        ElemsRef::F32(v) => (F32, v.as_ptr() as *const u8, v.len()),
        ElemsRef::Bf16(v) => (BF16, v.as_ptr() as *const u8, v.len()),
        ElemsRef::Q8(v) => (Q8, v.as_ptr() as *const u8, v.len()),
    }
}

/// Checks every bound the kernels rely on and returns the raw view and element kind.
fn raw(
    view: &KvHeadView<'_>,
    block: usize,
    visible: usize,
    queries: &[f32],
    group: usize,
    out: &[f32],
) -> (u8, Raw) {
    let hd = view.head_dim;
    let t0 = block * BLOCK;
    let (kind, keys, key_len) = elems(view.keys);
    let (vkind, values, value_len) = elems(view.values);
    assert!(hd.is_multiple_of(16) && kind == vkind);
    assert!((1..=BLOCK).contains(&visible) && t0 + visible <= view.len);
    assert!(key_len >= (block + 1) * hd * BLOCK && value_len >= (t0 + visible) * hd);
    if kind == Q8 {
        assert!(view.key_scales.len() >= (block + 1) * BLOCK);
        assert!(view.value_scales.len() >= t0 + visible);
    }
    assert!(queries.len() >= group * hd && out.len() >= group * partial_len(hd));
    (
        kind,
        Raw {
            keys,
            values,
            key_scales: view.key_scales.as_ptr(),
            value_scales: view.value_scales.as_ptr(),
            hd,
            t0,
            visible,
            more: t0 + BLOCK < view.len,
        },
    )
}

/// Weights `w_t` of the value sums: `p_t`, times the value scale at q8.
fn weights<const K: u8>(r: &Raw, p: &[f32; BLOCK], w: &mut [f32; BLOCK]) {
    for t in 0..r.visible {
        w[t] = if K == Q8 {
            // SAFETY: `raw` checked `value_scales.len() >= t0 + visible` at q8.
            p[t] * unsafe { *r.value_scales.add(r.t0 + t) }
        } else {
            p[t]
        };
    }
}

// ------------------------------------------------------------------------- AVX-512

/// Bytes per stored element of kind `K`.
const fn elem_bytes<const K: u8>() -> usize {
    match K {
        F32 => 4,
        BF16 => 2,
        _ => 1,
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn load16<const K: u8>(base: *const u8, i: usize) -> __m512 {
    unsafe {
        match K {
            F32 => _mm512_loadu_ps((base as *const f32).add(i)),
            BF16 => {
                let h = _mm256_loadu_si256((base as *const u16).add(i) as *const __m256i);
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
            }
            _ => {
                let b = _mm_loadu_si128((base as *const i8).add(i) as *const __m128i);
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b))
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
fn exp2_512(x: __m512) -> __m512 {
    let min = _mm512_set1_ps(EXP2_MIN);
    let magic = _mm512_set1_ps(ROUND_MAGIC);
    let xc = _mm512_max_ps(x, min);
    let n = _mm512_sub_ps(_mm512_add_ps(xc, magic), magic);
    let t = _mm512_mul_ps(_mm512_sub_ps(xc, n), _mm512_set1_ps(LN2));
    let mut p = _mm512_set1_ps(P[0]);
    for &c in &P[1..] {
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(p, _mm512_mul_ps(t, t), t),
        _mm512_set1_ps(1.0),
    );
    let e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)),
        23,
    );
    let v = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    let keep = _mm512_cmp_ps_mask(x, min, _CMP_GE_OQ);
    _mm512_maskz_mov_ps(keep, v)
}

/// The reference's tree over sixteen lanes.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
fn tree16(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    tree8(_mm256_add_ps(lo, hi))
}

/// The last three steps of the tree (lanes `j + j⊕4, ⊕2, ⊕1`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn tree8(v: __m256) -> f32 {
    let r4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    let r1 = _mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1));
    _mm_cvtss_f32(r1)
}

/// The AVX-512 block kernel (see [`super::reference::block_partial`]).
///
/// # Safety
/// The CPU must have AVX2, FMA and AVX-512 F/BW/VL; `head_dim % 16 == 0`.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn block_avx512(
    view: &KvHeadView<'_>,
    block: usize,
    visible: usize,
    queries: &[f32],
    group: usize,
    out: &mut [f32],
) {
    let (kind, r) = raw(view, block, visible, queries, group, out);
    // SAFETY: `raw` checked every bound the kernels use; the features are the caller's.
    unsafe {
        match kind {
            F32 => heads512::<F32>(&r, queries, group, out),
            BF16 => heads512::<BF16>(&r, queries, group, out),
            _ => heads512::<Q8>(&r, queries, group, out),
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn heads512<const K: u8>(r: &Raw, queries: &[f32], group: usize, out: &mut [f32]) {
    let (hd, pl) = (r.hd, partial_len(r.hd));
    let mut g0 = 0;
    while g0 < group {
        let gn = (group - g0).min(MAX_G);
        let q = &queries[g0 * hd..(g0 + gn) * hd];
        let o = &mut out[g0 * pl..(g0 + gn) * pl];
        // SAFETY: forwarded from the caller (bounds checked by `raw`).
        unsafe {
            match gn {
                1 => group512::<K, 1>(r, q, o),
                2 => group512::<K, 2>(r, q, o),
                3 => group512::<K, 3>(r, q, o),
                _ => group512::<K, 4>(r, q, o),
            }
        }
        g0 += gn;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn group512<const K: u8, const G: usize>(r: &Raw, q: &[f32], out: &mut [f32]) {
    let (hd, pl) = (r.hd, partial_len(r.hd));
    let kbase = (r.t0 / BLOCK) * hd * BLOCK;
    // Scores: sixteen positions per register, four registers per head.
    let mut acc = [[_mm512_setzero_ps(); 4]; G];
    let esz = elem_bytes::<K>();
    for d in 0..hd {
        let row = kbase + d * BLOCK;
        // The next block's key and value rows are asked for while this block's are worked
        // on: at long context a pass streams the cache from far caches or memory, and
        // with the hardware prefetcher alone the loads waited (SmolLM2 at 2048 positions:
        // 1-row pass 7.8–10.2 ms before, 5.8–6.8 after). The AVX2 kernel, bound by its
        // arithmetic here, measured no gain and does not.
        if r.more {
            crate::prefetch_bytes(r.keys.wrapping_add((row + hd * BLOCK) * esz), BLOCK * esz);
        }
        // SAFETY: `row + 64 <= (block + 1) · hd · BLOCK <= keys.len()` (checked by `raw`).
        let k = unsafe {
            [
                load16::<K>(r.keys, row),
                load16::<K>(r.keys, row + 16),
                load16::<K>(r.keys, row + 32),
                load16::<K>(r.keys, row + 48),
            ]
        };
        for g in 0..G {
            let qb = _mm512_set1_ps(q[g * hd + d]);
            for v in 0..4 {
                acc[g][v] = _mm512_fmadd_ps(qb, k[v], acc[g][v]);
            }
        }
    }
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut p = [[0f32; BLOCK]; G];
    for g in 0..G {
        let mut s = acc[g];
        for v in 0..4 {
            if K == Q8 {
                // SAFETY: `key_scales.len() >= (block + 1) · BLOCK` at q8 (checked by `raw`).
                let sc = unsafe { _mm512_loadu_ps(r.key_scales.add(r.t0 + 16 * v)) };
                s[v] = _mm512_mul_ps(s[v], sc);
            }
            let count = r.visible.saturating_sub(16 * v).min(16);
            let mask = ((1u32 << count) - 1) as u16;
            s[v] = _mm512_mask_blend_ps(mask, ninf, s[v]);
        }
        let top = _mm512_max_ps(_mm512_max_ps(s[0], s[1]), _mm512_max_ps(s[2], s[3]));
        let m = _mm512_reduce_max_ps(top) + 0.0;
        let mv = _mm512_set1_ps(m);
        let e: [__m512; 4] = std::array::from_fn(|v| exp2_512(_mm512_sub_ps(s[v], mv)));
        let sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(e[0], e[1]), e[2]), e[3]);
        out[g * pl] = m;
        out[g * pl + 1] = tree16(sum);
        for v in 0..4 {
            // SAFETY: `16 · v + 16 <= BLOCK`.
            unsafe { _mm512_storeu_ps(p[g].as_mut_ptr().add(16 * v), e[v]) };
        }
    }
    let mut w = [[0f32; BLOCK]; G];
    for g in 0..G {
        weights::<K>(r, &p[g], &mut w[g]);
    }
    // Value sums: sixteen dimensions per register, up to four registers per sweep.
    let mut dc = 0;
    while dc < hd {
        // SAFETY: forwarded (bounds checked by `raw`; `dc + 16 · NV <= hd`).
        unsafe {
            match (hd - dc) / 16 {
                1 => values512::<K, G, 1>(r, &w, dc, out),
                2 => values512::<K, G, 2>(r, &w, dc, out),
                3 => values512::<K, G, 3>(r, &w, dc, out),
                _ => values512::<K, G, 4>(r, &w, dc, out),
            }
        }
        dc += 64;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn values512<const K: u8, const G: usize, const NV: usize>(
    r: &Raw,
    w: &[[f32; BLOCK]; G],
    dc: usize,
    out: &mut [f32],
) {
    let (hd, pl) = (r.hd, partial_len(r.hd));
    let mut acc = [[_mm512_setzero_ps(); NV]; G];
    let esz = elem_bytes::<K>();
    for t in 0..r.visible {
        let row = (r.t0 + t) * hd + dc;
        if dc == 0 && r.more {
            // The same position of the next block: its whole value row.
            crate::prefetch_bytes(r.values.wrapping_add((row + BLOCK * hd) * esz), hd * esz);
        }
        // SAFETY: `row + 16 · NV <= (t0 + visible) · hd <= values.len()`.
        let v: [__m512; NV] =
            std::array::from_fn(|j| unsafe { load16::<K>(r.values, row + 16 * j) });
        for g in 0..G {
            let wb = _mm512_set1_ps(w[g][t]);
            for j in 0..NV {
                acc[g][j] = _mm512_fmadd_ps(wb, v[j], acc[g][j]);
            }
        }
    }
    for g in 0..G {
        for j in 0..NV {
            let at = g * pl + 2 + dc + 16 * j;
            assert!(at + 16 <= out.len());
            // SAFETY: checked just above.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(at), acc[g][j]) };
        }
    }
}

// ---------------------------------------------------------------------------- AVX2

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load8<const K: u8>(base: *const u8, i: usize) -> __m256 {
    unsafe {
        match K {
            F32 => _mm256_loadu_ps((base as *const f32).add(i)),
            BF16 => {
                let h = _mm_loadu_si128((base as *const u16).add(i) as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            }
            _ => {
                let b = _mm_loadl_epi64((base as *const i8).add(i) as *const __m128i);
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp2_256(x: __m256) -> __m256 {
    let min = _mm256_set1_ps(EXP2_MIN);
    let magic = _mm256_set1_ps(ROUND_MAGIC);
    let xc = _mm256_max_ps(x, min);
    let n = _mm256_sub_ps(_mm256_add_ps(xc, magic), magic);
    let t = _mm256_mul_ps(_mm256_sub_ps(xc, n), _mm256_set1_ps(LN2));
    let mut p = _mm256_set1_ps(P[0]);
    for &c in &P[1..] {
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(p, _mm256_mul_ps(t, t), t),
        _mm256_set1_ps(1.0),
    );
    let e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    let v = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    let keep = _mm256_cmp_ps(x, min, _CMP_GE_OQ);
    _mm256_and_ps(v, keep)
}

/// The AVX2 block kernel (see [`super::reference::block_partial`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA; `head_dim % 16 == 0`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn block_avx2(
    view: &KvHeadView<'_>,
    block: usize,
    visible: usize,
    queries: &[f32],
    group: usize,
    out: &mut [f32],
) {
    let (kind, r) = raw(view, block, visible, queries, group, out);
    // SAFETY: `raw` checked every bound the kernels use; the features are the caller's.
    unsafe {
        match kind {
            F32 => heads256::<F32>(&r, queries, group, out),
            BF16 => heads256::<BF16>(&r, queries, group, out),
            _ => heads256::<Q8>(&r, queries, group, out),
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn heads256<const K: u8>(r: &Raw, queries: &[f32], group: usize, out: &mut [f32]) {
    let (hd, pl) = (r.hd, partial_len(r.hd));
    let mut g0 = 0;
    while g0 < group {
        let gn = (group - g0).min(MAX_G);
        let q = &queries[g0 * hd..(g0 + gn) * hd];
        let o = &mut out[g0 * pl..(g0 + gn) * pl];
        // SAFETY: forwarded from the caller (bounds checked by `raw`).
        unsafe {
            match gn {
                1 => group256::<K, 1>(r, q, o),
                2 => group256::<K, 2>(r, q, o),
                3 => group256::<K, 3>(r, q, o),
                _ => group256::<K, 4>(r, q, o),
            }
        }
        g0 += gn;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn group256<const K: u8, const G: usize>(r: &Raw, q: &[f32], out: &mut [f32]) {
    let (hd, pl) = (r.hd, partial_len(r.hd));
    let kbase = (r.t0 / BLOCK) * hd * BLOCK;
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    // Scores, sixteen positions (two registers) per sweep over the dimensions.
    let mut s = [[f32::NEG_INFINITY; BLOCK]; G];
    for c in 0..r.visible.div_ceil(16) {
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        for d in 0..hd {
            let row = kbase + d * BLOCK + 16 * c;
            // SAFETY: `row + 16 <= (block + 1) · hd · BLOCK <= keys.len()`.
            let k = unsafe { [load8::<K>(r.keys, row), load8::<K>(r.keys, row + 8)] };
            for g in 0..G {
                let qb = _mm256_set1_ps(q[g * hd + d]);
                acc[g][0] = _mm256_fmadd_ps(qb, k[0], acc[g][0]);
                acc[g][1] = _mm256_fmadd_ps(qb, k[1], acc[g][1]);
            }
        }
        for g in 0..G {
            for h in 0..2 {
                let mut v = acc[g][h];
                let first = 16 * c + 8 * h;
                if K == Q8 {
                    // SAFETY: `key_scales.len() >= (block + 1) · BLOCK` at q8.
                    let sc = unsafe { _mm256_loadu_ps(r.key_scales.add(r.t0 + first)) };
                    v = _mm256_mul_ps(v, sc);
                }
                let count = r.visible.saturating_sub(first).min(8) as i32;
                let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(count), lane));
                v = _mm256_blendv_ps(ninf, v, valid);
                // SAFETY: `first + 8 <= BLOCK`.
                unsafe { _mm256_storeu_ps(s[g].as_mut_ptr().add(first), v) };
            }
        }
    }
    let mut w = [[0f32; BLOCK]; G];
    for g in 0..G {
        // SAFETY: every load below is inside `s[g]` (8 · j + 8 <= BLOCK).
        let sv: [__m256; 8] =
            std::array::from_fn(|j| unsafe { _mm256_loadu_ps(s[g].as_ptr().add(8 * j)) });
        let mut top = sv[0];
        for v in &sv[1..] {
            top = _mm256_max_ps(top, *v);
        }
        let top4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        let top2 = _mm_max_ps(top4, _mm_movehl_ps(top4, top4));
        let top1 = _mm_max_ss(top2, _mm_shuffle_ps(top2, top2, 1));
        let m = _mm_cvtss_f32(top1) + 0.0;
        let mv = _mm256_set1_ps(m);
        let e: [__m256; 8] = std::array::from_fn(|j| exp2_256(_mm256_sub_ps(sv[j], mv)));
        // Lanes 0..8 are the even registers (positions 16c..16c+8), 8..16 the odd ones.
        let lo = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(e[0], e[2]), e[4]), e[6]);
        let hi = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(e[1], e[3]), e[5]), e[7]);
        out[g * pl] = m;
        out[g * pl + 1] = tree8(_mm256_add_ps(lo, hi));
        let mut p = [0f32; BLOCK];
        for j in 0..8 {
            // SAFETY: `8 · j + 8 <= BLOCK`.
            unsafe { _mm256_storeu_ps(p.as_mut_ptr().add(8 * j), e[j]) };
        }
        weights::<K>(r, &p, &mut w[g]);
    }
    // Value sums: sixteen dimensions (two registers) per sweep over the positions.
    for dc in (0..hd).step_by(16) {
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        for t in 0..r.visible {
            let row = (r.t0 + t) * hd + dc;
            // SAFETY: `row + 16 <= (t0 + visible) · hd <= values.len()`.
            let v = unsafe { [load8::<K>(r.values, row), load8::<K>(r.values, row + 8)] };
            for g in 0..G {
                let wb = _mm256_set1_ps(w[g][t]);
                acc[g][0] = _mm256_fmadd_ps(wb, v[0], acc[g][0]);
                acc[g][1] = _mm256_fmadd_ps(wb, v[1], acc[g][1]);
            }
        }
        for g in 0..G {
            let at = g * pl + 2 + dc;
            assert!(at + 16 <= out.len());
            // SAFETY: checked just above.
            unsafe {
                _mm256_storeu_ps(out.as_mut_ptr().add(at), acc[g][0]);
                _mm256_storeu_ps(out.as_mut_ptr().add(at + 8), acc[g][1]);
            }
        }
    }
}
