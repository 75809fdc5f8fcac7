//! Draft hooks over a target package: the target's own embedding and head, read from
//! the package (not from the running target, which the loop holds mutably).

use dflash_draft::DraftHooks;
use npu_runtime::{argmax, HeadKind, TargetPackage, TargetWeights};
use onebit_kernels::{dense, matmul, Isa};

/// Embeds with the package's BF16 embedding and picks `argmax(head(hidden))`.
pub struct PackageHooks<'p> {
    weights: TargetWeights<'p>,
    vocab: usize,
    hidden: usize,
    head: HeadKind,
    kernel: Isa,
}

impl<'p> PackageHooks<'p> {
    /// Hooks over `package` with the head the CPU target would use.
    pub fn new(
        package: &'p TargetPackage,
        head: HeadKind,
    ) -> npu_runtime::Result<PackageHooks<'p>> {
        Ok(PackageHooks {
            weights: package.weights()?,
            vocab: package.config.vocab_size,
            hidden: package.config.hidden_size,
            head,
            kernel: Isa::detect(),
        })
    }

    /// Logits of `n` final-normed rows.
    pub fn logits(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * self.vocab];
        match self.head {
            HeadKind::Tiles => matmul(&self.weights.lm_head, hidden, n, &mut y, self.kernel),
            // The draft's picks only steer proposals (verification decides the text), so
            // the int8 head's drafts are scored with the BF16 embedding it was made from.
            HeadKind::Embedding | HeadKind::EmbeddingInt8 => dense::matmul_bf16(
                self.weights.embed.bytes,
                self.vocab,
                self.hidden,
                hidden,
                n,
                &mut y,
                self.kernel,
            ),
        }
        y
    }
}

impl DraftHooks for PackageHooks<'_> {
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        let h = self.hidden;
        let bytes = self.weights.embed.bytes;
        tokens
            .iter()
            .flat_map(|&t| {
                let t = (t as usize).min(self.vocab - 1);
                bytes[t * h * 2..(t + 1) * h * 2]
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            })
            .collect()
    }

    fn pick(&self, hidden: &[f32], n: usize) -> Vec<u32> {
        let logits = self.logits(hidden, n);
        (0..n)
            .map(|i| argmax(&logits[i * self.vocab..(i + 1) * self.vocab]) as u32)
            .collect()
    }
}
