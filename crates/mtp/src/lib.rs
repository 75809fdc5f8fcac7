//! # mtp
//!
//! onebit's speculative decoding loop. A [`DraftHead`] proposes tokens; [`run`] verifies
//! them against a target behind npu-runtime's `Forward` trait and keeps exactly what
//! plain decoding would produce:
//!
//! - the **plain step** (no draft that round): one target pass for the last token;
//! - the **one-pass round** for heads that do not need the target's last hidden state
//!   (DFlash): `[t, d1..dk]` verified in one batch;
//! - the **two-pass round** for classic MTP heads: `t` first, then the head drafts from
//!   its hidden state, then the verify batch.
//!
//! Greedy verification accepts the longest prefix that matches the target's argmax and
//! emits the target's own next token; with sampling, verification preserves the
//! target's distribution ([`verify::verify`]). The target's KV cache and the tap sink
//! end every round holding exactly the committed positions. [`DFlashHead`] runs a
//! DFlash draft as a head over `DraftHooks` (the engine's `PackageHooks` give it the
//! target's embedding and head; this crate names no backend).
//! [`LookupHead`] drafts by prompt lookup (no model); [`ChainedHead`] takes each round
//! from lookup or a DFlash draft, whichever has been accepting more.
//!
//! The draft length adapts by default ([`RunOptions::adaptive`]): before each round
//! [`AdaptiveK`] picks the k (0 = a plain step) with the most expected tokens per
//! second from the timed pass costs by row count, the draft's cost and the acceptance
//! seen at each draft position — kept per drafter ([`DraftHead::next_proposer`]), so a
//! chain's drafters are each measured by their own rounds ([`Stats::by_drafter`]).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod adaptive;
mod chain;
mod dflash;
mod head;
mod logprob;
mod lookup;
mod oracle;
mod run;
pub mod sample;
mod stats;
pub mod verify;

pub use adaptive::{
    best_k, calibrate, expected_accepted, warmed_up, AcceptanceEstimate, AdaptiveConfig, AdaptiveK,
    Choice, PassCosts, CALIBRATION_ROUNDS, WARM_UP_GAIN, WARM_UP_MAX_PASSES, WARM_UP_SETTLED,
};
pub use chain::{ChainedHead, PROBE_EVERY};
pub use dflash::DFlashHead;
pub use head::DraftHead;
pub use logprob::{log_softmax, token_logprob, TokenLogprob, MAX_TOP_LOGPROBS};
pub use lookup::{LookupHead, DEFAULT_MAX_NGRAM};
pub use oracle::{OracleHead, OracleRule};
pub use run::{
    run, run_from, run_observed, RunError, RunOptions, RunOutput, StopReason, PREFILL_CHUNK,
};
pub use sample::{PenaltyState, Sampler, SamplingConfig, SamplingError};
pub use stats::{DrafterStats, Stats};
