//! The interface between the loop and drafters.

/// Something that proposes tokens for the target to verify.
///
/// Position rule: `draft(pos, last_token, k)` proposes the tokens at `pos, pos + 1, ...`
/// following `last_token`, which sits at `pos - 1` and has not been run through the
/// target yet. After the verify pass the loop calls `commit_rows(m)` with the number of
/// positions of that pass it kept (`accepted + 1`); after a plain step (no draft) it
/// calls nothing. A draft may also go unverified (an adaptive loop's free "shadow"
/// probe compares it with a plain step's token): then too nothing is called.
pub trait DraftHead {
    /// True for classic MTP heads that draft from the target's last hidden state (the
    /// loop then runs the last token first: the two-pass round).
    fn needs_last_hidden(&self) -> bool;
    /// Up to `k` drafted tokens, or `None` (see [`DraftHead::error`]).
    fn draft(&mut self, pos: usize, last_token: u32, k: usize) -> Option<Vec<u32>>;
    /// The last verify pass kept `m` positions.
    fn commit_rows(&mut self, m: usize);
    /// Forget everything (a new generation starts).
    fn reset(&mut self);
    /// Why the last `draft` returned nothing, if it failed.
    fn error(&self) -> Option<String>;
    /// Two-pass heads receive the target's final-normed hidden row of the first pass.
    fn observe_hidden(&mut self, _hidden: &[f32]) {}
    /// Draft distributions (one per drafted token) for speculative sampling; `None`
    /// means the drafts are deterministic (the exact-match rule applies).
    fn draft_probabilities(&self) -> Option<Vec<Vec<f32>>> {
        None
    }
    /// Tokens joining the committed stream, in order: the prompt after `reset`, then
    /// every emitted token (a draft at `pos` comes after `pos` such tokens). For
    /// drafters that read the text itself (prompt lookup).
    fn observe_tokens(&mut self, _tokens: &[u32]) {}
    /// The name of the drafter whose proposal the last `draft` returned (`lookup`,
    /// `dflash`, ...): the loop counts rounds, drafted and accepted tokens by it
    /// ([`crate::Stats::by_drafter`]). A head that chains several drafters names the
    /// one it took the round from.
    fn proposer(&self) -> &'static str {
        "draft"
    }
    /// The drafter that would propose at `pos` after `last_token` (the arguments of
    /// the next `draft`), asked before the round's k is chosen: the adaptive draft
    /// length keeps its acceptance and draft cost per drafter. Changes no state.
    fn next_proposer(&mut self, _pos: usize, _last_token: u32) -> &'static str {
        self.proposer()
    }
}
