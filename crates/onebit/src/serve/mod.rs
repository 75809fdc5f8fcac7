//! `onebit serve MODEL_DIR`: OpenAI- and Ollama-compatible HTTP over the engine.
//!
//! The listener is bound first and answers while the model loads (`/health` and the
//! model routes say 503 until it is ready), so a launcher polling `/api/tags` sees 200
//! exactly when requests can be served. Generation runs on tokio's blocking threads, one
//! [`Session`] per `--parallel` slot over one shared [`Engine`]; requests beyond the
//! slots wait in a FIFO queue of `--q-len` (tokio's semaphore is fair), and past that are
//! refused with 503 and `Retry-After`. A request whose client goes away (its response
//! body or its handler dropped) sets its [`CancelFlag`]; the generation stops at the
//! next token and the session goes back to the pool.

mod api;
mod metrics;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use clap::Args;
use onebit_engine::{
    CancelFlag, Completion, DraftMode, DrafterConfig, Engine, EngineError, Event, Prompt, Request,
    Session,
};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};

use crate::run::TargetArgs;
use api::{ApiError, Job, Route};

/// The largest request body accepted (413 beyond).
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// How much of an oversized body is read and dropped before the 413.
const DRAIN_BYTES: usize = 64 << 20;

#[derive(Args)]
pub struct ServeArgs {
    /// The target package directory (config.json, model.q4nx, tokenizer.json).
    pub model_dir: PathBuf,
    /// A DFlash draft package: decode speculatively (same text as without it).
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Prompt-lookup drafting (no model); with --draft, chained with the draft.
    #[arg(long)]
    pub lookup: bool,
    /// Drafts verified per round at most (k).
    #[arg(long, default_value_t = 7)]
    pub draft_max: usize,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port (0: any free port; the log line names it). Default: $FLM_SERVE_PORT, else 52625.
    #[arg(long)]
    pub port: Option<u16>,
    /// Context size in tokens: a request's prompt plus max tokens must fit (cap: the
    /// model's max_position_embeddings; default: that, capped so a full-context KV
    /// cache takes at most half of the available memory, with a printed reason).
    #[arg(long, short = 'c')]
    pub ctx_len: Option<usize>,
    /// Requests that may wait for a free session; more are refused with 503.
    #[arg(long, default_value_t = 10)]
    pub q_len: usize,
    /// Sessions generating at once (each its own KV cache over the one model).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub parallel: usize,
    /// Give each session passes of its own instead of running the generating
    /// sessions' next rows together in one pass (continuous batching, the default with
    /// --parallel above 1). Answers are the same either way; for comparisons.
    #[arg(long)]
    pub no_shared_passes: bool,
    /// The model's name in the API (default: the package directory's name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Log errors only (no line per request).
    #[arg(long)]
    pub quiet: bool,
    /// Accepted for `flm serve` compatibility (sockets are not limited); ignored.
    #[arg(long, hide = true)]
    pub socket: Option<usize>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Activation precision of the projections (see `onebit run --help`).
    #[arg(long, value_enum, default_value_t = crate::run::PrecisionArg::Auto)]
    pub precision: crate::run::PrecisionArg,
    /// For tests of queueing and cancellation: sleep this long after every token.
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_token_delay_ms: u64,
    /// How long a shared pass waits at most for a generating session busy elsewhere.
    #[arg(long, hide = true, default_value_t = onebit_engine::DEFAULT_LINGER.as_micros() as u64)]
    pub debug_pass_linger_us: u64,
    /// For tests of readiness: wait this long before loading the model.
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_load_delay_ms: u64,
    /// For tests of where tokenization runs: sleep this long before tokenizing a request.
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_tokenize_delay_ms: u64,
    /// Require `Authorization: Bearer KEY` on every route but /health (401 otherwise).
    /// Default: $ONEBIT_API_KEY, else no key.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Allow browser pages from ORIGIN (or `*`: any) to call the API (CORS headers);
    /// repeat for several origins. Default: no CORS headers.
    #[arg(long, value_name = "ORIGIN")]
    pub cors: Vec<String>,
}

/// What the routes share.
struct App {
    /// The name clients use; `names` are every name accepted for it.
    name: String,
    names: Vec<String>,
    ready: OnceLock<Ready>,
    quiet: bool,
    q_len: usize,
    waiting: AtomicUsize,
    token_delay: Duration,
    tokenize_delay: Duration,
    started: Instant,
    created: u64,
    /// `--api-key`: required of every route but /health.
    api_key: Option<String>,
    metrics: metrics::Metrics,
    /// Requests being parsed, templated and tokenized at once: the queue's length plus
    /// the sessions, so that work waits here instead of filling tokio's blocking pool
    /// (which the generations share) with megabyte prompts.
    tokenizing: Arc<Semaphore>,
}

