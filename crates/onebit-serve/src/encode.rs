//! Response shapes: OpenAI's chunks and usage, llama-server's timings, Ollama's lines and
//! statistics, log-probabilities in each API's shape, times, and the SSE and NDJSON
//! framing.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use onebit_engine::{Completion, Engine, StopReason, TokenLogprob};
use serde_json::{json, Value};

use crate::generate::Meta;
use crate::request::{Job, Route};

pub(crate) fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

/// One Ollama object: a piece of the answer, or (with `done`) the whole of it.
pub(crate) fn ollama_line(job: &Job, meta: &Meta, text: &str, done: bool) -> Value {
    let mut v = json!({"model": meta.model, "created_at": now_rfc3339()});
    if job.route == Route::OllamaChat {
        v["message"] = json!({"role": "assistant", "content": text});
    } else {
        v["response"] = json!(text);
    }
    v["done"] = json!(done);
    v
}

/// One streamed OpenAI chunk.
pub(crate) fn openai_chunk(
    job: &Job,
    meta: &Meta,
    text: Option<&str>,
    role: bool,
    finish: Option<&str>,
    logprobs: Option<Value>,
) -> Value {
    let choice = if job.route == Route::Chat {
        let mut delta = json!({});
        if role {
            delta["role"] = json!("assistant");
        }
        if let Some(t) = text {
            delta["content"] = json!(t);
        }
        json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
    } else {
        json!({"text": text.unwrap_or(""), "index": 0, "logprobs": logprobs, "finish_reason": finish})
    };
    let mut v = json!({
        "id": meta.id,
        "object": if job.route == Route::Chat { "chat.completion.chunk" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "seed": meta.seed,
    });
    if job.include_usage {
        v["usage"] = Value::Null;
    }
    v
}

pub(crate) fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

pub(crate) fn ndjson(v: &Value) -> Bytes {
    Bytes::from(format!("{v}\n"))
}

/// A token as logprobs answers show it: its bytes as text (lossy: a token holding part of
/// a UTF-8 sequence shows U+FFFD; `bytes` carries the truth) and the bytes.
pub(crate) fn token_text(engine: &Engine, id: u32) -> (String, Vec<u8>) {
    let bytes = engine.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// One entry of OpenAI's chat `logprobs.content` (also Ollama's `logprobs`).
pub(crate) fn chat_entry(engine: &Engine, lp: &TokenLogprob) -> Value {
    let (token, bytes) = token_text(engine, lp.token);
    let top: Vec<Value> = lp
        .top
        .iter()
        .map(|&(id, logprob)| {
            let (token, bytes) = token_text(engine, id);
            json!({"token": token, "logprob": logprob, "bytes": bytes})
        })
        .collect();
    json!({"token": token, "logprob": lp.logprob, "bytes": bytes, "top_logprobs": top})
}

/// The entries of OpenAI's chat `logprobs.content` (and Ollama's `logprobs`).
pub(crate) fn chat_entries(engine: &Engine, lps: &[TokenLogprob]) -> Vec<Value> {
    lps.iter().map(|lp| chat_entry(engine, lp)).collect()
}

/// `/v1/completions`' legacy `logprobs` object over `(token, logprob)` pairs (`None`:
/// the prompt's first token, which nothing predicts: null). `offset` is the character
/// offset of the first token's text in the answer's `text`, advanced past the last.
pub(crate) fn legacy_logprobs(
    engine: &Engine,
    entries: &[(u32, Option<&TokenLogprob>)],
    offset: &mut usize,
) -> Value {
    let (mut tokens, mut logprobs, mut tops, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &(id, lp) in entries {
        let (text, _) = token_text(engine, id);
        offsets.push(*offset);
        *offset = offset.saturating_add(text.chars().count());
        tokens.push(text);
        match lp {
            None => {
                logprobs.push(Value::Null);
                tops.push(Value::Null);
            }
            Some(lp) => {
                logprobs.push(json!(lp.logprob));
                let mut top = serde_json::Map::new();
                for &(alt, v) in &lp.top {
                    top.entry(token_text(engine, alt).0).or_insert(json!(v));
                }
                tops.push(Value::Object(top));
            }
        }
    }
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
}

/// Seconds since the epoch.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// RFC 3339 UTC time of `secs` since the epoch, with `nanos`.
pub(crate) fn rfc3339(secs: u64, nanos: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The current time in RFC 3339.
pub(crate) fn now_rfc3339() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_nanos())
}

/// OpenAI's finish reason.
pub(crate) fn finish_reason(stop: &StopReason) -> &'static str {
    match stop {
        StopReason::Length => "length",
        _ => "stop",
    }
}

/// `usage`, with FastFlowLM's telemetry fields beside OpenAI's.
pub(crate) fn usage(c: &Completion) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.tokens.len(),
        "total_tokens": c.prompt_tokens + c.tokens.len(),
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
        "prefill_duration_ttft": c.timings.prompt_ms / 1e3,
        "decoding_duration": c.timings.predicted_ms / 1e3,
        "prefill_speed_tps": c.prompt_tokens_per_second(),
        "decoding_speed_tps": c.decode_tokens_per_second(),
    })
}

