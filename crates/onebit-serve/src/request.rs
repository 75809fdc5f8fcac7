//! The request bodies the server accepts (OpenAI, Ollama and llama-server shapes),
//! checked into one [`Job`] before any work.

use onebit_engine::{DraftMode, Message, Prompt, SamplingConfig, MAX_TOP_LOGPROBS};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;

/// Parses `bytes` as `T`, refusing malformed JSON and naming the field that does not fit.
pub(crate) fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(v) => de
            .end()
            .map(|()| v)
            .map_err(|e| ApiError::invalid(None, format!("malformed JSON body: {e}"))),
        Err(e) => {
            let inner = e.inner();
            if inner.is_syntax() || inner.is_eof() {
                return Err(ApiError::invalid(
                    None,
                    format!("malformed JSON body: {inner}"),
                ));
            }
            let path = e.path().to_string();
            if path == "." {
                return Err(ApiError::invalid(
                    None,
                    format!("invalid request body: {inner}"),
                ));
            }
            Err(ApiError::invalid(
                Some(&path),
                format!("invalid field '{path}': {inner}"),
            ))
        }
    }
}

/// `stop`: a string or a list of strings.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub(crate) enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    fn list(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

/// Message content: a string, or a list of parts of which the text ones are joined.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug, Clone)]
pub(crate) struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
pub(crate) struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

#[derive(Deserialize, Debug, Default)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/chat/completions` and `POST /v1/completions` (the union of both).
#[derive(Deserialize, Debug, Default)]
pub(crate) struct OpenAiRequest {
    pub model: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub prompt: Option<Value>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u64>,
    /// llama-server's extension: keep going past end-of-sequence.
    pub ignore_eos: Option<bool>,
    // Refused when set to something this server does not do.
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<Value>,
    pub response_format: Option<Value>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Extensions (llama-server's, vLLM's): top-k, min-p and llama.cpp's repeat penalty.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub logit_bias: Option<Value>,
    pub echo: Option<bool>,
    pub best_of: Option<u64>,
    pub suffix: Option<Value>,
    /// onebit's extension: per-request drafting (`{"mode": "auto|off|lookup|draft"}`).
    pub speculative: Option<Speculative>,
}

/// Ollama's `options`.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct OllamaOptions {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub num_predict: Option<i64>,
    /// The context size for this request (at most the server's `--ctx-len`).
    pub num_ctx: Option<i64>,
    pub stop: Option<Vec<String>>,
}

/// `POST /api/chat` and `POST /api/generate` (the union of both).
#[derive(Deserialize, Debug, Default)]
pub(crate) struct OllamaRequest {
    pub model: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub prompt: Option<String>,
    pub system: Option<String>,
    pub stream: Option<bool>,
    pub raw: Option<bool>,
    pub options: Option<OllamaOptions>,
    /// Ollama's log-probabilities of the generated tokens (and `top_logprobs`
    /// alternatives), in the shape of OpenAI's chat `logprobs.content`.
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Value>,
    pub format: Option<Value>,
    /// How long the model stays loaded after the request: a number of seconds or a Go
    /// duration ("5m"); 0 unloads.
    pub keep_alive: Option<Value>,
    /// onebit's extension: per-request drafting (`{"mode": "auto|off|lookup|draft"}`).
    pub speculative: Option<Speculative>,
}

/// The `speculative` extension field.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct Speculative {
    pub mode: Option<String>,
}

/// The drafting a request's `speculative.mode` asks for: `auto` (the server's drafter,
/// the default), `off` (plain decoding), `lookup` or `draft` (one drafter alone). Whether
/// the server has that drafter is checked against the loaded engine.
fn draft_mode(s: Option<Speculative>) -> Result<DraftMode, ApiError> {
    match s.and_then(|s| s.mode).as_deref() {
        None | Some("auto") => Ok(DraftMode::Auto),
        Some("off") => Ok(DraftMode::Off),
        Some("lookup") => Ok(DraftMode::LookupOnly),
        Some("draft") => Ok(DraftMode::DraftOnly),
        Some(other) => Err(ApiError::invalid(
            Some("speculative.mode"),
            format!("'speculative.mode' must be one of auto, off, lookup, draft; got {other:?}"),
        )),
    }
}