/// The loaded model and its sessions.
struct Ready {
    engine: Arc<Engine>,
    /// `--parallel`: the sessions, and the permits when none is generating.
    parallel: usize,
    permits: Arc<Semaphore>,
    sessions: Mutex<Vec<Session>>,
    package_bytes: u64,
    modified: String,
    digest: String,
}

impl App {
    fn log(&self, line: &str) {
        if !self.quiet {
            eprintln!("{line}");
        }
    }

    fn error(&self, line: &str) {
        eprintln!("{line}");
    }

    fn ready(&self) -> Result<&Ready, ApiError> {
        self.ready.get().ok_or_else(ApiError::loading)
    }

    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None | Some("") => Ok(()),
            Some(m) if self.serves(m) => Ok(()),
            Some(m) => Err(ApiError::unknown_model(m)),
        }
    }

    /// Whether `model` names the served model, with or without Ollama's default tag.
    fn serves(&self, model: &str) -> bool {
        self.names.iter().any(|n| untagged(n) == untagged(model))
    }
}

/// A model name without Ollama's default tag: Ollama clients (`ollama run NAME`) send
/// `NAME:latest` for `NAME`.
fn untagged(name: &str) -> &str {
    name.strip_suffix(":latest").unwrap_or(name)
}

/// An error as an HTTP response: the OpenAI object, or Ollama's `{"error": "..."}` on
/// the native routes.
fn error_response(e: &ApiError, ollama: bool) -> Response {
    let body = if ollama {
        let message = if e.code == Some("model_not_found") {
            format!(
                "model '{}' not found",
                e.message
                    .trim_start_matches("The model '")
                    .trim_end_matches("' does not exist")
            )
        } else {
            e.message.clone()
        };
        json!({ "error": message })
    } else {
        e.openai_body()
    };
    let mut r = (e.status, axum::Json(body)).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

pub fn run(args: &ServeArgs) -> Result<()> {
    if args.threads == Some(0) {
        anyhow::bail!("--threads must be at least 1");
    }
    let api_key = match &args.api_key {
        Some(k) => Some(k.clone()),
        None => std::env::var("ONEBIT_API_KEY").ok(),
    };
    if api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        anyhow::bail!("serve: --api-key (or ONEBIT_API_KEY) is empty: give a key, or leave it unset for no key");
    }
    let cors = cors_layer(&args.cors)?;
    let name = args
        .alias
        .clone()
        .unwrap_or_else(|| onebit_engine::model_name(&args.model_dir));
    let mut names = vec![name.clone(), args.model_dir.display().to_string()];
    names.push(onebit_engine::model_name(&args.model_dir));
    let target = TargetArgs {
        model: args.model_dir.clone(),
        threads: args.threads,
        head: crate::run::HeadArg::Auto,
        kernel: crate::run::KernelArg::Auto,
        precision: args.precision,
        kv_type: crate::run::KvTypeArg::Auto,
        backend: crate::backend::BackendArg::Cpu,
        kernels: None,
        device: 0,
    };
    let mut config = target.engine_config()?;
    config.drafter =
        DrafterConfig::from_flags(args.draft.as_deref(), args.lookup, mtp::DEFAULT_MAX_NGRAM);
    config.draft_max = args.draft_max;
    config.share_passes = args.parallel > 1 && !args.no_shared_passes;
    config.pass_linger = Duration::from_micros(args.debug_pass_linger_us);
    // --ctx-len as given (the engine caps it at the model's own limit, as `flm serve`
    // takes any value); without it, chosen in the loader, where config.json is read.
    config.ctx_len = args.ctx_len;
    let default_ctx = args.ctx_len.is_none();
    let app = Arc::new(App {
        name,
        names,
        ready: OnceLock::new(),
        quiet: args.quiet,
        q_len: args.q_len,
        waiting: AtomicUsize::new(0),
        token_delay: Duration::from_millis(args.debug_token_delay_ms),
        tokenize_delay: Duration::from_millis(args.debug_tokenize_delay_ms),
        started: Instant::now(),
        created: api::unix_now(),
        api_key,
        metrics: metrics::Metrics::default(),
        tokenizing: Arc::new(Semaphore::new(
            args.q_len.saturating_add(args.parallel).max(1),
        )),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("serve: cannot start the async runtime")?;
    let parallel = args.parallel;
    let load_delay = Duration::from_millis(args.debug_load_delay_ms);
    let port = match (args.port, std::env::var("FLM_SERVE_PORT")) {
        (Some(p), _) => p,
        (None, Ok(v)) => v
            .parse()
            .with_context(|| format!("serve: FLM_SERVE_PORT={v:?} is not a port number"))?,
        (None, Err(_)) => 52625,
    };
    let addr = format!("{}:{port}", args.host);
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("serve: cannot listen on {addr}"))?;
        let local: SocketAddr = listener.local_addr()?;
        app.log(&format!(
            "onebit serve: listening on http://{local} (loading {})",
            config.model.display()
        ));
        if let Some(warning) = exposure_warning(local, app.api_key.is_some()) {
            // Always printed, also under --quiet: it is about who can use the server.
            app.error(&warning);
        }
        let loader = {
            let app = app.clone();
            let mut config = config;
            tokio::task::spawn_blocking(move || -> Result<()> {
                std::thread::sleep(load_delay);
                if default_ctx {
                    // The model's max_position_embeddings capped by available memory
                    // (the reason printed, also under --quiet: it decides which
                    // requests are refused).
                    let model = npu_runtime::TargetConfig::read(&config.model)?;
                    config.ctx_len = Some(crate::context::context_len(
                        None,
                        &model,
                        config.kv_type,
                    )?);
                }
                let engine = Engine::load(&config)?;
                let sessions = (0..parallel)
                    .map(|_| engine.session())
                    .collect::<Result<Vec<_>, _>>()?;
                let (package_bytes, modified, digest) = package_facts(&config.model);
                let ctx = engine.ctx_len().unwrap_or(0);
                let drafter = config.drafter.describe();
                let info = engine.info().clone();
                let _ = app.ready.set(Ready {
                    parallel,
                    permits: Arc::new(Semaphore::new(parallel)),
                    sessions: Mutex::new(sessions),
                    engine,
                    package_bytes,
                    modified,
                    digest,
                });
                app.log(&format!(
                    "onebit serve: {} ready in {:.2} s (ctx {ctx}, parallel {parallel}, queue {}, drafter {drafter}, {} threads, {} precision, {} kernel)",
                    app.name,
                    app.started.elapsed().as_secs_f64(),
                    app.q_len,
                    info.threads,
                    info.precision.name(),
                    info.kernel,
                ));
                Ok(())
            })
        };
        let mut routes = router(app);
        if let Some(cors) = cors {
            // Outermost: a browser's preflight carries no key and is answered here.
            routes = routes.layer(cors);
        }
        let server = tokio::spawn(async move { axum::serve(listener, routes).await });
        match loader.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.context("serve: cannot load the model")),
            Err(e) => anyhow::bail!("serve: the loader failed: {e}"),
        }
        // Loaded: serve until the process is stopped.
        server
            .await
            .context("serve: the server task failed")?
            .context("serve: the server stopped")
    })
}

