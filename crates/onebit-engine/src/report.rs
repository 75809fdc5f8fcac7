//! The speculative statistics as JSON and as one terminal line (shared by `run`,
//! `bench` and the server's logs).

use serde_json::json;

/// Rounds, drafted and accepted tokens by drafter, as a JSON object keyed by the
/// drafter's name (`{"lookup": {"rounds": .., "drafted": .., "accepted": ..,
/// "tokens_per_round": ..}, "dflash": {..}}`).
pub fn drafters_json(s: &mtp::Stats) -> serde_json::Value {
    s.by_drafter
        .iter()
        .map(|d| {
            (
                d.name.to_string(),
                json!({
                    "rounds": d.rounds,
                    "drafted": d.drafted,
                    "accepted": d.accepted,
                    "tokens_per_round": d.tokens_per_round(),
                }),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The statistics as JSON.
pub fn stats_json(s: &mtp::Stats) -> serde_json::Value {
    let passes: Vec<_> = s
        .pass_costs
        .points()
        .iter()
        .map(|&(rows, secs)| json!({"rows": rows, "ms": secs * 1e3}))
        .collect();
    json!({
        "k_histogram": s.k_histogram,
        "probes": s.probes,
        "shadow_probes": s.shadow_probes,
        "draft_share": s.draft_share(),
        "pass_costs": passes,
        "rounds": s.rounds,
        "plain_steps": s.plain_steps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "accepted_per_round": s.accepted_per_round,
        "acceptance_by_position": s.acceptance_by_position(),
        "tokens_per_round": s.tokens_per_round(),
        "tokens_per_pass": s.tokens_per_pass(),
        "drafters": drafters_json(s),
        "seconds": {"target": s.target_seconds, "draft": s.draft_seconds, "sampling": s.sampling_seconds},
    })
}

/// One line of speculative statistics for a terminal.
pub fn stats_line(s: &mtp::Stats) -> String {
    let by_pos: Vec<String> = s
        .acceptance_by_position()
        .iter()
        .map(|a| format!("{:.0}%", a * 100.0))
        .collect();
    let hist: Vec<String> = s
        .k_histogram
        .iter()
        .enumerate()
        .filter(|&(_, &n)| n > 0)
        .map(|(k, n)| format!("{k}:{n}"))
        .collect();
    // By drafter, when several shared the rounds.
    let drafters = if s.by_drafter.len() > 1 {
        let each: Vec<String> = s
            .by_drafter
            .iter()
            .map(|d| {
                format!(
                    "{} {}/{} in {} rounds ({:.2} tokens/round)",
                    d.name,
                    d.accepted,
                    d.drafted,
                    d.rounds,
                    d.tokens_per_round()
                )
            })
            .collect();
        format!(" | by drafter: {}", each.join(", "))
    } else {
        String::new()
    };
    format!(
        "{} rounds, {} plain steps, {}/{} drafts accepted, {:.2} tokens/round, acceptance by position {}{drafters} | k chosen {} ({} probes, {} shadow) | time: target {:.2} s, draft {:.3} s ({:.1}%), sampling {:.3} s",
        s.rounds,
        s.plain_steps,
        s.accepted,
        s.drafted,
        s.tokens_per_round(),
        by_pos.join(" "),
        hist.join(" "),
        s.probes,
        s.shadow_probes,
        s.target_seconds,
        s.draft_seconds,
        100.0 * s.draft_share(),
        s.sampling_seconds
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rounds of lookup (4 of 4, 0 of 2 accepted) and one of the DFlash draft
    /// (1 of 3).
    fn chained() -> mtp::Stats {
        mtp::Stats {
            rounds: 3,
            drafted: 9,
            accepted: 5,
            by_drafter: vec![
                mtp::DrafterStats {
                    name: "lookup",
                    rounds: 2,
                    drafted: 6,
                    accepted: 4,
                },
                mtp::DrafterStats {
                    name: "dflash",
                    rounds: 1,
                    drafted: 3,
                    accepted: 1,
                },
            ],
            ..mtp::Stats::default()
        }
    }

    #[test]
    fn drafters_are_reported_by_name() {
        let s = chained();
        let j = stats_json(&s);
        let l = &j["drafters"]["lookup"];
        assert_eq!(
            (
                l["rounds"].as_u64(),
                l["drafted"].as_u64(),
                l["accepted"].as_u64()
            ),
            (Some(2), Some(6), Some(4))
        );
        assert_eq!(l["tokens_per_round"], 3.0);
        let d = &j["drafters"]["dflash"];
        assert_eq!(
            (
                d["rounds"].as_u64(),
                d["drafted"].as_u64(),
                d["accepted"].as_u64()
            ),
            (Some(1), Some(3), Some(1))
        );
        let line = stats_line(&s);
        assert!(
            line.contains("by drafter: lookup 4/6 in 2 rounds (3.00 tokens/round), dflash 1/3 in 1 rounds (2.00 tokens/round)"),
            "{line}"
        );
        // One drafter: the totals say it all.
        let mut one = mtp::Stats::default();
        one.by_drafter.push(mtp::DrafterStats {
            name: "dflash",
            rounds: 1,
            drafted: 3,
            accepted: 2,
        });
        assert!(!stats_line(&one).contains("by drafter"));
        assert_eq!(stats_json(&one)["drafters"]["dflash"]["accepted"], 2);
    }
}
