//! The defining arithmetic of the BF16 × f32 family: [`reference_dot`] (sixteen lane
//! sums and a fixed tree) and the block-column form's scalar sums.

use half::bf16;

pub(super) const LANES: usize = 16;

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
pub(super) fn reduce_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] += acc[j + width];
        }
    }
    acc[0]
}

/// 32 outputs of one row block: `acc[r] = Σ_c fma(W[r][c], x[c], acc[r])`.
pub(super) fn scalar_block_column(block: &[u8], x: &[f32]) -> [f32; 32] {
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
