//! Log-probabilities of emitted tokens: the target's log-softmax of the raw logits
//! (before penalties, truncation and temperature), as OpenAI and llama-server (by
//! default, `post_sampling_probs: false`) report them.

/// Most alternatives a caller may ask for per token (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One token's log-probability and the most likely alternatives at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// `log softmax(logits)[token]`, natural log.
    pub logprob: f32,
    /// The `n` most likely tokens and their log-probabilities, most likely first (ties:
    /// lower id first).
    pub top: Vec<(u32, f32)>,
}

/// `log softmax(logits)` in f64 (the sum of exponentials in f64, as `onebit perplexity`
/// computes it, so both report the same values).
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    logits.iter().map(|&l| l as f64 - log_z).collect()
}

/// The log-probability of `token` under `logits`, with the `top` most likely
/// alternatives (at most [`MAX_TOP_LOGPROBS`]). A token outside the row gets `-inf`.
pub fn token_logprob(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let lp = log_softmax(logits);
    let top = top.min(MAX_TOP_LOGPROBS).min(lp.len());
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        // One pass keeping the `top` best (a small sorted list): no sort of the vocabulary.
        for (i, &v) in lp.iter().enumerate() {
            let v = v as f32;
            if best.len() == top && best.last().is_some_and(|&(_, w)| w >= v) {
                continue;
            }
            let at = best.partition_point(|&(_, w)| w >= v);
            best.insert(at, (i as u32, v));
            best.truncate(top);
        }
    }
    TokenLogprob {
        token,
        logprob: lp
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&v| v as f32),
        top: best,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_alternatives_are_the_largest_in_order() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let t = token_logprob(&logits, 4, 3);
        let lp = log_softmax(&logits);
        assert_eq!(t.logprob, lp[4] as f32);
        let ids: Vec<u32> = t.top.iter().map(|&(i, _)| i).collect();
        assert_eq!(ids, [1, 3, 4], "ties go to the lower id");
        let total: f64 = lp.iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert!(token_logprob(&logits, 9, 0).logprob.is_infinite());
        assert_eq!(token_logprob(&logits, 0, 100).top.len(), 5);
    }
}
