//! Element-wise kernels and attention: RMSNorm, rope, SwiGLU, the fixed-order `dot`,
//! softmax attention, and `first_max` (a drafter's argmax). Each is deterministic per
//! output element.

use crate::isa::Isa;

/// The first index of the largest value (NaN never largest; 0 when there is no number),
/// compiled for `isa` (every compilation gives the same index: the maximum and the
/// comparisons are exact). What a drafter's picks need from a row of logits.
pub fn first_max(isa: Isa, values: &[f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512() {
            // SAFETY: detection found avx512f/bw/vl (with avx2 and fma).
            return unsafe { first_max_avx512(values) };
        }
        if isa.avx2() {
            // SAFETY: detection found avx2 and fma.
            return unsafe { first_max_avx2(values) };
        }
    }
    let _ = isa;
    first_max_body(values)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn first_max_avx512(values: &[f32]) -> usize {
    first_max_body(values)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn first_max_avx2(values: &[f32]) -> usize {
    first_max_body(values)
}

/// The maximum by lanes (an exact operation, so its order is free and it vectorizes),
/// then the first chunk holding it (each chunk's test has no early exit, so it
/// vectorizes too), then the position inside that chunk.
#[inline(always)]
fn first_max_body(values: &[f32]) -> usize {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = m.max(x);
        }
    }
    let max = tail
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    values
        .chunks(LANES)
        .enumerate()
        .find(|(_, c)| c.iter().fold(false, |hit, &x| hit | (x == max)))
        .and_then(|(k, c)| c.iter().position(|&x| x == max).map(|j| k * LANES + j))
        .unwrap_or(0)
}

/// `out = x / sqrt(mean(x²) + eps) * gain` per row, each row's sum of squares in index
/// order (one f32 accumulator from 0, `v · v` rounded before each add). Rows pair off as
/// far as both `x` and `out` hold whole rows of `gain.len()`; an empty `gain` norms nothing.
///
/// That sum is a chain of dependent adds, bound by the add's latency; rows are
/// independent, so up to [`NORM_ROWS`] rows' chains advance together (each in its own
/// order, so every row's bits are those it has alone). A pass of 8 rows spent 0.5 ms of
/// its 13 in these chains one row after another (SmolLM2, Ice Lake Xeon).
pub fn rms_norm(x: &[f32], gain: &[f32], eps: f32, out: &mut [f32]) {
    let width = gain.len();
    if width == 0 {
        return;
    }
    let rows = (x.len() / width).min(out.len() / width);
    let mut r0 = 0;
    while r0 < rows {
        // Chunks of 8 rows, then one of 4, then what is left (1 to 3 rows).
        let n = match rows - r0 {
            n @ 1..=3 => n,
            4..NORM_ROWS => 4,
            _ => NORM_ROWS,
        };
        let at = r0 * width..(r0 + n) * width;
        let (x, out) = (&x[at.clone()], &mut out[at]);
        match n {
            1 => rms_norm_rows::<1>(x, gain, eps, out),
            2 => rms_norm_rows::<2>(x, gain, eps, out),
            3 => rms_norm_rows::<3>(x, gain, eps, out),
            4 => rms_norm_rows::<4>(x, gain, eps, out),
            _ => rms_norm_rows::<NORM_ROWS>(x, gain, eps, out),
        }
        r0 += n;
    }
}

/// Rows whose sums of squares [`rms_norm`] interleaves.
pub const NORM_ROWS: usize = 8;

/// [`rms_norm`] of exactly `R` rows, their sums advancing column by column.
#[inline(always)]
// The column indexes every row at once.
#[allow(clippy::needless_range_loop)]
fn rms_norm_rows<const R: usize>(x: &[f32], gain: &[f32], eps: f32, out: &mut [f32]) {
    let width = gain.len();
    let rows: [&[f32]; R] = std::array::from_fn(|r| &x[r * width..(r + 1) * width]);
    let mut ss = [0f32; R];
    for c in 0..width {
        for r in 0..R {
            let v = rows[r][c];
            ss[r] += v * v;
        }
    }
    for (r, dst) in out.chunks_exact_mut(width).enumerate().take(R) {
        let inv = 1.0 / (ss[r] / width as f32 + eps).sqrt();
        for ((o, &v), &g) in dst.iter_mut().zip(rows[r]).zip(gain) {
            *o = g * (v * inv);
        }
    }
}

