//! The integer-activation family (`q8`): activations quantized to int8 per row and per
//! 32-column group, multiplied with 4-bit weight codes (or int8 head weights) in exact
//! integer arithmetic, then scaled by one fixed sequence of f32 operations.
//!
//! The bits are defined by [`mod@reference`]: for output row `r` and input row `i`,
//! ```text
//! y = 0
//! for each 32-column group g, in column order:
//!     isum  = Σ_c code[r][c] · qx[i][c]            (exact, i32)
//!     scale = d[r][g] · dx[i][g]                   (f32 multiply)
//!     y     = y + fma(m[r][g], sx[i][g], scale · isum)   (q4 weights)
//!     y     = fma(scale, isum, y)                        (int8 head weights)
//! ```
//! At two levels ([`Levels::Two`]) an input is `(dx/128) · (128·q + q')`, `q'` the
//! residual's code: `isum = 128 · Σ code·q + Σ code·q'` (still exact), with `dx/128` as
//! the row's scale, so the float sequence above runs once per element at either level.
//! The integer sum is exact, so the order in which a SIMD variant adds its products does
//! not matter; every variant then performs exactly the float sequence above per element,
//! which makes every variant equal the reference bit for bit. Quantization is per input
//! row ([`QuantizedRows`]), so a row's result does not depend on the other rows of the
//! batch: batched verify passes equal single-row passes, and speculative text equals
//! plain text.
//!
//! Weights are repacked once at load ([`PackedQ4`], [`I8Matrix`]) into the order the
//! integer dot-product instructions want (four consecutive columns of one row in a
//! 32-bit lane); the packed q4 copy has the same size as the tiles.

pub mod amx;
pub mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use half::bf16;
use q4nx_format::{Q4Kind, Q4Matrix, GROUP_COLS, TILE_ROWS};
use rayon::prelude::*;

use crate::isa::Isa;
use crate::pages::WeightBytes;
use std::ops::Range;
use std::sync::Arc;

/// Columns per quantization group (activations and weights alike).
pub const GROUP: usize = GROUP_COLS;
/// Rows per packed q4 block.
pub const BLOCK_ROWS: usize = TILE_ROWS;
/// Bytes of one packed q4 block-group: 32 rows × 32 codes as nibbles, 32 bf16 scales,
/// 32 bf16 mins.
pub const Q4_GROUP_BYTES: usize = 512 + 64 + 64;
/// Rows per packed int8 block.
pub const I8_BLOCK_ROWS: usize = 16;
/// Bytes of one packed int8 block-group: 16 rows × 32 codes, 16 f32 scales.
pub const I8_GROUP_BYTES: usize = 512 + 64;

/// `round(v)` with ties to even, by one fixed f32 sequence (`|v| < 2^22`).
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    (v + MAGIC) - MAGIC
}

/// Quantizes one group of any length (32 for activations, `head_dim` for q8 KV rows):
/// `d = max|v| / 127`, `q = round(v · 127 / max|v|)` (ties to even), clamped to ±127,
/// NaN as 0. Returns `d` and writes the codes (as many as there are values).
///
/// # Panics
/// If `codes` is shorter than `values`.
#[inline]
pub fn quantize_group(values: &[f32], codes: &mut [i8]) -> f32 {
    if let (Ok(values), Ok(codes)) = (
        <&[f32; GROUP]>::try_from(values),
        <&mut [i8; GROUP]>::try_from(&mut *codes),
    ) {
        return quantize_codes(values, codes, None) / 127.0;
    }
    assert!(codes.len() >= values.len(), "q8: fewer codes than values");
    let amax = values.iter().fold(0f32, |m, &v| m.max(v.abs()));
    let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in codes.iter_mut().zip(values) {
        *q = to_i8(code_of(round_even(v * inverse)));
    }
    amax / 127.0
}

/// A group's codes `q = round(t)`, `t = v · 127 / max|v|` (ties to even, clamped to
/// ±127), and with `residual` the second level `q' = round(128 · (t - q))`; returns
/// `max|v|`. NaN or infinite input saturates through `as`; nothing here can panic.
#[inline(always)]
fn quantize_codes(
    values: &[f32; GROUP],
    codes: &mut [i8; GROUP],
    residual: Option<&mut [i8; GROUP]>,
) -> f32 {
    // The maximum is exact, so the lanes' order cannot change it.
    let mut lanes = [0f32; 8];
    for (c, &v) in values.iter().enumerate() {
        lanes[c % 8] = lanes[c % 8].max(v.abs());
    }
    let amax = lanes.iter().fold(0f32, |m, &v| m.max(v));
    let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let mut coarse = [0f32; GROUP];
    for ((q, c), &v) in codes.iter_mut().zip(coarse.iter_mut()).zip(values) {
        *c = code_of(round_even(v * inverse));
        *q = to_i8(*c);
    }
    if let Some(residual) = residual {
        for ((r, &c), &v) in residual.iter_mut().zip(&coarse).zip(values) {
            *r = to_i8(code_of(round_even((v * inverse - c) * 128.0)));
        }
    }
    amax
}

