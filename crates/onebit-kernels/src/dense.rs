//! `y = x · Wᵀ` for a dense BF16 W (`rows × k`, row-major): the tied LM head read
//! straight from the BF16 embedding.
//!
//! The arithmetic per output element is fixed: sixteen lane sums, lane `j` adding
//! `fma(w[c], x[c], acc_j)` for `c = j, j + 16, ...` in order, then the tree
//! `j + j⊕8`, `+ j⊕4`, `+ j⊕2`, `+ j⊕1`. The AVX-512 kernel performs exactly those
//! operations, so it equals the scalar one bit for bit, and every row is computed the
//! same way whatever the batch size (batch invariance).

use half::bf16;

use crate::isa::Isa;

const LANES: usize = 16;

/// One output element by the defining operations (requires `k % 16 == 0`).
pub fn reference_dot(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (c, &xv) in x.iter().enumerate() {
        let wv = bf16::from_le_bytes([w[2 * c], w[2 * c + 1]]).to_f32();
        acc[c % LANES] = wv.mul_add(xv, acc[c % LANES]);
    }
    reduce_lanes(acc)
}

/// The fixed reduction tree over the sixteen lane sums.
fn reduce_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] += acc[j + width];
        }
    }
    acc[0]
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

/// `y[i * rows + r] = Σ_c W[r][c] · x[i * k + c]`.
///
/// # Panics
/// If `k` is not a multiple of 16 or the slices do not match.
pub fn matmul_bf16(w: &[u8], rows: usize, k: usize, x: &[f32], n: usize, y: &mut [f32], isa: Isa) {
    assert_eq!(k % LANES, 0, "K must be a multiple of 16");
    assert_eq!(w.len(), rows * k * 2);
    assert_eq!(x.len(), n * k);
    assert_eq!(y.len(), n * rows);
    const BLOCK: usize = 64;
    crate::blocks_through_scratch(y, rows, n, BLOCK, |b, out| {
        let first = b * BLOCK;
        let count = BLOCK.min(rows.saturating_sub(first));
        #[cfg(target_arch = "x86_64")]
        if isa.avx512() {
            // SAFETY: the token's avx512 flag is set only by run-time detection.
            unsafe { avx512::block(w, first, count, k, x, n, out) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // SAFETY: the token's avx2 flag (avx2 + fma) is set only by detection.
            unsafe { avx2::block(w, first, count, k, x, n, out) };
            return;
        }
        for r in 0..count {
            let row = first + r;
            let wr = &w[row * k * 2..(row + 1) * k * 2];
            for i in 0..n {
                out[r * n + i] = reference_dot(wr, &x[i * k..(i + 1) * k]);
            }
        }
    });
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{reduce_lanes, LANES};

    /// `out[r * n + i]` for `count` rows from `first` and all `n` inputs. Each 16-column
    /// chunk of a row is widened from BF16 once and multiplied into the accumulators of
    /// several rows or inputs at a time: independent FMA chains instead of one, and one
    /// decode per chunk instead of one per input. Each accumulator still adds its
    /// columns in order, so every element is `reference_dot`'s bits.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn block(
        w: &[u8],
        first: usize,
        count: usize,
        k: usize,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) {
        unsafe {
            let mut r = 0;
            while r < count {
                if n == 1 && count - r >= 4 {
                    tile::<4, 1>(w, first + r, k, x, 0, n, &mut out[r * n..]);
                    r += 4;
                    continue;
                }
                let mut i = 0;
                while i < n {
                    let step = match n - i {
                        8.. => {
                            tile::<1, 8>(w, first + r, k, x, i, n, &mut out[r * n..]);
                            8
                        }
                        4..=7 => {
                            tile::<1, 4>(w, first + r, k, x, i, n, &mut out[r * n..]);
                            4
                        }
                        2 | 3 => {
                            tile::<1, 2>(w, first + r, k, x, i, n, &mut out[r * n..]);
                            2
                        }
                        _ => {
                            tile::<1, 1>(w, first + r, k, x, i, n, &mut out[r * n..]);
                            1
                        }
                    };
                    i += step;
                }
                r += 1;
            }
        }
    }

    /// Rows `row0 .. row0 + RB` times inputs `i0 .. i0 + R`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const RB: usize, const R: usize>(
        w: &[u8],
        row0: usize,
        k: usize,
        x: &[f32],
        i0: usize,
        n: usize,
        out: &mut [f32],
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); R]; RB];
            for c in (0..k).step_by(LANES) {
                for (rr, row_acc) in acc.iter_mut().enumerate() {
                    let h = _mm256_loadu_si256(
                        w.as_ptr().add(2 * ((row0 + rr) * k + c)) as *const __m256i
                    );
                    let wv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
                    for (ii, a) in row_acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(
                            wv,
                            _mm512_loadu_ps(x.as_ptr().add((i0 + ii) * k + c)),
                            *a,
                        );
                    }
                }
            }
            let mut lanes = [0f32; LANES];
            for (rr, row_acc) in acc.iter().enumerate() {
                for (ii, a) in row_acc.iter().enumerate() {
                    _mm512_storeu_ps(lanes.as_mut_ptr(), *a);
                    out[rr * n + i0 + ii] = reduce_lanes(lanes);
                }
            }
        }
    }
}

