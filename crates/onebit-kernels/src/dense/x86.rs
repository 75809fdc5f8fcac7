//! The x86-64 variants of the BF16 × f32 family (AVX2 + FMA, AVX-512), each performing
//! the reference's operations per element.

pub(super) mod avx512 {
    use std::arch::x86_64::*;

    use super::super::reference::{reduce_lanes, LANES};

    /// `out[r * n + i]` for `count` rows from `first` and all `n` inputs. Each 16-column
    /// chunk of a row is widened from BF16 once and multiplied into the accumulators of
    /// several rows or inputs at a time: independent FMA chains instead of one, and one
    /// decode per chunk instead of one per input. Each accumulator still adds its
    /// columns in order, so every element is `reference_dot`'s bits.
    #[target_feature(enable = "avx512f")]
    pub(in crate::dense) unsafe fn block(
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

/// Inputs `i0 .. i0 + R` of one row block (`out[r * n + i]`); returns `R`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn avx512_block_columns<const R: usize>(
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
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn avx2_block_columns<const R: usize>(
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

pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use super::super::reference::{reduce_lanes, LANES};

    /// `out[r * n + i]` for `count` rows from `first` and all `n` inputs: the sixteen
    /// lane sums of [`crate::dense::reference_dot`] as two 8-lane vectors (lanes 0..8 and
    /// 8..16), each lane adding its columns in order, then the same reduction tree.
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::dense) unsafe fn block(
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
