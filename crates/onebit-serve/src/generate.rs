//! A generation request: its body checked into a job (on a blocking thread), admitted
//! to a session, run, and answered whole or streamed (SSE, NDJSON); a dropped response
//! cancels it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use onebit_engine::{
    CancelFlag, Completion, DraftMode, Engine, EngineError, Event, Prompt, Request,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::encode::{self, merge, ndjson, ollama_line, openai_chunk, sse};
use crate::error::{api_error, error_response, prompt_error, ApiError};
use crate::request::{self, Job, Route};
use crate::routes::ollama::load_call;
use crate::sessions::{admit, busy, release_idle, settle, Ready};
use crate::{blocking, read_body, App};

/// Sets the flag when dropped, unless disarmed: a handler or a response stream dropped
/// because the client went away cancels its generation.
pub(crate) struct CancelOnDrop(Option<CancelFlag>);

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f.cancel();
        }
    }
}

/// What the generation thread sends a streaming response.
pub(crate) enum Msg {
    /// Text released, and (asked for) the log-probabilities of the tokens behind it in
    /// the route's shape.
    Piece(String, Option<Value>),
    /// For a whole answer, before `Done`: the echoed prompt text and the answer's
    /// log-probabilities in the route's shape (built here, where the tokenizer is).
    Extra(Box<Extra>),
    Done(Box<Result<Completion, EngineError>>),
}

/// What a whole answer adds to its completion.
#[derive(Default)]
pub(crate) struct Extra {
    echo: Option<String>,
    logprobs: Option<Value>,
}

/// Parses, checks and queues one generation request, then answers it (streaming or not).
pub(crate) async fn generate_route(
    app: Arc<App>,
    headers: HeaderMap,
    body: Body,
    route: Route,
) -> Response {
    let start = Instant::now();
    let prepared = prepare(&app, &headers, body, route).await;
    let e = match prepared {
        Ok(Prepared::Load(call)) => return load_call(&app, call),
        Ok(Prepared::Generate(job, request)) => match admit(&app).await {
            Ok(permit) => return run_job(app, *job, request, permit, start).await,
            Err(e) => e,
        },
        Err(e) => e,
    };
    let line = format!("{} {} {}", route.path(), e.status.as_u16(), e.message);
    if e.status.is_server_error() && e.status != StatusCode::SERVICE_UNAVAILABLE {
        app.error(&line);
    } else {
        app.log(&line);
    }
    error_response(&e, route.is_ollama())
}

/// What a generation route's body asks for.
pub(crate) enum Prepared {
    Generate(Box<Job>, Request),
    Load(request::LoadCall),
}

/// The checked job and the engine request: the body read, then (on a blocking thread)
/// parsed, the model checked, the prompt tokenized and fitted to the context.
pub(crate) async fn prepare(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
    route: Route,
) -> Result<Prepared, ApiError> {
    let bytes = read_body(headers, body).await?;
    let app = app.clone();
    blocking(&app.clone(), move || prepare_blocking(&app, &bytes, route)).await
}

