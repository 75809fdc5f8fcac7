//! The x86-64 variants of the q4 × f32 family: AVX2 + FMA (8 rows a vector) and AVX-512
//! (16 rows a vector, with a VBMI form), each performing [`super::reference_dot`]'s
//! operations per element.

pub(super) mod avx512 {
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

pub(super) mod avx2 {
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