/// An Ollama request: a generation, or (no prompt, or no messages) a load or unload.
#[derive(Debug)]
pub(crate) enum OllamaCall {
    Generate(Job),
    Load(LoadCall),
}

/// Ollama's preload (`done_reason: "load"`) or unload (`keep_alive: 0`,
/// `done_reason: "unload"`): nothing is generated.
#[derive(Debug)]
pub(crate) struct LoadCall {
    pub route: Route,
    pub model: Option<String>,
    pub keep_alive: Option<KeepAlive>,
}

/// Ollama's `keep_alive`: how long the KV caches stay once the server is idle (the
/// weights always stay: one model per server).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum KeepAlive {
    /// 0: freed as soon as the request ends (Ollama's unload).
    Unload,
    /// Freed after the server has been idle this long.
    Idle(std::time::Duration),
    /// Negative (or too long to time): kept.
    Forever,
}

/// The `keep_alive` field, when given.
pub(crate) fn keep_alive(v: Option<&Value>) -> Result<Option<KeepAlive>, ApiError> {
    let seconds = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => keep_alive_seconds(v)?,
    };
    Ok(Some(if seconds == 0.0 {
        KeepAlive::Unload
    } else if seconds < 0.0 {
        KeepAlive::Forever
    } else {
        std::time::Duration::try_from_secs_f64(seconds).map_or(KeepAlive::Forever, KeepAlive::Idle)
    }))
}

/// `keep_alive` in seconds: a JSON number of seconds, or a string holding one or a Go
/// duration (`"5m"`, `"1h30m"`, `"-1"`), as Ollama takes it.
pub(crate) fn keep_alive_seconds(v: &Value) -> Result<f64, ApiError> {
    let bad = || {
        ApiError::invalid(
            Some("keep_alive"),
            format!(
                "'keep_alive' must be a number of seconds or a duration such as \"5m\", got {v}"
            ),
        )
    };
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(bad),
        Value::String(s) => {
            let s = s.trim();
            if let Ok(n) = s.parse::<f64>() {
                return if n.is_finite() { Ok(n) } else { Err(bad()) };
            }
            let (sign, mut rest) = match s.strip_prefix('-') {
                Some(r) => (-1.0, r),
                None => (1.0, s.strip_prefix('+').unwrap_or(s)),
            };
            if rest.is_empty() {
                return Err(bad());
            }
            let mut total = 0f64;
            while !rest.is_empty() {
                let digits = rest
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .ok_or_else(bad)?;
                let n: f64 = rest[..digits].parse().map_err(|_| bad())?;
                rest = &rest[digits..];
                let unit = rest
                    .find(|c: char| c.is_ascii_digit() || c == '.')
                    .unwrap_or(rest.len());
                let scale = match &rest[..unit] {
                    "ns" => 1e-9,
                    "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
                    "ms" => 1e-3,
                    "s" => 1.0,
                    "m" => 60.0,
                    "h" => 3600.0,
                    _ => return Err(bad()),
                };
                total += n * scale;
                rest = &rest[unit..];
            }
            if total.is_finite() {
                Ok(sign * total)
            } else {
                Err(bad())
            }
        }
        _ => Err(bad()),
    }
}

/// `POST /api/show`.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct ShowRequest {
    pub model: Option<String>,
    pub name: Option<String>,
}

/// llama-server's `POST /tokenize`.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct TokenizeRequest {
    pub content: Option<String>,
    /// Add the tokenizer's special tokens (BOS); llama-server's default is false.
    pub add_special: Option<bool>,
    /// Special-token text in `content` is always parsed as the special token here.
    pub parse_special: Option<bool>,
    pub with_pieces: Option<bool>,
}

/// llama-server's `POST /detokenize`.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct DetokenizeRequest {
    pub tokens: Option<Vec<Value>>,
}

/// llama-server's `POST /apply-template`.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct ApplyTemplateRequest {
    pub messages: Option<Vec<ChatMessage>>,
}

impl TokenizeRequest {
    /// The text and whether to add special tokens, refusing what this server does not do.
    pub fn check(self) -> Result<(String, bool), ApiError> {
        refuse_set("with_pieces", self.with_pieces == Some(true))?;
        refuse_set("parse_special", self.parse_special == Some(false))?;
        let content = self
            .content
            .ok_or_else(|| ApiError::invalid(Some("content"), "'content' is required"))?;
        Ok((content, self.add_special.unwrap_or(false)))
    }
}

