//! `mtp::run`: plain steps, one-pass rounds and two-pass rounds over a [`Forward`]
//! target and an optional [`DraftHead`].

use std::time::Instant;

use npu_runtime::{Forward, TargetError};

use crate::adaptive::{AdaptiveConfig, AdaptiveK, Choice, MAX_TRACKED_ROWS};
use crate::head::DraftHead;
use crate::logprob::{token_logprob, TokenLogprob};
use crate::sample::{Sampler, SamplingConfig, SamplingError};
use crate::stats::Stats;

/// Prompt tokens per prefill pass at most: bounds the activations and attention scratch
/// of a long prompt, and is how often a server's prefill asks whether it was cancelled
/// (about half a second of SmolLM2 prefill on two cores). The result is the same bits
/// for every chunk size.
pub const PREFILL_CHUNK: usize = 256;

/// How to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Tokens to emit at most.
    pub max_tokens: usize,
    /// Drafts per round at most (k).
    pub draft_max: usize,
    /// `Some`: before each round choose k in 0..=draft_max from the timed pass costs,
    /// the draft's cost and the acceptance so far ([`AdaptiveK`]; the default of
    /// `onebit run`). `None`: always draft `draft_max` (fixed k).
    /// Tokens that end the run (not emitted).
    pub stop_tokens: Vec<u32>,
    /// Greedy or sampled picks, checked when the run starts.
    pub sampling: SamplingConfig,
    /// Adaptive draft length (`None`: draft `draft_max` every round).
    pub adaptive: Option<AdaptiveConfig>,
}

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `max_tokens` tokens were emitted.
    MaxTokens,
    /// A stop token came (it is not emitted).
    StopToken,
    /// The callback asked to stop.
    Callback,
}

/// Why `run` refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No prompt tokens: the first pick needs the logits of the prompt's last token.
    #[error("mtp::run: the prompt is empty (at least one token is needed)")]
    EmptyPrompt,
    /// A sampling parameter is out of range.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The target failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The drafter failed (a draft that cannot run is an error, never a silent fall
    /// back to plain decoding).
    #[error("mtp::run: the drafter failed: {0}")]
    Draft(String),
    /// [`run_from`] was told the target holds a prefix it does not hold, or one that
    /// leaves no prompt token to run.
    #[error("mtp::run: {cached} cached prompt positions, but the target holds {position} and the prompt has {prompt} tokens (at least one must be left to run)")]
    Cached {
        /// Prompt positions the caller said are cached.
        cached: usize,
        /// Positions the target holds.
        position: usize,
        /// Prompt tokens.
        prompt: usize,
    },
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// The emitted tokens, in order (stop tokens excluded).
    pub tokens: Vec<u32>,
    /// Why the run ended.
    pub stop: StopReason,
    /// Rounds, acceptance and time split.
    pub stats: Stats,
}

fn row(logits: &[f32], vocab: usize, i: usize) -> &[f32] {
    &logits[i * vocab..(i + 1) * vocab]
}

