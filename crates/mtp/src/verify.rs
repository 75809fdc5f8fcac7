//! Verification of a drafted run against the target's logits.

use crate::sample::Sampler;

/// Verifies `drafts` against the logits of the batch `[last, d1..dk]`
/// (`(k + 1) x vocab`). Returns how many drafts are accepted and the token that
/// follows the accepted prefix (the target's own).
///
/// The target distribution of row `i` is the sampler's whole chain (penalties, top-k,
/// top-p, min-p, temperature) given the committed stream *and the drafts accepted
/// before `i` in this round*: the sampler's penalty state is advanced through each
/// accepted draft and put back before returning (the caller then commits the accepted
/// drafts and the follower with [`Sampler::accept`], as plain decoding would).
///
/// - Greedy: accept while `d_i == argmax(row i - 1)` (penalized); the follower is
///   `argmax(row a)`.
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
    let saved = sampler.penalty_state();
    let result = verify_rows(sampler, logits, vocab, drafts, q);
    sampler.restore_penalty_state(saved);
    result
}

fn verify_rows(
    sampler: &mut Sampler,
    logits: &[f32],
    vocab: usize,
    drafts: &[u32],
    q: Option<&[Vec<f32>]>,
) -> (usize, u32) {
    let row = |i: usize| &logits[i * vocab..(i + 1) * vocab];
    if sampler.is_greedy() {
        let mut a = 0;
        while a < drafts.len() && sampler.pick(row(a)) == drafts[a] {
            sampler.accept(drafts[a]);
            a += 1;
        }
        return (a, sampler.pick(row(a)));
    }
    for (i, &d) in drafts.iter().enumerate() {
        // The target's distribution at this position, given the accepted prefix.
        let p = sampler.distribution(row(i));
        match q {
            None => {
                let x = sampler.draw(&p) as u32;
                if x != d {
                    return (i, x);
                }
            }
            Some(q) => {
                // A draft outside the vocabulary (or without a q row) has q = 0:
                // rejected, never an index out of range.
                let qi = q.get(i).map(Vec::as_slice).unwrap_or(&[]);
                let at = |v: &[f32]| v.get(d as usize).copied().unwrap_or(0.0);
                let (pd, qd) = (at(&p), at(qi));
                let u = sampler.uniform();
                if qd <= 0.0 || u >= (pd / qd).min(1.0) {
                    let mut residual: Vec<f32> = p
                        .iter()
                        .enumerate()
                        .map(|(j, a)| (a - qi.get(j).copied().unwrap_or(0.0)).max(0.0))
                        .collect();
                    let total: f32 = residual.iter().sum();
                    if total <= 0.0 {
                        return (i, sampler.draw(&p) as u32);
                    }
                    residual.iter_mut().for_each(|v| *v /= total);
                    return (i, sampler.draw(&residual) as u32);
                }
            }
        }
        sampler.accept(d);
    }
    let p = sampler.distribution(row(drafts.len()));
    (drafts.len(), sampler.draw(&p) as u32)
}
