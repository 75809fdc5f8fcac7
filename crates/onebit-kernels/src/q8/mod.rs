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
mod pack;
mod quantize;
pub mod reference;
mod screen;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use pack::{I8Matrix, PackedQ4};
pub use quantize::{quantize_group, Levels, QuantizedRows, PARALLEL_VALUES};
pub use screen::{matmul_screened, top_rows};
// For the variants' `super::` imports.
use quantize::GroupStats;

use half::bf16;
use q4nx_format::{GROUP_COLS, TILE_ROWS};

use crate::isa::Isa;

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
/// A block task's share of a matmul's output: its block's columns of every input row
/// (what every variant's block function writes).
type Out<'a> = crate::team::ColumnBlock<'a, f32>;

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
            block_i8(
                kernel,
                w,
                b,
                x,
                &mut out.columns(j * I8_BLOCK_ROWS, (j + 1) * I8_BLOCK_ROWS),
            );
        }
    });
}

/// The int8 matrix's 16-row blocks `blocks` for every input row: `x.rows()` rows of
/// `blocks.len() · 16` values, block `blocks[t]`'s outputs at `16t..16t + 16` (rows past
/// the matrix's end are 0). Each value is the one [`matmul_i8`] gives, bit for bit.
///
/// # Panics
/// If `x`'s K differs from the weights' or a block is past the matrix's end.
pub fn matmul_i8_blocks(w: &I8Matrix, x: &QuantizedRows, blocks: &[usize], isa: Isa) -> Vec<f32> {
    assert_eq!(x.cols(), w.cols(), "q8: input K differs from the weights'");
    let count = w.rows().div_ceil(I8_BLOCK_ROWS);
    if let Some(&b) = blocks.iter().find(|&&b| b >= count) {
        panic!("q8: block {b} is past the int8 matrix's {count} blocks");
    }
    let width = blocks.len() * I8_BLOCK_ROWS;
    let mut y = vec![0f32; x.rows() * width];
    if x.rows() == 0 || blocks.is_empty() {
        return y;
    }
    let kernel = variant(isa);
    crate::team::for_each_column_block(&mut y, width, I8_BLOCK_ROWS, |t, mut out| {
        block_i8(kernel, w, blocks[t], x, &mut out)
    });
    y
}

/// Block `b` of the int8 matrix for every input row, by `kernel`.
fn block_i8(kernel: Variant, w: &I8Matrix, b: usize, x: &QuantizedRows, out: &mut Out<'_>) {
    match kernel {
        Variant::Scalar => reference::block_i8(w, b, x, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the variant comes from an `Isa` token, set only by detection.
        Variant::Avx2 => unsafe { x86::block_i8_avx2(w, b, x, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Variant::AvxVnni => unsafe { x86::block_i8_avxvnni(w, b, x, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Variant::Avx512Vnni => unsafe { x86::block_i8_avx512vnni(w, b, x, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above (AMX implies AVX-512 VNNI): few rows.
        Variant::Amx => unsafe { x86::block_i8_avx512vnni(w, b, x, out) },
    }
}

#[inline]
pub(crate) fn bf16_at(bytes: &[u8], at: usize) -> f32 {
    bf16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}
