//! `y = x · Wᵀ` for a dense BF16 W (`rows × k`, row-major): the tied LM head read
//! straight from the BF16 embedding.
//!
//! The arithmetic per output element is fixed: sixteen lane sums, lane `j` adding
//! `fma(w[c], x[c], acc_j)` for `c = j, j + 16, ...` in order, then the tree
//! `j + j⊕8`, `+ j⊕4`, `+ j⊕2`, `+ j⊕1`. The AVX-512 kernel performs exactly those
//! operations, so it equals the scalar one bit for bit, and every row is computed the
//! same way whatever the batch size (batch invariance).
//!
//! Layout, as every kernel family: `reference.rs` holds the defining scalar code,
//! `x86.rs` the AVX2 and AVX-512 variants, and this file the dispatch from an [`Isa`]
//! token.

mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::isa::Isa;
pub use reference::reference_dot;
use reference::{scalar_block_column, LANES};
#[cfg(target_arch = "x86_64")]
use x86::{avx2, avx2_block_columns, avx512, avx512_block_columns};

/// The name of the variant this family runs under `isa` (for reports).
pub fn variant_name(isa: Isa) -> &'static str {
    if isa.avx512() {
        "avx512"
    } else if isa.avx2() {
        "avx2"
    } else {
        "scalar"
    }
}

/// `y[i * rows + r] = Σ_c W[r][c] · x[i * k + c]`.
///
/// # Panics
/// If `k` is not a multiple of 16 or the slices do not match.
pub fn matmul_bf16(w: &[u8], rows: usize, k: usize, x: &[f32], n: usize, y: &mut [f32], isa: Isa) {
    assert_eq!(k % LANES, 0, "K must be a multiple of 16");
    assert_eq!(w.len(), rows * k * 2);
    assert_eq!(x.len(), n * k);
    assert_eq!(y.len(), n * rows);
    const BLOCK: usize = 64;
    crate::blocks_through_scratch(y, rows, n, BLOCK, |b, out| {
        let first = b * BLOCK;
        let count = BLOCK.min(rows.saturating_sub(first));
        #[cfg(target_arch = "x86_64")]
        if isa.avx512() {
            // SAFETY: the token's avx512 flag is set only by run-time detection.
            unsafe { avx512::block(w, first, count, k, x, n, out) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // SAFETY: the token's avx2 flag (avx2 + fma) is set only by detection.
            unsafe { avx2::block(w, first, count, k, x, n, out) };
            return;
        }
        for r in 0..count {
            let row = first + r;
            let wr = &w[row * k * 2..(row + 1) * k * 2];
            for i in 0..n {
                out[r * n + i] = reference_dot(wr, &x[i * k..(i + 1) * k]);
            }
        }
    });
}

/// `y = x · Wᵀ` for a BF16 W stored in block-column order `[rows/32][k][32]`
/// (element `[b][c][r]` is `W[b*32 + r][c]`): the DFlash fusion matrix's layout.
///
/// Per output element: `acc = Σ_c fma(W[r][c], x[c], acc)` in column order, so every
/// row is computed the same way whatever the batch (batch invariance).
pub fn matmul_bf16_block_columns(
    w: &[u8],
    rows: usize,
    k: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    isa: Isa,
) {
    assert_eq!(rows % 32, 0, "rows must be a multiple of 32");
    assert_eq!(w.len(), rows * k * 2);
    assert_eq!(x.len(), n * k);
    assert_eq!(y.len(), n * rows);
    crate::blocks_through_scratch(y, rows, n, 32, |b, out| {
        let block = &w[b * k * 64..(b + 1) * k * 64];
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // Up to 8 inputs per sweep of the block: each column is widened once
            // and feeds independent accumulator chains.
            let mut i = 0;
            while i < n {
                // SAFETY: the token's avx512 / avx2 flags are set only by detection.
                let step = unsafe {
                    match (isa.avx512(), n - i) {
                        (true, 8..) => avx512_block_columns::<8>(block, x, k, i, n, out),
                        (true, 4..=7) => avx512_block_columns::<4>(block, x, k, i, n, out),
                        (true, 2 | 3) => avx512_block_columns::<2>(block, x, k, i, n, out),
                        (true, _) => avx512_block_columns::<1>(block, x, k, i, n, out),
                        (false, 4..) => avx2_block_columns::<4>(block, x, k, i, n, out),
                        (false, 2 | 3) => avx2_block_columns::<2>(block, x, k, i, n, out),
                        (false, _) => avx2_block_columns::<1>(block, x, k, i, n, out),
                    }
                };
                i += step;
            }
            return;
        }
        for i in 0..n {
            let acc = scalar_block_column(block, &x[i * k..(i + 1) * k]);
            for (r, &a) in acc.iter().enumerate() {
                out[r * n + i] = a;
            }
        }
    });
}