/// Rotate-half (NeoX) rope of one head vector at the given angles' cos/sin
/// (`cos.len() == head.len() / 2`).
pub fn rope_rotate_half(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = head.len() / 2;
    for i in 0..half {
        let (a, b) = (head[i], head[i + half]);
        head[i] = a * cos[i] - b * sin[i];
        head[i + half] = b * cos[i] + a * sin[i];
    }
}

/// Cos/sin tables for `positions` of a head of `head_dim` (angles computed in f64, stored f32).
pub fn rope_table(theta: f64, head_dim: usize, position: usize) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(half);
    let mut sin = Vec::with_capacity(half);
    for i in 0..half {
        let inv_freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
        let angle = position as f64 * inv_freq;
        cos.push(angle.cos() as f32);
        sin.push(angle.sin() as f32);
    }
    (cos, sin)
}

/// Below this, [`exp_nonpositive`] is 0 (`e^-87` is a normal f32; `e^-88` is not).
pub const EXP_MIN: f32 = -87.0;
/// `1.5 · 2^23`: adding it rounds an f32 below `2^22` in magnitude to an integer
/// (ties to even), which then sits in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// `ln 2` in two parts (Cody–Waite): the high part has few bits, so `n · LN2_HI` is
/// exact for the `|n| ≤ 126` used here.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `e^r ≈ 1 + r + r²·P(r)` on `|r| ≤ ln2 / 2` (Cephes `expf`'s coefficients).
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `e^a` for `a ≤ 0` by one fixed sequence of f32 operations, so every compilation
/// (scalar, or vectorized by the compiler under AVX2 or AVX-512) gives the same bits:
/// `v = fma(a, log2 e, 1.5·2^23)` (so `n = v - 1.5·2^23` is `a · log2 e` rounded to an
/// integer), `r = fma(n, -ln2_lo, fma(n, -ln2_hi, a))`, `y = fma(P(r), r², r) + 1` with
/// `P` by Horner's rule in FMAs, then `y · 2^n` (the exponent bits taken from `v`'s
/// mantissa). 0 below [`EXP_MIN`] and for NaN. Branch-free, so a loop over it
/// vectorizes. Relative error against `f64` below 2e-7 (8.3e-8 measured by
/// `tests/elementwise.rs`).
#[inline(always)]
pub fn exp_nonpositive(a: f32) -> f32 {
    let keep = a >= EXP_MIN;
    let ac = if keep { a } else { EXP_MIN };
    let v = ac.mul_add(std::f32::consts::LOG2_E, ROUND_MAGIC);
    let n = v - ROUND_MAGIC;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, ac));
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // v's bits are ROUND_MAGIC's plus n (two's complement, |n| ≤ 126): 2^n's exponent.
    let exponent = v
        .to_bits()
        .wrapping_sub(ROUND_MAGIC.to_bits())
        .wrapping_add(127);
    let scale = f32::from_bits(exponent << 23);
    if keep {
        y * scale
    } else {
        0.0
    }
}

/// The logistic function `1 / (1 + e^-t)`, times `x`: `x · σ(t)`, by one fixed sequence
/// of f32 operations. Only `e^-|t|` is taken (it cannot overflow): `σ(t) = 1 / (1 + e)`
/// for `t ≥ 0` and `e / (1 + e)` below, so the result is `(x or x·e) / (1 + e)`.
#[inline(always)]
fn times_sigmoid(x: f32, t: f32) -> f32 {
    let e = exp_nonpositive(-t.abs());
    let numerator = if t >= 0.0 { x } else { x * e };
    numerator / (1.0 + e)
}

/// SiLU: `g · σ(g)`, by [`exp_nonpositive`]'s fixed sequence (the same bits on every
/// CPU and compilation).
#[inline(always)]
pub fn silu(g: f32) -> f32 {
    times_sigmoid(g, g)
}