/// Size, modification time and a digest-like tag of the package's weights.
fn package_facts(dir: &std::path::Path) -> (u64, String, String) {
    let meta = std::fs::metadata(dir.join("model.q4nx")).ok();
    let size = meta.as_ref().map(|m| m.len()).unwrap_or(0);
    let mtime = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    let modified = api::rfc3339(mtime.as_secs(), mtime.subsec_nanos());
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (size, mtime.as_nanos(), dir.display().to_string()).hash(&mut h);
    (size, modified, format!("{:016x}{:016x}", h.finish(), size))
}

/// Every route. Only `/health` is open (launchers probe it); the others, and the 404
/// of unknown paths, sit behind the API key check (which passes everything when the
/// server has no key). The serve tests read the `.route(` calls here to knock on each.
fn router(app: Arc<App>) -> Router {
    let open = Router::new().route("/health", get(health));
    let locked = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(retrieve_model))
        .route("/v1/version", get(version))
        .route("/api/version", get(version))
        .route("/api/tags", get(tags))
        .route("/api/ps", get(ps))
        .route("/api/show", post(show))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/api/chat", post(ollama_chat))
        .route("/api/generate", post(ollama_generate))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .route("/metrics", get(metrics_route))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            require_key,
        ));
    open.merge(locked)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            count_answers,
        ))
        .with_state(app)
}

/// Counts every answer (a 401 too) by the route's pattern, so that paths nobody serves
/// add one `unmatched` series rather than one series each.
async fn count_answers(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let response = next.run(request).await;
    app.metrics.answered(&route, response.status().as_u16());
    response
}

/// `GET /metrics`: Prometheus' text format.
async fn metrics_route(State(app): State<Arc<App>>) -> Response {
    let gauges = match app.ready.get() {
        Some(r) => metrics::Gauges {
            queue_depth: app.waiting.load(Ordering::Acquire),
            active_sessions: r.parallel.saturating_sub(r.permits.available_permits()),
            sessions: r.parallel,
            ready: true,
            batch: r.engine.batch_stats(),
            batch_members: r.engine.batch_members(),
        },
        None => metrics::Gauges {
            queue_depth: 0,
            active_sessions: 0,
            sessions: 0,
            ready: false,
            batch: None,
            batch_members: 0,
        },
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(&gauges),
    )
        .into_response()
}

