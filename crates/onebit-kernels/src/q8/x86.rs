//! x86-64 variants of the `q8` family. Each computes the exact integer sums of
//! [`super::reference`] (in whatever order the instructions add) and then the same f32
//! operations per element, so each equals the reference bit for bit.
//!
//! - AVX2: `vpmaddubsw` (u8 code × s8 input → i16 pairs) then `vpmaddwd` by ones. For q4
//!   codes the i16 partial sums of a whole group stay below 2·15·127·8 = 30480 < 2^15, so
//!   one `vpmaddwd` per group suffices. For int8 head weights the sign trick keeps the
//!   u8 operand ≤ 127 (|w| · sign(x, w)), pairs ≤ 32258.
//! - AVX-VNNI / AVX-512 VNNI: `vpdpbusd` (u8 × s8, four products into i32). Int8 head
//!   weights are made unsigned by `w ^ 0x80` (= w + 128) and the surplus `128 · Σx` is
//!   subtracted from the exact sum.

// The kernels index several per-row arrays (accumulators, inputs) by the same counter.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{
    GroupStats, I8Matrix, Levels, Out, PackedQ4, QuantizedRows, BLOCK_ROWS, GROUP, I8_BLOCK_ROWS,
};
use super::{I8_GROUP_BYTES, Q4_GROUP_BYTES};

/// Level rows per sweep of a weight block (a multiple of every level count).
const MAX_R: usize = 4;
/// Level rows per sweep of the AVX-512 int8 kernel, and of the q4 kernel at two levels
/// (a multiple of every level count).
const WIDE_R: usize = 8;
/// Input rows per sweep of the AVX-512 q4 kernel at one level: each input row is an
/// output row of both halves' accumulators besides its level row's, so eight of them
/// (32 registers of sums alone) spilled to the stack. Measured on one thread of an Ice
/// Lake Xeon, 1536 × 576, one level, five alternating runs: 8 rows took 89–121 µs at 8 a
/// sweep, 60–76 at 4 (16 rows: 181–230 against 117–126). Its remainder widths are listed
/// where it is used (`[1 2 3]`), and must be every width below it.
const WIDE_R_ONE_LEVEL: usize = 4;
const _: () = assert!(WIDE_R_ONE_LEVEL == 4, "list the remainder widths below it");
/// How many groups ahead the first sweep of a block prefetches (about 7 KB of q4 weights):
/// far enough that a pass of 2–4 rows finds its weights arriving while it computes, not
/// waiting for them. Measured on SmolLM2 (2 threads, AVX-512 VNNI Xeon, three
/// alternations): 2-row passes 4.0–5.1 ms at 2 groups, 3.6–3.8 at 8–16; 4-row 6.0–7.4
/// against 5.5–5.9; 1-row about the same.
const PREFETCH_GROUPS: usize = 12;

/// Asks for the weights `PREFETCH_GROUPS` groups (of `group_bytes`) past `p`: the first
/// sweep of a block streams them in. Blocks are contiguous, so at a block's end this
/// reaches into the next; a prefetch past the matrix is harmless (it never faults).
#[inline(always)]
fn prefetch_groups_ahead(p: *const u8, group_bytes: usize) {
    crate::prefetch_bytes(p.wrapping_add(PREFETCH_GROUPS * group_bytes), group_bytes);
}

/// Raw views of input rows `i0 ..` (no bounds checks in the inner loops; every index
/// used below is inside the row by construction: `g < K / 32`, offsets `< 32`).
struct Inputs<const R: usize> {
    codes: [*const i8; R],
    scales: [*const f32; R],
    sums: [*const f32; R],
    code_sums: [*const i32; R],
}