/// `sqrt(2 / pi)`, the tanh GELU's inner factor (PyTorch's `kBeta`).
const GELU_BETA: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh GELU (PyTorch's `kKappa`).
const GELU_KAPPA: f32 = 0.044_715;

/// GELU with the tanh approximation (`gelu_pytorch_tanh`),
/// `0.5 · x · (1 + tanh(u))` with `u = β · (x + κ · x³)`, computed as the equal
/// `x · σ(2u)` (`(1 + tanh u) / 2 = σ(2u)`): one [`exp_nonpositive`], no cancellation
/// where `tanh u` nears -1.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    let inner = GELU_BETA * (x + GELU_KAPPA * (x * x * x));
    times_sigmoid(x, 2.0 * inner)
}

/// The gated activations of an MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// SwiGLU: `silu(gate) · up`.
    Silu,
    /// GeGLU (Gemma): `gelu_tanh(gate) · up`.
    GeluTanh,
}

/// SiLU(gate) · up, in place into `gate`, compiled for `isa` (the same bits every way).
///
/// # Panics
/// If `gate` and `up` differ in length.
pub fn swiglu(isa: Isa, gate: &mut [f32], up: &[f32]) {
    gated(isa, Gate::Silu, gate, up)
}

/// GELU-tanh(gate) · up, in place into `gate` (Gemma's GeGLU MLP), compiled for `isa`.
///
/// # Panics
/// If `gate` and `up` differ in length.
pub fn geglu(isa: Isa, gate: &mut [f32], up: &[f32]) {
    gated(isa, Gate::GeluTanh, gate, up)
}

/// `activation(gate) · up`, in place into `gate`, compiled for `isa`: element-wise, so
/// spreading it over the team in chunks cannot change a bit.
///
/// # Panics
/// If `gate` and `up` differ in length.
pub fn gated(isa: Isa, activation: Gate, gate: &mut [f32], up: &[f32]) {
    /// Elements per task: vectorized, a few thousand outweigh a task's hand-off.
    const CHUNK: usize = 2048;
    let name = match activation {
        Gate::Silu => "swiglu",
        Gate::GeluTanh => "geglu",
    };
    assert_eq!(gate.len(), up.len(), "{name}: gate and up differ in length");
    let serial = |gate: &mut [f32], up: &[f32]| gated_serial(isa, activation, gate, up);
    if gate.len() <= CHUNK {
        return serial(gate, up);
    }
    crate::team::for_each_chunk(gate, CHUNK, |i, g| serial(g, &up[i * CHUNK..]));
}

fn gated_serial(isa: Isa, activation: Gate, gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512() {
            // SAFETY: detection found avx512f/bw/vl (and avx2, fma).
            return unsafe { gated_avx512(activation, gate, up) };
        }
        if isa.avx2() {
            // SAFETY: detection found avx2 and fma.
            return unsafe { gated_avx2(activation, gate, up) };
        }
    }
    let _ = isa;
    gated_body(activation, gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn gated_avx512(activation: Gate, gate: &mut [f32], up: &[f32]) {
    gated_body(activation, gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_avx2(activation: Gate, gate: &mut [f32], up: &[f32]) {
    gated_body(activation, gate, up)
}

/// The one body every compilation runs: IEEE operations and FMAs only, so the
/// compiler's vectorization cannot change a bit.
#[inline(always)]
fn gated_body(activation: Gate, gate: &mut [f32], up: &[f32]) {
    match activation {
        Gate::Silu => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = silu(*g) * u;
            }
        }
        Gate::GeluTanh => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = gelu_tanh(*g) * u;
            }
        }
    }
}

/// Lanes of [`dot`]'s partial sums.
const DOT_LANES: usize = 32;