/// The API key check: without `--api-key` every request passes; with it, a request
/// must carry `Authorization: Bearer KEY`, else 401 in its API's error shape.
async fn require_key(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(key) = &app.api_key else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let message = match given {
        None => "serve: this server requires an API key (--api-key): send the header 'Authorization: Bearer KEY'",
        // The scheme's name is case-insensitive (RFC 9110).
        Some(v) => match v
            .get(..7)
            .filter(|s| s.eq_ignore_ascii_case(b"bearer "))
            .map(|_| &v[7..])
        {
            Some(token) if same_key(token, key.as_bytes()) => return next.run(request).await,
            Some(_) => "serve: the API key in the Authorization header does not match the server's --api-key",
            None => "serve: the Authorization header must be 'Bearer KEY' (the server's --api-key)",
        },
    };
    let e = ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: message.into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("invalid_api_key"),
        retry_after: None,
    };
    let ollama = request.uri().path().starts_with("/api/");
    app.log(&format!("{} 401 {message}", request.uri().path()));
    let mut r = error_response(&e, ollama);
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// Whether `given` equals `key`, in time that depends only on the key's length (not on
/// where the first differing byte is), so the key cannot be guessed byte by byte.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    let mut diff = usize::from(given.len() != key.len());
    for (i, &k) in key.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(!k) ^ k);
    }
    std::hint::black_box(diff) == 0
}

/// The warning for a listener other clients can reach without a key.
fn exposure_warning(local: SocketAddr, has_key: bool) -> Option<String> {
    if has_key || local.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "onebit serve: warning: listening on {local} without an API key: anyone who can reach this address can use the model (pass --api-key KEY or set ONEBIT_API_KEY)"
    ))
}

/// `--cors`: the CORS layer for these origins (`*`: any), or none.
fn cors_layer(origins: &[String]) -> Result<Option<tower_http::cors::CorsLayer>> {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list = origins
            .iter()
            .map(|o| {
                HeaderValue::from_str(o)
                    .with_context(|| format!("serve: --cors {o:?} is not a valid origin"))
            })
            .collect::<Result<Vec<_>>>()?;
        AllowOrigin::list(list)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            // Whatever the page's client sends (the OpenAI JS SDK adds `x-stainless-*`
            // headers): a fixed list would make browsers block its requests, and `*`
            // does not cover Authorization.
            .allow_headers(tower_http::cors::AllowHeaders::mirror_request())
            .max_age(Duration::from_secs(600)),
    ))
}

async fn not_found(method: Method, uri: Uri) -> Response {
    let e = ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("no route for {method} {}", uri.path()),
        kind: "invalid_request_error",
        param: None,
        code: Some("not_found"),
        retry_after: None,
    };
    error_response(&e, false)
}

async fn health(State(app): State<Arc<App>>) -> Response {
    match app.ready() {
        Ok(_) => axum::Json(json!({"status": "ok"})).into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})),
        )
            .into_response(),
    }
}

async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// The served model as an OpenAI model object.
fn model_object(app: &App) -> Value {
    json!({"id": app.name, "object": "model", "created": app.created, "owned_by": "onebit"})
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_object(&app)]})).into_response()
}

/// OpenAI's `GET /v1/models/{id}` (the SDK's `models.retrieve`).
async fn retrieve_model(
    State(app): State<Arc<App>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if app.serves(&id) {
        axum::Json(model_object(&app)).into_response()
    } else {
        error_response(&ApiError::unknown_model(&id), false)
    }
}

/// Ollama's `details` of the served model.
fn details(ready: &Ready) -> Value {
    let c = &ready.engine.package().config;
    let family = format!("{:?}", c.family).to_lowercase();
    json!({
        "parent_model": "",
        "format": "q4nx",
        "family": family,
        "families": [family],
        "parameter_size": parameter_size(c),
        "quantization_level": "Q4_1",
    })
}

/// Parameters of the model, counted from its config ("135M", "1.2B").
fn parameter_size(c: &npu_runtime::TargetConfig) -> String {
    let n = parameter_count(c) as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else {
        format!("{:.0}M", n / 1e6)
    }
}

fn parameter_count(c: &npu_runtime::TargetConfig) -> u64 {
    let (h, i, v) = (
        c.hidden_size as u64,
        c.intermediate_size as u64,
        c.vocab_size as u64,
    );
    let per_layer = h * c.q_dim() as u64 * 2 + h * c.kv_dim() as u64 * 2 + 3 * h * i + 2 * h;
    let head = if c.tie_word_embeddings { 0 } else { v * h };
    v * h + head + c.num_layers as u64 * per_layer + h
}