impl<const R: usize> Inputs<R> {
    #[inline(always)]
    fn new(x: &QuantizedRows, i0: usize) -> Self {
        let groups = x.cols() / GROUP;
        let (codes, scales, sums, code_sums) = x.raw();
        assert!((i0 + R) * x.cols() <= codes.len() && (i0 + R) * groups <= scales.len());
        let at = |r: usize| (i0 + r) * x.cols();
        let gat = |r: usize| (i0 + r) * groups;
        Inputs {
            codes: std::array::from_fn(|r| codes[at(r)..].as_ptr()),
            scales: std::array::from_fn(|r| scales[gat(r)..].as_ptr()),
            sums: std::array::from_fn(|r| sums[gat(r)..].as_ptr()),
            code_sums: std::array::from_fn(|r| code_sums[gat(r)..].as_ptr()),
        }
    }
    /// Four codes of row `r` from column `at` as one little-endian i32.
    #[inline(always)]
    unsafe fn quad(&self, r: usize, at: usize) -> i32 {
        unsafe { (self.codes[r].add(at) as *const i32).read_unaligned() }
    }
    #[inline(always)]
    unsafe fn scale(&self, r: usize, g: usize) -> f32 {
        unsafe { *self.scales[r].add(g) }
    }
    #[inline(always)]
    unsafe fn sum(&self, r: usize, g: usize) -> f32 {
        unsafe { *self.sums[r].add(g) }
    }
    #[inline(always)]
    unsafe fn code_sum(&self, r: usize, g: usize) -> i32 {
        unsafe { *self.code_sums[r].add(g) }
    }
}

/// Sweeps a weight block over the level rows, `$max` at a time (the remainder by the
/// smaller widths listed; `L` level rows make one input row, so with two levels only
/// even widths occur). The list must hold every width below `$max`. The 256-bit
/// variants sweep `MAX_R`; AVX-512, whose 32 registers hold eight level rows'
/// accumulators, sweeps `WIDE_R` (the q4 kernel at one level, `WIDE_R_ONE_LEVEL`).
macro_rules! sweep_inputs {
    ([$($r:literal)*] $max:ident, $kernel:ident, $w:expr, $b:expr, $x:expr, $out:expr) => {{
        match $x.levels() {
            Levels::One => sweep_inputs!(@levels 1, [$($r)*] $max, $kernel, $w, $b, $x, $out),
            Levels::Two => sweep_inputs!(@levels 2, [$($r)*] $max, $kernel, $w, $b, $x, $out),
        }
    }};
    (@levels $l:literal, [$($r:literal)*] $max:ident, $kernel:ident, $w:expr, $b:expr, $x:expr, $out:expr) => {{
        let n = $x.level_rows();
        let mut i0 = 0;
        while i0 < n {
            match n - i0 {
                $($r => $kernel::<$r, $l>($w, $b, $x, i0, $out),)*
                _ => $kernel::<$max, $l>($w, $b, $x, i0, $out),
            }
            i0 += $max;
        }
    }};
}

/// Level rows `L·o ..` of exact sums folded into input row `o`'s:
/// `Σ_l 128^(L-1-l) · sum[L·o + l]` (exact: |sums| < 2^24).
macro_rules! fold_levels {
    ($sums:expr, $o:expr, $l:expr, $shift:ident, $add:ident) => {{
        let mut folded = $sums[$l * $o];
        for level in 1..$l {
            folded = $add($shift::<7>(folded), $sums[$l * $o + level]);
        }
        folded
    }};
}

// ---------------------------------------------------------------- quantization

