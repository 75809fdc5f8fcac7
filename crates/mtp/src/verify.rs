//! Verification of a drafted run against the target's logits.

use crate::sample::Sampler;

/// Verifies `drafts` against the logits of the batch `[last, d1..dk]`
/// (`(k + 1) x vocab`). Returns how many drafts are accepted and the token that
/// follows the accepted prefix (the target's own).
///
/// - Greedy: accept while `d_i == argmax(row i - 1)`; the follower is `argmax(row a)`.
/// - Sampling, deterministic drafts: draw `x_i` from the target's distribution of row
///   `i - 1`; accept while `x_i == d_i`; the follower is the first non-matching draw (or
///   a draw from row k). Every emitted token is a draw from the target: lossless.
/// - Sampling with draft probabilities `q`: accept `d_i` with probability
///   `min(1, p(d_i) / q(d_i))`; on rejection draw from `norm(max(0, p - q))`.
pub fn verify(
    sampler: &mut Sampler,
    logits: &[f32],
    vocab: usize,
    drafts: &[u32],
    q: Option<&[Vec<f32>]>,
) -> (usize, u32) {
    let row = |i: usize| &logits[i * vocab..(i + 1) * vocab];
    if sampler.is_greedy() {
        let mut a = 0;
        while a < drafts.len() && npu_runtime::argmax(row(a)) as u32 == drafts[a] {
            a += 1;
        }
        return (a, npu_runtime::argmax(row(a)) as u32);
    }
    for (i, &d) in drafts.iter().enumerate() {
        let p = sampler.distribution(row(i));
        match q {
            None => {
                let x = sampler.draw(&p) as u32;
                if x != d {
                    return (i, x);
                }
            }
            Some(q) => {
                let qi = &q[i];
                let (pd, qd) = (p[d as usize], qi[d as usize]);
                let u = sampler.uniform();
                if qd <= 0.0 || u >= (pd / qd).min(1.0) {
                    let mut residual: Vec<f32> =
                        p.iter().zip(qi).map(|(a, b)| (a - b).max(0.0)).collect();
                    let total: f32 = residual.iter().sum();
                    if total <= 0.0 {
                        return (i, sampler.draw(&p) as u32);
                    }
                    residual.iter_mut().for_each(|v| *v /= total);
                    return (i, sampler.draw(&residual) as u32);
                }
            }
        }
    }
    let p = sampler.distribution(row(drafts.len()));
    (drafts.len(), sampler.draw(&p) as u32)
}
