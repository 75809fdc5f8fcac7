//! Choosing the next token from logits: greedy, or a draw after llama.cpp's default
//! chain of transforms.
//!
//! The order (llama.cpp's `common_sampler` default chain, where the order matters):
//!
//! 1. **penalties**, on the raw logits: `repeat_penalty` over the tokens among the last
//!    `repeat_last_n` of the context (prompt and generated tokens, llama.cpp's rule: a
//!    logit `l > 0` becomes `l / penalty`, else `l * penalty`), then
//!    `presence_penalty` and `frequency_penalty` over the tokens generated so far
//!    (OpenAI's definition: `l - frequency * count - presence * [count > 0]`, counting
//!    only sampled tokens, not the prompt; llama.cpp counts them over its repeat window
//!    instead);
//! 2. greedy (temperature 0) stops here: the argmax of the penalized logits;
//! 3. **top_k** (the k largest logits; 0 keeps all);
//! 4. **top_p** (the smallest set, by falling probability at temperature 1, whose mass
//!    reaches `top_p`);
//! 5. **min_p** (tokens whose probability is at least `min_p` times the largest's);
//! 6. **temperature**, then the softmax over the tokens kept, and the draw.
//!
//! Ties in the ordering go to the lower token id, so the kept set never depends on a
//! sort's stability. The penalty state is the [`Sampler`]'s; the loop feeds it the
//! context ([`Sampler::observe_prompt`]) and every committed token
//! ([`Sampler::accept`]), and verification advances a copy of it through the drafts it
//! accepts, so the distribution at each draft position is the penalized one given the
//! accepted prefix.

use std::collections::{HashMap, VecDeque};

use rand::{rngs::StdRng, Rng, SeedableRng};

/// How to pick tokens. [`SamplingConfig::default`] is greedy with every transform off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingConfig {
    /// A finite number >= 0; 0 means greedy (argmax of the penalized logits).
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 keeps every token.
    pub top_p: f32,
    /// Seeds the sampler's random draws.
    pub seed: u64,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// In [0, 1]: keep tokens at least `min_p` times as likely as the most likely; 0 off.
    pub min_p: f32,
    /// A finite number > 0 dividing the positive (multiplying the negative) logits of
    /// the tokens among the last `repeat_last_n` of the context; 1 is off.
    pub repeat_penalty: f32,
    /// How many of the last context tokens `repeat_penalty` looks at (`usize::MAX`: all).
    pub repeat_last_n: usize,
    /// In [-2, 2]: subtracted from the logit of every token generated at least once.
    pub presence_penalty: f32,
    /// In [-2, 2]: subtracted once per earlier generation of the token.
    pub frequency_penalty: f32,
}