/// A rounded value as a code: clamped to ±127, NaN as 0 (what `v as i8` would give).
#[inline(always)]
fn code_of(rounded: f32) -> f32 {
    if rounded.is_nan() {
        0.0
    } else {
        rounded.clamp(-127.0, 127.0)
    }
}

/// An integral value in ±127 (from [`code_of`]) as `i8`, by a conversion that vectorizes.
#[inline(always)]
fn to_i8(code: f32) -> i8 {
    debug_assert!(code.abs() <= 127.0 && code.fract() == 0.0);
    // SAFETY: `code_of` returns a finite value in [-127, 127], representable in i32.
    (unsafe { code.to_int_unchecked::<i32>() }) as i8
}

/// The float sum of a group's inputs: eight lanes of four columns each (`c mod 8`, in
/// column order), then the lanes pairwise: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
#[inline(always)]
fn group_sum(values: &[f32; GROUP]) -> f32 {
    let mut lanes = [0f32; 8];
    for chunk in values.chunks_exact(8) {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l += v;
        }
    }
    let half: [f32; 4] = std::array::from_fn(|l| lanes[l] + lanes[l + 4]);
    (half[0] + half[2]) + (half[1] + half[3])
}

/// The exact sum of a group's codes.
#[inline(always)]
fn code_sum(codes: &[i8; GROUP]) -> i32 {
    codes.iter().map(|&c| c as i32).sum()
}

/// A block task's share of a matmul's output: its block's columns of every input row
/// (what every variant's block function writes).
type Out<'a> = crate::team::ColumnBlock<'a, f32>;

/// What quantizing one group yields besides its codes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GroupStats {
    /// `max|v|` over the group (NaN ignored).
    pub amax: f32,
    /// The float sum of the inputs ([`group_sum`]).
    pub sum: f32,
    /// The exact sum of the first level's codes.
    pub code_sum: i32,
    /// The exact sum of the residual codes (0 without a residual).
    pub residual_code_sum: i32,
}

/// The reference quantization of one group: codes, residual codes and their stats.
#[inline(always)]
fn quantize_group_stats(
    values: &[f32; GROUP],
    codes: &mut [i8; GROUP],
    residual: Option<&mut [i8; GROUP]>,
) -> GroupStats {
    let sum = group_sum(values);
    let (amax, residual_code_sum) = match residual {
        Some(residual) => {
            let amax = quantize_codes(values, codes, Some(&mut *residual));
            (amax, code_sum(residual))
        }
        None => (quantize_codes(values, codes, None), 0),
    };
    GroupStats {
        amax,
        sum,
        code_sum: code_sum(codes),
        residual_code_sum,
    }
}

/// Input rows quantized for the `q8` family: per row and 32-column group, int8 codes,
/// the scale `dx`, the float sum of the group's inputs `sx` (for the q4 mins) and the
/// sum of its codes (for the int8 head's unsigned-operand correction).
///
/// Each input row is [`Levels::count`] *level rows* of codes, stored next to each other
/// (input row `i` is level rows `L·i .. L·i + L`); the accessors index level rows.
#[derive(Clone, Debug)]
pub struct QuantizedRows {
    levels: Levels,
    rows: usize,
    k: usize,
    codes: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<f32>,
    code_sums: Vec<i32>,
}

impl Default for QuantizedRows {
    fn default() -> QuantizedRows {
        QuantizedRows {
            levels: Levels::One,
            rows: 0,
            k: 0,
            codes: Vec::new(),
            scales: Vec::new(),
            sums: Vec::new(),
            code_sums: Vec::new(),
        }
    }
}

impl QuantizedRows {
    /// Quantizes `rows` rows of `k` values (`k` a multiple of 32).
    ///
    /// # Panics
    /// If `k` is not a multiple of 32 or `x.len() != rows * k`.
    pub fn quantize(x: &[f32], rows: usize, k: usize) -> QuantizedRows {
        let mut q = QuantizedRows::default();
        q.quantize_from(x, rows, k);
        q
    }