pub(crate) fn prepare_blocking(
    app: &App,
    bytes: &[u8],
    route: Route,
) -> Result<Prepared, ApiError> {
    let job = match route {
        Route::Chat | Route::Completions => {
            Job::openai(request::parse(bytes)?, route == Route::Chat)?
        }
        Route::OllamaChat | Route::OllamaGenerate => {
            match Job::ollama(request::parse(bytes)?, route == Route::OllamaChat)? {
                request::OllamaCall::Generate(job) => job,
                request::OllamaCall::Load(call) => {
                    app.check_model(call.model.as_deref())?;
                    app.ready()?;
                    return Ok(Prepared::Load(call));
                }
            }
        }
    };
    app.check_model(job.model.as_deref())?;
    let ready = app.ready()?;
    let engine = &ready.engine;
    if !app.tokenize_delay.is_zero() {
        std::thread::sleep(app.tokenize_delay);
    }
    let ids = engine
        .tokenize(&job.prompt)
        .map_err(|e| prompt_error(e, &job.prompt))?;
    if !job.draft.available(&engine.config().drafter) {
        let (mode, flag) = match job.draft {
            DraftMode::LookupOnly => ("lookup", "--lookup"),
            _ => ("draft", "--draft DIR"),
        };
        return Err(ApiError::invalid(
            Some("speculative.mode"),
            format!(
                "'speculative.mode' is {mode:?}, but this server was started without that drafter (drafter: {}; start it with {flag})",
                engine.config().drafter.describe()
            ),
        ));
    }
    let ctx = context_of(&job, engine.ctx_len())?;
    let max_tokens = job.max_tokens.unwrap_or(ctx.saturating_sub(ids.len()));
    // Saturating: max_tokens may be anything up to 2^64 - 1.
    // 0 tokens is a request of its own only with echo (the prompt's log-probabilities).
    if ids.len().saturating_add(max_tokens) > ctx || (max_tokens == 0 && !job.echo) {
        let name = job.max_tokens_field;
        let mut e = ApiError::invalid(
            Some(name),
            format!(
                "the request exceeds the available context size: the prompt has {} tokens and {name} is {max_tokens}, but the context holds {ctx} tokens (n_prompt_tokens {}, n_ctx {ctx})",
                ids.len(),
                ids.len()
            ),
        );
        e.code = Some("exceed_context_size_error");
        e.kind = "exceed_context_size_error";
        return Err(e);
    }
    let request = Request {
        sampling: job.sampling,
        stop: job.stop.clone(),
        ignore_eos: job.ignore_eos,
        draft: job.draft,
        logprobs: job.logprobs,
        prompt_logprobs: job.echo && job.logprobs.is_some(),
        ..Request::new(Prompt::Tokens(ids), max_tokens)
    };
    Ok(Prepared::Generate(Box::new(job), request))
}

/// Runs a job on a free session (holding `permit`) and answers it.
pub(crate) async fn run_job(
    app: Arc<App>,
    job: Job,
    request: Request,
    permit: tokio::sync::OwnedSemaphorePermit,
    start: Instant,
) -> Response {
    let ready = app
        .ready()
        .expect("admitted requests run on a loaded model");
    // The session holding the longest prefix of this prompt.
    let session = ready.take_session(match &request.prompt {
        Prompt::Tokens(ids) => ids.as_slice(),
        _ => &[],
    });
    let cancel = CancelFlag::new();
    let (tx, rx) = mpsc::channel::<Msg>(64);
    let delay = app.token_delay;
    let route = job.route;
    // Only a stream needs the pieces: a whole answer's handler is woken once, at the end.
    let stream = job.stream;
    let keep_alive = job.keep_alive;
    let unload = keep_alive == Some(request::KeepAlive::Unload);
    busy(&app);
    let (logprobs, echo) = (job.logprobs.is_some(), job.echo);
    let worker = {
        let app = app.clone();
        let cancel = cancel.clone();
        tokio::task::spawn_blocking(move || {
            let mut session = session;
            let engine = session.engine().clone();
            // Streamed log-probabilities of tokens whose text is not released yet, and
            // the legacy shape's running text offset.
            let mut pending: Vec<onebit_engine::TokenLogprob> = Vec::new();
            let mut offset = 0usize;
            let shaped = |lps: &mut Vec<onebit_engine::TokenLogprob>, offset: &mut usize| {
                if lps.is_empty() {
                    return None;
                }
                let v = stream_logprobs(&engine, route, lps, offset);
                lps.clear();
                Some(v)
            };
            // When the first token came (for the time-to-first-token histogram).
            let mut first_token: Option<f64> = None;
            let mut sink = |e: Event<'_>| {
                let (text, lp) = match e {
                    Event::Token { text, logprob, .. } => {
                        first_token.get_or_insert_with(|| start.elapsed().as_secs_f64());
                        (text, logprob)
                    }
                    Event::Text(text) => (text, None),
                };
                if let (true, Some(lp)) = (stream, lp) {
                    pending.push(lp.clone());
                }
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                if stream
                    && !text.is_empty()
                    && tx
                        .blocking_send(Msg::Piece(
                            text.to_string(),
                            shaped(&mut pending, &mut offset),
                        ))
                        .is_err()
                {
                    return std::ops::ControlFlow::Break(());
                }
                if tx.is_closed() {
                    return std::ops::ControlFlow::Break(());
                }
                std::ops::ControlFlow::Continue(())
            };
            let ready = app.ready().expect("loaded");
            // A panic is a bug, but it must not take a slot with it: the session is then
            // replaced by a fresh one.
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                session.generate(&request, &mut sink, &cancel)
            }));
            let result = match run {
                Ok(r) => r,
                Err(_) => {
                    session = match ready.engine.session() {
                        Ok(fresh) => fresh,
                        Err(e) => {
                            app.error(&format!("onebit serve: cannot replace a session: {e}"));
                            session
                        }
                    };
                    Err(EngineError::Internal("the generation panicked".into()))
                }
            };
            // Log-probabilities of tokens whose text never came out (cut by a stop
            // string) close the stream; a whole answer gets its extras here.
            if let Some(v) = shaped(&mut pending, &mut offset) {
                let _ = tx.blocking_send(Msg::Piece(String::new(), Some(v)));
            }
            if let (false, Ok(c)) = (stream, &result) {
                if logprobs || echo {
                    let extra = whole_extra(ready, route, &request, c, logprobs, echo);
                    let _ = tx.blocking_send(Msg::Extra(Box::new(extra)));
                }
            }
            match &result {
                Ok(c) => {
                    app.metrics.generated(c);
                    if let Some(seconds) = first_token {
                        app.metrics.first_token(seconds);
                    }
                    log_done(&app, route, c, start);
                }
                Err(e) => {
                    engine_error(&app, route, e);
                }
            }
            // keep_alive 0: nothing of the request stays cached, in this session or
            // the idle ones.
            if unload {
                session.release();
                release_idle(ready);
            }
            // The session goes back before the slot is released.
            ready.give_back(session);
            drop(permit);
            settle(&app, keep_alive);
            let _ = tx.blocking_send(Msg::Done(Box::new(result)));
        })
    };
    drop(worker);
    let meta = Meta {
        id: format!(
            "{}-{}",
            if job.route == Route::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            next_id()
        ),
        created: encode::unix_now(),
        model: app.name.clone(),
        load_seconds: ready.engine.load_seconds(),
        seed: job.seed,
    };
    if job.stream {
        stream_response(job, meta, rx, cancel, app.sse_keep_alive)
    } else {
        whole_response(job, meta, rx, cancel).await
    }
}

