//! CPU kernels. Each one is deterministic per output element: the same inputs give the
//! same bits whatever the batch size, which the batch-invariance tests rely on.

pub mod matmul;

pub use matmul::{matmul, Kernel};

/// `out = x / sqrt(mean(x²) + eps) * gain`, one row at a time, sums in index order.
pub fn rms_norm(x: &[f32], gain: &[f32], eps: f32, out: &mut [f32]) {
    let width = gain.len();
    for (row, dst) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let mut ss = 0f32;
        for &v in row {
            ss += v * v;
        }
        let inv = 1.0 / (ss / width as f32 + eps).sqrt();
        for ((o, &v), &g) in dst.iter_mut().zip(row).zip(gain) {
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

/// SiLU(gate) * up, in place into `gate`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let s = *g / (1.0 + (-*g).exp());
        *g = s * u;
    }
}

/// Softmax-weighted attention of one query over `len` keys/values
/// (`keys[t * dim ..]`, `values[t * dim ..]`), scores scaled by `scale`.
pub fn attend(
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
        let k = &keys[t * dim..(t + 1) * dim];
        let mut s = 0f32;
        for (a, b) in query.iter().zip(k) {
            s += a * b;
        }
        let s = s * scale;
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
            *o += p * vv;
        }
    }
}

pub mod dense;

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