    /// [`QuantizedRows::quantize`] into this value's buffers (no allocation once grown).
    pub fn quantize_from(&mut self, x: &[f32], rows: usize, k: usize) {
        self.quantize_levels(x, rows, k, Levels::One);
    }

    /// Quantizes `rows` rows of `k` values at `levels` int8 levels, into this value's
    /// buffers (no allocation once grown). Per group, `t = v · 127 / max|v|` and
    /// `q = round(t)` (ties to even) as in [`quantize_group`]; at [`Levels::Two`] the
    /// residual code is `q' = round(128 · (t - q))` (|q'| ≤ 64) and the scale is
    /// `dx / 128`, so `(dx/128)·(128·q + q')` carries each input to within `dx / 256`
    /// (about 15 bits). Either way a row's codes depend on that row alone.
    ///
    /// # Panics
    /// If `k` is not a multiple of 32 or `x.len() != rows * k`.
    pub fn quantize_levels(&mut self, x: &[f32], rows: usize, k: usize, levels: Levels) {
        self.quantize_levels_on(Isa::detect(), x, rows, k, levels);
    }

    /// [`QuantizedRows::quantize_levels`] compiled for `isa` (the same bits on every
    /// ISA; tests compare each compilation with the baseline's).
    ///
    /// # Panics
    /// If `k` is not a multiple of 32 or `x.len() != rows * k`.
    pub fn quantize_levels_on(
        &mut self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        k: usize,
        levels: Levels,
    ) {
        assert_eq!(k % GROUP, 0, "q8: K must be a multiple of 32, got {k}");
        assert_eq!(x.len(), rows * k, "q8: input is not rows × K");
        let count = levels.count();
        let groups = k / GROUP;
        self.levels = levels;
        self.k = k;
        self.rows = rows;
        self.codes.resize(count * rows * k, 0);
        self.scales.resize(count * rows * groups, 0.0);
        self.sums.resize(count * rows * groups, 0.0);
        self.code_sums.resize(count * rows * groups, 0);
        #[cfg(target_arch = "x86_64")]
        {
            if isa.avx512() {
                // SAFETY: detection found avx512f/bw/vl.
                return unsafe { self.quantize_avx512(x, levels) };
            }
            if isa.avx2() {
                // SAFETY: detection found avx2 and fma.
                return unsafe { self.quantize_avx2(x, levels) };
            }
        }
        let _ = isa;
        self.quantize_body(x, levels, quantize_group_stats)
    }