/// Streamed log-probabilities in the route's shape: chat's `{"content": [...]}`, the
/// legacy object on completions, Ollama's list.
pub(crate) fn stream_logprobs(
    engine: &Engine,
    route: Route,
    lps: &[onebit_engine::TokenLogprob],
    offset: &mut usize,
) -> Value {
    match route {
        Route::Chat => json!({"content": encode::chat_entries(engine, lps), "refusal": null}),
        Route::Completions => {
            let entries: Vec<_> = lps.iter().map(|lp| (lp.token, Some(lp))).collect();
            encode::legacy_logprobs(engine, &entries, offset)
        }
        Route::OllamaChat | Route::OllamaGenerate => json!(encode::chat_entries(engine, lps)),
    }
}

/// A whole answer's echoed prompt and log-probabilities (the prompt's first, with echo).
pub(crate) fn whole_extra(
    ready: &Ready,
    route: Route,
    request: &Request,
    c: &Completion,
    logprobs: bool,
    echo: bool,
) -> Extra {
    let engine = &ready.engine;
    let ids: &[u32] = match &request.prompt {
        Prompt::Tokens(ids) => ids,
        _ => &[],
    };
    // The prompt as the ids that ran (special tokens written out), as llama-server echoes.
    let echo_text = echo.then(|| engine.detokenize(ids).unwrap_or_default());
    let logprobs = logprobs.then(|| match route {
        Route::Completions => {
            let mut entries: Vec<(u32, Option<&onebit_engine::TokenLogprob>)> = Vec::new();
            if echo {
                entries.extend(
                    ids.iter()
                        .zip(&c.prompt_logprobs)
                        .map(|(&id, lp)| (id, lp.as_ref())),
                );
            }
            entries.extend(c.logprobs.iter().map(|lp| (lp.token, Some(lp))));
            encode::legacy_logprobs(engine, &entries, &mut 0)
        }
        _ => stream_logprobs(engine, route, &c.logprobs, &mut 0),
    });
    Extra {
        echo: echo_text,
        logprobs,
    }
}