fn model_entry(app: &App, ready: &Ready) -> Value {
    json!({
        "name": app.name,
        "model": app.name,
        "modified_at": ready.modified,
        "size": ready.package_bytes,
        "digest": ready.digest,
        "details": details(ready),
    })
}

async fn tags(State(app): State<Arc<App>>) -> Response {
    match app.ready() {
        Ok(r) => axum::Json(json!({"models": [model_entry(&app, r)]})).into_response(),
        Err(e) => error_response(&e, true),
    }
}

async fn ps(State(app): State<Arc<App>>) -> Response {
    match app.ready() {
        Ok(r) => {
            let mut m = model_entry(&app, r);
            m["expires_at"] = json!("2318-01-01T00:00:00.000000000Z");
            m["size_vram"] = json!(0);
            m["context_length"] = json!(r.engine.ctx_len());
            axum::Json(json!({"models": [m]})).into_response()
        }
        Err(e) => error_response(&e, true),
    }
}

async fn show(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let bytes = read_body(&headers, body).await?;
        let r: api::ShowRequest = api::parse(&bytes)?;
        let model = r.model.or(r.name);
        app.check_model(model.as_deref())?;
        let ready = app.ready()?;
        let c = &ready.engine.package().config;
        let arch = format!("{:?}", c.family).to_lowercase();
        Ok::<_, ApiError>(json!({
            "modelfile": "",
            "parameters": "",
            "template": ready.engine.chat_template().unwrap_or(onebit_engine::FALLBACK_CHAT_TEMPLATE),
            "details": details(ready),
            "model_info": {
                "general.architecture": arch,
                "general.parameter_count": parameter_count(c),
                format!("{arch}.context_length"): ready.engine.ctx_len(),
                format!("{arch}.embedding_length"): c.hidden_size,
                format!("{arch}.block_count"): c.num_layers,
                format!("{arch}.attention.head_count"): c.num_heads,
                format!("{arch}.attention.head_count_kv"): c.num_kv_heads,
                format!("{arch}.vocab_size"): c.vocab_size,
            },
            "capabilities": ["completion"],
            "modified_at": ready.modified,
        }))
    }
    .await;
    match result {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error_response(&e, true),
    }
}

/// A text route of llama-server's (`/tokenize`, `/detokenize`, `/apply-template`): the
/// body read, then parsed and answered by `work` over the engine on a blocking thread.
async fn text_route(
    app: Arc<App>,
    headers: HeaderMap,
    body: Body,
    path: &'static str,
    work: fn(&App, &Engine, &[u8]) -> Result<Value, ApiError>,
) -> Response {
    let result = async {
        let bytes = read_body(&headers, body).await?;
        let app = app.clone();
        blocking(&app.clone(), move || {
            let engine = app.ready()?.engine.clone();
            work(&app, &engine, &bytes)
        })
        .await
    }
    .await;
    match result {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => {
            app.log(&format!("{path} {} {}", e.status.as_u16(), e.message));
            error_response(&e, false)
        }
    }
}

/// The answer to the engine's refusal of a text request (`field` names what was sent).
fn text_error(e: EngineError, field: &str) -> ApiError {
    match e {
        EngineError::Target(t @ npu_runtime::TargetError::TokenOutOfRange { .. }) => {
            ApiError::invalid(Some(field), format!("{field}: {t}"))
        }
        EngineError::NoTokenizer | EngineError::Encode(_) => {
            ApiError::invalid(Some(field), format!("{field}: {e}"))
        }
        other => ApiError::internal(other.to_string()),
    }
}

/// llama-server's `POST /tokenize`: `{"content", "add_special"}` → `{"tokens": [...]}`.
async fn tokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    text_route(app, headers, body, "/tokenize", |app, engine, bytes| {
        let (content, special) = api::parse::<api::TokenizeRequest>(bytes)?.check()?;
        if !app.tokenize_delay.is_zero() {
            std::thread::sleep(app.tokenize_delay);
        }
        let tokens = engine
            .encode(&content, special)
            .map_err(|e| text_error(e, "content"))?;
        Ok(json!({ "tokens": tokens }))
    })
    .await
}

/// llama-server's `POST /detokenize`: `{"tokens": [...]}` → `{"content"}`.
async fn detokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    text_route(app, headers, body, "/detokenize", |_, engine, bytes| {
        let ids = api::parse::<api::DetokenizeRequest>(bytes)?.check()?;
        let content = engine
            .detokenize(&ids)
            .map_err(|e| text_error(e, "tokens"))?;
        Ok(json!({ "content": content }))
    })
    .await
}