    /// [`QuantizedRows::quantize_body`] with the groups quantized by AVX-512 instructions
    /// that perform the reference's operations lane by lane ([`x86::quantize_group_512`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn quantize_avx512(&mut self, x: &[f32], levels: Levels) {
        self.quantize_body(x, levels, |values, codes, residual| {
            // SAFETY: the caller's detection found avx512f/bw/vl.
            unsafe { x86::quantize_group_512(values, codes, residual) }
        })
    }

    /// [`QuantizedRows::quantize_body`] compiled for AVX2: the same operations, wider.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn quantize_avx2(&mut self, x: &[f32], levels: Levels) {
        self.quantize_body(x, levels, quantize_group_stats)
    }

    /// Quantizes every group of `x` into the sized buffers, each group by `quantize`
    /// (the reference's [`quantize_group_stats`] or an equal SIMD version).
    #[inline(always)]
    fn quantize_body(
        &mut self,
        x: &[f32],
        levels: Levels,
        quantize: impl Fn(&[f32; GROUP], &mut [i8; GROUP], Option<&mut [i8; GROUP]>) -> GroupStats,
    ) {
        let (k, count) = (self.k, levels.count());
        let groups = k / GROUP;
        for (at, values) in x.chunks_exact(GROUP).enumerate() {
            let values: &[f32; GROUP] = values.try_into().expect("chunks of GROUP");
            let (i, g) = (at / groups, at % groups);
            // Level row `count·i`, group `g`; its residual row is one row (K codes) on.
            let gi = count * i * groups + g;
            let start = count * i * k + g * GROUP;
            match levels {
                Levels::One => {
                    let codes: &mut [i8; GROUP] = (&mut self.codes[start..start + GROUP])
                        .try_into()
                        .expect("a group");
                    let stats = quantize(values, codes, None);
                    self.sums[gi] = stats.sum;
                    self.scales[gi] = stats.amax / 127.0;
                    self.code_sums[gi] = stats.code_sum;
                }
                Levels::Two => {
                    let (upper, lower) = self.codes[start..].split_at_mut(k);
                    let codes: &mut [i8; GROUP] =
                        (&mut upper[..GROUP]).try_into().expect("a group");
                    let residual: &mut [i8; GROUP] =
                        (&mut lower[..GROUP]).try_into().expect("a group");
                    let stats = quantize(values, codes, Some(residual));
                    self.sums[gi] = stats.sum;
                    // A division by a power of two: exact (short of underflow).
                    self.scales[gi] = stats.amax / 127.0 / 128.0;
                    self.scales[gi + groups] = self.scales[gi];
                    self.sums[gi + groups] = 0.0;
                    self.code_sums[gi] = stats.code_sum;
                    self.code_sums[gi + groups] = stats.residual_code_sum;
                }
            }
        }
    }

    /// The levels each input row carries.
    pub fn levels(&self) -> Levels {
        self.levels
    }

    /// Input rows (each [`QuantizedRows::levels`] level rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Level rows: input rows times levels.
    pub fn level_rows(&self) -> usize {
        self.rows * self.levels.count()
    }
    /// Columns per row.
    pub fn cols(&self) -> usize {
        self.k
    }
    /// Codes of level row `i`.
    pub fn codes(&self, i: usize) -> &[i8] {
        &self.codes[i * self.k..(i + 1) * self.k]
    }
    /// Scale of level row `i`, group `g` (`dx`; `dx / 128` at two levels).
    pub fn scale(&self, i: usize, g: usize) -> f32 {
        self.scales[i * (self.k / GROUP) + g]
    }
    /// Float sum of level row `i`'s inputs in group `g` (in the lane order of
    /// `group_sum`; the input row's, on its first level row; 0 on a residual row).
    pub fn sum(&self, i: usize, g: usize) -> f32 {
        self.sums[i * (self.k / GROUP) + g]
    }
    /// Codes, scales, sums and code sums of every row, for the SIMD variants.
    pub(crate) fn raw(&self) -> (&[i8], &[f32], &[f32], &[i32]) {
        (&self.codes, &self.scales, &self.sums, &self.code_sums)
    }
    /// Sum of level row `i`'s codes in group `g`.
    pub fn code_sum(&self, i: usize, g: usize) -> i32 {
        self.code_sums[i * (self.k / GROUP) + g]
    }
}

/// How many int8 levels carry each activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Levels {
    /// One: `x ≈ dx·q` (error up to `dx / 2`).
    One,
    /// Two: `x ≈ dx·q + dr·r`, the second level quantizing the first's residual
    /// (error up to `dx / 508`); twice the integer work, the same weight traffic.
    Two,
}

impl Levels {
    /// Quantized rows per input row.
    pub fn count(self) -> usize {
        match self {
            Levels::One => 1,
            Levels::Two => 2,
        }
    }
}

/// [`matmul_q4`] into a new `x.rows() × w.stride()` vector, for rows quantized at
/// `levels` ([`QuantizedRows::quantize_levels`]).
///
/// # Panics
/// If `x` was quantized at other levels (or as [`matmul_q4`]).
pub fn matmul_q4_levels(w: &PackedQ4, x: &QuantizedRows, levels: Levels, isa: Isa) -> Vec<f32> {
    assert_eq!(x.levels(), levels, "q8: rows quantized at other levels");
    let mut y = vec![0f32; x.rows() * w.stride()];
    matmul_q4(w, x, &mut y, isa);
    y
}

/// [`matmul_i8`] into a new `x.rows() × w.rows()` vector, for rows quantized at `levels`.
///
/// # Panics
/// If `x` was quantized at other levels (or as [`matmul_i8`]).
pub fn matmul_i8_levels(w: &I8Matrix, x: &QuantizedRows, levels: Levels, isa: Isa) -> Vec<f32> {
    assert_eq!(x.levels(), levels, "q8: rows quantized at other levels");
    let mut y = vec![0f32; x.rows() * w.rows()];
    matmul_i8(w, x, &mut y, isa);
    y
}