impl Default for SamplingConfig {
    fn default() -> SamplingConfig {
        SamplingConfig {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            top_k: 0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            // llama.cpp's default window (only read when repeat_penalty != 1).
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
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
    /// min_p is NaN or outside [0, 1].
    #[error("sampling: min_p must be a number in [0, 1], got {0}")]
    MinP(f32),
    /// repeat_penalty is NaN, infinite, zero or negative.
    #[error("sampling: repeat_penalty must be a finite number > 0 (1 is off), got {0}")]
    RepeatPenalty(f32),
    /// presence_penalty is NaN or outside [-2, 2].
    #[error("sampling: presence_penalty must be a number in [-2, 2], got {0}")]
    PresencePenalty(f32),
    /// frequency_penalty is NaN or outside [-2, 2].
    #[error("sampling: frequency_penalty must be a number in [-2, 2], got {0}")]
    FrequencyPenalty(f32),
}

impl SamplingError {
    /// The parameter's name, as the request fields and flags spell it (`top_p`, ...).
    pub fn parameter(&self) -> &'static str {
        match self {
            SamplingError::Temperature(_) => "temperature",
            SamplingError::TopP(_) => "top_p",
            SamplingError::MinP(_) => "min_p",
            SamplingError::RepeatPenalty(_) => "repeat_penalty",
            SamplingError::PresencePenalty(_) => "presence_penalty",
            SamplingError::FrequencyPenalty(_) => "frequency_penalty",
        }
    }
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
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SamplingError::MinP(self.min_p));
        }
        let r = self.repeat_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(SamplingError::RepeatPenalty(r));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(SamplingError::PresencePenalty(self.presence_penalty));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(SamplingError::FrequencyPenalty(self.frequency_penalty));
        }
        Ok(())
    }

    /// Whether the repeat penalty changes anything.
    fn repeat_on(&self) -> bool {
        self.repeat_penalty != 1.0 && self.repeat_last_n > 0
    }

    /// Whether the presence or frequency penalty changes anything.
    fn counts_on(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

/// What the penalties depend on: the repeat window and the generated tokens' counts.
/// Kept only for the penalties that are on (empty otherwise, so copying it is free).
#[derive(Clone, Debug, Default)]
pub struct PenaltyState {
    /// The last `repeat_last_n` context tokens, oldest first.
    window: VecDeque<u32>,
    /// How often each token occurs in `window`.
    in_window: HashMap<u32, u32>,
    /// How often each token was generated.
    generated: HashMap<u32, u32>,
}

/// A seeded sampler with its penalty state.
pub struct Sampler {
    config: SamplingConfig,
    rng: StdRng,
    state: PenaltyState,
}

impl Sampler {
    /// A sampler for `config`, refused when a parameter is out of range
    /// ([`SamplingConfig::check`]).
    pub fn new(config: SamplingConfig) -> Result<Sampler, SamplingError> {
        config.check()?;
        Ok(Sampler {
            rng: StdRng::seed_from_u64(config.seed),
            config,
            state: PenaltyState::default(),
        })
    }

    /// The parameters.
    pub fn config(&self) -> &SamplingConfig {
        &self.config
    }

    /// True when picks are argmax (no randomness).
    pub fn is_greedy(&self) -> bool {
        self.config.temperature <= 0.0
    }

    /// Whether any penalty is on (picks then depend on the context).
    pub fn penalized(&self) -> bool {
        self.config.repeat_on() || self.config.counts_on()
    }

    fn push_window(&mut self, t: u32) {
        if !self.config.repeat_on() {
            return;
        }
        let s = &mut self.state;
        s.window.push_back(t);
        *s.in_window.entry(t).or_insert(0) += 1;
        if s.window.len() > self.config.repeat_last_n {
            if let Some(old) = s.window.pop_front() {
                if let Some(c) = s.in_window.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        s.in_window.remove(&old);
                    }
                }
            }
        }
    }

    /// The context before generation (the whole prompt, cached part included): it
    /// fills the repeat window, and is not counted as generated.
    pub fn observe_prompt(&mut self, prompt: &[u32]) {
        if !self.config.repeat_on() {
            return;
        }
        let start = prompt.len().saturating_sub(self.config.repeat_last_n);
        for &t in &prompt[start..] {
            self.push_window(t);
        }
    }

    /// A token joins the committed stream (emitted, or a draft accepted in the
    /// verification under way).
    pub fn accept(&mut self, t: u32) {
        self.push_window(t);
        if self.config.counts_on() {
            *self.state.generated.entry(t).or_insert(0) += 1;
        }
    }

    /// A copy of the penalty state (verification advances the live one through its
    /// accepted drafts, then puts this back).
    pub fn penalty_state(&self) -> PenaltyState {
        self.state.clone()
    }

    /// Puts back a state taken by [`Sampler::penalty_state`].
    pub fn restore_penalty_state(&mut self, state: PenaltyState) {
        self.state = state;
    }

    /// `logits` with the penalties of the current state applied (step 1 of the chain).
    pub fn penalize(&self, logits: &[f32]) -> Vec<f32> {
        let mut l = logits.to_vec();
        let c = &self.config;
        // Ids come from the committed stream, which the target checked against its
        // vocabulary; `get_mut` keeps a foreign id from indexing out of range anyway.
        for &t in self.state.in_window.keys() {
            if let Some(v) = l.get_mut(t as usize) {
                *v = if *v > 0.0 {
                    *v / c.repeat_penalty
                } else {
                    *v * c.repeat_penalty
                };
            }
        }
        for (&t, &n) in &self.state.generated {
            if let Some(v) = l.get_mut(t as usize) {
                *v -= c.frequency_penalty * n as f32 + c.presence_penalty;
            }
        }
        l
    }

    /// The distribution the next pick draws from, given the current penalty state: the
    /// whole chain (module docs), renormalised. Greedy puts all mass on the argmax of
    /// the penalized logits.
    pub fn distribution(&self, logits: &[f32]) -> Vec<f32> {
        let l = if self.penalized() {
            self.penalize(logits)
        } else {
            logits.to_vec()
        };
        let mut p = vec![0f32; l.len()];
        if l.is_empty() {
            return p;
        }
        if self.is_greedy() {
            p[npu_runtime::argmax(&l)] = 1.0;
            return p;
        }
        let c = &self.config;
        // The candidates, by falling logit (ties: lower id first), cut by top-k, top-p
        // and min-p. Sorting is skipped when nothing truncates.
        let truncating = (c.top_k > 0 && c.top_k < l.len()) || c.top_p < 1.0 || c.min_p > 0.0;
        let kept: Vec<usize> = if truncating {
            let by_logit = |&a: &usize, &b: &usize| l[b].total_cmp(&l[a]).then(a.cmp(&b));
            let mut order: Vec<usize> = (0..l.len()).collect();
            if c.top_k > 0 && c.top_k < order.len() {
                order.select_nth_unstable_by(c.top_k - 1, by_logit);
                order.truncate(c.top_k);
            }
            order.sort_unstable_by(by_logit);
            let max = l[order[0]];
            if c.top_p < 1.0 {
                // Probabilities at temperature 1 over the candidates left (llama.cpp
                // applies top-p before the temperature).
                let w: Vec<f64> = order.iter().map(|&i| ((l[i] - max) as f64).exp()).collect();
                let total: f64 = w.iter().sum();
                let mut mass = 0f64;
                let mut keep = order.len();
                for (rank, wi) in w.iter().enumerate() {
                    mass += wi / total;
                    if mass >= c.top_p as f64 {
                        keep = rank + 1;
                        break;
                    }
                }
                order.truncate(keep);
            }
            if c.min_p > 0.0 {
                // p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p); the max stays.
                let floor = max + c.min_p.ln();
                order.retain(|&i| l[i] >= floor);
            }
            order
        } else {
            (0..l.len()).collect()
        };
        let max = kept.iter().map(|&i| l[i]).fold(f32::NEG_INFINITY, f32::max);
        let t = c.temperature;
        let mut total = 0f64;
        for &i in &kept {
            p[i] = ((l[i] - max) / t).exp();
            total += p[i] as f64;
        }
        for &i in &kept {
            p[i] = (p[i] as f64 / total) as f32;
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

    /// Picks the next token from logits, given the current penalty state (which the
    /// caller advances with [`Sampler::accept`] once the token is committed).
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.is_greedy() && !self.penalized() {
            return npu_runtime::argmax(logits) as u32;
        }
        let p = self.distribution(logits);
        if self.is_greedy() {
            return npu_runtime::argmax(&p) as u32;
        }
        self.draw(&p) as u32
    }
}
