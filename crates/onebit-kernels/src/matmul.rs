//! `y = x · Wᵀ` for a q4_1-tiled W, straight from the tile bytes.
//!
//! The arithmetic is defined by [`reference_dot`]: per output element, per 32-column
//! group `g`, `acc = Σ_c fma(q[c], x[c], acc)` in column order, then
//! `t = fma(m_g, Σx_g, d_g · acc)` and `y += t`, groups in column order. Every kernel
//! evaluates exactly that sequence of f32 operations for every element, whatever the
//! batch size and whichever rows share a task, so:
//! - the AVX-512 kernel equals the scalar one bit for bit (tested);
//! - a batched pass equals single-row passes bit for bit (batch invariance), which is
//!   what makes speculative decoding's text equal plain decoding's.
//!
//! Work is split over 32-row blocks of W (rayon); each task streams its tiles once for
//! all input rows, so an n-row pass reads the weights once. Columns past K (the
//! tile's zero padding) are never read.

use half::bf16;
use q4nx_format::{
    Q4Kind, Q4Matrix, GROUP_COLS, MIN_OFFSET, NIBBLE_OFFSET, TILE_BYTES, TILE_COLS, TILE_ROWS,
};

use crate::isa::Isa;

/// The variants of this family; [`variant`] picks one from an [`Isa`] token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// Portable scalar code (`f32::mul_add`); the definition of the arithmetic.
    Scalar,
    /// x86-64 AVX2 + FMA, 8 rows per vector.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86-64 AVX-512F, 16 rows per vector.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX-512F with VBMI: the q4 codes widened by byte and table permutes (fewer
    /// instructions per weight); the same bits as `Avx512`.
    #[cfg(target_arch = "x86_64")]
    Avx512Vbmi,
}

fn variant(isa: Isa) -> Variant {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512_vbmi() {
            return Variant::Avx512Vbmi;
        }
        if isa.avx512() {
            return Variant::Avx512;
        }
        if isa.avx2() {
            return Variant::Avx2;
        }
    }
    let _ = isa;
    Variant::Scalar
}

/// The name of the variant [`matmul`] runs under `isa` (for reports).
pub fn variant_name(isa: Isa) -> &'static str {
    match variant(isa) {
        Variant::Scalar => "scalar",
        #[cfg(target_arch = "x86_64")]
        Variant::Avx2 => "avx2",
        #[cfg(target_arch = "x86_64")]
        Variant::Avx512 => "avx512",
        #[cfg(target_arch = "x86_64")]
        Variant::Avx512Vbmi => "avx512vbmi",
    }
}

/// Per-group sums of each input row: `sums[i * groups + g] = Σ_{c in g} x[i][c]`,
/// added in column order.
pub fn group_sums(x: &[f32], n: usize, k: usize) -> Vec<f32> {
    let groups = k / GROUP_COLS;
    let mut out = vec![0f32; n * groups];
    for i in 0..n {
        for g in 0..groups {
            let mut s = 0f32;
            for &v in &x[i * k + g * GROUP_COLS..i * k + (g + 1) * GROUP_COLS] {
                s += v;
            }
            out[i * groups + g] = s;
        }
    }
    out
}

#[inline]
fn bf16_at(tile: &[u8], at: usize) -> f32 {
    bf16::from_le_bytes([tile[at], tile[at + 1]]).to_f32()
}

#[inline]
fn code(tile: &[u8], row: usize, col: usize, kind: Q4Kind) -> f32 {
    let byte = tile[NIBBLE_OFFSET + (row / 16) * (TILE_COLS * 8) + col * 8 + (row % 16) / 2];
    let nib = if row % 2 == 1 { byte >> 4 } else { byte & 0x0f };
    match kind {
        Q4Kind::Q4_1 => nib as f32,
        Q4Kind::Q4_0 => ((nib ^ 8) as i32 - 8) as f32,
    }
}

/// One output element by the defining sequence of operations (slow; for tests).
pub fn reference_dot(w: &Q4Matrix, row: usize, x: &[f32]) -> f32 {
    let k = w.cols();
    let mut y = 0f32;
    for g in 0..k / GROUP_COLS {
        let col0 = g * GROUP_COLS;
        let tile = w.tile(row / TILE_ROWS, col0 / TILE_COLS);
        let (r, gi) = (row % TILE_ROWS, (col0 % TILE_COLS) / GROUP_COLS);
        let s = gi * TILE_ROWS + r;
        let d = bf16_at(tile, 2 * s);
        let m = if w.kind() == Q4Kind::Q4_1 {
            bf16_at(tile, MIN_OFFSET + 2 * s)
        } else {
            0.0
        };
        let mut acc = 0f32;
        let mut sx = 0f32;
        for c in 0..GROUP_COLS {
            acc = code(tile, r, gi * GROUP_COLS + c, w.kind()).mul_add(x[col0 + c], acc);
            sx += x[col0 + c];
        }
        y += m.mul_add(sx, d * acc);
    }
    y
}