impl DetokenizeRequest {
    /// The token ids (each checked to fit 32 bits; the vocabulary is checked by the caller).
    pub fn check(self) -> Result<Vec<u32>, ApiError> {
        let tokens = self
            .tokens
            .ok_or_else(|| ApiError::invalid(Some("tokens"), "'tokens' is required"))?;
        token_ids(&tokens, "tokens")
    }
}

impl ApplyTemplateRequest {
    /// The messages, checked as a chat request's are.
    pub fn check(self) -> Result<Vec<Message>, ApiError> {
        let list = self
            .messages
            .ok_or_else(|| ApiError::invalid(Some("messages"), "'messages' is required"))?;
        messages(list)
    }
}

/// Which route shaped a job (and so its answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Chat,
    Completions,
    OllamaChat,
    OllamaGenerate,
}

impl Route {
    pub fn path(self) -> &'static str {
        match self {
            Route::Chat => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::OllamaChat => "/api/chat",
            Route::OllamaGenerate => "/api/generate",
        }
    }

    pub fn is_ollama(self) -> bool {
        matches!(self, Route::OllamaChat | Route::OllamaGenerate)
    }
}

/// A checked generation request, whatever route it came from.
#[derive(Debug)]
pub(crate) struct Job {
    pub route: Route,
    pub model: Option<String>,
    pub prompt: Prompt,
    pub max_tokens: Option<usize>,
    /// The field `max_tokens` came from, for refusals.
    pub max_tokens_field: &'static str,
    pub sampling: SamplingConfig,
    /// The seed as the response reports it (`sampling.seed` is its bits).
    pub seed: i64,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    /// Ollama's `keep_alive`: 0 frees the sessions' KV caches afterwards; a duration
    /// frees them after that long idle.
    pub keep_alive: Option<KeepAlive>,
    /// `Some(n)`: report log-probabilities with `n` alternatives a token.
    pub logprobs: Option<usize>,
    /// `/v1/completions`' `echo`: the answer's text (and, with `logprobs`, its
    /// log-probabilities) starts with the prompt.
    pub echo: bool,
    /// Ollama's `options.num_ctx`: the context this request runs in, within the server's.
    pub num_ctx: Option<usize>,
    /// `speculative.mode`: which drafting this request uses.
    pub draft: DraftMode,
}

pub(crate) fn refuse_set(name: &str, set: bool) -> Result<(), ApiError> {
    if set {
        return Err(ApiError::invalid(
            Some(name),
            format!("'{name}' is not supported by this server"),
        ));
    }
    Ok(())
}

pub(crate) fn messages(list: Vec<ChatMessage>) -> Result<Vec<Message>, ApiError> {
    if list.is_empty() {
        return Err(ApiError::invalid(
            Some("messages"),
            "'messages' must hold at least one message",
        ));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                other => {
                    return Err(ApiError::invalid(
                        Some(&format!("messages[{i}].role")),
                        format!("messages[{i}].role: '{other}' is not one of system, developer, user, assistant"),
                    ))
                }
            };
            let content = match m.content {
                // A turn without text would be rendered as an empty turn and answered
                // as if the user had said nothing: refused instead, by index.
                None => {
                    return Err(ApiError::invalid(
                        Some(&format!("messages[{i}].content")),
                        format!("messages[{i}].content is null or missing: every message needs text content"),
                    ))
                }
                Some(Content::Text(s)) => s,
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.into_iter().enumerate() {
                        if p.kind != "text" {
                            return Err(ApiError::invalid(
                                Some(&format!("messages[{i}].content[{j}].type")),
                                format!("messages[{i}].content[{j}].type: '{}' is not supported (text only)", p.kind),
                            ));
                        }
                        text.push_str(&p.text.unwrap_or_default());
                    }
                    text
                }
            };
            Ok(Message::new(role, content))
        })
        .collect()
}

/// The seed a request samples with: its own, or a fresh random one when it has none
/// (or -1, which llama.cpp and Ollama clients send for "random"), so that regenerating
/// an answer gives a new one. The seed is returned in the response so that the answer
/// can be replayed.
pub(crate) fn request_seed(seed: Option<i64>) -> i64 {
    match seed {
        None | Some(-1) => fresh_seed(),
        Some(s) => s,
    }
}

