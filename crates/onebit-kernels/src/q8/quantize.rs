//! Activation quantization for the q8 family: rows to int8 codes per 32-column group
//! (one or two levels), with the group statistics the epilogue uses; the bits every
//! variant reads.

#[cfg(target_arch = "x86_64")]
use super::x86;
use super::GROUP;
use crate::isa::Isa;

/// `round(v)` with ties to even, by one fixed f32 sequence (`|v| < 2^22`).
#[inline(always)]
pub(super) fn round_even(v: f32) -> f32 {
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
pub(super) fn quantize_codes(
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
pub(super) fn code_of(rounded: f32) -> f32 {
    if rounded.is_nan() {
        0.0
    } else {
        rounded.clamp(-127.0, 127.0)
    }
}

/// An integral value in ±127 (from [`code_of`]) as `i8`, by a conversion that vectorizes.
#[inline(always)]
pub(super) fn to_i8(code: f32) -> i8 {
    debug_assert!(code.abs() <= 127.0 && code.fract() == 0.0);
    // SAFETY: `code_of` returns a finite value in [-127, 127], representable in i32.
    (unsafe { code.to_int_unchecked::<i32>() }) as i8
}

/// The float sum of a group's inputs: eight lanes of four columns each (`c mod 8`, in
/// column order), then the lanes pairwise: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
#[inline(always)]
pub(super) fn group_sum(values: &[f32; GROUP]) -> f32 {
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
pub(super) fn code_sum(codes: &[i8; GROUP]) -> i32 {
    codes.iter().map(|&c| c as i32).sum()
}

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
pub(super) fn quantize_group_stats(
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

    /// [`QuantizedRows::quantize`] into this value's buffers (grown, never shrunk).
    pub fn quantize_from(&mut self, x: &[f32], rows: usize, k: usize) {
        self.quantize_levels(x, rows, k, Levels::One);
    }

    /// Quantizes `rows` rows of `k` values at `levels` int8 levels, into this value's
    /// buffers (grown, never shrunk). Per group, `t = v · 127 / max|v|` and
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
                // SAFETY: the token's detection found avx512f/bw/vl, avx2 and fma.
                return self.quantize_rows(x, levels, |row, levels| unsafe {
                    row.quantize_avx512(levels)
                });
            }
            if isa.avx2() {
                // SAFETY: the token's detection found avx2 and fma.
                return self.quantize_rows(x, levels, |row, levels| unsafe {
                    row.quantize_avx2(levels)
                });
            }
        }
        let _ = isa;
        self.quantize_rows(x, levels, |row, levels| {
            row.quantize(levels, &quantize_group_stats)
        })
    }

    /// Quantizes every input row of `x` into the sized buffers by `quantize_row` (each
    /// ISA's compilation of [`RowBuffers::quantize`]). With at least two rows, two
    /// threads and [`PARALLEL_VALUES`] values, the rows are shared out over the threads
    /// of [`crate::team::parallel_for`]: each row's buffers are its own, so the split
    /// cannot change a bit.
    fn quantize_rows(
        &mut self,
        x: &[f32],
        levels: Levels,
        quantize_row: impl Fn(&mut RowBuffers<'_>, Levels) + Sync,
    ) {
        let (k, count) = (self.k, levels.count());
        if self.rows == 0 || k == 0 {
            return;
        }
        let groups = k / GROUP;
        let rows = self.codes.chunks_exact_mut(count * k).zip(
            self.scales.chunks_exact_mut(count * groups).zip(
                self.sums
                    .chunks_exact_mut(count * groups)
                    .zip(self.code_sums.chunks_exact_mut(count * groups)),
            ),
        );
        let rows =
            x.chunks_exact(k)
                .zip(rows)
                .map(|(input, (codes, (scales, (sums, code_sums))))| RowBuffers {
                    input,
                    codes,
                    scales,
                    sums,
                    code_sums,
                });
        let threads = crate::team::current_threads();
        if self.rows < 2 || self.rows * k < PARALLEL_VALUES || threads < 2 {
            for mut row in rows {
                quantize_row(&mut row, levels);
            }
            return;
        }
        // One lock per row, each taken once by the task whose share holds that row
        // (never contended). A task's rows are contiguous: rows handed out one by one
        // would have both threads writing the scales of neighbouring rows, which share
        // cache lines.
        let rows: Vec<std::sync::Mutex<RowBuffers<'_>>> = rows.map(std::sync::Mutex::new).collect();
        let tasks = threads.min(rows.len());
        crate::team::parallel_for(tasks, &|t| {
            let share = rows.len() * t / tasks..rows.len() * (t + 1) / tasks;
            for row in &rows[share] {
                let mut row = row.lock().unwrap_or_else(|e| e.into_inner());
                quantize_row(&mut row, levels);
            }
        });
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

/// Values (rows × columns) from which [`QuantizedRows::quantize_levels_on`] shares the
/// rows out over the threads (given at least two rows and two threads). Measured on a 2-vCPU Ice Lake Xeon (AVX-512, two levels,
/// 100k back-to-back calls on a two-thread team): 8 × 576 values took 3.9 µs alone and
/// 4.3 µs shared (a region's hand-off costs more than half the work saves), 8 × 1536
/// 9.9 against 8.1 µs, 16 × 576 7.6 against 5.5 µs.
pub const PARALLEL_VALUES: usize = 8192;

/// One input row's inputs and its slices of the [`QuantizedRows`] buffers: `count · k`
/// codes (level after level) and `count · groups` scales, sums and code sums.
struct RowBuffers<'a> {
    input: &'a [f32],
    codes: &'a mut [i8],
    scales: &'a mut [f32],
    sums: &'a mut [f32],
    code_sums: &'a mut [i32],
}

impl RowBuffers<'_> {
    /// Quantizes the row's groups by `quantize` into its slices.
    #[inline(always)]
    fn quantize(
        &mut self,
        levels: Levels,
        quantize: &impl Fn(&[f32; GROUP], &mut [i8; GROUP], Option<&mut [i8; GROUP]>) -> GroupStats,
    ) {
        let k = self.input.len();
        let groups = k / GROUP;
        for (g, values) in self.input.chunks_exact(GROUP).enumerate() {
            let values: &[f32; GROUP] = values.try_into().expect("chunks of GROUP");
            let start = g * GROUP;
            match levels {
                Levels::One => {
                    let codes: &mut [i8; GROUP] = (&mut self.codes[start..start + GROUP])
                        .try_into()
                        .expect("a group");
                    let stats = quantize(values, codes, None);
                    self.sums[g] = stats.sum;
                    self.scales[g] = stats.amax / 127.0;
                    self.code_sums[g] = stats.code_sum;
                }
                Levels::Two => {
                    // The residual level row is one row (K codes) on.
                    let (upper, lower) = self.codes.split_at_mut(k);
                    let codes: &mut [i8; GROUP] = (&mut upper[start..start + GROUP])
                        .try_into()
                        .expect("a group");
                    let residual: &mut [i8; GROUP] = (&mut lower[start..start + GROUP])
                        .try_into()
                        .expect("a group");
                    let stats = quantize(values, codes, Some(residual));
                    self.sums[g] = stats.sum;
                    // A division by a power of two: exact (short of underflow).
                    self.scales[g] = stats.amax / 127.0 / 128.0;
                    self.scales[g + groups] = self.scales[g];
                    self.sums[g + groups] = 0.0;
                    self.code_sums[g] = stats.code_sum;
                    self.code_sums[g + groups] = stats.residual_code_sum;
                }
            }
        }
    }

    /// [`RowBuffers::quantize`] with the groups quantized by AVX-512 instructions that
    /// perform the reference's operations lane by lane ([`x86::quantize_group_512`]).
    ///
    /// # Safety
    /// The CPU must have avx512f, avx512bw, avx512vl, avx2 and fma.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn quantize_avx512(&mut self, levels: Levels) {
        self.quantize(levels, &|values, codes, residual| {
            // SAFETY: this function's features are the caller's guarantee.
            unsafe { x86::quantize_group_512(values, codes, residual) }
        })
    }

    /// [`RowBuffers::quantize`] compiled for AVX2: the reference's operations, wider.
    ///
    /// # Safety
    /// The CPU must have avx2 and fma.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn quantize_avx2(&mut self, levels: Levels) {
        self.quantize(levels, &quantize_group_stats)
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