/// llama-server's `POST /apply-template`: `{"messages": [...]}` → `{"prompt"}`, the text
/// a chat request's messages become before tokenization.
async fn apply_template(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    text_route(app, headers, body, "/apply-template", |_, engine, bytes| {
        let messages = api::parse::<api::ApplyTemplateRequest>(bytes)?.check()?;
        // The template's errors are answered as a chat request's are.
        let prompt = engine
            .render_chat(&messages)
            .map_err(|e| prompt_error(e, &Prompt::Chat(messages)))?;
        Ok(json!({ "prompt": prompt }))
    })
    .await
}

/// The body, refused past [`MAX_BODY_BYTES`]. An oversized body is still read (and
/// dropped) up to [`DRAIN_BYTES`], so the client finishes sending and reads the 413
/// instead of a reset connection.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    use futures_util::StreamExt;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > DRAIN_BYTES) {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    let mut stream = body.into_data_stream();
    let mut data = Vec::with_capacity(declared.unwrap_or(0).min(MAX_BODY_BYTES));
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::invalid(None, format!("cannot read the request body: {e}")))?;
        seen += chunk.len();
        if seen <= MAX_BODY_BYTES {
            data.extend_from_slice(&chunk);
        } else if seen > DRAIN_BYTES {
            break;
        }
    }
    if seen > MAX_BODY_BYTES {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    Ok(Bytes::from(data))
}

async fn chat_completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate_route(app, headers, body, Route::Chat).await
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate_route(app, headers, body, Route::Completions).await
}

async fn ollama_chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate_route(app, headers, body, Route::OllamaChat).await
}

async fn ollama_generate(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate_route(app, headers, body, Route::OllamaGenerate).await
}

/// Sets the flag when dropped, unless disarmed: a handler or a response stream dropped
/// because the client went away cancels its generation.
struct CancelOnDrop(Option<CancelFlag>);

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

/// Counts a request waiting for a session while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the generation thread sends a streaming response.
enum Msg {
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
struct Extra {
    echo: Option<String>,
    logprobs: Option<Value>,
}

/// Parses, checks and queues one generation request, then answers it (streaming or not).
async fn generate_route(app: Arc<App>, headers: HeaderMap, body: Body, route: Route) -> Response {
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
enum Prepared {
    Generate(Box<Job>, Request),
    Load(api::LoadCall),
}

/// Runs `work` on a blocking thread: tokenizing and templating a prompt of megabytes
/// takes long enough to stall every stream and health probe sharing the async runtime's
/// two threads.
/// At most `App::tokenizing` of them run at once; the others wait here.
async fn blocking<T: Send + 'static>(
    app: &App,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let permit = app
        .tokenizing
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| ApiError::internal(format!("serve: the tokenizer permits closed: {e}")))?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
    .map_err(|e| ApiError::internal(format!("serve: a tokenizer thread failed: {e}")))?
}

/// The checked job and the engine request: the body read, then (on a blocking thread)
/// parsed, the model checked, the prompt tokenized and fitted to the context.
async fn prepare(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
    route: Route,
) -> Result<Prepared, ApiError> {
    let bytes = read_body(headers, body).await?;
    let app = app.clone();
    blocking(&app.clone(), move || prepare_blocking(&app, &bytes, route)).await
}