/// q4 weights repacked for integer dot products, optionally several matrices of the same
/// K stacked into one (q, k and v; gate and up), so one parallel region computes them all.
///
/// Block `b` (32 rows), group `g` (32 columns) is [`Q4_GROUP_BYTES`] bytes at
/// `(b · groups + g) · Q4_GROUP_BYTES`: for half `h` (rows 16h..16h+16) and quad `q`,
/// 64 bytes at `(4h + q) · 64` hold, for lane `j` (row 16h + j), bytes `4j + t` =
/// `code(col 8q + t) | code(col 8q + 4 + t) << 4`; then 32 bf16 scales `d`, then 32 bf16
/// mins `m`. A q4_0 source is stored as unsigned codes `c ^ 8` with `m = -8d` (the same
/// values). Rows past a part's end are zero codes with zero scale and min.
#[derive(Clone, Debug)]
pub struct PackedQ4 {
    k: usize,
    blocks: usize,
    /// `(rows, first block)` of each stacked matrix.
    parts: Vec<(usize, usize)>,
    /// The buffer this matrix shares with the others packed with it ([`stack_many`]),
    /// and where its bytes are in it.
    ///
    /// [`stack_many`]: PackedQ4::stack_many
    buffer: Arc<WeightBytes>,
    range: Range<usize>,
}

/// The shape of one stack: K, blocks, each part's `(rows, first block)`, bytes.
struct StackLayout {
    k: usize,
    blocks: usize,
    parts: Vec<(usize, usize)>,
    bytes: usize,
}

impl StackLayout {
    /// # Panics
    /// If the matrices' K differ, K is not a multiple of 32, or the list is empty.
    fn of(parts: &[&Q4Matrix]) -> StackLayout {
        assert!(!parts.is_empty(), "q8: nothing to pack");
        let k = parts[0].cols();
        assert_eq!(k % GROUP, 0, "q8: K must be a multiple of 32, got {k}");
        let mut layout = Vec::new();
        let mut blocks = 0;
        for w in parts {
            assert_eq!(w.cols(), k, "q8: stacked matrices must share K");
            layout.push((w.rows(), blocks));
            blocks += w.rows().div_ceil(BLOCK_ROWS);
        }
        StackLayout {
            k,
            blocks,
            parts: layout,
            bytes: blocks * (k / GROUP) * Q4_GROUP_BYTES,
        }
    }

    /// Packs `parts` (this layout's matrices) into `data` (`self.bytes` zero bytes).
    fn pack(&self, parts: &[&Q4Matrix], data: &mut [u8]) {
        let groups = self.k / GROUP;
        data.par_chunks_mut(groups * Q4_GROUP_BYTES)
            .enumerate()
            .for_each(|(b, out)| {
                let (part, &(rows, first)) = self
                    .parts
                    .iter()
                    .enumerate()
                    .rev()
                    .find(|(_, &(_, first))| first <= b)
                    .expect("block belongs to a part");
                let w = parts[part];
                let rb = b - first;
                for (g, dst) in out.chunks_exact_mut(Q4_GROUP_BYTES).enumerate() {
                    pack_q4_group(w, rows, rb, g, dst);
                }
            });
    }
}

impl PackedQ4 {
    /// Repacks one matrix.
    pub fn new(w: &Q4Matrix) -> PackedQ4 {
        Self::stack(&[w])
    }

    /// Repacks matrices of the same K into one, each starting on a 32-row block.
    ///
    /// # Panics
    /// If the matrices' K differ, K is not a multiple of 32, or the list is empty.
    pub fn stack(parts: &[&Q4Matrix]) -> PackedQ4 {
        Self::stack_many(&[parts]).remove(0)
    }

    /// Repacks each list of `stacks` as [`PackedQ4::stack`] does, all into one buffer,
    /// so that a model's projections (0.4–1.1 MB each for SmolLM2) share huge pages
    /// ([`WeightBytes`]) that none of them would fill alone. Each gets the bytes
    /// `stack` would give it.
    ///
    /// # Panics
    /// As [`PackedQ4::stack`], for any of the lists.
    pub fn stack_many(stacks: &[&[&Q4Matrix]]) -> Vec<PackedQ4> {
        let layouts: Vec<StackLayout> = stacks.iter().map(|parts| StackLayout::of(parts)).collect();
        let mut buffer = WeightBytes::zeroed(layouts.iter().map(|l| l.bytes).sum());
        let mut ranges = Vec::with_capacity(layouts.len());
        {
            let mut rest: &mut [u8] = &mut buffer;
            let mut slices = Vec::with_capacity(layouts.len());
            for l in &layouts {
                let at = ranges.last().map_or(0, |r: &Range<usize>| r.end);
                ranges.push(at..at + l.bytes);
                let (mine, after) = std::mem::take(&mut rest).split_at_mut(l.bytes);
                slices.push(mine);
                rest = after;
            }
            slices
                .into_par_iter()
                .zip(layouts.par_iter().zip(stacks))
                .for_each(|(data, (layout, parts))| layout.pack(parts, data));
        }
        let buffer = Arc::new(buffer);
        layouts
            .into_iter()
            .zip(ranges)
            .map(|(l, range)| PackedQ4 {
                k: l.k,
                blocks: l.blocks,
                parts: l.parts,
                buffer: buffer.clone(),
                range,
            })
            .collect()
    }

