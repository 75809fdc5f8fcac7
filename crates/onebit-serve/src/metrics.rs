//! `GET /metrics`: the server's counters in Prometheus' text format (version 0.0.4).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use onebit_engine::Completion;

/// Counters kept while the server runs.
#[derive(Default)]
pub(crate) struct Metrics {
    /// Answers by route (the router's pattern, or `unmatched`) and status.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    drafted_tokens: AtomicU64,
    accepted_tokens: AtomicU64,
}

/// What the exposition reads at the moment of a scrape, besides the counters.
pub(crate) struct Gauges {
    /// Requests waiting for a session.
    pub queue_depth: usize,
    /// Sessions generating.
    pub active_sessions: usize,
    /// Sessions in all (`--parallel`; 0 while the model loads).
    pub sessions: usize,
    /// Whether the model is loaded.
    pub ready: bool,
    /// The shared passes' counters (`None` when sessions run their own passes).
    pub batch: Option<onebit_engine::BatchStats>,
    /// Sessions generating in the shared passes now.
    pub batch_members: usize,
}

impl Metrics {
    /// One answer of `route` with `status`.
    pub fn answered(&self, route: &str, status: u16) {
        let mut requests = self.requests.lock().expect("metrics lock poisoned");
        *requests.entry((route.to_string(), status)).or_default() += 1;
    }

    /// The tokens of one finished (or cancelled) generation.
    pub fn generated(&self, c: &Completion) {
        let add = |counter: &AtomicU64, n: usize| {
            counter.fetch_add(n as u64, Ordering::Relaxed);
        };
        add(&self.prompt_tokens, c.prompt_tokens);
        add(&self.cached_tokens, c.cached_tokens);
        add(&self.generated_tokens, c.tokens.len());
        add(&self.drafted_tokens, c.stats.drafted);
        add(&self.accepted_tokens, c.stats.accepted);
    }

    /// The exposition.
    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::new();
        let name = "onebit_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} Answered requests by route and HTTP status.\n# TYPE {name} counter"
        );
        for ((route, status), n) in self.requests.lock().expect("metrics lock poisoned").iter() {
            let _ = writeln!(
                out,
                "{name}{{route=\"{}\",status=\"{status}\"}} {n}",
                escape(route)
            );
        }
        let counters = [
            (
                "onebit_prompt_tokens_total",
                "Prompt tokens of finished generations (cached ones included).",
                &self.prompt_tokens,
            ),
            (
                "onebit_prompt_tokens_cached_total",
                "Prompt tokens a session already held (not run again).",
                &self.cached_tokens,
            ),
            (
                "onebit_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
            (
                "onebit_draft_tokens_total",
                "Draft tokens proposed for verification.",
                &self.drafted_tokens,
            ),
            (
                "onebit_draft_tokens_accepted_total",
                "Draft tokens the target accepted.",
                &self.accepted_tokens,
            ),
        ];
        for (name, help, counter) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                counter.load(Ordering::Relaxed)
            );
        }
        let levels = [
            (
                "onebit_queue_depth",
                "Requests waiting for a free session.",
                gauges.queue_depth,
            ),
            (
                "onebit_sessions_active",
                "Sessions generating.",
                gauges.active_sessions,
            ),
            (
                "onebit_sessions",
                "Sessions in all (--parallel).",
                gauges.sessions,
            ),
            (
                "onebit_model_loaded",
                "1 once the model is loaded and requests are served.",
                usize::from(gauges.ready),
            ),
        ];
        for (name, help, value) in levels {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        if let Some(batch) = gauges.batch {
            let name = "onebit_shared_pass_members";
            let _ = writeln!(
                out,
                "# HELP {name} Sessions whose next rows the shared passes wait for.\n# TYPE {name} gauge\n{name} {}",
                gauges.batch_members
            );
            let shared = [
                (
                    "onebit_shared_passes_total",
                    "Passes run for the generating sessions together.",
                    batch.passes,
                ),
                (
                    "onebit_shared_pass_sessions_total",
                    "Sessions in those passes (over passes: sessions per pass).",
                    batch.parts,
                ),
                (
                    "onebit_shared_pass_rows_total",
                    "Rows in those passes (over passes: rows per pass).",
                    batch.rows,
                ),
            ];
            for (name, help, value) in shared {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
                );
            }
        }
        out
    }
}

/// A label value escaped as the text format requires (backslash, quote, newline).
pub(crate) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_help_type_and_samples() {
        let m = Metrics::default();
        m.answered("/v1/chat/completions", 200);
        m.answered("/v1/chat/completions", 200);
        m.answered("/v1/chat/completions", 400);
        m.answered("a\"b", 404);
        let text = m.render(&Gauges {
            queue_depth: 2,
            active_sessions: 1,
            sessions: 1,
            ready: true,
            batch: Some(onebit_engine::BatchStats {
                passes: 3,
                parts: 5,
                rows: 9,
                widest: 2,
            }),
            batch_members: 1,
        });
        for line in [
            "# TYPE onebit_requests_total counter",
            "onebit_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2",
            "onebit_requests_total{route=\"/v1/chat/completions\",status=\"400\"} 1",
            "onebit_requests_total{route=\"a\\\"b\",status=\"404\"} 1",
            "onebit_generated_tokens_total 0",
            "# TYPE onebit_queue_depth gauge",
            "onebit_queue_depth 2",
            "onebit_sessions_active 1",
            "onebit_shared_passes_total 3",
            "onebit_shared_pass_rows_total 9",
            "onebit_shared_pass_members 1",
            "onebit_model_loaded 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
        assert!(text.ends_with('\n'));
    }
}