fn prepare_blocking(app: &App, bytes: &[u8], route: Route) -> Result<Prepared, ApiError> {
    let job = match route {
        Route::Chat | Route::Completions => Job::openai(api::parse(bytes)?, route == Route::Chat)?,
        Route::OllamaChat | Route::OllamaGenerate => {
            match Job::ollama(api::parse(bytes)?, route == Route::OllamaChat)? {
                api::OllamaCall::Generate(job) => job,
                api::OllamaCall::Load(call) => {
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
    let ctx = engine.ctx_len().unwrap_or(usize::MAX);
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
        draft: DraftMode::Auto,
        logprobs: job.logprobs,
        prompt_logprobs: job.echo && job.logprobs.is_some(),
        ..Request::new(Prompt::Tokens(ids), max_tokens)
    };
    Ok(Prepared::Generate(Box::new(job), request))
}

/// The answer to the engine's refusal to tokenize (or template) `prompt`.
fn prompt_error(e: EngineError, prompt: &Prompt) -> ApiError {
    match e {
        EngineError::Invalid(m) => ApiError::invalid(Some("prompt"), m),
        // The template refused these messages (roles not alternating...): the client's
        // request is at fault, and a 5xx would make SDKs retry it.
        e @ EngineError::TemplateException { .. } => {
            ApiError::invalid(Some("messages"), e.to_string())
        }
        EngineError::Target(t @ npu_runtime::TargetError::TokenOutOfRange { .. }) => {
            ApiError::invalid(Some("prompt"), t.to_string())
        }
        EngineError::EmptyPrompt => ApiError::invalid(
            Some(if matches!(prompt, Prompt::Chat(_)) {
                "messages"
            } else {
                "prompt"
            }),
            "the prompt is empty (it tokenizes to no tokens)",
        ),
        other => ApiError::internal(other.to_string()),
    }
}

/// Ollama's load (nothing to do: the model is loaded at start and stays) or unload (the
/// weights stay, as this server serves one model, but the idle sessions forget their
/// cached prompts), answered as Ollama does, with one object.
fn load_call(app: &App, call: api::LoadCall) -> Response {
    if call.unload {
        if let Ok(ready) = app.ready() {
            forget_prompts(ready);
        }
    }
    let reason = if call.unload { "unload" } else { "load" };
    let mut v = json!({"model": app.name, "created_at": api::now_rfc3339()});
    if call.route == Route::OllamaChat {
        v["message"] = json!({"role": "assistant", "content": ""});
    } else {
        v["response"] = json!("");
    }
    v["done"] = json!(true);
    v["done_reason"] = json!(reason);
    app.log(&format!("{} 200 {reason}", call.route.path()));
    axum::Json(v).into_response()
}

/// Empties the KV caches of the idle sessions (Ollama's unload, `keep_alive: 0`).
fn forget_prompts(ready: &Ready) {
    let mut pool = ready.sessions.lock().expect("session pool lock poisoned");
    for session in pool.iter_mut() {
        session.reset();
    }
}

/// A session slot: now, after waiting in the FIFO queue, or 503 when the queue is full.
async fn admit(app: &App) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    let ready = app.ready()?;
    if let Ok(p) = ready.permits.clone().try_acquire_owned() {
        return Ok(p);
    }
    // Reserve a place in the queue, or refuse.
    let mut n = app.waiting.load(Ordering::Acquire);
    loop {
        if n >= app.q_len {
            return Err(ApiError::queue_full(app.q_len));
        }
        match app
            .waiting
            .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => break,
            Err(now) => n = now,
        }
    }
    let _waiting = Waiting(&app.waiting);
    ready
        .permits
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::internal("the session pool is closed"))
}

/// Runs a job on a free session (holding `permit`) and answers it.
async fn run_job(
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
    let session = {
        let mut pool = ready.sessions.lock().expect("session pool lock poisoned");
        let ids = match &request.prompt {
            Prompt::Tokens(ids) => ids.as_slice(),
            _ => &[],
        };
        let best = (0..pool.len())
            .max_by_key(|&i| pool[i].reusable(ids))
            .expect("a permit means a session is free");
        pool.swap_remove(best)
    };
    let cancel = CancelFlag::new();
    let (tx, rx) = mpsc::channel::<Msg>(64);
    let delay = app.token_delay;
    let route = job.route;
    // Only a stream needs the pieces: a whole answer's handler is woken once, at the end.
    let stream = job.stream;
    let unload = job.unload;
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
            let mut sink = |e: Event<'_>| {
                let (text, lp) = match e {
                    Event::Token { text, logprob, .. } => (text, logprob),
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
                    log_done(&app, route, c, start);
                }
                Err(e) => {
                    engine_error(&app, route, e);
                }
            }
            // keep_alive 0: nothing of the request stays cached, in this session or
            // the idle ones.
            if unload {
                session.reset();
                forget_prompts(ready);
            }
            // The session goes back before the slot is released.
            ready
                .sessions
                .lock()
                .expect("session pool lock poisoned")
                .push(session);
            drop(permit);
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
        created: api::unix_now(),
        model: app.name.clone(),
        load_seconds: ready.engine.load_seconds(),
        seed: job.seed,
    };
    if job.stream {
        stream_response(job, meta, rx, cancel)
    } else {
        whole_response(job, meta, rx, cancel).await
    }
}

/// Streamed log-probabilities in the route's shape: chat's `{"content": [...]}`, the
/// legacy object on completions, Ollama's list.
fn stream_logprobs(
    engine: &Engine,
    route: Route,
    lps: &[onebit_engine::TokenLogprob],
    offset: &mut usize,
) -> Value {
    match route {
        Route::Chat => json!({"content": api::chat_entries(engine, lps), "refusal": null}),
        Route::Completions => {
            let entries: Vec<_> = lps.iter().map(|lp| (lp.token, Some(lp))).collect();
            api::legacy_logprobs(engine, &entries, offset)
        }
        Route::OllamaChat | Route::OllamaGenerate => json!(api::chat_entries(engine, lps)),
    }
}