/// The dot product by one fixed sequence of f32 operations: element `i` is
/// fused-multiply-added into partial sum `i % 32` (in index order), then the partial
/// sums are added in a fixed tree (16, 8, 4, 2, 1 apart). The partial sums are
/// independent, so the loop vectorizes; the result is the same bits on every CPU
/// (without hardware FMA, `f32::mul_add` is the correctly rounded libm `fmaf`).
/// Compiled for `isa` (the same bits every way).
pub fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: detection found avx2 and fma (the token's `avx2` bit means both).
        return unsafe { dot_fma(a, b) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    dot_lanes(a, b)
}

/// [`dot`] without the hardware path: the same bits, computed with the correctly
/// rounded software `fmaf` where the build target lacks FMA (tests compare the two).
pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_fma(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0f32; DOT_LANES];
    let (a_main, a_tail) = a[..n].split_at(n - n % DOT_LANES);
    let (b_main, b_tail) = b[..n].split_at(n - n % DOT_LANES);
    for (ac, bc) in a_main
        .chunks_exact(DOT_LANES)
        .zip(b_main.chunks_exact(DOT_LANES))
    {
        for j in 0..DOT_LANES {
            acc[j] = ac[j].mul_add(bc[j], acc[j]);
        }
    }
    for (j, (&x, &y)) in a_tail.iter().zip(b_tail).enumerate() {
        acc[j] = x.mul_add(y, acc[j]);
    }
    let mut width = DOT_LANES / 2;
    while width > 0 {
        for j in 0..width {
            acc[j] += acc[j + width];
        }
        width /= 2;
    }
    acc[0]
}

/// Softmax-weighted attention of one query over `len` keys/values
/// (`keys[t * dim ..]`, `values[t * dim ..]`), scores scaled by `scale`.
///
/// Scores are [`dot`]s; the weighted sum adds `fma(p_t, v_t, out)` over `t` in order.
/// The same bits on every CPU path (FMA in hardware or in software); compiled for `isa`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    isa: Isa,
    query: &[f32],
    keys: &[f32],
    values: &[f32],
    len: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: detection found avx2 and fma (the token's `avx2` bit means both).
        unsafe { attend_fma(query, keys, values, len, scale, scores, out) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    attend_body(query, keys, values, len, scale, scores, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_fma(
    query: &[f32],
    keys: &[f32],
    values: &[f32],
    len: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_body(query, keys, values, len, scale, scores, out)
}

#[inline(always)]
fn attend_body(
    query: &[f32],
    keys: &[f32],
    values: &[f32],
    len: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let dim = query.len();
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for t in 0..len {
        let s = dot_lanes(query, &keys[t * dim..(t + 1) * dim]) * scale;
        max = max.max(s);
        scores.push(s);
    }
    let mut total = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        total += *s;
    }
    out.fill(0.0);
    for (t, &p) in scores.iter().enumerate() {
        let v = &values[t * dim..(t + 1) * dim];
        let p = p / total;
        for (o, &vv) in out.iter_mut().zip(v) {
            *o = p.mul_add(vv, *o);
        }
    }
}

/// [`attend`] without the hardware path (tests compare the two).
pub fn attend_portable(
    query: &[f32],
    keys: &[f32],
    values: &[f32],
    len: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_body(query, keys, values, len, scale, scores, out)
}

/// Per-head RMSNorm (when `norm` is given) then rope, for rows of `heads` heads at
/// positions `p0..`; `cos`/`sin` are tables indexed `[position][head_dim / 2]`.
#[allow(clippy::too_many_arguments)]
pub fn norm_and_rope(
    rows: &mut [f32],
    heads: usize,
    head_dim: usize,
    norm: Option<&[f32]>,
    eps: f32,
    p0: usize,
    cos: &[f32],
    sin: &[f32],
) {
    let half = head_dim / 2;
    let width = heads * head_dim;
    let mut normed = vec![0f32; head_dim];
    for (i, row) in rows.chunks_exact_mut(width).enumerate() {
        let pos = p0 + i;
        for head in row.chunks_exact_mut(head_dim) {
            if let Some(g) = norm {
                rms_norm(head, g, eps, &mut normed);
                head.copy_from_slice(&normed);
            }
            rope_rotate_half(
                head,
                &cos[pos * half..(pos + 1) * half],
                &sin[pos * half..(pos + 1) * half],
            );
        }
    }
}
