//! Choosing the next token from logits: greedy, or temperature with top-p.

use rand::{rngs::StdRng, Rng, SeedableRng};

/// How to pick tokens.
#[derive(Clone, Copy, Debug)]
pub struct SamplingConfig {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 keeps every token.
    pub top_p: f32,
    pub seed: u64,
}

/// A seeded sampler.
pub struct Sampler {
    config: SamplingConfig,
    rng: StdRng,
}

impl Sampler {
    pub fn new(config: SamplingConfig) -> Sampler {
        Sampler {
            rng: StdRng::seed_from_u64(config.seed),
            config,
        }
    }

    /// True when picks are argmax (no randomness).
    pub fn is_greedy(&self) -> bool {
        self.config.temperature <= 0.0
    }

    /// The probability distribution sampling draws from (temperature, then top-p,
    /// renormalised). Greedy puts all mass on the argmax.
    pub fn distribution(&self, logits: &[f32]) -> Vec<f32> {
        let mut p = vec![0f32; logits.len()];
        if self.is_greedy() {
            p[npu_runtime::argmax(logits)] = 1.0;
            return p;
        }
        let t = self.config.temperature;
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0f64;
        for (pi, &l) in p.iter_mut().zip(logits) {
            *pi = ((l - max) / t).exp();
            total += *pi as f64;
        }
        for pi in p.iter_mut() {
            *pi = (*pi as f64 / total) as f32;
        }
        if self.config.top_p < 1.0 {
            let mut order: Vec<usize> = (0..p.len()).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let mut mass = 0f32;
            let mut keep = order.len();
            for (rank, &i) in order.iter().enumerate() {
                mass += p[i];
                if mass >= self.config.top_p {
                    keep = rank + 1;
                    break;
                }
            }
            let kept: f32 = order[..keep].iter().map(|&i| p[i]).sum();
            let mut q = vec![0f32; p.len()];
            for &i in &order[..keep] {
                q[i] = p[i] / kept;
            }
            p = q;
        }
        p
    }

    /// A uniform draw in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        self.rng.random()
    }

    /// Draws an index from a distribution.
    pub fn draw(&mut self, p: &[f32]) -> usize {
        let u: f32 = self.rng.random();
        let mut acc = 0f32;
        let mut last = 0;
        for (i, &pi) in p.iter().enumerate() {
            if pi > 0.0 {
                acc += pi;
                last = i;
                if u < acc {
                    return i;
                }
            }
        }
        last
    }

    /// Picks the next token from logits.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.is_greedy() {
            return npu_runtime::argmax(logits) as u32;
        }
        let p = self.distribution(logits);
        self.draw(&p) as u32
    }
}
