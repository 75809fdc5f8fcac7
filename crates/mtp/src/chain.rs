//! `ChainedHead`: prompt lookup and a DFlash draft working together.
//!
//! Each round takes one drafter's proposal: prompt lookup's where it has a match and its
//! recent rounds accepted at least as many tokens as the DFlash draft's (the output is
//! copying its context), the DFlash draft's otherwise. Both drafters see every committed
//! token and every round, whoever proposed it: lookup indexes the text, and the DFlash
//! draft's tap sink is trimmed after a lookup round exactly as after its own (rejected
//! verify rows never reach the draft's context). Which drafter proposes changes speed
//! only: the loop verifies every proposal, so the text is plain decoding's.
//!
//! The estimates are exponential moving averages of the tokens each drafter's rounds
//! accepted. Lookup gets a round now and then even while it trails
//! ([`PROBE_EVERY`]), so an estimate never goes stale when the text starts copying.

use crate::dflash::DFlashHead;
use crate::head::DraftHead;
use crate::lookup::LookupHead;

/// A lookup proposal that was passed over this many times in a row is taken anyway, to
/// measure lookup again.
pub const PROBE_EVERY: usize = 8;

/// Weight of the newest round in a drafter's accepted-tokens estimate.
const SMOOTHING: f64 = 0.25;

/// Which drafter proposed the round being verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proposer {
    Lookup,
    DFlash,
}

/// Prompt lookup chained with a DFlash draft; see the module docs.
pub struct ChainedHead<'w, 'a> {
    lookup: LookupHead,
    dflash: DFlashHead<'w, 'a>,
    /// Accepted tokens per round, smoothed: lookup's, the DFlash draft's. `None` until
    /// the drafter's first verified round.
    lookup_accepts: Option<f64>,
    dflash_accepts: Option<f64>,
    /// Lookup proposals passed over since lookup last proposed.
    passed_over: usize,
    /// Who proposed the round in flight.
    proposer: Option<Proposer>,
    error: Option<String>,
}

impl<'w, 'a> ChainedHead<'w, 'a> {
    /// Lookup and `dflash` chained.
    pub fn new(lookup: LookupHead, dflash: DFlashHead<'w, 'a>) -> ChainedHead<'w, 'a> {
        ChainedHead {
            lookup,
            dflash,
            lookup_accepts: None,
            dflash_accepts: None,
            passed_over: 0,
            proposer: None,
            error: None,
        }
    }

    /// Whether lookup's proposal of `len` tokens should be taken this round.
    fn prefer_lookup(&self, len: usize) -> bool {
        take_lookup(
            len,
            self.lookup_accepts,
            self.dflash_accepts,
            self.passed_over,
        )
    }
}

/// The chain's rule: a lookup proposal of `len` tokens is taken when lookup's estimate
/// is unmeasured or at least the draft's, or when it was passed over `PROBE_EVERY - 1`
/// times in a row.
fn take_lookup(len: usize, lookup: Option<f64>, dflash: Option<f64>, passed_over: usize) -> bool {
    if len == 0 {
        return false;
    }
    match (lookup, dflash) {
        // Unmeasured lookup: try it (a match is cheap to verify).
        (None, _) => true,
        (Some(_), None) => true,
        (Some(l), Some(d)) => l >= d || passed_over + 1 >= PROBE_EVERY,
    }
}

fn fold(estimate: &mut Option<f64>, accepted: usize) {
    let a = accepted as f64;
    *estimate = Some(match *estimate {
        Some(e) => e + SMOOTHING * (a - e),
        None => a,
    });
}

impl DraftHead for ChainedHead<'_, '_> {
    fn needs_last_hidden(&self) -> bool {
        false
    }

    fn draft(&mut self, pos: usize, last_token: u32, k: usize) -> Option<Vec<u32>> {
        self.error = None;
        self.proposer = None;
        let Some(lookup) = self.lookup.draft(pos, last_token, k) else {
            self.error = self.lookup.error();
            return None;
        };
        if self.prefer_lookup(lookup.len()) {
            self.passed_over = 0;
            // The verify pass writes tap rows for every drafted position; the DFlash
            // draft trims the rejected ones at commit, as after its own rounds.
            self.dflash.mark_round();
            self.proposer = Some(Proposer::Lookup);
            return Some(lookup);
        }
        if !lookup.is_empty() {
            self.passed_over += 1;
        }
        match self.dflash.draft(pos, last_token, k) {
            Some(d) => {
                self.proposer = Some(Proposer::DFlash);
                Some(d)
            }
            None => {
                self.error = self.dflash.error();
                None
            }
        }
    }

    fn commit_rows(&mut self, m: usize) {
        self.dflash.commit_rows(m);
        self.lookup.commit_rows(m);
        let accepted = m.saturating_sub(1);
        match self.proposer.take() {
            Some(Proposer::Lookup) => {
                fold(&mut self.lookup_accepts, accepted);
            }
            Some(Proposer::DFlash) => {
                fold(&mut self.dflash_accepts, accepted);
            }
            None => {}
        }
    }

    fn reset(&mut self) {
        self.lookup.reset();
        self.dflash.reset();
        self.proposer = None;
        self.passed_over = 0;
        self.error = None;
        // The estimates carry over: they describe the drafters on this model, and the
        // next generation starts from them.
    }

    fn error(&self) -> Option<String> {
        self.error.clone()
    }

    fn draft_probabilities(&self) -> Option<Vec<Vec<f32>>> {
        match self.proposer {
            Some(Proposer::DFlash) => self.dflash.draft_probabilities(),
            _ => self.lookup.draft_probabilities(),
        }
    }

    fn observe_tokens(&mut self, tokens: &[u32]) {
        self.lookup.observe_tokens(tokens);
        self.dflash.observe_tokens(tokens);
    }

    fn next_proposer(&mut self, pos: usize, last_token: u32) -> &'static str {
        let len = usize::from(self.lookup.would_propose(pos, last_token));
        if self.prefer_lookup(len) {
            self.lookup.proposer()
        } else {
            self.dflash.proposer()
        }
    }

    fn proposer(&self) -> &'static str {
        match self.proposer {
            Some(Proposer::DFlash) => self.dflash.proposer(),
            _ => self.lookup.proposer(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_takes_the_drafter_that_accepts_more_and_probes_the_other() {
        // No match: never lookup.
        assert!(!take_lookup(0, None, None, 0));
        // Unmeasured lookup, or an unmeasured draft: lookup.
        assert!(take_lookup(3, None, Some(5.0), 0));
        assert!(take_lookup(3, Some(0.0), None, 0));
        // Measured: the one accepting more (ties to lookup).
        assert!(take_lookup(3, Some(2.0), Some(1.5), 0));
        assert!(take_lookup(3, Some(2.0), Some(2.0), 0));
        assert!(!take_lookup(3, Some(1.0), Some(2.0), 0));
        // A trailing lookup is probed once every PROBE_EVERY proposals.
        assert!(!take_lookup(3, Some(1.0), Some(2.0), PROBE_EVERY - 2));
        assert!(take_lookup(3, Some(1.0), Some(2.0), PROBE_EVERY - 1));
    }

    #[test]
    fn estimates_fold_towards_each_round() {
        let mut e = None;
        fold(&mut e, 4);
        assert_eq!(e, Some(4.0));
        fold(&mut e, 0);
        assert_eq!(e, Some(3.0));
    }
}