/// llama-server's `timings`.
pub(crate) fn timings(c: &Completion) -> Value {
    let prompt_n = c.prompt_tokens - c.cached_tokens;
    let predicted_n = c.tokens.len();
    let mut t = json!({
        "cache_n": c.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": c.timings.prompt_ms,
        "prompt_per_token_ms": c.timings.prompt_ms / prompt_n.max(1) as f64,
        "prompt_per_second": c.prompt_tokens_per_second(),
        "predicted_n": predicted_n,
        "predicted_ms": c.timings.predicted_ms,
        "predicted_per_token_ms": c.timings.predicted_ms / predicted_n.saturating_sub(1).max(1) as f64,
        "predicted_per_second": c.decode_tokens_per_second(),
    });
    if c.drafted {
        t["draft_n"] = json!(c.stats.drafted);
        t["draft_n_accepted"] = json!(c.stats.accepted);
        t["drafters"] = drafters(c);
    }
    t
}

/// The drafting counters by drafter (onebit's extension next to `draft_n`): `{"lookup":
/// {"rounds": .., "draft_n": .., "draft_n_accepted": ..}, "dflash": {..}}`, one entry
/// for a single drafter, two when lookup and a DFlash draft are chained.
fn drafters(c: &Completion) -> Value {
    c.stats
        .by_drafter
        .iter()
        .map(|d| {
            (
                d.name.to_string(),
                json!({"rounds": d.rounds, "draft_n": d.drafted, "draft_n_accepted": d.accepted}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Ollama's closing statistics (durations in nanoseconds).
pub(crate) fn ollama_stats(c: &Completion, load_seconds: f64) -> Value {
    let ns = |ms: f64| (ms * 1e6) as u64;
    let mut v = json!({
        "done_reason": match c.stop { StopReason::Length => "length", _ => "stop" },
        "total_duration": ns(c.timings.prompt_ms + c.timings.predicted_ms),
        "load_duration": (load_seconds * 1e9) as u64,
        "prompt_eval_count": c.prompt_tokens,
        "prompt_eval_duration": ns(c.timings.prompt_ms),
        "eval_count": c.tokens.len(),
        "eval_duration": ns(c.timings.predicted_ms),
    });
    // The speculative counters, named as in llama-server's `timings`.
    if c.drafted {
        v["draft_n"] = json!(c.stats.drafted);
        v["draft_n_accepted"] = json!(c.stats.accepted);
        v["drafters"] = drafters(c);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chained run's counters by drafter, in `timings` and Ollama's closing object.
    #[test]
    fn drafters_are_reported_by_name() {
        let mut stats = onebit_engine::Stats {
            rounds: 3,
            drafted: 9,
            accepted: 5,
            ..onebit_engine::Stats::default()
        };
        stats.by_drafter = vec![
            onebit_engine::DrafterStats {
                name: "lookup",
                rounds: 2,
                drafted: 6,
                accepted: 4,
            },
            onebit_engine::DrafterStats {
                name: "dflash",
                rounds: 1,
                drafted: 3,
                accepted: 1,
            },
        ];
        let c = Completion {
            prompt_tokens: 4,
            cached_tokens: 0,
            tokens: vec![1, 2, 3, 4, 5, 6, 7, 8],
            text: String::new(),
            stop: StopReason::Length,
            timings: onebit_engine::Timings::default(),
            stats,
            drafted: true,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
        };
        let want = json!({
            "lookup": {"rounds": 2, "draft_n": 6, "draft_n_accepted": 4},
            "dflash": {"rounds": 1, "draft_n": 3, "draft_n_accepted": 1},
        });
        let t = timings(&c);
        assert_eq!(t["drafters"], want, "{t}");
        assert_eq!(
            (t["draft_n"].as_u64(), t["draft_n_accepted"].as_u64()),
            (Some(9), Some(5))
        );
        let o = ollama_stats(&c, 0.0);
        assert_eq!(o["drafters"], want, "{o}");
        // Plain decoding: no drafting counters at all.
        let plain = Completion {
            drafted: false,
            stats: onebit_engine::Stats::default(),
            ..c
        };
        assert!(timings(&plain).get("drafters").is_none());
        assert!(ollama_stats(&plain, 0.0).get("drafters").is_none());
    }

    #[test]
    fn rfc3339_matches_known_dates() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.000000005Z");
        assert_eq!(rfc3339(1_764_601_200, 0), "2025-12-01T15:00:00.000000000Z");
    }
}