    /// A model's layers packed into one buffer by [`PackedQ4::stack_many`]:
    /// `stacks_of(layer)` names the layer's `N` stacks, and each layer gets its `N`
    /// packed stacks back, in that order.
    pub fn stack_layers<'m, L, const N: usize>(
        layers: &'m [L],
        stacks_of: impl Fn(&'m L) -> [Vec<&'m Q4Matrix<'m>>; N],
    ) -> Vec<[PackedQ4; N]> {
        let stacks: Vec<[Vec<&Q4Matrix>; N]> = layers.iter().map(stacks_of).collect();
        let lists: Vec<&[&Q4Matrix]> = stacks.iter().flatten().map(Vec::as_slice).collect();
        let mut packed = Self::stack_many(&lists).into_iter();
        stacks
            .iter()
            .map(|_| std::array::from_fn(|_| packed.next().expect("N stacks a layer")))
            .collect()
    }

    /// Columns (K).
    pub fn cols(&self) -> usize {
        self.k
    }
    /// Output values per input row: 32 per block (parts padded to whole blocks).
    pub fn stride(&self) -> usize {
        self.blocks * BLOCK_ROWS
    }
    /// Where part `p`'s rows start in an output row, and how many there are.
    pub fn part(&self, p: usize) -> std::ops::Range<usize> {
        let (rows, first) = self.parts[p];
        first * BLOCK_ROWS..first * BLOCK_ROWS + rows
    }
    /// Bytes of packed weights (what one pass streams).
    pub fn byte_len(&self) -> usize {
        self.range.len()
    }
    pub(crate) fn group_bytes(&self, block: usize, g: usize) -> &[u8] {
        let at = (block * (self.k / GROUP) + g) * Q4_GROUP_BYTES;
        &self.data()[at..at + Q4_GROUP_BYTES]
    }
    pub(crate) fn data(&self) -> &[u8] {
        &self.buffer[self.range.clone()]
    }
}

fn pack_q4_group(w: &Q4Matrix, rows: usize, rb: usize, g: usize, dst: &mut [u8]) {
    let tile = w.tile(rb, g * GROUP / q4nx_format::TILE_COLS);
    let gi = (g * GROUP % q4nx_format::TILE_COLS) / GROUP;
    let nib = |r: usize, c: usize| -> u8 {
        let col = gi * GROUP + c;
        let byte = tile[q4nx_format::NIBBLE_OFFSET
            + (r / 16) * (q4nx_format::TILE_COLS * 8)
            + col * 8
            + (r % 16) / 2];
        let v = if r % 2 == 1 { byte >> 4 } else { byte & 0x0f };
        match w.kind() {
            Q4Kind::Q4_1 => v,
            Q4Kind::Q4_0 => v ^ 8,
        }
    };
    for r in 0..BLOCK_ROWS {
        if rb * BLOCK_ROWS + r >= rows {
            break; // padding rows stay zero: zero codes, zero scale, zero min
        }
        let (h, j) = (r / 16, r % 16);
        for q in 0..4 {
            for t in 0..4 {
                let lo = nib(r, 8 * q + t);
                let hi = nib(r, 8 * q + 4 + t);
                dst[(4 * h + q) * 64 + 4 * j + t] = lo | (hi << 4);
            }
        }
        let s = gi * TILE_ROWS + r;
        let d = [tile[2 * s], tile[2 * s + 1]];
        let m = match w.kind() {
            Q4Kind::Q4_1 => [
                tile[q4nx_format::MIN_OFFSET + 2 * s],
                tile[q4nx_format::MIN_OFFSET + 2 * s + 1],
            ],
            // -8·d is exact in bf16 (an exponent shift and a sign).
            Q4Kind::Q4_0 => bf16::from_f32(-8.0 * bf16::from_le_bytes(d).to_f32()).to_le_bytes(),
        };
        dst[512 + 2 * r..512 + 2 * r + 2].copy_from_slice(&d);
        dst[576 + 2 * r..576 + 2 * r + 2].copy_from_slice(&m);
    }
}

