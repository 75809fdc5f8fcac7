//! onebit's CPU arithmetic, organised by family: each family is a contract about bits,
//! defined by a scalar reference, with x86 variants that must equal it bit for bit.
//!
//! | family | module | reference | variants |
//! |---|---|---|---|
//! | q4 tiles × f32 activations | [`mod@matmul`] | [`matmul::reference_dot`] | scalar, AVX2, AVX-512, AVX-512 VBMI |
//! | q4 × int8 activations, int8 head | [`q8`] | [`mod@q8::reference`] | scalar, AVX2, AVX-VNNI, AVX-512 VNNI |
//! | dense BF16 × f32 (tied head, DFlash fusion) | [`dense`] | [`dense::reference_dot`] | scalar, AVX2, AVX-512 |
//! | causal GQA attention over the KV layout ([`kv`]) | [`attention`] | [`mod@attention::reference`] + [`attention::combine`] | scalar, AVX2, AVX-512 |
//! | element-wise, `dot`, the draft's `attend` | [`elementwise`] | the portable functions | hardware or software FMA |
//!
//! Every kernel computes each output element by one fixed sequence of operations that
//! does not depend on the other rows of the batch. That is **batch invariance**: a
//! verify pass over n rows gives each row the bits a single-row pass gives it, which is
//! what lets speculative decoding produce exactly the text of plain decoding.
//!
//! Variants are chosen by an [`Isa`] token, which only run-time CPU detection can build
//! (its fields are private), so no safe call can run an instruction the CPU lacks.
//! Parallel loops run on the caller's rayon pool.
#![warn(missing_docs)]

pub mod attention;
pub mod dense;
pub mod elementwise;
pub mod isa;
pub mod kv;
pub mod matmul;
pub mod q8;
pub mod team;

pub use elementwise::*;

/// Scratch laid out `[output row][input row]` (what the row-block tasks write) into
/// `y[input row · rows + output row]`, for the first `rows` output rows (padding rows of
/// the scratch are skipped). Every family's matmul ends with it.
pub(crate) fn transpose_into(scratch: &[f32], n: usize, rows: usize, y: &mut [f32]) {
    for (r, values) in scratch.chunks_exact(n).enumerate().take(rows) {
        for (i, &v) in values.iter().enumerate() {
            y[i * rows + r] = v;
        }
    }
}
pub use isa::Isa;
pub use matmul::matmul;