/// A random seed below 2^53: JavaScript clients (Open WebUI) read JSON numbers as
/// doubles, exact only up to 2^53, and must be able to send the seed back unchanged.
pub(crate) fn fresh_seed() -> i64 {
    (rand::random::<u64>() >> 11) as i64
}

/// A request's sampling fields, before defaults.
#[derive(Default)]
pub(crate) struct SamplingFields {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    repeat_last_n: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
}

/// The sampling parameters of a request's fields over `defaults`, each checked, a
/// refusal naming the field (`prefix` + its name, e.g. `options.top_k`).
pub(crate) fn sampling(
    f: SamplingFields,
    defaults: SamplingConfig,
    seed: i64,
    prefix: &str,
) -> Result<SamplingConfig, ApiError> {
    let top_k = match f.top_k {
        None => defaults.top_k,
        Some(k) => usize::try_from(k).map_err(|_| {
            ApiError::invalid(
                Some(&format!("{prefix}top_k")),
                format!("sampling: top_k must be an integer >= 0 (0 keeps every token), got {k}"),
            )
        })?,
    };
    let repeat_last_n = match f.repeat_last_n {
        None => defaults.repeat_last_n,
        // llama.cpp's and Ollama's convention: -1 is the whole context.
        Some(-1) => usize::MAX,
        Some(n) => usize::try_from(n).map_err(|_| {
            ApiError::invalid(
                Some(&format!("{prefix}repeat_last_n")),
                format!("sampling: repeat_last_n must be an integer >= 0, or -1 for the whole context, got {n}"),
            )
        })?,
    };
    let config = SamplingConfig {
        temperature: f.temperature.unwrap_or(defaults.temperature),
        top_p: f.top_p.unwrap_or(defaults.top_p),
        // Negative seeds (other than -1) are accepted as given, by their bits.
        seed: seed as u64,
        top_k,
        min_p: f.min_p.unwrap_or(defaults.min_p),
        repeat_penalty: f.repeat_penalty.unwrap_or(defaults.repeat_penalty),
        repeat_last_n,
        presence_penalty: f.presence_penalty.unwrap_or(defaults.presence_penalty),
        frequency_penalty: f.frequency_penalty.unwrap_or(defaults.frequency_penalty),
    };
    config.check().map_err(|e| {
        ApiError::invalid(Some(&format!("{prefix}{}", e.parameter())), e.to_string())
    })?;
    Ok(config)
}

/// `top_logprobs` (or `/v1/completions`' integer `logprobs`): 0..=20 alternatives.
pub(crate) fn top_logprobs(v: &Value, field: &str) -> Result<usize, ApiError> {
    v.as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= MAX_TOP_LOGPROBS)
        .ok_or_else(|| {
            ApiError::invalid(
                Some(field),
                format!("'{field}' must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {v}"),
            )
        })
}

/// The log-probabilities an OpenAI request asks for: on chat, `logprobs: true` and
/// `top_logprobs: N`; on completions, `logprobs: N` (legacy; `true` counts as 0).
pub(crate) fn openai_logprobs(
    logprobs: Option<&Value>,
    top: Option<&Value>,
    chat: bool,
) -> Result<Option<usize>, ApiError> {
    let top = top.filter(|v| !v.is_null());
    let on = match logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(0),
        Some(v) if !chat => Some(top_logprobs(v, "logprobs")?),
        Some(v) => {
            return Err(ApiError::invalid(
                Some("logprobs"),
                format!("'logprobs' must be true or false on chat completions (the count goes in 'top_logprobs'), got {v}"),
            ))
        }
    };
    match (on, top) {
        (_, None) => Ok(on),
        (Some(base), Some(t)) => Ok(Some(top_logprobs(t, "top_logprobs")?.max(base))),
        (None, Some(t)) => {
            top_logprobs(t, "top_logprobs")?;
            Err(ApiError::invalid(
                Some("top_logprobs"),
                "'top_logprobs' needs 'logprobs': true",
            ))
        }
    }
}

/// Token ids given as JSON numbers (`field[i]`), refusing any that does not fit the
/// 32 bits of an id rather than cutting it (4294967297 would become 1).
pub(crate) fn token_ids(list: &[Value], field: &str) -> Result<Vec<u32>, ApiError> {
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        Some(&format!("{field}[{i}]")),
                        format!("{field}[{i}]: token id {v} is not a token id (ids are integers from 0 to 4294967295)"),
                    )
                })
        })
        .collect()
}

