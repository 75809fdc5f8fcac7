//! `OracleHead`: a drafter that knows the target's own continuation (computed first by
//! plain decoding) and drafts from it under a pick rule. It isolates the engine's round
//! cost from draft quality: with `Always` every draft is accepted.

use crate::head::DraftHead;

/// Which drafts the oracle gets right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OracleRule {
    /// Every draft is the target's token.
    Always,
    /// Drafts at every third absolute position are wrong.
    EveryThirdWrong,
    /// Every draft is wrong.
    Never,
}

impl OracleRule {
    /// Parses `always`, `every-third`, `never`.
    pub fn parse(s: &str) -> Option<OracleRule> {
        match s {
            "always" => Some(OracleRule::Always),
            "every-third" => Some(OracleRule::EveryThirdWrong),
            "never" => Some(OracleRule::Never),
            _ => None,
        }
    }
}

/// Drafts the known stream (`prompt + continuation`) from `pos` on.
pub struct OracleHead {
    stream: Vec<u32>,
    vocab: u32,
    rule: OracleRule,
}

impl OracleHead {
    /// `stream` is the prompt followed by the target's greedy continuation.
    pub fn new(stream: Vec<u32>, vocab: usize, rule: OracleRule) -> OracleHead {
        OracleHead {
            stream,
            vocab: vocab as u32,
            rule,
        }
    }
}

impl DraftHead for OracleHead {
    fn needs_last_hidden(&self) -> bool {
        false
    }

    fn draft(&mut self, pos: usize, _last_token: u32, k: usize) -> Option<Vec<u32>> {
        let known = self.stream.get(pos..)?;
        Some(
            known
                .iter()
                .take(k)
                .enumerate()
                .map(|(i, &t)| {
                    let wrong = match self.rule {
                        OracleRule::Always => false,
                        OracleRule::EveryThirdWrong => (pos + i).is_multiple_of(3),
                        OracleRule::Never => true,
                    };
                    if wrong {
                        (t + 1) % self.vocab
                    } else {
                        t
                    }
                })
                .collect(),
        )
    }

    fn commit_rows(&mut self, _m: usize) {}

    fn reset(&mut self) {}

    fn error(&self) -> Option<String> {
        None
    }

    fn proposer(&self) -> &'static str {
        "oracle"
    }
}

#[cfg(test)]
mod tests {
    use super::{OracleHead, OracleRule};
    use crate::head::DraftHead;

    #[test]
    fn rules_parse_by_name() {
        assert_eq!(OracleRule::parse("always"), Some(OracleRule::Always));
        assert_eq!(
            OracleRule::parse("every-third"),
            Some(OracleRule::EveryThirdWrong)
        );
        assert_eq!(OracleRule::parse("never"), Some(OracleRule::Never));
        assert_eq!(OracleRule::parse("sometimes"), None);
    }

    #[test]
    fn drafts_follow_the_stream_under_the_rule() {
        // Stream positions 0..10 hold tokens 10..20; vocabulary 20 (so 19 + 1 wraps to 0).
        let stream: Vec<u32> = (10..20).collect();
        let mut always = OracleHead::new(stream.clone(), 20, OracleRule::Always);
        assert!(!always.needs_last_hidden());
        assert_eq!(always.draft(4, 0, 3), Some(vec![14, 15, 16]));
        assert_eq!(always.draft(8, 0, 5), Some(vec![18, 19]), "the stream ends");
        assert_eq!(always.draft(11, 0, 2), None, "past the stream");
        assert_eq!(always.error(), None);
        // Wrong at absolute positions 6 and 9: the token plus one, modulo the vocabulary.
        let mut third = OracleHead::new(stream.clone(), 20, OracleRule::EveryThirdWrong);
        assert_eq!(third.draft(5, 0, 5), Some(vec![15, 17, 17, 18, 0]));
        let mut never = OracleHead::new(stream, 20, OracleRule::Never);
        assert_eq!(never.draft(7, 0, 3), Some(vec![18, 19, 0]));
    }
}
