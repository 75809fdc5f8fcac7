//! Helpers shared by the mtp integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use npu_runtime::{Family, Forward, TapSink, TargetConfig, TargetError};

/// The shape of the toy targets (one layer, two wide): only the vocabulary matters to
/// the loop.
pub fn toy_config(vocab_size: usize) -> Arc<TargetConfig> {
    Arc::new(TargetConfig {
        family: Family::Llama,
        vocab_size,
        hidden_size: 2,
        intermediate_size: 2,
        num_layers: 1,
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 2,
        rope_theta: 1.0,
        rms_eps: 1e-6,
        max_positions: 100_000,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_ids: vec![],
        chat_template: None,
        lm_head_requantized: false,
        variant: Default::default(),
    })
}

/// Two-sample chi-squared statistic over the cells either sample hit, and its degrees
/// of freedom (cells - 1).
pub fn chi2(a: &[f64], b: &[f64]) -> (f64, usize) {
    let (na, nb): (f64, f64) = (a.iter().sum(), b.iter().sum());
    let mut stat = 0.0;
    let mut cells = 0;
    for (&x, &y) in a.iter().zip(b) {
        if x + y == 0.0 {
            continue;
        }
        cells += 1;
        let ka = (nb / na).sqrt();
        let kb = (na / nb).sqrt();
        stat += (ka * x - kb * y).powi(2) / (x + y);
    }
    (stat, cells - 1)
}

/// A toy target whose logits depend on the position, the token and (when `period` is
/// set) the token `period` positions back: with `copy` weight it prefers to repeat it.
pub struct Toy {
    config: Arc<TargetConfig>,
    /// The positions run so far.
    pub tokens: Vec<u32>,
    /// The row count of every pass, in order.
    pub passes: Vec<usize>,
    period: usize,
    copy: f32,
    /// Simulated pass time, (base µs, µs a row): the adaptive loop sees costs that
    /// depend on the row count as a real target's do (well above sleep jitter).
    slow: Option<(u64, u64)>,
}

impl Toy {
    pub fn new(vocab: usize, period: usize, copy: f32) -> Toy {
        Toy {
            config: toy_config(vocab),
            tokens: Vec::new(),
            passes: Vec::new(),
            period,
            copy,
            slow: None,
        }
    }
    /// 2 ms a pass plus 0.5 ms a row.
    pub fn slow(self) -> Toy {
        self.slow_by(2000, 500)
    }
    pub fn slow_by(mut self, base_us: u64, per_row_us: u64) -> Toy {
        self.slow = Some((base_us, per_row_us));
        self
    }
    fn logits(&self, pos: usize) -> Vec<f32> {
        let vocab = self.config.vocab_size;
        let token = self.tokens[pos] as usize;
        let mut l: Vec<f32> = (0..vocab)
            .map(|v| (((pos * 7 + token * 5 + v * 3) % 11) as f32) * 0.35 - (v as f32) * 0.2)
            .collect();
        // The token that follows position pos - period + 1 ... repeated.
        if self.period > 0 && pos + 1 >= self.period {
            l[self.tokens[pos + 1 - self.period] as usize] += self.copy;
        }
        l
    }
}

impl Forward for Toy {
    fn config(&self) -> &TargetConfig {
        &self.config
    }
    fn position(&self) -> usize {
        self.tokens.len()
    }
    fn forward(&mut self, tokens: &[u32]) -> npu_runtime::Result<Vec<f32>> {
        self.passes.push(tokens.len());
        if let Some((base, per_row)) = self.slow {
            std::thread::sleep(std::time::Duration::from_micros(
                base + per_row * tokens.len() as u64,
            ));
        }
        let mut out = Vec::new();
        for &t in tokens {
            self.tokens.push(t);
            out.extend(self.logits(self.tokens.len() - 1));
        }
        Ok(out)
    }
    fn last_hidden(&self) -> &[f32] {
        &[]
    }
    fn truncate(&mut self, len: usize) -> npu_runtime::Result<()> {
        if len > self.tokens.len() {
            return Err(TargetError::TruncateBeyond {
                len,
                position: self.tokens.len(),
            });
        }
        self.tokens.truncate(len);
        Ok(())
    }
    fn set_layer_taps(&mut self, _: &[usize], _: TapSink) -> npu_runtime::Result<()> {
        Ok(())
    }
    fn clear_layer_taps(&mut self) {}
    fn embed(&self, _: &[u32]) -> npu_runtime::Result<Vec<f32>> {
        Ok(Vec::new())
    }
    fn lm_head(&self, _: &[f32], _: usize) -> Vec<f32> {
        Vec::new()
    }
}