/// `y = x · Wᵀ` for a BF16 W stored in block-column order `[rows/32][k][32]`
/// (element `[b][c][r]` is `W[b*32 + r][c]`): the DFlash fusion matrix's layout.
///
/// Per output element: `acc = Σ_c fma(W[r][c], x[c], acc)` in column order, so every
/// row is computed the same way whatever the batch (batch invariance).
pub fn matmul_bf16_block_columns(
    w: &[u8],
    rows: usize,
    k: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    isa: Isa,
) {
    assert_eq!(rows % 32, 0, "rows must be a multiple of 32");
    assert_eq!(w.len(), rows * k * 2);
    assert_eq!(x.len(), n * k);
    assert_eq!(y.len(), n * rows);
    crate::blocks_through_scratch(y, rows, n, 32, |b, out| {
        let block = &w[b * k * 64..(b + 1) * k * 64];
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // Up to 8 inputs per sweep of the block: each column is widened once
            // and feeds independent accumulator chains.
            let mut i = 0;
            while i < n {
                // SAFETY: the token's avx512 / avx2 flags are set only by detection.
                let step = unsafe {
                    match (isa.avx512(), n - i) {
                        (true, 8..) => avx512_block_columns::<8>(block, x, k, i, n, out),
                        (true, 4..=7) => avx512_block_columns::<4>(block, x, k, i, n, out),
                        (true, 2 | 3) => avx512_block_columns::<2>(block, x, k, i, n, out),
                        (true, _) => avx512_block_columns::<1>(block, x, k, i, n, out),
                        (false, 4..) => avx2_block_columns::<4>(block, x, k, i, n, out),
                        (false, 2 | 3) => avx2_block_columns::<2>(block, x, k, i, n, out),
                        (false, _) => avx2_block_columns::<1>(block, x, k, i, n, out),
                    }
                };
                i += step;
            }
            return;
        }
        for i in 0..n {
            let acc = scalar_block_column(block, &x[i * k..(i + 1) * k]);
            for (r, &a) in acc.iter().enumerate() {
                out[r * n + i] = a;
            }
        }
    });
}

/// 32 outputs of one row block: `acc[r] = Σ_c fma(W[r][c], x[c], acc[r])`.
fn scalar_block_column(block: &[u8], x: &[f32]) -> [f32; 32] {
    let mut acc = [0f32; 32];
    for (c, &xv) in x.iter().enumerate() {
        let col = &block[c * 64..(c + 1) * 64];
        for (r, a) in acc.iter_mut().enumerate() {
            let wv = bf16::from_le_bytes([col[2 * r], col[2 * r + 1]]).to_f32();
            *a = wv.mul_add(xv, *a);
        }
    }
    acc
}

