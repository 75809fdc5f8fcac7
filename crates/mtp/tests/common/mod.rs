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
        toy_logits(
            self.config.vocab_size,
            self.period,
            self.copy,
            &self.tokens,
            pos,
        )
    }
}

/// The logits a [`Toy`] of these parameters gives at `pos` of the stream `tokens`
/// (the analytic side of the distribution tests).
pub fn toy_logits(vocab: usize, period: usize, copy: f32, tokens: &[u32], pos: usize) -> Vec<f32> {
    let token = tokens[pos] as usize;
    let mut l: Vec<f32> = (0..vocab)
        .map(|v| (((pos * 7 + token * 5 + v * 3) % 11) as f32) * 0.35 - (v as f32) * 0.2)
        .collect();
    // The token that follows position pos - period + 1 ... repeated.
    if period > 0 && pos + 1 >= period {
        l[tokens[pos + 1 - period] as usize] += copy;
    }
    l
}

/// The sampling chain of `mtp::sample`, written again in f64 from its documentation
/// (an independent reference): penalties given the context (`prompt` for the repeat
/// window, `generated` for it and the counts), then greedy, or top-k, top-p at
/// temperature 1, min-p, and the softmax at the temperature. Ties: lower id first.
pub fn reference_distribution(
    logits: &[f32],
    c: &mtp::SamplingConfig,
    prompt: &[u32],
    generated: &[u32],
) -> Vec<f64> {
    let mut l: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
    let context: Vec<u32> = prompt.iter().chain(generated).copied().collect();
    let window = &context[context.len().saturating_sub(c.repeat_last_n)..];
    let r = c.repeat_penalty as f64;
    for t in 0..l.len() as u32 {
        if c.repeat_last_n > 0 && window.contains(&t) {
            let v = &mut l[t as usize];
            *v = if *v > 0.0 { *v / r } else { *v * r };
        }
        let n = generated.iter().filter(|&&g| g == t).count() as f64;
        if n > 0.0 {
            l[t as usize] -= c.frequency_penalty as f64 * n + c.presence_penalty as f64;
        }
    }
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
    let mut p = vec![0.0; l.len()];
    if c.temperature <= 0.0 {
        p[order[0]] = 1.0;
        return p;
    }
    if c.top_k > 0 {
        order.truncate(c.top_k);
    }
    let max = l[order[0]];
    if c.top_p < 1.0 {
        let total: f64 = order.iter().map(|&i| (l[i] - max).exp()).sum();
        let mut mass = 0.0;
        let mut keep = order.len();
        for (rank, &i) in order.iter().enumerate() {
            mass += (l[i] - max).exp() / total;
            if mass >= c.top_p as f64 - 1e-7 {
                keep = rank + 1;
                break;
            }
        }
        order.truncate(keep);
    }
    if c.min_p > 0.0 {
        order.retain(|&i| (l[i] - max).exp() >= c.min_p as f64 - 1e-9);
    }
    let t = c.temperature as f64;
    let total: f64 = order.iter().map(|&i| ((l[i] - max) / t).exp()).sum();
    for &i in &order {
        p[i] = ((l[i] - max) / t).exp() / total;
    }
    p
}

/// The exact probability of each sequence of `n` tokens (cell = the tokens as base-`vocab`
/// digits, first token most significant) that sampling after `prompt` from a [`Toy`] of
/// these parameters gives, by enumeration.
pub fn analytic_histogram(
    vocab: usize,
    period: usize,
    copy: f32,
    prompt: &[u32],
    config: &mtp::SamplingConfig,
    n: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; vocab.pow(n as u32)];
    fn walk(
        out: &mut [f64],
        shape: (usize, usize, f32),
        prompt: &[u32],
        generated: &mut Vec<u32>,
        config: &mtp::SamplingConfig,
        n: usize,
        prob: f64,
    ) {
        let (vocab, period, copy) = shape;
        if generated.len() == n {
            let cell = generated
                .iter()
                .fold(0usize, |acc, &t| acc * vocab + t as usize);
            out[cell] += prob;
            return;
        }
        let stream: Vec<u32> = prompt.iter().chain(generated.iter()).copied().collect();
        let logits = toy_logits(vocab, period, copy, &stream, stream.len() - 1);
        let p = reference_distribution(&logits, config, prompt, generated);
        for (t, &pt) in p.iter().enumerate() {
            if pt > 0.0 {
                generated.push(t as u32);
                walk(out, shape, prompt, generated, config, n, prob * pt);
                generated.pop();
            }
        }
    }
    walk(
        &mut out,
        (vocab, period, copy),
        prompt,
        &mut Vec::new(),
        config,
        n,
        1.0,
    );
    out
}

/// Pearson's goodness-of-fit statistic of `observed` counts against the probabilities
/// `expected`, cells expecting fewer than 5 pooled into one, and its degrees of freedom.
/// An observation in a cell of probability 0 makes the statistic infinite.
pub fn chi2_fit(observed: &[f64], expected: &[f64]) -> (f64, usize) {
    let n: f64 = observed.iter().sum();
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pooled_o, mut pooled_e) = (0.0, 0.0);
    for (&o, &p) in observed.iter().zip(expected) {
        let e = p * n;
        if p <= 0.0 {
            if o > 0.0 {
                return (f64::INFINITY, cells.max(1));
            }
            continue;
        }
        if e < 5.0 {
            pooled_o += o;
            pooled_e += e;
            continue;
        }
        stat += (o - e).powi(2) / e;
        cells += 1;
    }
    if pooled_e > 0.0 {
        stat += (pooled_o - pooled_e).powi(2) / pooled_e;
        cells += 1;
    }
    (stat, cells.saturating_sub(1).max(1))
}

/// The chi-squared critical value at significance 0.001 for `df` degrees of freedom
/// (Wilson–Hilferty: within 1% of the exact quantile for df >= 3; 103.4 at df 63).
pub fn chi2_critical_001(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.090_232; // the standard normal's 99.9th percentile
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
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

/// The target's embedding and head as a DFlash draft sees them: a CPU model of the
/// package at `f32` with `head` (what `onebit_engine::PackageHooks::new` builds; `mtp`'s
/// own code names no backend, so its tests bring their own).
pub struct CpuHooks(Arc<npu_runtime::CpuModel>);

impl CpuHooks {
    pub fn new(package: &Arc<npu_runtime::TargetPackage>, head: npu_runtime::HeadKind) -> CpuHooks {
        let options = npu_runtime::CpuOptions {
            head: Some(head),
            ..npu_runtime::CpuOptions::default()
        };
        let model = npu_runtime::CpuModel::load(package.clone(), options).unwrap();
        model.prepare_proposals();
        CpuHooks(model)
    }
}

impl dflash_draft::DraftHooks for CpuHooks {
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        let vocab = self.0.config().vocab_size as u32;
        let ids: Vec<u32> = tokens.iter().map(|&t| t.min(vocab - 1)).collect();
        self.0.embed(&ids).unwrap()
    }

    fn pick(&self, hidden: &[f32], n: usize) -> Vec<u32> {
        self.0.proposal_picks(hidden, n)
    }

    fn logits(&self, hidden: &[f32], n: usize) -> Option<Vec<f32>> {
        Some(self.0.proposal_logits(hidden, n))
    }

    fn install(&self, f: &mut dyn FnMut()) {
        self.0.install(f)
    }
}
