//! Choosing the next token from logits: greedy, or temperature with top-p.

use rand::{rngs::StdRng, Rng, SeedableRng};

/// How to pick tokens.
#[derive(Clone, Copy, Debug)]
pub struct SamplingConfig {
    /// A finite number >= 0; 0 means greedy (argmax).
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 keeps every token.
    pub top_p: f32,
    /// Seeds the sampler's random draws.
    pub seed: u64,
}

/// A sampling parameter out of its range; the message names the parameter and value.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// The temperature is NaN, infinite or negative.
    #[error("sampling: temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    /// top_p is NaN or outside (0, 1].
    #[error("sampling: top_p must be a number in (0, 1], got {0}")]
    TopP(f32),
}

impl SamplingConfig {
    /// Refuses parameters out of range: the one check every front end (CLI, server)
    /// relies on. `-0.0` counts as 0 (greedy).
    pub fn check(&self) -> Result<(), SamplingError> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(SamplingError::Temperature(t));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(SamplingError::TopP(p));
        }
        Ok(())
    }
}

/// A seeded sampler.
pub struct Sampler {
    config: SamplingConfig,
    rng: StdRng,
}

impl Sampler {
    /// A sampler for `config`, refused when a parameter is out of range
    /// ([`SamplingConfig::check`]).
    pub fn new(config: SamplingConfig) -> Result<Sampler, SamplingError> {
        config.check()?;
        Ok(Sampler {
            rng: StdRng::seed_from_u64(config.seed),
            config,
        })
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
