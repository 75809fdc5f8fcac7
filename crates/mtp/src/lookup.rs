//! `LookupHead`: prompt-lookup drafting. No model: the drafts are the tokens that
//! followed the most recent earlier occurrence of the longest suffix n-gram of the
//! committed stream (prompt + output), n from `max_ngram` down to 1.
//!
//! An index per n maps an n-gram to the position of the token that followed its most
//! recent occurrence. It grows by one entry per n with every committed token (the
//! n-grams ending just before it), so a lookup is `max_ngram` hash probes, never a
//! rescan of the history. The n-gram ending at the last token is not indexed until
//! its follower arrives: a lookup of the current suffix finds an *earlier* occurrence.
//!
//! Drafts are deterministic, so sampling verification uses the exact-match rule and
//! keeps the target's distribution.

use std::collections::HashMap;

use crate::head::DraftHead;

/// The default longest n-gram.
pub const DEFAULT_MAX_NGRAM: usize = 4;

/// A prompt-lookup drafter.
#[derive(Clone, Debug)]
pub struct LookupHead {
    max_ngram: usize,
    history: Vec<u32>,
    /// `[n - 1]`: n-gram hash → position of the token after its latest occurrence.
    index: Vec<HashMap<u64, usize>>,
    /// Length of the n-gram the last proposal matched (0: none).
    matched: usize,
    error: Option<String>,
}

