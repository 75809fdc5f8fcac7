//! Per-run statistics of speculative decoding.

use crate::adaptive::PassCosts;

/// One drafter's share of a run's verify rounds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrafterStats {
    /// The drafter ([`crate::DraftHead::proposer`]: `lookup`, `dflash`, ...).
    pub name: &'static str,
    /// Verify rounds it proposed.
    pub rounds: usize,
    /// Draft tokens it proposed in them.
    pub drafted: usize,
    /// Of those, accepted.
    pub accepted: usize,
}

impl DrafterStats {
    /// Tokens per verify round of this drafter's (accepted drafts plus the target's
    /// own token).
    pub fn tokens_per_round(&self) -> f64 {
        if self.rounds == 0 {
            return 0.0;
        }
        (self.accepted + self.rounds) as f64 / self.rounds as f64
    }

    /// Accepted share of its drafted tokens.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Verify rounds (a draft was verified).
    pub rounds: usize,
    /// Single-token target passes without a draft.
    pub plain_steps: usize,
    /// Draft tokens proposed in all rounds.
    pub drafted: usize,
    /// Draft tokens accepted in all rounds.
    pub accepted: usize,
    /// Rounds, drafted and accepted tokens by the drafter that proposed them, in the
    /// order each drafter first proposed (one entry for a single drafter; lookup and
    /// the DFlash draft for a chained head). Their sums are `rounds`, `drafted`,
    /// `accepted`.
    pub by_drafter: Vec<DrafterStats>,
    /// Accepted drafts of each round, in order.
    pub accepted_per_round: Vec<usize>,
    /// `[i]`: rounds that drafted a token at draft position i, and how many were accepted.
    pub offered_at: Vec<usize>,
    /// Per draft position: how many rounds accepted a draft there.
    pub accepted_at: Vec<usize>,
    /// Seconds in target passes.
    pub target_seconds: f64,
    /// Seconds in the draft head.
    pub draft_seconds: f64,
    /// Seconds picking and verifying tokens.
    pub sampling_seconds: f64,
    /// `[k]`: rounds for which the loop chose k drafts (0: a plain step by choice;
    /// the drafter may still have offered fewer). Empty without a drafter.
    pub k_histogram: Vec<usize>,
    /// Paid probes: 1-draft rounds run although the estimates said drafting does not pay.
    pub probes: usize,
    /// Shadow probes: a cheap draft compared with a plain step's token, not verified.
    pub shadow_probes: usize,
    /// Target pass seconds by row count at the end of the run (the calibration, then
    /// every timed pass folded in).
    pub pass_costs: PassCosts,
}

impl Stats {
    pub(crate) fn record_round(&mut self, drafter: &'static str, drafted: usize, accepted: usize) {
        let at = match self.by_drafter.iter().position(|d| d.name == drafter) {
            Some(i) => i,
            None => {
                self.by_drafter.push(DrafterStats {
                    name: drafter,
                    ..DrafterStats::default()
                });
                self.by_drafter.len() - 1
            }
        };
        let d = &mut self.by_drafter[at];
        d.rounds += 1;
        d.drafted += drafted;
        d.accepted += accepted;
        self.rounds += 1;
        self.drafted += drafted;
        self.accepted += accepted;
        self.accepted_per_round.push(accepted);
        if self.offered_at.len() < drafted {
            self.offered_at.resize(drafted, 0);
            self.accepted_at.resize(drafted, 0);
        }
        for i in 0..drafted {
            self.offered_at[i] += 1;
            if i < accepted {
                self.accepted_at[i] += 1;
            }
        }
    }

    pub(crate) fn record_k(&mut self, k: usize) {
        if self.k_histogram.len() <= k {
            self.k_histogram.resize(k + 1, 0);
        }
        self.k_histogram[k] += 1;
    }

    /// The draft's share of the time the loop spent (target, draft and sampling).
    pub fn draft_share(&self) -> f64 {
        let busy = self.target_seconds + self.draft_seconds + self.sampling_seconds;
        if busy > 0.0 {
            self.draft_seconds / busy
        } else {
            0.0
        }
    }

    /// The counts of the drafter named `name`, if it proposed a round.
    pub fn drafter(&self, name: &str) -> Option<&DrafterStats> {
        self.by_drafter.iter().find(|d| d.name == name)
    }

    /// Acceptance rate at each draft position.
    pub fn acceptance_by_position(&self) -> Vec<f64> {
        self.offered_at
            .iter()
            .zip(&self.accepted_at)
            .map(|(&o, &a)| a as f64 / o.max(1) as f64)
            .collect()
    }

    /// Tokens per target pass after the prefill: every verify round and plain step
    /// emits the target's own token, and a round its accepted drafts too. Plain decoding
    /// makes 1; it does not depend on timing.
    pub fn tokens_per_pass(&self) -> f64 {
        let passes = self.rounds + self.plain_steps;
        if passes == 0 {
            return 0.0;
        }
        (self.accepted + passes) as f64 / passes as f64
    }

    /// Tokens per verify round (accepted drafts plus the target's own token).
    pub fn tokens_per_round(&self) -> f64 {
        if self.rounds == 0 {
            return 0.0;
        }
        (self.accepted + self.rounds) as f64 / self.rounds as f64
    }
}

#[cfg(test)]
mod tests {
    use super::Stats;

    #[test]
    fn rounds_add_up_by_position() {
        let mut s = Stats::default();
        assert_eq!(s.tokens_per_round(), 0.0);
        s.record_round("lookup", 3, 3);
        s.record_round("dflash", 3, 1);
        s.record_round("dflash", 2, 0);
        s.record_round("lookup", 4, 2);
        assert_eq!((s.rounds, s.drafted, s.accepted), (4, 12, 6));
        // By drafter, in the order each first proposed; the sums are the totals.
        let names: Vec<_> = s.by_drafter.iter().map(|d| d.name).collect();
        assert_eq!(names, ["lookup", "dflash"]);
        let l = s.drafter("lookup").unwrap();
        assert_eq!((l.rounds, l.drafted, l.accepted), (2, 7, 5));
        let d = s.drafter("dflash").unwrap();
        assert_eq!((d.rounds, d.drafted, d.accepted), (2, 5, 1));
        assert_eq!(l.tokens_per_round(), 3.5);
        assert_eq!(d.tokens_per_round(), 1.5);
        assert_eq!(d.acceptance(), 0.2);
        assert!(s.drafter("oracle").is_none());
        assert_eq!(s.accepted_per_round, vec![3, 1, 0, 2]);
        assert_eq!(s.offered_at, vec![4, 4, 3, 1]);
        assert_eq!(s.accepted_at, vec![3, 2, 1, 0]);
        assert_eq!(s.acceptance_by_position(), vec![0.75, 0.5, 1.0 / 3.0, 0.0]);
        // (6 accepted + 4 own tokens) / 4 rounds.
        assert_eq!(s.tokens_per_round(), 2.5);
        // Two plain steps more: (6 + 6) / 6 passes.
        assert_eq!(s.tokens_per_pass(), 2.5);
        s.plain_steps = 2;
        assert_eq!(s.tokens_per_pass(), 2.0);
    }

    #[test]
    fn k_histogram_and_draft_share() {
        let mut s = Stats::default();
        assert_eq!(s.draft_share(), 0.0);
        for k in [0, 3, 3, 0, 1, 0] {
            s.record_k(k);
        }
        assert_eq!(s.k_histogram, vec![3, 1, 0, 2]);
        s.target_seconds = 3.0;
        s.draft_seconds = 0.5;
        s.sampling_seconds = 0.5;
        assert_eq!(s.draft_share(), 0.125);
    }
}
