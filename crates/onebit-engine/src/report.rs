//! The speculative statistics as JSON and as one terminal line (shared by `run`,
//! `bench` and the server's logs).

use serde_json::json;

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
    format!(
        "{} rounds, {} plain steps, {}/{} drafts accepted, {:.2} tokens/round, acceptance by position {} | k chosen {} ({} probes, {} shadow) | time: target {:.2} s, draft {:.3} s ({:.1}%), sampling {:.3} s",
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