/// A dense matrix quantized to int8 per row and 32-column group (the tied head's
/// embedding), packed in 16-row blocks: block `b`, group `g` is [`I8_GROUP_BYTES`]
/// bytes: for quad `q` (columns 4q..4q+4), 64 bytes with lane `j` (row 16b + j) at
/// `4j..4j+4`; then 16 f32 scales.
#[derive(Clone, Debug)]
pub struct I8Matrix {
    rows: usize,
    k: usize,
    data: WeightBytes,
}

impl I8Matrix {
    /// Quantizes a row-major BF16 matrix (`rows × k` little-endian values).
    ///
    /// # Panics
    /// If `k` is not a multiple of 32 or `w` is not `rows × k` BF16 values.
    pub fn from_bf16(w: &[u8], rows: usize, k: usize) -> I8Matrix {
        assert_eq!(k % GROUP, 0, "q8: K must be a multiple of 32, got {k}");
        assert_eq!(w.len(), rows * k * 2, "q8: BF16 matrix is not rows × K");
        let groups = k / GROUP;
        let blocks = rows.div_ceil(I8_BLOCK_ROWS);
        let mut data = WeightBytes::zeroed(blocks * groups * I8_GROUP_BYTES);
        data.par_chunks_mut(groups * I8_GROUP_BYTES)
            .enumerate()
            .for_each(|(b, out)| {
                let mut values = [0f32; GROUP];
                let mut codes = [0i8; GROUP];
                for j in 0..I8_BLOCK_ROWS {
                    let row = b * I8_BLOCK_ROWS + j;
                    if row >= rows {
                        break;
                    }
                    for (g, dst) in out.chunks_exact_mut(I8_GROUP_BYTES).enumerate() {
                        for (c, v) in values.iter_mut().enumerate() {
                            let at = 2 * (row * k + g * GROUP + c);
                            *v = bf16::from_le_bytes([w[at], w[at + 1]]).to_f32();
                        }
                        let d = quantize_group(&values, &mut codes);
                        for q in 0..GROUP / 4 {
                            for t in 0..4 {
                                dst[q * 64 + 4 * j + t] = codes[4 * q + t] as u8;
                            }
                        }
                        dst[512 + 4 * j..512 + 4 * j + 4].copy_from_slice(&d.to_le_bytes());
                    }
                }
            });
        I8Matrix { rows, k, data }
    }

    /// Rows (outputs per input row).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Columns.
    pub fn cols(&self) -> usize {
        self.k
    }
    /// Bytes of packed weights.
    pub fn byte_len(&self) -> usize {
        self.data.len()
    }
    pub(crate) fn group_bytes(&self, block: usize, g: usize) -> &[u8] {
        let at = (block * (self.k / GROUP) + g) * I8_GROUP_BYTES;
        &self.data[at..at + I8_GROUP_BYTES]
    }
    pub(crate) fn data(&self) -> &[u8] {
        &self.data
    }
}

/// Int8 blocks per task: enough work to amortise the task, many tasks to balance.
const I8_TASK_BLOCKS: usize = 8;

/// The variants of this family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    /// AVX-512 VNNI, and AMX tiles for the int8 head from [`amx::pays`]'s row count.
    #[cfg(target_arch = "x86_64")]
    Amx,
}

fn variant(isa: Isa) -> Variant {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.amx() {
            return Variant::Amx;
        }
        if isa.avx512_vnni() {
            return Variant::Avx512Vnni;
        }
        if isa.avx_vnni() {
            return Variant::AvxVnni;
        }
        if isa.avx2() {
            return Variant::Avx2;
        }
    }
    let _ = isa;
    Variant::Scalar
}

/// The name of the variant this family runs under `isa` (for reports).
pub fn variant_name(isa: Isa) -> &'static str {
    match variant(isa) {
        Variant::Scalar => "scalar",
        #[cfg(target_arch = "x86_64")]
        Variant::Avx2 => "avx2",
        #[cfg(target_arch = "x86_64")]
        Variant::AvxVnni => "avxvnni",
        #[cfg(target_arch = "x86_64")]
        Variant::Avx512Vnni => "avx512vnni",
        #[cfg(target_arch = "x86_64")]
        Variant::Amx => "avx512vnni+amx-head",
    }
}