/// [`super::quantize_group_stats`] in AVX-512: the same f32 operations per lane, so the
/// same codes, scale inputs and sums. `max` keeps the accumulator when the value is NaN
/// (as `f32::max` does); the group sum adds the same eight lanes in the same order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn quantize_group_512(
    values: &[f32; GROUP],
    codes: &mut [i8; GROUP],
    residual: Option<&mut [i8; GROUP]>,
) -> GroupStats {
    unsafe {
        let p = values.as_ptr();
        let v = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
        // Exact, so any order: max|v| with NaN lanes skipped (max_ps returns its second
        // operand when either is NaN).
        let zero = _mm512_setzero_ps();
        let mut amax = _mm512_max_ps(_mm512_abs_ps(v[0]), zero);
        amax = _mm512_max_ps(_mm512_abs_ps(v[1]), amax);
        let amax = _mm512_reduce_max_ps(amax);
        let inverse = _mm512_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });

        let magic = _mm512_set1_ps(12_582_912.0);
        let round = |t: __m512| _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
        let (low, high) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        // `code_of`: clamped to ±127, NaN as 0.
        let code = |r: __m512| {
            let clamped = _mm512_min_ps(_mm512_max_ps(r, low), high);
            _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r), clamped)
        };
        let t = [_mm512_mul_ps(v[0], inverse), _mm512_mul_ps(v[1], inverse)];
        let c = [code(round(t[0])), code(round(t[1]))];
        let q = [_mm512_cvttps_epi32(c[0]), _mm512_cvttps_epi32(c[1])];
        let out = codes.as_mut_ptr() as *mut __m128i;
        _mm_storeu_si128(out, _mm512_cvtepi32_epi8(q[0]));
        _mm_storeu_si128(out.add(1), _mm512_cvtepi32_epi8(q[1]));
        let code_sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));

        let residual_code_sum = match residual {
            Some(residual) => {
                let scale = _mm512_set1_ps(128.0);
                let r = [
                    _mm512_cvttps_epi32(code(round(_mm512_mul_ps(
                        _mm512_sub_ps(t[0], c[0]),
                        scale,
                    )))),
                    _mm512_cvttps_epi32(code(round(_mm512_mul_ps(
                        _mm512_sub_ps(t[1], c[1]),
                        scale,
                    )))),
                ];
                let out = residual.as_mut_ptr() as *mut __m128i;
                _mm_storeu_si128(out, _mm512_cvtepi32_epi8(r[0]));
                _mm_storeu_si128(out.add(1), _mm512_cvtepi32_epi8(r[1]));
                _mm512_reduce_add_epi32(_mm512_add_epi32(r[0], r[1]))
            }
            None => 0,
        };

        // `group_sum`: lanes `c mod 8` in column order from +0, then pairwise.
        let mut lanes = _mm256_setzero_ps();
        for j in 0..4 {
            lanes = _mm256_add_ps(lanes, _mm256_loadu_ps(p.add(8 * j)));
        }
        let half = _mm_add_ps(
            _mm256_castps256_ps128(lanes),
            _mm256_extractf128_ps::<1>(lanes),
        );
        let pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
        let sum = _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
        GroupStats {
            amax,
            sum,
            code_sum,
            residual_code_sum,
        }
    }
}