impl Job {
    /// A `/v1/chat/completions` (`chat`) or `/v1/completions` request.
    pub fn openai(r: OpenAiRequest, chat: bool) -> Result<Job, ApiError> {
        let draft = draft_mode(r.speculative)?;
        if let Some(n) = r.n {
            if n != 1 {
                return Err(ApiError::invalid(
                    Some("n"),
                    format!("'n' must be 1 (one choice per request), got {n}"),
                ));
            }
        }
        refuse_set(
            "tools",
            r.tools
                .as_ref()
                .is_some_and(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty())),
        )?;
        refuse_set(
            "tool_choice",
            r.tool_choice
                .as_ref()
                .is_some_and(|t| !t.is_null() && t != "none"),
        )?;
        refuse_set(
            "functions",
            r.functions.as_ref().is_some_and(|t| !t.is_null()),
        )?;
        refuse_set(
            "function_call",
            r.function_call
                .as_ref()
                .is_some_and(|t| !t.is_null() && t != "none"),
        )?;
        let logprobs = openai_logprobs(r.logprobs.as_ref(), r.top_logprobs.as_ref(), chat)?;
        refuse_set(
            "response_format",
            r.response_format
                .as_ref()
                .is_some_and(|v| !v.is_null() && v.get("type").is_none_or(|t| t != "text")),
        )?;
        refuse_set(
            "logit_bias",
            r.logit_bias
                .as_ref()
                .is_some_and(|v| v.as_object().is_some_and(|o| !o.is_empty())),
        )?;
        // `echo` is a completions field: a chat has no prompt text to echo.
        refuse_set("echo", chat && r.echo == Some(true))?;
        let echo = !chat && r.echo == Some(true);
        refuse_set("best_of", r.best_of.is_some_and(|b| b != 1))?;
        refuse_set("suffix", r.suffix.as_ref().is_some_and(|v| !v.is_null()))?;
        let (route, prompt) = if chat {
            let list = r
                .messages
                .ok_or_else(|| ApiError::invalid(Some("messages"), "'messages' is required"))?;
            (Route::Chat, Prompt::Chat(messages(list)?))
        } else {
            let prompt =
                match r.prompt {
                    Some(Value::String(s)) => Prompt::Text(s),
                    Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                        Prompt::Text(a[0].as_str().unwrap_or_default().to_string())
                    }
                    // A batch of one tokenized prompt (what lm-evaluation-harness sends).
                    Some(Value::Array(a))
                        if a.len() == 1
                            && a[0]
                                .as_array()
                                .is_some_and(|t| !t.is_empty() && t.iter().all(Value::is_u64)) =>
                    {
                        Prompt::Tokens(token_ids(
                            a[0].as_array().map_or(&[], Vec::as_slice),
                            "prompt[0]",
                        )?)
                    }
                    Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
                        Prompt::Tokens(token_ids(&a, "prompt")?)
                    }
                    None => return Err(ApiError::invalid(Some("prompt"), "'prompt' is required")),
                    Some(_) => return Err(ApiError::invalid(
                        Some("prompt"),
                        "'prompt' must be a string, a list of one string, or a list of token ids",
                    )),
                };
            (Route::Completions, prompt)
        };
        let max_tokens = r.max_completion_tokens.or(r.max_tokens);
        let name = if r.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        // With `echo`, 0 asks for the prompt's log-probabilities alone (lm-evaluation-harness).
        if max_tokens == Some(0) && !echo {
            return Err(ApiError::invalid(
                Some(name),
                format!("'{name}' must be at least 1 (0 only with 'echo': true)"),
            ));
        }
        let stop = r.stop.map(StopField::list).unwrap_or_default();
        if stop.len() > 4 {
            return Err(ApiError::invalid(
                Some("stop"),
                format!("'stop' holds at most 4 sequences, got {}", stop.len()),
            ));
        }
        let stream = r.stream.unwrap_or(false);
        if echo && stream {
            // The prompt's log-probabilities come with the finished answer, and an
            // echo sent after the generated text would read out of order.
            return Err(ApiError::invalid(
                Some("echo"),
                "'echo' is not supported with 'stream': true (send stream: false)",
            ));
        }
        let seed = request_seed(r.seed);
        Ok(Job {
            route,
            model: r.model,
            prompt,
            // Saturating: a count past the address space is refused later, by name, as
            // not fitting the context.
            max_tokens: max_tokens.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            max_tokens_field: name,
            sampling: sampling(
                SamplingFields {
                    temperature: r.temperature,
                    top_p: r.top_p,
                    top_k: r.top_k,
                    min_p: r.min_p,
                    repeat_penalty: r.repeat_penalty,
                    repeat_last_n: r.repeat_last_n,
                    presence_penalty: r.presence_penalty,
                    frequency_penalty: r.frequency_penalty,
                },
                SamplingConfig {
                    temperature: 1.0,
                    ..SamplingConfig::default()
                },
                seed,
                "",
            )?,
            seed,
            stop,
            stream,
            include_usage: r.stream_options.is_some_and(|o| o.include_usage),
            ignore_eos: r.ignore_eos.unwrap_or(false),
            keep_alive: None,
            logprobs,
            echo,
            num_ctx: None,
            draft,
        })
    }

    /// An `/api/chat` (`chat`) or `/api/generate` request: a generation, or, without a
    /// prompt (or messages), Ollama's load or unload.
    pub fn ollama(r: OllamaRequest, chat: bool) -> Result<OllamaCall, ApiError> {
        let draft = draft_mode(r.speculative)?;
        let keep_alive = keep_alive(r.keep_alive.as_ref())?;
        let empty = if chat {
            r.messages.as_ref().is_none_or(Vec::is_empty)
        } else {
            r.prompt.as_deref().is_none_or(str::is_empty)
                && r.system.as_deref().is_none_or(str::is_empty)
        };
        if empty {
            return Ok(OllamaCall::Load(LoadCall {
                route: if chat {
                    Route::OllamaChat
                } else {
                    Route::OllamaGenerate
                },
                model: r.model,
                keep_alive,
            }));
        }
        refuse_set(
            "tools",
            r.tools
                .as_ref()
                .is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty()) && !t.is_null()),
        )?;
        refuse_set(
            "format",
            r.format.as_ref().is_some_and(|f| !f.is_null() && f != ""),
        )?;
        let (route, prompt) = if chat {
            let list = r
                .messages
                .ok_or_else(|| ApiError::invalid(Some("messages"), "'messages' is required"))?;
            (Route::OllamaChat, Prompt::Chat(messages(list)?))
        } else {
            let text = r.prompt.unwrap_or_default();
            let prompt = if r.raw.unwrap_or(false) {
                Prompt::Text(text)
            } else {
                let mut m = Vec::new();
                if let Some(s) = r.system {
                    m.push(Message::new("system", s));
                }
                m.push(Message::new("user", text));
                Prompt::Chat(m)
            };
            (Route::OllamaGenerate, prompt)
        };
        let logprobs = match (r.logprobs, r.top_logprobs) {
            (Some(true), n) => Some(top_logprobs(&json!(n.unwrap_or(0)), "top_logprobs")?),
            (_, Some(n)) if n != 0 => {
                return Err(ApiError::invalid(
                    Some("top_logprobs"),
                    "'top_logprobs' needs 'logprobs': true",
                ))
            }
            _ => None,
        };
        let o = r.options.unwrap_or_default();
        let max_tokens = match o.num_predict {
            None => None,
            Some(n) if n < 0 => None,
            Some(0) => {
                return Err(ApiError::invalid(
                    Some("options.num_predict"),
                    "'options.num_predict' must be at least 1 (or -1 for no limit)",
                ))
            }
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        };
        let num_ctx = match o.num_ctx {
            None => None,
            Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            Some(n) => {
                return Err(ApiError::invalid(
                    Some("options.num_ctx"),
                    format!("'options.num_ctx' must be at least 1, got {n}"),
                ))
            }
        };
        let seed = request_seed(o.seed);
        Ok(OllamaCall::Generate(Job {
            route,
            model: r.model,
            prompt,
            max_tokens,
            max_tokens_field: "options.num_predict",
            sampling: sampling(
                SamplingFields {
                    temperature: o.temperature,
                    top_p: o.top_p,
                    top_k: o.top_k,
                    min_p: o.min_p,
                    repeat_penalty: o.repeat_penalty,
                    repeat_last_n: o.repeat_last_n,
                    presence_penalty: o.presence_penalty,
                    frequency_penalty: o.frequency_penalty,
                },
                OLLAMA_DEFAULTS,
                seed,
                "options.",
            )?,
            seed,
            stop: o.stop.unwrap_or_default(),
            stream: r.stream.unwrap_or(true),
            include_usage: true,
            ignore_eos: false,
            keep_alive,
            logprobs,
            echo: false,
            num_ctx,
            draft,
        }))
    }
}