/// A hash of an n-gram (verified against the history on lookup, so a collision costs
/// a missed draft, never a wrong match).
fn ngram_hash(tokens: &[u32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ tokens.len() as u64;
    for &t in tokens {
        h = (h ^ t as u64).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    h
}

impl LookupHead {
    /// A drafter matching suffixes of up to `max_ngram` tokens (at least 1).
    pub fn new(max_ngram: usize) -> LookupHead {
        let max_ngram = max_ngram.max(1);
        LookupHead {
            max_ngram,
            history: Vec::new(),
            index: vec![HashMap::new(); max_ngram],
            matched: 0,
            error: None,
        }
    }

    /// The longest n-gram matched.
    pub fn max_ngram(&self) -> usize {
        self.max_ngram
    }

    /// The committed stream seen so far.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Length of the suffix n-gram the last proposal came from (0: no match).
    pub fn last_match(&self) -> usize {
        self.matched
    }

    /// Appends one committed token, indexing the n-grams it follows.
    pub fn push(&mut self, token: u32) {
        let at = self.history.len();
        for n in 1..=self.max_ngram.min(at) {
            let key = ngram_hash(&self.history[at - n..at]);
            self.index[n - 1].insert(key, at);
        }
        self.history.push(token);
    }

    /// Up to `k` tokens continuing the history: what followed the most recent earlier
    /// occurrence of the longest matching suffix. A continuation that runs into the
    /// suffix itself keeps copying from the drafts (a repeating pattern repeats).
    pub fn propose(&mut self, k: usize) -> Vec<u32> {
        self.matched = 0;
        let len = self.history.len();
        if k == 0 {
            return Vec::new();
        }
        for n in (1..=self.max_ngram.min(len)).rev() {
            let suffix = &self.history[len - n..];
            let Some(&follow) = self.index[n - 1].get(&ngram_hash(suffix)) else {
                continue;
            };
            if self.history[follow - n..follow] != *suffix {
                continue; // a hash collision
            }
            self.matched = n;
            let mut drafts = Vec::with_capacity(k);
            for j in 0..k {
                let at = follow + j;
                let t = if at < len {
                    self.history[at]
                } else {
                    drafts[at - len]
                };
                drafts.push(t);
            }
            return drafts;
        }
        Vec::new()
    }
}

impl DraftHead for LookupHead {
    fn needs_last_hidden(&self) -> bool {
        false
    }

    fn draft(&mut self, pos: usize, last_token: u32, k: usize) -> Option<Vec<u32>> {
        self.error = None;
        if pos != self.history.len() || self.history.last() != Some(&last_token) {
            self.error = Some(format!(
                "lookup: drafting at position {pos} after token {last_token}, but the history holds {} tokens ending {:?}",
                self.history.len(),
                self.history.last()
            ));
            return None;
        }
        Some(self.propose(k))
    }

    fn commit_rows(&mut self, _m: usize) {}

    fn reset(&mut self) {
        self.history.clear();
        self.index.iter_mut().for_each(HashMap::clear);
        self.matched = 0;
        self.error = None;
    }

    fn error(&self) -> Option<String> {
        self.error.clone()
    }

    fn observe_tokens(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.push(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LookupHead;
    use crate::head::DraftHead;

    fn head(history: &[u32], n: usize) -> LookupHead {
        let mut h = LookupHead::new(n);
        h.observe_tokens(history);
        h
    }

    /// A textbook prompt lookup: scan every earlier start for the longest suffix.
    fn rescan(history: &[u32], max_n: usize, k: usize) -> Vec<u32> {
        let len = history.len();
        for n in (1..=max_n.min(len)).rev() {
            let suffix = &history[len - n..];
            // Latest earlier occurrence: starts s < len - n, so its follower s + n < len.
            for s in (0..len - n).rev() {
                if &history[s..s + n] == suffix {
                    let mut out = history.to_vec();
                    for j in 0..k {
                        out.push(out[s + n + j]);
                    }
                    return out[len..].to_vec();
                }
            }
        }
        Vec::new()
    }

    #[test]
    fn proposes_what_followed_the_latest_longest_match() {
        // "5 6 7" occurred at 1..4 followed by 8 9; "6 7" also at 6..8 followed by 1.
        let h = &[4, 5, 6, 7, 8, 9, 6, 7, 1, 2, 5, 6, 7];
        let mut lh = head(h, 4);
        assert_eq!(lh.propose(3), vec![8, 9, 6]);
        assert_eq!(lh.last_match(), 3);
        // With trigrams off, the latest "6 7" wins.
        let mut bigram = head(h, 2);
        assert_eq!(bigram.propose(3), vec![1, 2, 5]);
        assert_eq!(bigram.last_match(), 2);
        // No earlier occurrence of the last token: nothing.
        let mut none = head(&[1, 2, 3], 4);
        assert_eq!(none.propose(4), Vec::<u32>::new());
        assert_eq!(none.last_match(), 0);
        assert_eq!(lh.propose(0), Vec::<u32>::new());
    }

    #[test]
    fn a_repeating_pattern_repeats_past_the_end() {
        let mut lh = head(&[3, 1, 2, 1, 2], 4);
        // "1 2" last occurred at 1..3, followed by "1 2" (the suffix itself), then the drafts.
        assert_eq!(lh.propose(5), vec![1, 2, 1, 2, 1]);
    }

    #[test]
    fn incremental_index_equals_a_rescan() {
        // A pseudo-random stream over a small alphabet: many matches of every length.
        let mut state = 12345u64;
        let mut lh = LookupHead::new(4);
        let mut history = Vec::new();
        for step in 0..600 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            let t = ((state >> 33) % 5) as u32;
            lh.observe_tokens(&[t]);
            history.push(t);
            let k = 1 + step % 6;
            assert_eq!(lh.propose(k), rescan(&history, 4, k), "step {step}");
        }
    }

    #[test]
    fn drafting_follows_the_position_rule() {
        let mut lh = head(&[7, 8, 9, 7, 8], 4);
        assert_eq!(lh.draft(5, 8, 2), Some(vec![9, 7]));
        assert_eq!(lh.error(), None);
        assert_eq!(lh.draft(6, 8, 2), None, "the history holds 5 tokens");
        assert!(lh.error().unwrap().contains("position 6"));
        assert_eq!(lh.draft(5, 3, 2), None, "the last token differs");
        lh.reset();
        assert!(lh.history().is_empty());
        assert_eq!(lh.draft(0, 0, 2), None);
        lh.observe_tokens(&[1, 1]);
        assert_eq!(lh.draft(2, 1, 3), Some(vec![1, 1, 1]));
    }
}
