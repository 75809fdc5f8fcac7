//! The scalar definition of the `q8` family's bits: one output element at a time, by
//! the sequence of operations in the family's documentation. Every SIMD variant is
//! tested equal to these functions.

use super::{bf16_at, I8Matrix, Out, PackedQ4, QuantizedRows, BLOCK_ROWS, GROUP, I8_BLOCK_ROWS};

/// The 4-bit code of stacked row `r` of block `b`, column `c` of group `g`.
fn q4_code(w: &PackedQ4, b: usize, r: usize, g: usize, c: usize) -> i32 {
    let bytes = w.group_bytes(b, g);
    let (h, j) = (r / 16, r % 16);
    let (q, t, high) = (c / 8, c % 4, c % 8 >= 4);
    let byte = bytes[(4 * h + q) * 64 + 4 * j + t];
    (if high { byte >> 4 } else { byte & 0x0f }) as i32
}

/// The exact integer sum of group `g` for input row `i` over its levels:
/// `Σ_l 128^(L-1-l) · Σ_c weight(c) · code[L·i + l][c]`.
fn level_sum(x: &QuantizedRows, i: usize, g: usize, weight: impl Fn(usize) -> i32) -> i32 {
    let count = x.levels().count();
    let mut isum = 0i32;
    for level in 0..count {
        let codes = &x.codes(count * i + level)[g * GROUP..(g + 1) * GROUP];
        let mut part = 0i32;
        for (c, &q) in codes.iter().enumerate() {
            part += weight(c) * q as i32;
        }
        isum = isum * 128 + part;
    }
    isum
}

/// Output of stacked row `r` (block `r / 32`) for input row `i`.
pub fn dot_q4(w: &PackedQ4, r: usize, x: &QuantizedRows, i: usize) -> f32 {
    let (b, rr) = (r / BLOCK_ROWS, r % BLOCK_ROWS);
    let first = x.levels().count() * i;
    let mut y = 0f32;
    for g in 0..w.cols() / GROUP {
        let isum = level_sum(x, i, g, |c| q4_code(w, b, rr, g, c));
        let bytes = w.group_bytes(b, g);
        let d = bf16_at(bytes, 512 + 2 * rr);
        let m = bf16_at(bytes, 576 + 2 * rr);
        let scale = d * x.scale(first, g);
        y += m.mul_add(x.sum(first, g), scale * isum as f32);
    }
    y
}

/// Output of row `r` of the int8 matrix for input row `i`.
pub fn dot_i8(w: &I8Matrix, r: usize, x: &QuantizedRows, i: usize) -> f32 {
    let (b, j) = (r / I8_BLOCK_ROWS, r % I8_BLOCK_ROWS);
    let first = x.levels().count() * i;
    let mut y = 0f32;
    for g in 0..w.cols() / GROUP {
        let bytes = w.group_bytes(b, g);
        let isum = level_sum(x, i, g, |c| {
            bytes[(c / 4) * 64 + 4 * j + c % 4] as i8 as i32
        });
        let dw = f32::from_le_bytes(bytes[512 + 4 * j..512 + 4 * j + 4].try_into().unwrap());
        let scale = dw * x.scale(first, g);
        y = scale.mul_add(isum as f32, y);
    }
    y
}

/// One 32-row block for every input row: row `i`'s outputs in the share's row `i`.
pub(super) fn block_q4(w: &PackedQ4, b: usize, x: &QuantizedRows, out: &mut Out<'_>) {
    for i in 0..x.rows() {
        let row = out.row_mut(i);
        for (r, y) in row.iter_mut().enumerate().take(BLOCK_ROWS) {
            *y = dot_q4(w, b * BLOCK_ROWS + r, x, i);
        }
    }
}

/// One 16-row block for every input row (rows past the matrix's end, where the block's
/// share ends, are not written).
pub(super) fn block_i8(w: &I8Matrix, b: usize, x: &QuantizedRows, out: &mut Out<'_>) {
    for i in 0..x.rows() {
        let row = out.row_mut(i);
        for (j, y) in row.iter_mut().enumerate().take(I8_BLOCK_ROWS) {
            *y = dot_i8(w, b * I8_BLOCK_ROWS + j, x, i);
        }
    }
}

/// Input row `i`'s logits from the screened head ([`super::matmul_screened`]), by its
/// definition: every row's q4 output at one level (`x_screen`), the `m` largest of them
/// chosen by sorting (value descending, NaN as -inf, ties to the lower index), and
/// those rows' int8 outputs at `x`'s levels in their place.
pub fn screened_row(
    tiles: &PackedQ4,
    int8: &I8Matrix,
    x_screen: &QuantizedRows,
    x: &QuantizedRows,
    i: usize,
    m: usize,
) -> Vec<f32> {
    let screen: Vec<f32> = (0..int8.rows())
        .map(|r| dot_q4(tiles, r, x_screen, i))
        .collect();
    let rank = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let mut order: Vec<usize> = (0..screen.len()).collect();
    order.sort_by(|&a, &b| {
        rank(screen[b])
            .partial_cmp(&rank(screen[a]))
            .expect("no NaN after ranking")
            .then(a.cmp(&b))
    });
    let mut y = screen;
    for &r in order.iter().take(m) {
        y[r] = dot_i8(int8, r, x, i);
    }
    y
}
