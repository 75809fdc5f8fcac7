//! # npu-runtime
//!
//! The target side of onebit: a Llama- or Qwen3-family model loaded from a Q4NX
//! package ([`TargetPackage`]), run by a backend behind the [`Forward`] trait, with
//! what speculative decoding needs: logits for every position of a batched pass,
//! `truncate` to roll the KV cache back to the committed positions, and layer taps
//! (`set_layer_taps`) that write one feature row per position a pass runs.
//!
//! The CPU backend ([`CpuTarget`]) is the default and the reference. Its kernels read
//! the q4_1 tiles directly (no dequantized copy of the model), stream every weight
//! once per pass whatever the batch size, and are **batch invariant**: a batched pass
//! gives, row for row, the same bits as single-token passes, so greedy speculative
//! text equals plain greedy text exactly.
//!
//! ```no_run
//! use npu_runtime::{CpuTarget, Forward, TargetPackage};
//!
//! let package = TargetPackage::open("target/models/smollm2")?;
//! let mut target = CpuTarget::new(&package)?;
//! let logits = target.forward(&[1, 9690, 28])?; // 3 rows of vocab logits
//! target.truncate(2)?; // forget the last position
//! # Ok::<(), npu_runtime::TargetError>(())
//! ```

mod cpu;
mod error;
mod forward;
pub mod kernels;
mod model;
pub mod npu;

pub use cpu::{CpuTarget, HeadKind};
pub use error::{Result, TargetError};
pub use forward::{Forward, TapRows, TapSink};
pub use model::{Family, LayerWeights, TargetConfig, TargetPackage, TargetWeights};

/// Index of the largest value (the first one on ties), or 0 for an empty slice.
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}
