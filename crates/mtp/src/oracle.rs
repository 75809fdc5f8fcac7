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
}