/// A response id unique in this process and unlikely to repeat across restarts: the
/// start time in nanoseconds, then a counter.
pub(crate) fn next_id() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    static START: OnceLock<u128> = OnceLock::new();
    let start = START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    });
    format!("{start:x}{:06x}", N.fetch_add(1, Ordering::Relaxed))
}

/// A response's identity.
pub(crate) struct Meta {
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) load_seconds: f64,
    /// The seed sampled with (the request's, or the fresh one drawn for it).
    pub(crate) seed: i64,
}

/// The request's log line.
pub(crate) fn log_done(app: &App, route: Route, c: &Completion, start: Instant) {
    let drafts = if c.drafted {
        format!(", drafts {}/{} accepted", c.stats.accepted, c.stats.drafted)
    } else {
        String::new()
    };
    app.log(&format!(
        "{} 200 prompt {} tokens ({} cached, {:.1} tok/s) | {} tokens, {:.1} tok/s decode | stop: {}{drafts} | {:.3} s",
        route.path(),
        c.prompt_tokens,
        c.cached_tokens,
        c.prompt_tokens_per_second(),
        c.tokens.len(),
        c.decode_tokens_per_second(),
        c.stop.name(),
        start.elapsed().as_secs_f64()
    ));
}

/// Logs a failed generation (always: it is an error).
pub(crate) fn engine_error(app: &App, route: Route, e: &EngineError) {
    let err = api_error(e);
    app.error(&format!(
        "{} {} {}",
        route.path(),
        err.status.as_u16(),
        err.message
    ));
}

/// A non-streaming answer: waits for the whole completion (the handler's drop, when the
/// client goes away, cancels it).
pub(crate) async fn whole_response(
    job: Job,
    meta: Meta,
    mut rx: mpsc::Receiver<Msg>,
    cancel: CancelFlag,
) -> Response {
    let mut guard = CancelOnDrop(Some(cancel));
    let mut extra = Extra::default();
    let result = loop {
        match rx.recv().await {
            Some(Msg::Piece(..)) => continue,
            Some(Msg::Extra(e)) => extra = *e,
            Some(Msg::Done(r)) => break *r,
            None => {
                break Err(EngineError::Internal(
                    "the generation thread stopped".into(),
                ))
            }
        }
    };
    guard.disarm();
    let c = match result {
        Ok(c) => c,
        Err(e) => return error_response(&api_error(&e), job.route.is_ollama()),
    };
    let body = match job.route {
        Route::Chat => json!({
            "id": meta.id,
            "object": "chat.completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": extra.logprobs,
                "finish_reason": encode::finish_reason(&c.stop),
            }],
            "usage": encode::usage(&c),
            "timings": encode::timings(&c),
            "seed": meta.seed,
        }),
        Route::Completions => json!({
            "id": meta.id,
            "object": "text_completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [{
                "text": match &extra.echo {
                    Some(prompt) => format!("{prompt}{}", c.text),
                    None => c.text.clone(),
                },
                "index": 0,
                "logprobs": extra.logprobs,
                "finish_reason": encode::finish_reason(&c.stop),
            }],
            "usage": encode::usage(&c),
            "timings": encode::timings(&c),
            "seed": meta.seed,
        }),
        Route::OllamaChat | Route::OllamaGenerate => {
            let mut v = ollama_line(&job, &meta, &c.text, true);
            merge(&mut v, encode::ollama_stats(&c, meta.load_seconds));
            v["seed"] = json!(meta.seed);
            if let Some(lp) = extra.logprobs {
                v["logprobs"] = lp;
            }
            v
        }
    };
    axum::Json(body).into_response()
}