/// Generates after `prompt`. `on_token` sees every emitted token in order and may
/// return `false` to stop. The target ends holding exactly the committed positions.
///
/// Greedy (temperature 0): drafts are accepted while they equal the target's argmax,
/// then the target's own next token is emitted — the text equals plain greedy decoding
/// exactly, because a batched verify pass gives the same logits as single steps.
/// Sampling: each verify row draws the target's token from its (temperature, top-p)
/// distribution and a draft is accepted only when it equals that draw (the exact-match
/// rule, lossless for deterministic drafts); heads that expose draft probabilities
/// use the standard min(1, p/q) test with residual resampling instead.
pub fn run(
    base: &mut dyn Forward,
    head: Option<&mut dyn DraftHead>,
    prompt: &[u32],
    options: &RunOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<RunOutput, RunError> {
    if prompt.is_empty() {
        return Err(RunError::EmptyPrompt);
    }
    generate(base, head, prompt, prompt, options, None, &mut |t, _| {
        on_token(t)
    })
}

/// [`run`] for a target that already holds the first `cached` positions of `prompt`
/// (a session's earlier turn, or a chunked prefill): only `prompt[cached..]` is run.
/// `base.position()` must equal `cached`, and `cached < prompt.len()` (the first pick
/// needs the last prompt token's logits). The head still observes the whole prompt.
pub fn run_from(
    base: &mut dyn Forward,
    head: Option<&mut dyn DraftHead>,
    prompt: &[u32],
    cached: usize,
    options: &RunOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<RunOutput, RunError> {
    run_observed(base, head, prompt, cached, options, None, &mut |t, _| {
        on_token(t)
    })
}

/// [`run_from`] reporting, with every emitted token, its [`TokenLogprob`] when
/// `logprobs` is `Some(n)` (the target's log-softmax of the logits the token was picked
/// from, with the `n` most likely alternatives, at most [`crate::MAX_TOP_LOGPROBS`]). A drafted
/// token's row is the verify pass's row, which equals a plain step's bit for bit (every
/// kernel is batch-invariant), so the values are the same with or without a drafter.
pub fn run_observed(
    base: &mut dyn Forward,
    head: Option<&mut dyn DraftHead>,
    prompt: &[u32],
    cached: usize,
    options: &RunOptions,
    logprobs: Option<usize>,
    on_token: &mut dyn FnMut(u32, Option<&TokenLogprob>) -> bool,
) -> Result<RunOutput, RunError> {
    if prompt.is_empty() {
        return Err(RunError::EmptyPrompt);
    }
    if cached >= prompt.len() || base.position() != cached {
        return Err(RunError::Cached {
            cached,
            position: base.position(),
            prompt: prompt.len(),
        });
    }
    generate(
        base,
        head,
        prompt,
        &prompt[cached..],
        options,
        logprobs,
        on_token,
    )
}

/// The loop: `prompt` is the whole committed stream's start, `fresh` its tail the
/// target has not run yet.
fn generate(
    base: &mut dyn Forward,
    mut head: Option<&mut dyn DraftHead>,
    prompt: &[u32],
    fresh: &[u32],
    options: &RunOptions,
    logprobs: Option<usize>,
    on_token: &mut dyn FnMut(u32, Option<&TokenLogprob>) -> bool,
) -> Result<RunOutput, RunError> {
    let vocab = base.config().vocab_size;
    let mut sampler = Sampler::new(options.sampling)?;
    // The repeat penalty's window starts in the prompt (llama.cpp's rule).
    sampler.observe_prompt(prompt);
    // The log-probabilities of a token picked from `logits`, when asked for.
    let scored = |logits: &[f32], t: u32| logprobs.map(|n| token_logprob(logits, t, n));
    let mut stats = Stats::default();
    let mut tokens = Vec::new();
    if let Some(h) = head.as_deref_mut() {
        h.reset();
        h.observe_tokens(prompt);
    }
    // Adaptive k: pass costs by row count (calibrated, then timed as the run goes),
    // the draft round's cost (timed), the policy's acceptance state.
    stats.pass_costs = options
        .adaptive
        .as_ref()
        .and_then(|a| a.calibration.clone())
        .unwrap_or_default();
    // One policy and draft cost per drafter (a chained head's lookup and DFlash draft
    // accept and cost differently): the entry of the drafter proposing next.
    let mut policies: Vec<(&'static str, AdaptiveK, Option<f64>)> = Vec::new();
    let t0 = Instant::now();
    // Prefill of the fresh tokens, in chunks of bounded memory: only the last prompt
    // row's logits are used (the same bits for every chunk size).
    let never = std::sync::atomic::AtomicBool::new(false);
    let logits = base.prefill(fresh, PREFILL_CHUNK, &never)?;
    stats.target_seconds += t0.elapsed().as_secs_f64();
    let s0 = Instant::now();
    let mut next = sampler.pick(row(&logits, vocab, 0));
    let mut next_lp = scored(row(&logits, vocab, 0), next);
    stats.sampling_seconds += s0.elapsed().as_secs_f64();

    // `next` is committed but not yet run through the target; it sits at `position()`.
    let emit = |t: u32,
                lp: Option<TokenLogprob>,
                tokens: &mut Vec<u32>,
                sampler: &mut Sampler,
                head: &mut Option<&mut dyn DraftHead>,
                on_token: &mut dyn FnMut(u32, Option<&TokenLogprob>) -> bool|
     -> Option<StopReason> {
        if options.stop_tokens.contains(&t) {
            return Some(StopReason::StopToken);
        }
        tokens.push(t);
        sampler.accept(t);
        if let Some(h) = head.as_deref_mut() {
            h.observe_tokens(&[t]);
        }
        if !on_token(t, lp.as_ref()) {
            return Some(StopReason::Callback);
        }
        if tokens.len() >= options.max_tokens {
            return Some(StopReason::MaxTokens);
        }
        None
    };
    if options.max_tokens == 0 {
        return Ok(RunOutput {
            tokens,
            stop: StopReason::MaxTokens,
            stats,
        });
    }
    loop {
        if let Some(stop) = emit(
            next,
            next_lp.take(),
            &mut tokens,
            &mut sampler,
            &mut head,
            on_token,
        ) {
            return Ok(RunOutput {
                tokens,
                stop,
                stats,
            });
        }
        let two_pass = head.as_deref().is_some_and(|h| h.needs_last_hidden());
        // The drafter this round's policy belongs to.
        let pos_ahead = base.position() + 1 + usize::from(two_pass);
        let drafter = head
            .as_deref_mut()
            .map(|h| h.next_proposer(pos_ahead, next));
        let mut policy = match (&options.adaptive, drafter) {
            (Some(config), Some(name)) => {
                let at = match policies.iter().position(|p| p.0 == name) {
                    Some(i) => i,
                    None => {
                        policies.push((name, AdaptiveK::new(config.clone()), None));
                        policies.len() - 1
                    }
                };
                Some(&mut policies[at])
            }
            _ => None,
        };
        // How many drafts this round: `draft_max`, or the adaptive choice.
        let room = options.max_tokens - tokens.len();
        let choice = match policy.as_mut() {
            Some((_, p, draft_cost)) => {
                let cap = options.draft_max.min(room).min(MAX_TRACKED_ROWS - 1);
                p.choose(
                    &stats.pass_costs.table(cap + 1),
                    draft_cost.unwrap_or(0.0),
                    cap,
                    two_pass,
                )
            }
            _ => Choice {
                k: options.draft_max,
                probe: false,
                shadow: false,
            },
        };

        // Two-pass heads need the last hidden state: run `next` first.
        if two_pass && choice.k > 0 {
            let t = Instant::now();
            let l = base.forward(&[next])?;
            let secs = t.elapsed().as_secs_f64();
            stats.target_seconds += secs;
            stats.pass_costs.record(1, secs);
            if let Some(h) = head.as_deref_mut() {
                h.observe_hidden(base.last_hidden());
            }
            let s = Instant::now();
            let following = sampler.pick(&l);
            let following_lp = scored(&l, following);
            stats.sampling_seconds += s.elapsed().as_secs_f64();
            if let Some(stop) = emit(
                following,
                following_lp,
                &mut tokens,
                &mut sampler,
                &mut head,
                on_token,
            ) {
                return Ok(RunOutput {
                    tokens,
                    stop,
                    stats,
                });
            }
            next = following;
        }
        // Never draft past the end: `emit` stopped at max_tokens, so at least one token
        // is left; k drafts and the target's own token fill at most k + 1 of the room
        // (the last one may go unused).
        let k = choice.k.min(options.max_tokens - tokens.len());
        if head.is_some() {
            stats.record_k(k);
        }
        stats.probes += choice.probe as usize;
        let pos_next = base.position();
        let asked = if k > 0 { k } else { choice.shadow as usize };
        let drafts = match head.as_deref_mut() {
            Some(h) if asked > 0 => {
                let t = Instant::now();
                let d = h.draft(pos_next + 1, next, asked);
                let secs = t.elapsed().as_secs_f64();
                stats.draft_seconds += secs;
                if let Some((_, _, draft_cost)) = policy.as_mut() {
                    *draft_cost = Some(match *draft_cost {
                        Some(c) => c + 0.2 * (secs - c),
                        None => secs,
                    });
                }
                match d {
                    Some(d) => d,
                    None => match h.error() {
                        Some(e) => return Err(RunError::Draft(e)),
                        None => Vec::new(),
                    },
                }
            }
            _ => Vec::new(),
        };
        if k == 0 || drafts.is_empty() {
            // Plain step.
            let t = Instant::now();
            let l = base.forward(&[next])?;
            let secs = t.elapsed().as_secs_f64();
            stats.target_seconds += secs;
            stats.pass_costs.record(1, secs);
            let s = Instant::now();
            next = sampler.pick(&l);
            next_lp = scored(&l, next);
            stats.sampling_seconds += s.elapsed().as_secs_f64();
            stats.plain_steps += 1;
            if let Some((_, p, _)) = policy.as_mut() {
                match drafts.first() {
                    // A shadow probe: would the draft have been accepted?
                    Some(&d) if k == 0 => {
                        stats.shadow_probes += 1;
                        p.record_shadow(d == next);
                    }
                    _ if k > 0 => p.record_empty(),
                    _ => {}
                }
            }
            continue;
        }
        // Verify [next, d1..dk] in one batch.
        let mut batch = Vec::with_capacity(drafts.len() + 1);
        batch.push(next);
        batch.extend(&drafts);
        let t = Instant::now();
        let logits = base.forward(&batch)?;
        let secs = t.elapsed().as_secs_f64();
        stats.target_seconds += secs;
        stats.pass_costs.record(batch.len(), secs);
        let s = Instant::now();
        let draft_probs = head.as_deref().and_then(|h| h.draft_probabilities());
        let proposer = head.as_deref().map_or("draft", |h| h.proposer());
        let (accepted, following) = crate::verify::verify(
            &mut sampler,
            &logits,
            vocab,
            &drafts,
            draft_probs.as_deref(),
        );
        stats.sampling_seconds += s.elapsed().as_secs_f64();
        base.truncate(pos_next + 1 + accepted)?;
        if let Some(h) = head.as_deref_mut() {
            h.commit_rows(accepted + 1);
        }
        stats.record_round(proposer, drafts.len(), accepted);
        if let Some((_, p, _)) = policy.as_mut() {
            p.record_round(drafts.len(), accepted);
        }
        for (i, &d) in drafts[..accepted].iter().enumerate() {
            let lp = scored(row(&logits, vocab, i), d);
            if let Some(stop) = emit(d, lp, &mut tokens, &mut sampler, &mut head, on_token) {
                // Positions past the stop are not part of the committed stream.
                return Ok(RunOutput {
                    tokens,
                    stop,
                    stats,
                });
            }
        }
        next = following;
        next_lp = scored(row(&logits, vocab, accepted), following);
    }
}