/// Inputs `i0 .. i0 + R` of one row block (`out[r * n + i]`); returns `R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_block_columns<const R: usize>(
    block: &[u8],
    x: &[f32],
    k: usize,
    i0: usize,
    n: usize,
    out: &mut [f32],
) -> usize {
    unsafe {
        use std::arch::x86_64::*;
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for c in 0..k {
            let p = block.as_ptr().add(c * 64);
            let w0 = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i)),
                16,
            ));
            let w1 = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(32) as *const __m256i)),
                16,
            ));
            for (ii, a) in acc.iter_mut().enumerate() {
                let xb = _mm512_set1_ps(*x.get_unchecked((i0 + ii) * k + c));
                a[0] = _mm512_fmadd_ps(w0, xb, a[0]);
                a[1] = _mm512_fmadd_ps(w1, xb, a[1]);
            }
        }
        let mut lanes = [0f32; 32];
        for (ii, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(lanes.as_mut_ptr(), a[0]);
            _mm512_storeu_ps(lanes.as_mut_ptr().add(16), a[1]);
            for (r, &v) in lanes.iter().enumerate() {
                out[r * n + i0 + ii] = v;
            }
        }
        R
    }
}

/// [`avx512_block_columns`] on AVX2: the 32 rows of a column as four 8-lane vectors,
/// the same fused multiply-adds in the same order per row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_block_columns<const R: usize>(
    block: &[u8],
    x: &[f32],
    k: usize,
    i0: usize,
    n: usize,
    out: &mut [f32],
) -> usize {
    unsafe {
        use std::arch::x86_64::*;
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for c in 0..k {
            let p = block.as_ptr().add(c * 64);
            let mut w = [_mm256_setzero_ps(); 4];
            for (q, wq) in w.iter_mut().enumerate() {
                *wq = _mm256_castsi256_ps(_mm256_slli_epi32(
                    _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(16 * q) as *const __m128i)),
                    16,
                ));
            }
            for (ii, a) in acc.iter_mut().enumerate() {
                let xb = _mm256_set1_ps(*x.get_unchecked((i0 + ii) * k + c));
                for q in 0..4 {
                    a[q] = _mm256_fmadd_ps(w[q], xb, a[q]);
                }
            }
        }
        let mut lanes = [0f32; 32];
        for (ii, a) in acc.iter().enumerate() {
            for (q, v) in a.iter().enumerate() {
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * q), *v);
            }
            for (r, &v) in lanes.iter().enumerate() {
                out[r * n + i0 + ii] = v;
            }
        }
        R
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{reduce_lanes, LANES};

    /// `out[r * n + i]` for `count` rows from `first` and all `n` inputs: the sixteen
    /// lane sums of [`super::reference_dot`] as two 8-lane vectors (lanes 0..8 and
    /// 8..16), each lane adding its columns in order, then the same reduction tree.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block(
        w: &[u8],
        first: usize,
        count: usize,
        k: usize,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) {
        unsafe {
            for r in 0..count {
                let mut i = 0;
                while i < n {
                    let step = match n - i {
                        4.. => {
                            tile::<4>(w, first + r, k, x, i, &mut out[r * n..]);
                            4
                        }
                        2 | 3 => {
                            tile::<2>(w, first + r, k, x, i, &mut out[r * n..]);
                            2
                        }
                        _ => {
                            tile::<1>(w, first + r, k, x, i, &mut out[r * n..]);
                            1
                        }
                    };
                    i += step;
                }
            }
        }
    }

    /// One row times inputs `i0 .. i0 + R`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize>(
        w: &[u8],
        row: usize,
        k: usize,
        x: &[f32],
        i0: usize,
        out: &mut [f32],
    ) {
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for c in (0..k).step_by(LANES) {
                let p = w.as_ptr().add(2 * (row * k + c));
                let w0 = _mm256_castsi256_ps(_mm256_slli_epi32(
                    _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)),
                    16,
                ));
                let w1 = _mm256_castsi256_ps(_mm256_slli_epi32(
                    _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(16) as *const __m128i)),
                    16,
                ));
                for (ii, a) in acc.iter_mut().enumerate() {
                    let xp = x.as_ptr().add((i0 + ii) * k + c);
                    a[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp), a[0]);
                    a[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(8)), a[1]);
                }
            }
            let mut lanes = [0f32; LANES];
            for (ii, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(lanes.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), a[1]);
                out[i0 + ii] = reduce_lanes(lanes);
            }
        }
    }
}