/// # Panics
/// If `x`'s K differs from the weights' or `y.len() != x.rows() · w.stride()`.
fn check_q4_shapes(w: &PackedQ4, x: &QuantizedRows, y: &[f32]) {
    assert_eq!(x.cols(), w.cols(), "q8: input K differs from the weights'");
    assert_eq!(
        y.len(),
        x.rows() * w.stride(),
        "q8: output is not rows × stride"
    );
}

/// # Panics
/// If `x`'s K differs from the weights' or `y.len() != x.rows() · w.rows()`.
fn check_i8_shapes(w: &I8Matrix, x: &QuantizedRows, y: &[f32]) {
    assert_eq!(x.cols(), w.cols(), "q8: input K differs from the weights'");
    assert_eq!(y.len(), x.rows() * w.rows(), "q8: output is not rows × N");
}

/// `y[i · stride + r] = Σ_c W[r][c] · x[i][c]` by the family's arithmetic, for every
/// stacked row `r` (padding rows included; see [`PackedQ4::part`]).
///
/// # Panics
/// If `x`'s K differs from the weights' or `y.len() != x.rows() · w.stride()`.
pub fn matmul_q4(w: &PackedQ4, x: &QuantizedRows, y: &mut [f32], isa: Isa) {
    check_q4_shapes(w, x, y);
    let stride = w.stride();
    if x.rows() == 0 {
        return;
    }
    let kernel = variant(isa);
    // Each task writes its 32-row block's outputs for every input row straight into `y`.
    crate::team::for_each_column_block(y, stride, BLOCK_ROWS, |b, mut out| match kernel {
        Variant::Scalar => reference::block_q4(w, b, x, &mut out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the variant comes from an `Isa` token, set only by detection.
        Variant::Avx2 => unsafe { x86::block_q4_avx2(w, b, x, &mut out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above (avx2, fma, avxvnni detected).
        Variant::AvxVnni => unsafe { x86::block_q4_avxvnni(w, b, x, &mut out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above (avx512f, bw, vl, vnni detected).
        Variant::Avx512Vnni => unsafe { x86::block_q4_avx512vnni(w, b, x, &mut out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above (AMX implies AVX-512 VNNI). The q4 tile kernel is not chosen
        // (`amx::matmul_q4_hardware` says why).
        Variant::Amx => unsafe { x86::block_q4_avx512vnni(w, b, x, &mut out) },
    });
}

/// `y[i · rows + r] = Σ_c W[r][c] · x[i][c]` for the int8 matrix, by the family's
/// arithmetic.
///
/// # Panics
/// If `x`'s K differs from the weights' or `y.len() != x.rows() · w.rows()`.
pub fn matmul_i8(w: &I8Matrix, x: &QuantizedRows, y: &mut [f32], isa: Isa) {
    check_i8_shapes(w, x, y);
    let rows = w.rows();
    if x.rows() == 0 {
        return;
    }
    let kernel = variant(isa);
    #[cfg(target_arch = "x86_64")]
    if kernel == Variant::Amx && amx::pays(x.level_rows()) {
        return amx::matmul_i8_hardware(isa, w, x, y);
    }
    let width = I8_TASK_BLOCKS * I8_BLOCK_ROWS;
    // Each task writes its blocks' outputs for every input row straight into `y`.
    crate::team::for_each_column_block(y, rows, width, |t, mut out| {
        for j in 0..out.width().div_ceil(I8_BLOCK_ROWS) {
            let b = t * I8_TASK_BLOCKS + j;
            let mut out = out.columns(j * I8_BLOCK_ROWS, (j + 1) * I8_BLOCK_ROWS);
            match kernel {
                Variant::Scalar => reference::block_i8(w, b, x, &mut out),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the variant comes from an `Isa` token, set only by detection.
                Variant::Avx2 => unsafe { x86::block_i8_avx2(w, b, x, &mut out) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                Variant::AvxVnni => unsafe { x86::block_i8_avxvnni(w, b, x, &mut out) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                Variant::Avx512Vnni => unsafe { x86::block_i8_avx512vnni(w, b, x, &mut out) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above (AMX implies AVX-512 VNNI): few rows.
                Variant::Amx => unsafe { x86::block_i8_avx512vnni(w, b, x, &mut out) },
            }
        }
    });
}

#[inline]
pub(crate) fn bf16_at(bytes: &[u8], at: usize) -> f32 {
    bf16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}
