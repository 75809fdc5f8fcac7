//! `GET /metrics`: the server's counters in Prometheus' text format (version 0.0.4).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use onebit_engine::Completion;

/// Counters kept while the server runs.
pub(crate) struct Metrics {
    /// Answers by route (the router's pattern, or `unmatched`) and status.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    drafted_tokens: AtomicU64,
    accepted_tokens: AtomicU64,
    /// From a request's arrival to its first token (parsing, queueing and prefill).
    ttft: Histogram,
    /// A request's decode time over its tokens after the first.
    tpot: Histogram,
}

/// A Prometheus histogram: counts per bucket (not cumulative here; the exposition
/// accumulates), the sum and the count of the observations.
pub(crate) struct Histogram {
    /// Upper bounds, increasing (`+Inf` is implied).
    bounds: &'static [f64],
    state: Mutex<HistogramState>,
}

#[derive(Default)]
struct HistogramState {
    /// One per bound, and the last for values above every bound.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            state: Mutex::new(HistogramState {
                counts: vec![0; bounds.len() + 1],
                sum: 0.0,
            }),
        }
    }

    /// One observation (seconds). A bucket's bound is inclusive (`le`).
    pub(crate) fn observe(&self, value: f64) {
        let i = self.bounds.partition_point(|&b| b < value);
        let mut st = self.state.lock().expect("metrics lock poisoned");
        st.counts[i] += 1;
        st.sum += value;
    }

    /// `name_bucket{le=..}` (cumulative, ending `+Inf`), `name_sum`, `name_count`.
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let st = self.state.lock().expect("metrics lock poisoned");
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0u64;
        for (bound, n) in self.bounds.iter().zip(&st.counts) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += st.counts[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", st.sum);
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// Time to first token, seconds: 10 ms to a minute.
const TTFT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Decode time per token, seconds: 1 ms (1000 tok/s) to 1 s.
const TPOT_BOUNDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            requests: Mutex::default(),
            prompt_tokens: AtomicU64::default(),
            cached_tokens: AtomicU64::default(),
            generated_tokens: AtomicU64::default(),
            drafted_tokens: AtomicU64::default(),
            accepted_tokens: AtomicU64::default(),
            ttft: Histogram::new(TTFT_BOUNDS),
            tpot: Histogram::new(TPOT_BOUNDS),
        }
    }
}

/// What the exposition reads at the moment of a scrape, besides the counters (the
/// default: a model not loaded).
#[derive(Default)]
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
    /// Bytes the idle sessions' KV caches have allocated (`None`: fixed buffers).
    pub idle_kv_bytes: Option<usize>,
}

impl Gauges {
    /// The gauges of several models as one server's: counts added, `ready` when any
    /// model is loaded, the shared passes' counters added (the widest pass the widest
    /// of any).
    pub fn sum(all: impl IntoIterator<Item = Gauges>) -> Gauges {
        let mut total = Gauges::default();
        for g in all {
            total.queue_depth += g.queue_depth;
            total.active_sessions += g.active_sessions;
            total.sessions += g.sessions;
            total.ready |= g.ready;
            total.batch_members += g.batch_members;
            if let Some(bytes) = g.idle_kv_bytes {
                total.idle_kv_bytes = Some(total.idle_kv_bytes.unwrap_or(0) + bytes);
            }
            if let Some(b) = g.batch {
                let mut t = total.batch.unwrap_or_default();
                t.passes += b.passes;
                t.parts += b.parts;
                t.rows += b.rows;
                t.widest = t.widest.max(b.widest);
                total.batch = Some(t);
            }
        }
        total
    }
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
        // Decode time per token: over the tokens after the first (which the prefill's
        // pass gives), so a request of one token has none.
        if c.tokens.len() >= 2 {
            self.tpot
                .observe(c.timings.predicted_ms / 1e3 / (c.tokens.len() - 1) as f64);
        }
    }

    /// A request's first token came `seconds` after it arrived.
    pub fn first_token(&self, seconds: f64) {
        self.ttft.observe(seconds);
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
        self.ttft.render(
            &mut out,
            "onebit_time_to_first_token_seconds",
            "From a request's arrival to its first token (parsing, queueing, prefill).",
        );
        self.tpot.render(
            &mut out,
            "onebit_time_per_output_token_seconds",
            "A request's decode time over its tokens after the first (one observation per request of 2 tokens or more).",
        );
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
        if let Some(bytes) = gauges.idle_kv_bytes {
            let name = "onebit_kv_cache_idle_bytes";
            let _ = writeln!(
                out,
                "# HELP {name} Bytes the idle sessions' KV caches hold allocated (freed by keep_alive).\n# TYPE {name} gauge\n{name} {bytes}"
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
            idle_kv_bytes: Some(4096),
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
            "onebit_kv_cache_idle_bytes 4096",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn histograms_are_cumulative_with_inclusive_bounds() {
        let h = Histogram::new(&[0.25, 1.0]);
        // Binary fractions: the sum is exact.
        for v in [0.125, 0.25, 0.5, 1.0, 7.0] {
            h.observe(v);
        }
        let mut text = String::new();
        h.render(&mut text, "x_seconds", "Help.");
        assert_eq!(
            text,
            "# HELP x_seconds Help.\n# TYPE x_seconds histogram\n\
             x_seconds_bucket{le=\"0.25\"} 2\nx_seconds_bucket{le=\"1\"} 4\n\
             x_seconds_bucket{le=\"+Inf\"} 5\nx_seconds_sum 8.875\nx_seconds_count 5\n"
        );
    }
}
