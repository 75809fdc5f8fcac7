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
//! Parallel loops run on the caller's rayon pool. Packed weights live in
//! [`pages::WeightBytes`], huge pages where the OS hands them out on request: a pass
//! streams every weight byte, and 4 KiB pages would cost it a page walk per page.
#![warn(missing_docs)]

pub mod attention;
pub mod dense;
pub mod elementwise;
pub mod isa;
pub mod kv;
pub mod matmul;
pub mod pages;
pub mod q8;
pub mod team;

pub use elementwise::*;

/// Asks for the `bytes` at `p` into the caches, whole 64-byte lines (the last one covers
/// a partial tail). The q8 kernels ask for the weights a few groups ahead, the AVX-512
/// attention kernel for the next key block. A prefetch reads nothing and never faults,
/// whatever the address, so `p` may point past its buffer.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_bytes(p: *const u8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for line in 0..bytes.div_ceil(64) {
        // SAFETY: SSE is part of the x86-64 baseline; a prefetch never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line) as *const i8) };
    }
}

/// `y[i · rows + r]` for `n` input rows by tasks that each compute one block of `block`
/// output rows into a block-local scratch laid out `[output row][input row]` (what the
/// f32 and BF16 families' kernels write): each task then copies its block's columns into
/// `y` itself (parallel, through [`team::ColumnBlock`]), so no pass allocates a scratch
/// of the whole output or transposes it on one thread. The scratch is zeroed for each
/// block (kernels may accumulate into it) and is one per thread, reused.
pub(crate) fn blocks_through_scratch(
    y: &mut [f32],
    rows: usize,
    n: usize,
    block: usize,
    kernel: impl Fn(usize, &mut [f32]) + Sync,
) {
    use std::cell::RefCell;
    thread_local! {
        static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    }
    assert_eq!(y.len(), rows * n, "kernels: output is not {n} × {rows}");
    if n == 0 || rows == 0 {
        return;
    }
    team::for_each_column_block(y, rows, block, |b, mut out| {
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            scratch.clear();
            scratch.resize(block * n, 0.0);
            kernel(b, &mut scratch);
            for i in 0..n {
                let row = out.row_mut(i);
                for (r, v) in row.iter_mut().enumerate() {
                    *v = scratch[r * n + i];
                }
            }
        })
    });
}
pub use isa::Isa;
pub use matmul::matmul;

#[cfg(test)]
mod tests {
    #[test]
    #[should_panic(expected = "kernels: output is not 2 × 3")]
    fn blocks_through_scratch_refuses_an_output_of_another_size() {
        super::blocks_through_scratch(&mut [0f32; 5], 3, 2, 32, |_, _| {});
    }
}
