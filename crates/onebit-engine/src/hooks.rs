//! Draft hooks over the target's model: the embedding and head a session of it uses
//! (the shared [`CpuModel`], not the running target, which the loop holds mutably).
//! They live here, not in `mtp`, so the speculative loop names no backend type.

use dflash_draft::DraftHooks;
use npu_runtime::{CpuModel, CpuOptions, HeadKind, TargetPackage};
use std::sync::Arc;

/// Embeds with the target model's embedding and picks `argmax(head(hidden))` with the
/// target's head (at `f32` the weights the target's own passes read; at the integer
/// precisions the package's q4 lm_head tiles over one int8 level of activations, see
/// [`CpuModel::proposal_logits`]), on the target model's team.
pub struct PackageHooks {
    model: Arc<CpuModel>,
}

impl PackageHooks {
    /// Hooks over a CPU target's shared model (what `CpuTarget::model` returns); its
    /// proposal head is built now, not in the first round.
    pub fn for_model(model: Arc<CpuModel>) -> PackageHooks {
        model.prepare_proposals();
        PackageHooks { model }
    }

    /// Hooks for a target on another backend: a CPU model of `package` at `f32` with
    /// `head` (the arithmetic the simulated and real NPU backends mirror).
    pub fn new(package: &Arc<TargetPackage>, head: HeadKind) -> npu_runtime::Result<PackageHooks> {
        let options = CpuOptions {
            head: Some(head),
            ..CpuOptions::default()
        };
        Ok(PackageHooks::for_model(CpuModel::load(
            package.clone(),
            options,
        )?))
    }

    /// Logits of `n` final-normed rows.
    pub fn logits(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        self.model.logits(hidden, n)
    }
}

impl DraftHooks for PackageHooks {
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        // The draft embeds its mask token beside committed ids; the draft package's
        // check ties `mask_token_id` to the target's vocabulary, so no id here is out of
        // range, and one that were would read the last row rather than stop a round.
        let vocab = self.model.config().vocab_size as u32;
        let ids: Vec<u32> = tokens.iter().map(|&t| t.min(vocab - 1)).collect();
        self.model
            .embed(&ids)
            .expect("ids clamped to the vocabulary embed")
    }

    /// `argmax` of the head's proposal logits ([`CpuModel::proposal_picks`]: the q4
    /// tiles over one int8 level at the integer precisions): the picks only steer
    /// proposals, verification decides.
    fn pick(&self, hidden: &[f32], n: usize) -> Vec<u32> {
        self.model.proposal_picks(hidden, n)
    }

    /// The proposal logits the picks come from ([`CpuModel::proposal_logits`]): what a
    /// DFlash 2 draft's selector rescores.
    fn logits(&self, hidden: &[f32], n: usize) -> Option<Vec<f32>> {
        Some(self.model.proposal_logits(hidden, n))
    }

    /// The round runs on the target model's thread team.
    fn install(&self, f: &mut dyn FnMut()) {
        self.model.install(f)
    }
}
