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
//! use npu_runtime::{CpuModel, CpuOptions, Forward, TargetPackage};
//! use std::sync::Arc;
//!
//! let package = Arc::new(TargetPackage::open("target/models/smollm2")?);
//! let model = CpuModel::load(package, CpuOptions::default())?; // shared, read-only
//! let mut target = model.session(); // one sequence's KV cache
//! let mut other = model.session(); // another, over the same weights and team
//! let logits = target.forward(&[1, 9690, 28])?; // 3 rows of vocab logits
//! target.truncate(2)?; // forget the last position
//! # Ok::<(), npu_runtime::TargetError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cpu;
mod error;
mod forward;
pub use onebit_kernels as kernels;
mod model;
pub mod npu;
pub mod profile;

pub use cpu::{
    BatchStats, CpuModel, CpuOptions, CpuTarget, Membership, PassBatcher, DEFAULT_LINGER,
};
pub use error::{Result, TargetError};
pub use forward::{Forward, TapRows, TapSink};
pub use kernels::kv::KvType;
pub use model::{
    Activation, ArchVariant, Family, HeadKind, LayerWeights, Precision, TargetConfig,
    TargetPackage, TargetWeights, SCREEN_CANDIDATES,
};

/// Index of the largest number (the first one on ties; NaN is never the largest), or 0
/// when there is none (an empty or all-NaN slice): greedy decoding's pick, the same
/// rule as a drafter's ([`kernels::elementwise::first_max`], vectorized for this CPU;
/// every ISA gives the same index, tested in `onebit-kernels`).
pub fn argmax(values: &[f32]) -> usize {
    kernels::elementwise::first_max(kernels::isa::Isa::detect(), values)
}

/// Entry points the fuzzer (`cargo xtask fuzz`) and the property tests share: the
/// parsers of files a user points onebit at, fed arbitrary bytes.
pub mod fuzzing {
    use std::path::Path;

    /// Parses `bytes` as a kernel manifest at `dir/kernels.json` (whose folder holds
    /// the files it may name). Returns whether it was accepted; never panics.
    pub fn exercise_manifest(dir: &Path, bytes: &[u8]) -> bool {
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(bytes) else {
            return false;
        };
        match crate::npu::KernelManifest::from_json(&dir.join("kernels.json"), &json) {
            Ok(m) => {
                for entry in m.kernels.values() {
                    assert!(
                        entry.xclbin.starts_with(dir),
                        "a path left the manifest's folder"
                    );
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Parses `bytes` as an instruction stream both ways; never panics.
    pub fn exercise_instructions(bytes: &[u8]) -> bool {
        let binary = crate::npu::manifest::parse_instructions(bytes, true, "fuzz");
        let text = crate::npu::manifest::parse_instructions(bytes, false, "fuzz");
        if let Ok(words) = &binary {
            assert_eq!(words.len() * 4, bytes.len());
        }
        binary.is_ok() || text.is_ok()
    }
}
