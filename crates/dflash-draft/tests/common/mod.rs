//! What the reference tests (DFlash 1 and DFlash 2) share: the shared fixtures' path,
//! the largest absolute difference, and draft hooks over a CPU target.

#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;

use dflash_draft::DraftHooks;
use npu_runtime::{argmax, CpuTarget, Forward};

/// `../shared/fixtures/NAME`, beside this checkout.
pub fn shared_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

/// The largest `|a[i] - b[i]|` (the lengths must match).
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The target's embedding, argmax pick and head logits as a draft's hooks.
pub struct TargetHooks<'t>(pub &'t CpuTarget);

impl DraftHooks for TargetHooks<'_> {
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        self.0.embed(tokens).unwrap()
    }
    fn pick(&self, hidden: &[f32], n: usize) -> Vec<u32> {
        let vocab = self.0.config().vocab_size;
        let logits = self.0.lm_head(hidden, n);
        (0..n)
            .map(|i| argmax(&logits[i * vocab..(i + 1) * vocab]) as u32)
            .collect()
    }
    fn logits(&self, hidden: &[f32], n: usize) -> Option<Vec<f32>> {
        Some(self.0.lm_head(hidden, n))
    }
}