/// A whole answer's echoed prompt and log-probabilities (the prompt's first, with echo).
fn whole_extra(
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
            api::legacy_logprobs(engine, &entries, &mut 0)
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
fn next_id() -> String {
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
struct Meta {
    id: String,
    created: u64,
    model: String,
    load_seconds: f64,
    /// The seed sampled with (the request's, or the fresh one drawn for it).
    seed: i64,
}

/// The request's log line.
fn log_done(app: &App, route: Route, c: &Completion, start: Instant) {
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

/// The answer to a failed generation.
fn api_error(e: &EngineError) -> ApiError {
    match e {
        EngineError::ContextOverflow { .. }
        | EngineError::Invalid(_)
        | EngineError::TemplateException { .. }
        | EngineError::Sampling(_) => ApiError::invalid(None, e.to_string()),
        _ => ApiError::internal(e.to_string()),
    }
}

/// Logs a failed generation (always: it is an error).
fn engine_error(app: &App, route: Route, e: &EngineError) {
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
async fn whole_response(
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
                "finish_reason": api::finish_reason(&c.stop),
            }],
            "usage": api::usage(&c),
            "timings": api::timings(&c),
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
                "finish_reason": api::finish_reason(&c.stop),
            }],
            "usage": api::usage(&c),
            "timings": api::timings(&c),
            "seed": meta.seed,
        }),
        Route::OllamaChat | Route::OllamaGenerate => {
            let mut v = ollama_line(&job, &meta, &c.text, true);
            merge(&mut v, api::ollama_stats(&c, meta.load_seconds));
            v["seed"] = json!(meta.seed);
            if let Some(lp) = extra.logprobs {
                v["logprobs"] = lp;
            }
            v
        }
    };
    axum::Json(body).into_response()
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

/// One Ollama object: a piece of the answer, or (with `done`) the whole of it.
fn ollama_line(job: &Job, meta: &Meta, text: &str, done: bool) -> Value {
    let mut v = json!({"model": meta.model, "created_at": api::now_rfc3339()});
    if job.route == Route::OllamaChat {
        v["message"] = json!({"role": "assistant", "content": text});
    } else {
        v["response"] = json!(text);
    }
    v["done"] = json!(done);
    v
}

/// One streamed OpenAI chunk.
fn openai_chunk(
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

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn ndjson(v: &Value) -> Bytes {
    Bytes::from(format!("{v}\n"))
}

/// A streaming answer: SSE for the OpenAI routes (ending `data: [DONE]`), NDJSON for
/// Ollama's. Dropping the body (the client went away) cancels the generation.
fn stream_response(job: Job, meta: Meta, rx: mpsc::Receiver<Msg>, cancel: CancelFlag) -> Response {
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
    let stream = futures_util::stream::unfold(state, |mut st| async move {
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
        match st.rx.recv().await {
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
                        merge(&mut v, api::ollama_stats(&c, st.meta.load_seconds));
                        v["seed"] = json!(st.meta.seed);
                        out.extend_from_slice(&ndjson(&v));
                    }
                    Ok(c) => {
                        let reason = api::finish_reason(&c.stop);
                        let mut last =
                            openai_chunk(&st.job, &st.meta, None, false, Some(reason), None);
                        last["timings"] = api::timings(&c);
                        out.extend_from_slice(&sse(&last));
                        if st.job.include_usage {
                            let mut u = openai_chunk(&st.job, &st.meta, None, false, None, None);
                            u["choices"] = json!([]);
                            u["usage"] = api::usage(&c);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_only_when_equal() {
        let key = b"sk-0123456789";
        assert!(same_key(key, key));
        assert!(!same_key(b"sk-0123456788", key));
        assert!(!same_key(b"sk-012345678", key), "a prefix");
        assert!(!same_key(b"sk-01234567890", key), "longer");
        assert!(!same_key(b"", key));
        // A shorter given key whose missing bytes would be 0 under another padding.
        assert!(!same_key(b"sk-\0", b"sk-"));
    }

    #[test]
    fn only_a_reachable_listener_without_a_key_warns() {
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let w = exposure_warning(any, false).unwrap();
        assert!(w.contains("0.0.0.0:8080 without an API key"), "{w}");
        assert!(exposure_warning(any, true).is_none());
        for local in ["127.0.0.1:8080", "127.3.4.5:1", "[::1]:8080"] {
            assert!(exposure_warning(local.parse().unwrap(), false).is_none());
        }
        assert!(exposure_warning("[::]:8080".parse().unwrap(), false).is_some());
    }

    #[test]
    fn latest_is_ollamas_default_tag() {
        assert_eq!(untagged("smollm2:latest"), "smollm2");
        assert_eq!(untagged("smollm2"), "smollm2");
        assert_eq!(untagged("smollm2:7b"), "smollm2:7b");
    }

    #[test]
    fn cors_origins_are_checked() {
        assert!(cors_layer(&[]).unwrap().is_none());
        assert!(cors_layer(&["*".into()]).unwrap().is_some());
        assert!(cors_layer(&["http://localhost:8080".into()])
            .unwrap()
            .is_some());
        let e = cors_layer(&["http://a\nb".into()]).unwrap_err();
        assert!(e.to_string().contains("--cors"), "{e}");
    }
}