// ---------------------------------------------------------------- AVX-512 VNNI

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn bf16x16(p: *const u8) -> __m512 {
    unsafe {
        let h = _mm256_loadu_si256(p as *const __m256i);
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn block_q4_avx512vnni(
    w: &PackedQ4,
    b: usize,
    x: &QuantizedRows,
    out: &mut Out<'_>,
) {
    unsafe {
        match x.levels() {
            Levels::One => sweep_inputs!(@levels 1, [1 2 3] WIDE_R_ONE_LEVEL, q4_512, w, b, x, out),
            Levels::Two => sweep_inputs!(@levels 2, [1 2 3 4 5 6 7] WIDE_R, q4_512, w, b, x, out),
        }
    }
}

/// `acc + Σ_4 w(u8) · x(s8)` per lane, `x` the four codes at `row + OFFSET`
/// broadcast to every lane by the instruction's own memory operand (`{1to16}`): a
/// broadcast costs a load, not a vector register, so a sweep can hold eight level rows'
/// accumulators. The caller guarantees `row + OFFSET .. + 4` lies inside the row's codes
/// (`row` is a group's first code, `OFFSET ≤ 28`); the block reads nothing else.
macro_rules! dpbusd_broadcast {
    ($acc:expr, $w:expr, $row:expr, $offset:literal) => {{
        let mut acc: __m512i = $acc;
        core::arch::asm!(
            concat!("vpdpbusd {acc}, {w}, dword ptr [{row} + ", $offset, "]{{1to16}}"),
            acc = inout(zmm_reg) acc,
            w = in(zmm_reg) $w,
            row = in(reg) $row,
            options(pure, readonly, nostack, preserves_flags),
        );
        acc
    }};
}

/// Quad column `q` (a literal) of both 16-row halves: each half's 64 bytes of nibbles
/// decoded once, then the low nibbles (columns `8q .. 8q+4`) and the high (`8q+4 ..
/// 8q+8`) against every level row, into one accumulator per level row and half (the
/// sums are exact, so the order in which the products arrive cannot matter).
macro_rules! q4_512_quad {
    ($p:expr, $q:literal, $lo_off:literal, $hi_off:literal, $mask:expr, $rows:expr, $acc:expr) => {{
        let c0 = _mm512_loadu_si512($p.add($q * 64) as *const _);
        let c1 = _mm512_loadu_si512($p.add((4 + $q) * 64) as *const _);
        let l0 = _mm512_and_si512(c0, $mask);
        let h0 = _mm512_and_si512(_mm512_srli_epi16(c0, 4), $mask);
        let l1 = _mm512_and_si512(c1, $mask);
        let h1 = _mm512_and_si512(_mm512_srli_epi16(c1, 4), $mask);
        for r in 0..$rows.len() {
            $acc[r][0] = dpbusd_broadcast!($acc[r][0], l0, $rows[r], $lo_off);
            $acc[r][1] = dpbusd_broadcast!($acc[r][1], l1, $rows[r], $lo_off);
            $acc[r][0] = dpbusd_broadcast!($acc[r][0], h0, $rows[r], $hi_off);
            $acc[r][1] = dpbusd_broadcast!($acc[r][1], h1, $rows[r], $hi_off);
        }
    }};
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_512<const R: usize, const L: usize>(
    w: &PackedQ4,
    b: usize,
    x: &QuantizedRows,
    i0: usize,
    out: &mut Out<'_>,
) {
    unsafe {
        let o0 = i0 / L;
        let groups = w.cols() / GROUP;
        let xs = Inputs::<R>::new(x, i0);
        let base = w.data().as_ptr().add(b * groups * Q4_GROUP_BYTES);
        let mask = _mm512_set1_epi8(0x0f);
        let mut y = [[_mm512_setzero_ps(); 2]; R];
        for g in 0..groups {
            let p = base.add(g * Q4_GROUP_BYTES);
            if i0 == 0 {
                prefetch_groups_ahead(p, Q4_GROUP_BYTES);
            }
            // Both halves (16 rows each) decode their nibbles once for all R level rows;
            // the inputs are read by the dot products' broadcast operands.
            let mut acc = [[_mm512_setzero_si512(); 2]; R];
            let rows: [*const i8; R] = std::array::from_fn(|r| xs.codes[r].add(g * GROUP));
            q4_512_quad!(p, 0, "0", "4", mask, rows, acc);
            q4_512_quad!(p, 1, "8", "12", mask, rows, acc);
            q4_512_quad!(p, 2, "16", "20", mask, rows, acc);
            q4_512_quad!(p, 3, "24", "28", mask, rows, acc);
            for h in 0..2 {
                let d = bf16x16(p.add(512 + 32 * h));
                let m = bf16x16(p.add(576 + 32 * h));
                let sums: [__m512i; R] = std::array::from_fn(|r| acc[r][h]);
                for o in 0..R / L {
                    let folded = fold_levels!(sums, o, L, _mm512_slli_epi32, _mm512_add_epi32);
                    let isum = _mm512_cvtepi32_ps(folded);
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(xs.scale(L * o, g)));
                    let sx = _mm512_set1_ps(xs.sum(L * o, g));
                    let t = _mm512_fmadd_ps(m, sx, _mm512_mul_ps(scale, isum));
                    y[o][h] = _mm512_add_ps(y[o][h], t);
                }
            }
        }
        debug_assert_eq!(BLOCK_ROWS, 32);
        for (o, yo) in y.iter().enumerate().take(R / L) {
            let row = out.row_mut(o0 + o);
            for (h, v) in yo.iter().enumerate() {
                _mm512_storeu_ps(row[16 * h..16 * h + 16].as_mut_ptr(), *v);
            }
        }
    }
}

/// Quad columns `q` and `q + 1` (a literal) of a 16-row int8 block: each 64 bytes of
/// weights made unsigned once, then against every level row's codes at the offsets.
macro_rules! i8_512_quads {
    ($p:expr, $q:literal, $even_off:literal, $odd_off:literal,
     $flip:expr, $rows:expr, $even:expr, $odd:expr) => {{
        let w0 = _mm512_xor_si512(_mm512_loadu_si512($p.add($q * 64) as *const _), $flip);
        let w1 = _mm512_xor_si512(_mm512_loadu_si512($p.add($q * 64 + 64) as *const _), $flip);
        for r in 0..$rows.len() {
            $even[r] = dpbusd_broadcast!($even[r], w0, $rows[r], $even_off);
            $odd[r] = dpbusd_broadcast!($odd[r], w1, $rows[r], $odd_off);
        }
    }};
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn block_i8_avx512vnni(
    w: &I8Matrix,
    b: usize,
    x: &QuantizedRows,
    out: &mut Out<'_>,
) {
    unsafe { sweep_inputs!([1 2 3 4 5 6 7] WIDE_R, i8_512, w, b, x, out) }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn i8_512<const R: usize, const L: usize>(
    w: &I8Matrix,
    b: usize,
    x: &QuantizedRows,
    i0: usize,
    out: &mut Out<'_>,
) {
    unsafe {
        let groups = w.cols() / GROUP;
        let xs = Inputs::<R>::new(x, i0);
        let base = w.data().as_ptr().add(b * groups * I8_GROUP_BYTES);
        let flip = _mm512_set1_epi8(-128);
        let mut y = [_mm512_setzero_ps(); R];
        for g in 0..groups {
            let p = base.add(g * I8_GROUP_BYTES);
            if i0 == 0 {
                prefetch_groups_ahead(p, I8_GROUP_BYTES);
            }
            let mut even = [_mm512_setzero_si512(); R];
            let mut odd = [_mm512_setzero_si512(); R];
            let rows: [*const i8; R] = std::array::from_fn(|r| xs.codes[r].add(g * GROUP));
            i8_512_quads!(p, 0, "0", "4", flip, rows, even, odd);
            i8_512_quads!(p, 2, "8", "12", flip, rows, even, odd);
            i8_512_quads!(p, 4, "16", "20", flip, rows, even, odd);
            i8_512_quads!(p, 6, "24", "28", flip, rows, even, odd);
            let dw = _mm512_loadu_ps(p.add(512) as *const f32);
            let mut sums = [_mm512_setzero_si512(); R];
            for r in 0..R {
                let surplus = _mm512_set1_epi32(128 * xs.code_sum(r, g));
                sums[r] = _mm512_sub_epi32(_mm512_add_epi32(even[r], odd[r]), surplus);
            }
            for o in 0..R / L {
                let folded = fold_levels!(sums, o, L, _mm512_slli_epi32, _mm512_add_epi32);
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(xs.scale(L * o, g)));
                y[o] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(folded), y[o]);
            }
        }
        store_i8(&y_lanes512(&y), i0 / L, R / L, out);
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn y_lanes512<const R: usize>(y: &[__m512; R]) -> [[f32; 16]; R] {
    unsafe {
        let mut lanes = [[0f32; 16]; R];
        for (dst, v) in lanes.iter_mut().zip(y) {
            _mm512_storeu_ps(dst.as_mut_ptr(), *v);
        }
        lanes
    }
}

/// Writes 16 rows × `outputs` input rows (from `o0`) of an int8 block, skipping rows
/// past the matrix's end (where the block's share ends).
#[inline(always)]
fn store_i8<const R: usize>(lanes: &[[f32; 16]; R], o0: usize, outputs: usize, out: &mut Out<'_>) {
    let valid = out.width().min(I8_BLOCK_ROWS);
    for (o, values) in lanes.iter().enumerate().take(outputs) {
        out.row_mut(o0 + o).copy_from_slice(&values[..valid]);
    }
}

// ---------------------------------------------------------------- AVX2 and AVX-VNNI

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16x8(p: *const u8) -> __m256 {
    unsafe {
        let h = _mm_loadu_si128(p as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }
}

/// The q4 kernel over 8-row vectors; `$dot` adds one quad's products of the low and
/// high nibbles into the accumulators (AVX2: i16 lanes, AVX-VNNI: i32 lanes) and
/// `$finish` turns an accumulator into i32 sums.
macro_rules! q4_256 {
    ($name:ident, $block:ident, $features:literal, $zero:expr, $dot:ident, $finish:ident) => {
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $block(w: &PackedQ4, b: usize, x: &QuantizedRows, out: &mut Out<'_>) {
            unsafe { sweep_inputs!([1 2 3] MAX_R, $name, w, b, x, out) }
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize, const L: usize>(
            w: &PackedQ4,
            b: usize,
            x: &QuantizedRows,
            i0: usize,
            out: &mut Out<'_>,
        ) {
            unsafe {
                let o0 = i0 / L;
                let groups = w.cols() / GROUP;
                let xs = Inputs::<R>::new(x, i0);
                let base = w.data().as_ptr().add(b * groups * Q4_GROUP_BYTES);
                let mask = _mm256_set1_epi8(0x0f);
                let mut y = [[_mm256_setzero_ps(); 4]; R];
                // Eight output rows (`v`) at a time through every group: sixteen vector
                // registers hold one slice's accumulators without spilling (the block's
                // weights stay in L1 between slices).
                for v in 0..4 {
                    for g in 0..groups {
                        let p = base.add(g * Q4_GROUP_BYTES);
                        if i0 == 0 && v == 0 {
                            prefetch_groups_ahead(p, Q4_GROUP_BYTES);
                        }
                        let mut acc = [$zero; R];
                        for q in 0..4 {
                            let c = _mm256_loadu_si256(
                                p.add((4 * (v / 2) + q) * 64 + 32 * (v % 2)) as *const __m256i,
                            );
                            let wl = _mm256_and_si256(c, mask);
                            let wh = _mm256_and_si256(_mm256_srli_epi16(c, 4), mask);
                            for r in 0..R {
                                let at = g * GROUP + 8 * q;
                                let bl = _mm256_set1_epi32(xs.quad(r, at));
                                let bh = _mm256_set1_epi32(xs.quad(r, at + 4));
                                acc[r] = $dot(acc[r], wl, bl, wh, bh);
                            }
                        }
                        let d = bf16x8(p.add(512 + 16 * v));
                        let m = bf16x8(p.add(576 + 16 * v));
                        let mut sums = [_mm256_setzero_si256(); R];
                        for r in 0..R {
                            sums[r] = $finish(acc[r]);
                        }
                        for o in 0..R / L {
                            let folded =
                                fold_levels!(sums, o, L, _mm256_slli_epi32, _mm256_add_epi32);
                            let isum = _mm256_cvtepi32_ps(folded);
                            let scale = _mm256_mul_ps(d, _mm256_set1_ps(xs.scale(L * o, g)));
                            let sx = _mm256_set1_ps(xs.sum(L * o, g));
                            let t = _mm256_fmadd_ps(m, sx, _mm256_mul_ps(scale, isum));
                            y[o][v] = _mm256_add_ps(y[o][v], t);
                        }
                    }
                }
                for (o, yo) in y.iter().enumerate().take(R / L) {
                    let row = out.row_mut(o0 + o);
                    for (v, vec) in yo.iter().enumerate() {
                        _mm256_storeu_ps(row[8 * v..8 * v + 8].as_mut_ptr(), *vec);
                    }
                }
            }
        }
    };
}

/// i16 lanes: `maddubs(lo) + maddubs(hi)` (≤ 7620 per quad, ≤ 30480 per group).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q4_avx2(acc: __m256i, wl: __m256i, bl: __m256i, wh: __m256i, bh: __m256i) -> __m256i {
    let both = _mm256_add_epi16(_mm256_maddubs_epi16(wl, bl), _mm256_maddubs_epi16(wh, bh));
    _mm256_add_epi16(acc, both)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn finish_avx2(acc: __m256i) -> __m256i {
    _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
}

#[inline]
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn dot_q4_vnni(acc: __m256i, wl: __m256i, bl: __m256i, wh: __m256i, bh: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, wl, bl), wh, bh)
}

#[inline(always)]
unsafe fn finish_vnni(acc: __m256i) -> __m256i {
    acc
}

q4_256!(
    q4_avx2,
    block_q4_avx2,
    "avx2,fma",
    _mm256_setzero_si256(),
    dot_q4_avx2,
    finish_avx2
);
q4_256!(
    q4_avxvnni,
    block_q4_avxvnni,
    "avx2,fma,avxvnni",
    _mm256_setzero_si256(),
    dot_q4_vnni,
    finish_vnni
);

/// The int8 kernel over two 8-row vectors; `$dot` adds one quad's four products per
/// lane into an i32 accumulator; `$surplus` is whether the unsigned-operand surplus
/// `128 · Σx` must be taken off.
macro_rules! i8_256 {
    ($name:ident, $block:ident, $features:literal, $dot:ident, $surplus:expr) => {
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $block(w: &I8Matrix, b: usize, x: &QuantizedRows, out: &mut Out<'_>) {
            unsafe { sweep_inputs!([1 2 3] MAX_R, $name, w, b, x, out) }
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize, const L: usize>(
            w: &I8Matrix,
            b: usize,
            x: &QuantizedRows,
            i0: usize,
            out: &mut Out<'_>,
        ) {
            unsafe {
                let groups = w.cols() / GROUP;
                let xs = Inputs::<R>::new(x, i0);
                let base = w.data().as_ptr().add(b * groups * I8_GROUP_BYTES);
                let mut y = [[_mm256_setzero_ps(); 2]; R];
                for g in 0..groups {
                    let p = base.add(g * I8_GROUP_BYTES);
                    if i0 == 0 {
                        prefetch_groups_ahead(p, I8_GROUP_BYTES);
                    }
                    for v in 0..2 {
                        let mut acc = [_mm256_setzero_si256(); R];
                        for q in 0..GROUP / 4 {
                            let c = _mm256_loadu_si256(p.add(q * 64 + 32 * v) as *const __m256i);
                            for r in 0..R {
                                let bx = _mm256_set1_epi32(xs.quad(r, g * GROUP + 4 * q));
                                acc[r] = $dot(acc[r], c, bx);
                            }
                        }
                        let dw = _mm256_loadu_ps(p.add(512 + 32 * v) as *const f32);
                        let mut sums = acc;
                        if $surplus {
                            for r in 0..R {
                                let s = _mm256_set1_epi32(128 * xs.code_sum(r, g));
                                sums[r] = _mm256_sub_epi32(sums[r], s);
                            }
                        }
                        for o in 0..R / L {
                            let folded =
                                fold_levels!(sums, o, L, _mm256_slli_epi32, _mm256_add_epi32);
                            let scale = _mm256_mul_ps(dw, _mm256_set1_ps(xs.scale(L * o, g)));
                            y[o][v] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(folded), y[o][v]);
                        }
                    }
                }
                let mut lanes = [[0f32; 16]; R];
                for (dst, yr) in lanes.iter_mut().zip(&y) {
                    _mm256_storeu_ps(dst.as_mut_ptr(), yr[0]);
                    _mm256_storeu_ps(dst.as_mut_ptr().add(8), yr[1]);
                }
                store_i8(&lanes, i0 / L, R / L, out);
            }
        }
    };
}

/// `Σ |w| · sign(x, w)` by pairs, then pairs to i32: exactly `Σ w · x` per lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_i8_avx2(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// `Σ (w + 128) · x` per lane.
#[inline]
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn dot_i8_vnni(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, _mm256_xor_si256(w, _mm256_set1_epi8(-128)), x)
}

i8_256!(i8_avx2, block_i8_avx2, "avx2,fma", dot_i8_avx2, false);
i8_256!(
    i8_avxvnni,
    block_i8_avxvnni,
    "avx2,fma,avxvnni",
    dot_i8_vnni,
    true
);
