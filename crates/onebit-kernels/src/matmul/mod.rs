//! `y = x · Wᵀ` for a q4_1-tiled W, straight from the tile bytes.
//!
//! The arithmetic is defined by [`reference_dot`]: per output element, per 32-column
//! group `g`, `acc = Σ_c fma(q[c], x[c], acc)` in column order, then
//! `t = fma(m_g, Σx_g, d_g · acc)` and `y += t`, groups in column order. Every kernel
//! evaluates exactly that sequence of f32 operations for every element, whatever the
//! batch size and whichever rows share a task, so:
//! - the AVX-512 kernel equals the scalar one bit for bit (tested);
//! - a batched pass equals single-row passes bit for bit (batch invariance), which is
//!   what makes speculative decoding's text equal plain decoding's.
//!
//! Work is split over 32-row blocks of W (rayon); each task streams its tiles once for
//! all input rows, so an n-row pass reads the weights once. Columns past K (the
//! tile's zero padding) are never read.
//!
//! Layout, as every kernel family: `reference.rs` holds the defining scalar code
//! ([`reference_dot`], and the scalar variant built from the same operations), `x86.rs`
//! the AVX2 and AVX-512 variants, and this file the one dispatch from an [`Isa`] token.

mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use q4nx_format::{Q4Kind, Q4Matrix, GROUP_COLS, TILE_ROWS};

use crate::isa::Isa;
use reference::block_scalar;
pub use reference::reference_dot;
#[cfg(target_arch = "x86_64")]
use x86::{avx2, avx512};

/// The variants of this family; [`variant`] picks one from an [`Isa`] token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// Portable scalar code (`f32::mul_add`); the definition of the arithmetic.
    Scalar,
    /// x86-64 AVX2 + FMA, 8 rows per vector.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86-64 AVX-512F, 16 rows per vector.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX-512F with VBMI: the q4 codes widened by byte and table permutes (fewer
    /// instructions per weight); the same bits as `Avx512`.
    #[cfg(target_arch = "x86_64")]
    Avx512Vbmi,
}

fn variant(isa: Isa) -> Variant {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512_vbmi() {
            return Variant::Avx512Vbmi;
        }
        if isa.avx512() {
            return Variant::Avx512;
        }
        if isa.avx2() {
            return Variant::Avx2;
        }
    }
    let _ = isa;
    Variant::Scalar
}

/// The name of the variant [`matmul`] runs under `isa` (for reports).
pub fn variant_name(isa: Isa) -> &'static str {
    match variant(isa) {
        Variant::Scalar => "scalar",
        #[cfg(target_arch = "x86_64")]
        Variant::Avx2 => "avx2",
        #[cfg(target_arch = "x86_64")]
        Variant::Avx512 => "avx512",
        #[cfg(target_arch = "x86_64")]
        Variant::Avx512Vbmi => "avx512vbmi",
    }
}

/// Per-group sums of each input row: `sums[i * groups + g] = Σ_{c in g} x[i][c]`,
/// added in column order.
pub fn group_sums(x: &[f32], n: usize, k: usize) -> Vec<f32> {
    let groups = k / GROUP_COLS;
    let mut out = vec![0f32; n * groups];
    for i in 0..n {
        for g in 0..groups {
            let mut s = 0f32;
            for &v in &x[i * k + g * GROUP_COLS..i * k + (g + 1) * GROUP_COLS] {
                s += v;
            }
            out[i * groups + g] = s;
        }
    }
    out
}

/// `y[i * N + r] = Σ_k W[r][k] · x[i * K + k]` for `n` input rows.
///
/// # Panics
/// If K is not a multiple of 32 or the slices do not match `n`, N and K.
pub fn matmul(w: &Q4Matrix, x: &[f32], n: usize, y: &mut [f32], isa: Isa) {
    let (rows, k) = (w.rows(), w.cols());
    assert_eq!(k % GROUP_COLS, 0, "K must be a multiple of 32");
    assert_eq!(x.len(), n * k);
    assert_eq!(y.len(), n * rows);
    if n == 0 {
        return;
    }
    let sums = group_sums(x, n, k);
    let kernel = if w.kind() == Q4Kind::Q4_0 {
        Variant::Scalar
    } else {
        variant(isa)
    };
    // Each 32-row block's task computes `[32 rows][n inputs]` into its scratch.
    crate::blocks_through_scratch(y, rows, n, TILE_ROWS, |rb, out| match kernel {
        Variant::Scalar => block_scalar(w, rb, x, n, &sums, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the variant comes from an `Isa` token, which only detection of
        // avx512f (and avx512vbmi for the VBMI variant) can set.
        Variant::Avx512 => unsafe { avx512::block(w, rb, x, n, &sums, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Variant::Avx512Vbmi => unsafe { avx512::block_vbmi(w, rb, x, n, &sums, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, avx2 and fma detected.
        Variant::Avx2 => unsafe { avx2::block(w, rb, x, n, &sums, out) },
    });
}