/// Ollama's defaults for the options a request leaves out: temperature 0.8, top_p 0.9,
/// top_k 40. No repeat penalty: Ollama's own engine (`ollamarunner`, which serves most
/// models since 0.6) applies none unless asked, though its docs list 1.1 (what its
/// llama.cpp runner applies); a temperature-0 answer then stays the model's argmax.
pub(crate) const OLLAMA_DEFAULTS: SamplingConfig = SamplingConfig {
    temperature: 0.8,
    top_p: 0.9,
    seed: 0,
    top_k: 40,
    min_p: 0.0,
    repeat_penalty: 1.0,
    repeat_last_n: 64,
    presence_penalty: 0.0,
    frequency_penalty: 0.0,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_is_seconds_or_a_go_duration() {
        let secs = |v: Value| keep_alive_seconds(&v);
        assert_eq!(secs(json!(0)).unwrap(), 0.0);
        assert_eq!(secs(json!(300)).unwrap(), 300.0);
        assert_eq!(secs(json!("0")).unwrap(), 0.0);
        assert_eq!(secs(json!("0s")).unwrap(), 0.0);
        assert_eq!(secs(json!("5m")).unwrap(), 300.0);
        assert_eq!(secs(json!("1h30m")).unwrap(), 5400.0);
        assert_eq!(secs(json!("1.5s")).unwrap(), 1.5);
        assert_eq!(secs(json!("250ms")).unwrap(), 0.25);
        assert_eq!(secs(json!("-1")).unwrap(), -1.0);
        assert_eq!(secs(json!("-1m")).unwrap(), -60.0);
        for bad in [
            json!("soon"),
            json!(""),
            json!("-"),
            json!("5x"),
            json!("m"),
            json!(true),
            json!([1]),
            json!("1e999"),
        ] {
            let e = secs(bad.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("keep_alive"), "{bad}");
        }
    }

    #[test]
    fn keep_alive_zero_unloads_negative_keeps_positive_times() {
        use std::time::Duration;
        let ka = |v: Value| keep_alive(Some(&v)).unwrap();
        assert_eq!(keep_alive(None).unwrap(), None);
        assert_eq!(ka(Value::Null), None);
        assert_eq!(ka(json!(0)), Some(KeepAlive::Unload));
        assert_eq!(ka(json!("0s")), Some(KeepAlive::Unload));
        assert_eq!(ka(json!(-1)), Some(KeepAlive::Forever));
        assert_eq!(
            ka(json!("5m")),
            Some(KeepAlive::Idle(Duration::from_secs(300)))
        );
        assert_eq!(
            ka(json!(0.25)),
            Some(KeepAlive::Idle(Duration::from_millis(250)))
        );
        // Beyond what a Duration holds: kept, as a negative value is.
        assert_eq!(ka(json!(1e300)), Some(KeepAlive::Forever));
        assert!(keep_alive(Some(&json!("soon"))).is_err());
    }

    #[test]
    fn token_ids_past_32_bits_are_refused_by_index() {
        assert_eq!(
            token_ids(&[json!(0), json!(4294967295u64)], "prompt").unwrap(),
            [0, u32::MAX]
        );
        let e = token_ids(&[json!(5), json!(4294967297u64)], "prompt").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt[1]"));
        assert!(e.message.contains("token id 4294967297"), "{e:?}");
    }

    #[test]
    fn a_bad_field_is_named() {
        let e = parse::<OpenAiRequest>(br#"{"messages": [{"role": "user", "content": 3}]}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"), "{e:?}");
        let e = parse::<OpenAiRequest>(br#"{"max_tokens": -1}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{e:?}");
        let e = parse::<OpenAiRequest>(b"{\"messages\": [").unwrap_err();
        assert!(e.message.starts_with("malformed JSON body"), "{e:?}");
    }
}
