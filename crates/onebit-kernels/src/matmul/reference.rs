//! The defining arithmetic of the q4 × f32 family: [`reference_dot`] (one element by
//! the sequence of operations every variant performs) and the scalar variant, which
//! performs it block by block.

use half::bf16;
use q4nx_format::{
    Q4Kind, Q4Matrix, GROUP_COLS, MIN_OFFSET, NIBBLE_OFFSET, TILE_BYTES, TILE_COLS, TILE_ROWS,
};

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

/// One 32-row block for all inputs, scalar. `out[r * n + i]`.
pub(super) fn block_scalar(
    w: &Q4Matrix,
    rb: usize,
    x: &[f32],
    n: usize,
    sums: &[f32],
    out: &mut [f32],
) {
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