/// `y[i * N + r] = Σ_k W[r][k] · x[i * K + k]` for `n` input rows.
///
/// # Panics
/// If K is not a multiple of 32 or the slices do not match `n`, N and K.
pub fn matmul(w: &Q4Matrix, x: &[f32], n: usize, y: &mut [f32], isa: Isa) {
    let (rows, k) = (w.rows(), w.cols());
    assert_eq!(k % GROUP_COLS, 0, "K must be a multiple of 32");
    assert_eq!(x.len(), n * k);
    assert_eq!(y.len(), n * rows);
    if n == 0 {
        return;
    }
    let sums = group_sums(x, n, k);
    let kernel = if w.kind() == Q4Kind::Q4_0 {
        Variant::Scalar
    } else {
        variant(isa)
    };
    // Each 32-row block's task computes `[32 rows][n inputs]` into its scratch.
    crate::blocks_through_scratch(y, rows, n, TILE_ROWS, |rb, out| match kernel {
        Variant::Scalar => block_scalar(w, rb, x, n, &sums, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the variant comes from an `Isa` token, which only detection of
        // avx512f (and avx512vbmi for the VBMI variant) can set.
        Variant::Avx512 => unsafe { avx512::block(w, rb, x, n, &sums, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Variant::Avx512Vbmi => unsafe { avx512::block_vbmi(w, rb, x, n, &sums, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, avx2 and fma detected.
        Variant::Avx2 => unsafe { avx2::block(w, rb, x, n, &sums, out) },
    });
}

/// One 32-row block for all inputs, scalar. `out[r * n + i]`.
fn block_scalar(w: &Q4Matrix, rb: usize, x: &[f32], n: usize, sums: &[f32], out: &mut [f32]) {
    let k = w.cols();
    let groups = k / GROUP_COLS;
    out.fill(0.0);
    for g in 0..groups {
        let col0 = g * GROUP_COLS;
        let tile = w.tile(rb, col0 / TILE_COLS);
        let gi = (col0 % TILE_COLS) / GROUP_COLS;
        for r in 0..TILE_ROWS {
            let s = gi * TILE_ROWS + r;
            let d = bf16_at(tile, 2 * s);
            let m = if w.kind() == Q4Kind::Q4_1 {
                bf16_at(tile, MIN_OFFSET + 2 * s)
            } else {
                0.0
            };
            for i in 0..n {
                let xr = &x[i * k + col0..i * k + col0 + GROUP_COLS];
                let mut acc = 0f32;
                for (c, &xv) in xr.iter().enumerate() {
                    acc = code(tile, r, gi * GROUP_COLS + c, w.kind()).mul_add(xv, acc);
                }
                out[r * n + i] += m.mul_add(sums[i * groups + g], d * acc);
            }
        }
    }
    debug_assert_eq!(TILE_BYTES, 5120);
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use q4nx_format::{
        Q4Matrix, GROUP_COLS, MIN_OFFSET, NIBBLE_OFFSET, TILE_BYTES, TILE_COLS, TILE_ROWS,
    };

    /// How many tiles ahead of the current one to prefetch.
    const PREFETCH_TILES: usize = 2;

    /// Sixteen bf16 values as f32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_bf16x16(p: *const u8) -> __m512 {
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
    }

    /// Widens the codes of two columns of a 16-row group (16 bytes at `p`: column
    /// `c` in bytes 0..8, `c + 1` in 8..16, even rows in low nibbles) to f32 lanes,
    /// lane `j` = row `j`: unpack, zero-extend, convert.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn decode_unpack(p: *const u8) -> (__m512, __m512) {
        unsafe {
            let mask = _mm_set1_epi8(0x0f);
            let bytes = _mm_loadu_si128(p as *const __m128i);
            let lo = _mm_and_si128(bytes, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
            (
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi))),
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi))),
            )
        }
    }

    /// The same lanes with VBMI in three instructions per column: a byte permute puts
    /// row `j`'s byte in lane `j`, a per-lane shift brings odd rows' high nibble down,
    /// and a 16-entry table permute turns the code (the lane's low four bits) into its
    /// f32 value, which is exact, so the lanes equal [`decode_unpack`]'s.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vbmi")]
    unsafe fn decode_vbmi(p: *const u8) -> (__m512, __m512) {
        unsafe {
            let bytes = _mm512_castsi128_si512(_mm_loadu_si128(p as *const __m128i));
            let first = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
            let second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
            let shifts = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
            let codes = _mm512_set_ps(
                15.0, 14.0, 13.0, 12.0, 11.0, 10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0,
                0.0,
            );
            let lane = |index: __m512i| {
                let picked = _mm512_permutexvar_epi8(index, bytes);
                _mm512_permutexvar_ps(_mm512_srlv_epi32(picked, shifts), codes)
            };
            (lane(first), lane(second))
        }
    }

    macro_rules! define_chunk {
        ($name:ident, $features:literal, $decode:ident) => {
            /// Processes inputs `i0 .. i0 + R` of one row block.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn $name<const R: usize>(
                w: &Q4Matrix,
                rb: usize,
                x: &[f32],
                i0: usize,
                sums: &[f32],
                n: usize,
                out: &mut [f32],
            ) {
                unsafe {
                    let k = w.cols();
                    let groups = k / GROUP_COLS;
                    let mut y = [[_mm512_setzero_ps(); 2]; R];
                    let all = w.bytes();
                    let col_blocks = w.grid().col_blocks();
                    for g in 0..groups {
                        let col0 = g * GROUP_COLS;
                        let tile = w.tile(rb, col0 / TILE_COLS).as_ptr();
                        let gi = (col0 % TILE_COLS) / GROUP_COLS;
                        // The hardware prefetcher does not follow the four interleaved streams of a
                        // tile (scales, mins, two nibble row groups) well; fetch the same group of
                        // the tile PREFETCH_TILES ahead, which is what this task reads next.
                        let ahead =
                            (rb * col_blocks + col0 / TILE_COLS + PREFETCH_TILES) * TILE_BYTES;
                        if ahead + TILE_BYTES <= all.len() {
                            let p = all.as_ptr().add(ahead);
                            _mm_prefetch::<_MM_HINT_T0>(p.add(2 * gi * TILE_ROWS) as *const i8);
                            _mm_prefetch::<_MM_HINT_T0>(
                                p.add(MIN_OFFSET + 2 * gi * TILE_ROWS) as *const i8
                            );
                            for rg in 0..2 {
                                for line in 0..4 {
                                    let at = NIBBLE_OFFSET
                                        + rg * TILE_COLS * 8
                                        + gi * GROUP_COLS * 8
                                        + line * 64;
                                    _mm_prefetch::<_MM_HINT_T0>(p.add(at) as *const i8);
                                }
                            }
                        }
                        let mut acc = [[_mm512_setzero_ps(); 2]; R];
                        for c in (0..GROUP_COLS).step_by(2) {
                            let col = gi * GROUP_COLS + c;
                            for (half, rg) in [0usize, 1].into_iter().enumerate() {
                                let p = tile.add(NIBBLE_OFFSET + rg * TILE_COLS * 8 + col * 8);
                                let (w0, w1) = $decode(p);
                                for (r, a) in acc.iter_mut().enumerate() {
                                    let xi = x.as_ptr().add((i0 + r) * k + col0 + c);
                                    a[half] = _mm512_fmadd_ps(w0, _mm512_set1_ps(*xi), a[half]);
                                    a[half] =
                                        _mm512_fmadd_ps(w1, _mm512_set1_ps(*xi.add(1)), a[half]);
                                }
                            }
                        }
                        for rg in 0..2 {
                            let s = gi * TILE_ROWS + rg * 16;
                            let d = load_bf16x16(tile.add(2 * s));
                            let m = load_bf16x16(tile.add(MIN_OFFSET + 2 * s));
                            for r in 0..R {
                                let sx = _mm512_set1_ps(sums[(i0 + r) * groups + g]);
                                let t = _mm512_fmadd_ps(m, sx, _mm512_mul_ps(d, acc[r][rg]));
                                y[r][rg] = _mm512_add_ps(y[r][rg], t);
                            }
                        }
                    }
                    let mut lanes = [0f32; 16];
                    for (r, yr) in y.iter().enumerate() {
                        for (rg, v) in yr.iter().enumerate() {
                            _mm512_storeu_ps(lanes.as_mut_ptr(), *v);
                            for (l, &value) in lanes.iter().enumerate() {
                                out[(rg * 16 + l) * n + i0 + r] = value;
                            }
                        }
                    }
                }
            }
        };
    }

    define_chunk!(chunk, "avx512f", decode_unpack);
    define_chunk!(chunk_vbmi, "avx512f,avx512vbmi", decode_vbmi);

    macro_rules! define_block {
        ($name:ident, $features:literal, $chunk:ident) => {
            /// One 32-row block for all inputs. `out[r * n + i]`.
            #[target_feature(enable = $features)]
            pub unsafe fn $name(
                w: &Q4Matrix,
                rb: usize,
                x: &[f32],
                n: usize,
                sums: &[f32],
                out: &mut [f32],
            ) {
                unsafe {
                    let mut i0 = 0;
                    while i0 < n {
                        match n - i0 {
                            1 => $chunk::<1>(w, rb, x, i0, sums, n, out),
                            2 => $chunk::<2>(w, rb, x, i0, sums, n, out),
                            3 => $chunk::<3>(w, rb, x, i0, sums, n, out),
                            4 => $chunk::<4>(w, rb, x, i0, sums, n, out),
                            5 => $chunk::<5>(w, rb, x, i0, sums, n, out),
                            6 => $chunk::<6>(w, rb, x, i0, sums, n, out),
                            7 => $chunk::<7>(w, rb, x, i0, sums, n, out),
                            _ => $chunk::<8>(w, rb, x, i0, sums, n, out),
                        }
                        i0 += 8;
                    }
                }
            }
        };
    }

    define_block!(block, "avx512f", chunk);
    define_block!(block_vbmi, "avx512f,avx512vbmi", chunk_vbmi);
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use q4nx_format::{Q4Matrix, GROUP_COLS, MIN_OFFSET, NIBBLE_OFFSET, TILE_COLS, TILE_ROWS};

    /// Eight bf16 values as f32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_bf16x8(p: *const u8) -> __m256 {
        unsafe {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
    }

    /// Processes inputs `i0 .. i0 + R` of one row block; each 16-row group is two
    /// 8-lane halves, with the same per-lane operations as the scalar kernel.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn chunk<const R: usize>(
        w: &Q4Matrix,
        rb: usize,
        x: &[f32],
        i0: usize,
        sums: &[f32],
        n: usize,
        out: &mut [f32],
    ) {
        unsafe {
            let k = w.cols();
            let groups = k / GROUP_COLS;
            let mask = _mm_set1_epi8(0x0f);
            let mut y = [[_mm256_setzero_ps(); 4]; R];
            for g in 0..groups {
                let col0 = g * GROUP_COLS;
                let tile = w.tile(rb, col0 / TILE_COLS).as_ptr();
                let gi = (col0 % TILE_COLS) / GROUP_COLS;
                let mut acc = [[_mm256_setzero_ps(); 4]; R];
                for c in (0..GROUP_COLS).step_by(2) {
                    let col = gi * GROUP_COLS + c;
                    for rg in 0..2 {
                        let p = tile.add(NIBBLE_OFFSET + rg * TILE_COLS * 8 + col * 8);
                        let bytes = _mm_loadu_si128(p as *const __m128i);
                        let lo = _mm_and_si128(bytes, mask);
                        let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
                        let c0 = _mm_unpacklo_epi8(lo, hi);
                        let c1 = _mm_unpackhi_epi8(lo, hi);
                        let w00 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c0));
                        let w01 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c0, 8)));
                        let w10 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c1));
                        let w11 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c1, 8)));
                        for (r, a) in acc.iter_mut().enumerate() {
                            let xi = x.as_ptr().add((i0 + r) * k + col0 + c);
                            let (x0, x1) = (_mm256_set1_ps(*xi), _mm256_set1_ps(*xi.add(1)));
                            a[2 * rg] = _mm256_fmadd_ps(w00, x0, a[2 * rg]);
                            a[2 * rg + 1] = _mm256_fmadd_ps(w01, x0, a[2 * rg + 1]);
                            a[2 * rg] = _mm256_fmadd_ps(w10, x1, a[2 * rg]);
                            a[2 * rg + 1] = _mm256_fmadd_ps(w11, x1, a[2 * rg + 1]);
                        }
                    }
                }
                for q in 0..4 {
                    let s = gi * TILE_ROWS + q * 8;
                    let d = load_bf16x8(tile.add(2 * s));
                    let m = load_bf16x8(tile.add(MIN_OFFSET + 2 * s));
                    for r in 0..R {
                        let sx = _mm256_set1_ps(sums[(i0 + r) * groups + g]);
                        let t = _mm256_fmadd_ps(m, sx, _mm256_mul_ps(d, acc[r][q]));
                        y[r][q] = _mm256_add_ps(y[r][q], t);
                    }
                }
            }
            let mut lanes = [0f32; 8];
            for (r, yr) in y.iter().enumerate() {
                for (q, v) in yr.iter().enumerate() {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), *v);
                    for (l, &value) in lanes.iter().enumerate() {
                        out[(q * 8 + l) * n + i0 + r] = value;
                    }
                }
            }
        }
    }

    /// One 32-row block for all inputs. `out[r * n + i]`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn block(
        w: &Q4Matrix,
        rb: usize,
        x: &[f32],
        n: usize,
        sums: &[f32],
        out: &mut [f32],
    ) {
        unsafe {
            let mut i0 = 0;
            while i0 < n {
                match n - i0 {
                    1 => chunk::<1>(w, rb, x, i0, sums, n, out),
                    2 => chunk::<2>(w, rb, x, i0, sums, n, out),
                    3 => chunk::<3>(w, rb, x, i0, sums, n, out),
                    _ => chunk::<4>(w, rb, x, i0, sums, n, out),
                }
                i0 += 4;
            }
        }
    }
}