/// A streaming answer: SSE for the OpenAI routes (ending `data: [DONE]`), NDJSON for
/// Ollama's. Dropping the body (the client went away) cancels the generation.
pub(crate) fn stream_response(
    job: Job,
    meta: Meta,
    rx: mpsc::Receiver<Msg>,
    cancel: CancelFlag,
    keep_alive: Duration,
) -> Response {
    struct St {
        job: Job,
        meta: Meta,
        rx: mpsc::Receiver<Msg>,
        _guard: CancelOnDrop,
        first: bool,
        finished: bool,
    }
    let ollama = job.route.is_ollama();
    let state = St {
        job,
        meta,
        rx,
        _guard: CancelOnDrop(Some(cancel)),
        first: true,
        finished: false,
    };
    let stream = futures_util::stream::unfold(state, move |mut st| async move {
        if st.finished {
            return None;
        }
        let ollama = st.job.route.is_ollama();
        let mut out: Vec<u8> = Vec::new();
        if st.first && st.job.route == Route::Chat {
            out.extend_from_slice(&sse(&openai_chunk(
                &st.job,
                &st.meta,
                Some(""),
                true,
                None,
                None,
            )));
        }
        st.first = false;
        // SSE may carry comments: while nothing comes (queued, prefilling, a slow
        // token), one every `keep_alive` keeps proxies and clients from timing out.
        // NDJSON (Ollama) has no comment line.
        let next = if ollama {
            st.rx.recv().await
        } else {
            match tokio::time::timeout(keep_alive, st.rx.recv()).await {
                Ok(next) => next,
                Err(_) => {
                    out.extend_from_slice(b": keep-alive\n\n");
                    return Some((Ok(Bytes::from(out)), st));
                }
            }
        };
        match next {
            Some(Msg::Piece(text, logprobs)) => {
                if ollama {
                    let mut line = ollama_line(&st.job, &st.meta, &text, false);
                    if let Some(lp) = logprobs {
                        line["logprobs"] = lp;
                    }
                    out.extend_from_slice(&ndjson(&line));
                } else {
                    out.extend_from_slice(&sse(&openai_chunk(
                        &st.job,
                        &st.meta,
                        Some(&text),
                        false,
                        None,
                        logprobs,
                    )));
                }
            }
            Some(Msg::Extra(_)) => {}
            Some(Msg::Done(r)) => {
                st.finished = true;
                match *r {
                    Ok(c) if ollama => {
                        let mut v = ollama_line(&st.job, &st.meta, "", true);
                        merge(&mut v, encode::ollama_stats(&c, st.meta.load_seconds));
                        v["seed"] = json!(st.meta.seed);
                        out.extend_from_slice(&ndjson(&v));
                    }
                    Ok(c) => {
                        let reason = encode::finish_reason(&c.stop);
                        let mut last =
                            openai_chunk(&st.job, &st.meta, None, false, Some(reason), None);
                        last["timings"] = encode::timings(&c);
                        out.extend_from_slice(&sse(&last));
                        if st.job.include_usage {
                            let mut u = openai_chunk(&st.job, &st.meta, None, false, None, None);
                            u["choices"] = json!([]);
                            u["usage"] = encode::usage(&c);
                            out.extend_from_slice(&sse(&u));
                        }
                        out.extend_from_slice(b"data: [DONE]\n\n");
                    }
                    Err(e) if ollama => {
                        out.extend_from_slice(&ndjson(&json!({"error": api_error(&e).message})));
                    }
                    Err(e) => {
                        out.extend_from_slice(&sse(&api_error(&e).openai_body()));
                        out.extend_from_slice(b"data: [DONE]\n\n");
                    }
                }
            }
            None => return None,
        }
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(out)), st))
    });
    let content_type = if ollama {
        "application/x-ndjson"
    } else {
        "text/event-stream"
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .expect("a valid response")
}

/// The context a job runs in: the server's, or Ollama's `options.num_ctx` within it (a
/// larger one is refused by name: the server's KV caches are sized for its own).
fn context_of(job: &Job, server: Option<usize>) -> Result<usize, ApiError> {
    let server = server.unwrap_or(usize::MAX);
    match job.num_ctx {
        None => Ok(server),
        Some(n) if n <= server => Ok(n),
        Some(n) => Err(ApiError::invalid(
            Some("options.num_ctx"),
            format!(
                "'options.num_ctx' is {n}, more than this server's context of {server} tokens (onebit serve --ctx-len)"
            ),
        )),
    }
}
