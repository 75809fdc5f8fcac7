//! # onebit-serve
//!
//! onebit's HTTP server: OpenAI-, Ollama- and llama-server-compatible routes over
//! [`onebit_engine`], and nothing below it (it names no backend, sampler or kernel type;
//! `cargo xtask tidy` checks). `onebit serve` parses its flags into [`ServeOptions`] and
//! calls [`serve`]; tests call [`start`] and get the bound address back.
//!
//! The listener is bound first and answers while the model loads (`/health` and the
//! model routes say 503 until it is ready), so a launcher polling `/api/tags` sees 200
//! exactly when requests can be served. Generation runs on tokio's blocking threads,
//! one [`Session`](onebit_engine::Session) per `--parallel` slot over one shared
//! [`Engine`]; requests beyond the slots wait in a FIFO queue of `--q-len` (tokio's
//! semaphore is fair), and past that are refused with 503 and `Retry-After`. A request
//! whose client goes away (its response body or its handler dropped) sets its
//! [`CancelFlag`](onebit_engine::CancelFlag); the generation stops at the next token
//! and the session goes back to the pool.
//!
//! Modules by concern: `routes/` (OpenAI, Ollama, llama-server's text routes),
//! `request` (bodies checked into one `Job`), `generate` (a job run and answered,
//! whole or streamed), `sessions` (admission queue and the prefix-affinity session
//! pool), `encode` (response shapes, SSE and NDJSON framing), `auth` (`--api-key`,
//! `--cors`), `error` (refusals in each API's error shape), `metrics` (`GET /metrics`).
//!
//! Invariants: no 5xx on malformed input; a dropped response cancels its generation;
//! no route but `/health` answers without the key when one is set; sessions sharing
//! passes answer byte for byte as sessions alone.

#![forbid(unsafe_code)]

mod auth;
mod encode;
mod error;
mod generate;
mod metrics;
mod request;
mod routes;
mod sessions;
mod store;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use onebit_engine::{Engine, EngineConfig};
use serde_json::json;
use tokio::sync::Semaphore;

use error::{error_response, ApiError};
use routes::{ollama, openai, text};
use sessions::Ready;

/// The largest request body accepted (413 beyond).
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// How much of an oversized body is read and dropped before the 413.
const DRAIN_BYTES: usize = 64 << 20;

/// Where the server's log lines go (standard error unless a caller, such as a test,
/// collects them).
#[derive(Clone)]
pub struct Log(Arc<dyn Fn(&str) + Send + Sync>);

impl Log {
    /// Lines to standard error.
    pub fn stderr() -> Log {
        Log(Arc::new(|line| eprintln!("{line}")))
    }

    /// Lines to `f`.
    pub fn to(f: impl Fn(&str) + Send + Sync + 'static) -> Log {
        Log(Arc::new(f))
    }
}

/// Delays that make races reproducible in tests (all zero in use).
#[derive(Clone, Copy, Debug, Default)]
pub struct DebugDelays {
    /// Sleep this long after every token (tests of queueing and cancellation).
    pub token: Duration,
    /// Wait this long before loading the model (tests of readiness).
    pub load: Duration,
    /// Sleep this long before tokenizing a request (tests of where tokenization runs).
    pub tokenize: Duration,
}

/// How long a streamed OpenAI answer stays silent before an SSE keep-alive comment.
pub const DEFAULT_SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// What `onebit serve` was asked for.
#[derive(Clone)]
pub struct ServeOptions {
    /// The model or models, by name.
    pub models: Served,
    /// The address to listen on.
    pub host: String,
    /// The port (0: any free port; the log line names it).
    pub port: u16,
    /// Requests that may wait for a free session; more are refused with 503.
    pub q_len: usize,
    /// Sessions generating at once.
    pub parallel: usize,
    /// Log errors only (no line per request).
    pub quiet: bool,
    /// Required as `Authorization: Bearer KEY` on every route but `/health`.
    pub api_key: Option<String>,
    /// Browser origins allowed to call the API (`*`: any); empty: no CORS headers.
    pub cors: Vec<String>,
    /// A streamed OpenAI answer with nothing to send for this long (queued, prefilling,
    /// or a slow token) sends an SSE comment (`: keep-alive`), so proxies and clients
    /// with read timeouts keep the connection (axum's and llama-server's habit).
    pub sse_keep_alive: Duration,
    /// For tests.
    pub debug: DebugDelays,
    /// Where log lines go.
    pub log: Log,
}

/// What a server serves. The other options apply to each model.
#[derive(Clone)]
pub enum Served {
    /// One model, loaded at start (`onebit serve MODEL`).
    One(ServedModel),
    /// Several models by name, each loaded on its first request (`onebit serve` with no
    /// model: every model of the store). At least one.
    Store(Vec<ServedModel>),
}

impl Served {
    /// The models, in order.
    pub fn models(&self) -> &[ServedModel] {
        match self {
            Served::One(m) => std::slice::from_ref(m),
            Served::Store(models) => models,
        }
    }
}

/// A model of a server.
#[derive(Clone)]
pub struct ServedModel {
    /// How it loads: its package, backend, drafter, context (`ctx_len` already resolved:
    /// the server refuses requests beyond it) and shared passes.
    pub engine: EngineConfig,
    /// Its name in the API.
    pub name: String,
    /// Other names requests may use for it (the package path, its directory's name).
    pub aliases: Vec<String>,
}

impl ServedModel {
    /// `engine` named `name`, with no other names.
    pub fn new(engine: EngineConfig, name: impl Into<String>) -> ServedModel {
        ServedModel {
            engine,
            name: name.into(),
            aliases: Vec::new(),
        }
    }
}

impl ServeOptions {
    /// Defaults for serving `models`: 127.0.0.1, any free port, one session, a queue of
    /// 10, no key, no CORS, log lines to standard error.
    pub fn new(models: Served) -> ServeOptions {
        ServeOptions {
            models,
            host: "127.0.0.1".into(),
            port: 0,
            q_len: 10,
            parallel: 1,
            quiet: false,
            api_key: None,
            cors: Vec::new(),
            sse_keep_alive: DEFAULT_SSE_KEEP_ALIVE,
            debug: DebugDelays::default(),
            log: Log::stderr(),
        }
    }
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
    sse_keep_alive: Duration,
    tokenize_delay: Duration,
    created: u64,
    /// `--api-key`: required of every route but /health.
    api_key: Option<String>,
    /// Shared by the models of a server that serves several.
    metrics: Arc<metrics::Metrics>,
    /// Ollama's `keep_alive` idle timeout.
    idle: std::sync::Mutex<sessions::IdleTimer>,
    /// Requests being parsed, templated and tokenized at once: the queue's length plus
    /// the sessions, so that work waits here instead of filling tokio's blocking pool
    /// (which the generations share) with megabyte prompts.
    tokenizing: Arc<Semaphore>,
    log: Log,
}

/// Serves until the process is stopped (or the model fails to load: that error).
pub fn serve(options: ServeOptions) -> Result<()> {
    start(options)?.wait()
}

/// A server running on its own threads; dropping it stops the listener.
pub struct Running {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Running {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until the server ends: only when the model fails to load, or it is stopped.
    pub fn wait(mut self) -> Result<()> {
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => anyhow::bail!("serve: the server thread panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Binds the listener, starts loading the model and serving on a thread of its own, and
/// returns once the listener is bound (the routes answer 503 until the model is ready).
pub fn start(options: ServeOptions) -> Result<Running> {
    if options
        .api_key
        .as_deref()
        .is_some_and(|k| k.trim().is_empty())
    {
        anyhow::bail!("serve: --api-key (or ONEBIT_API_KEY) is empty: give a key, or leave it unset for no key");
    }
    if options.parallel == 0 {
        anyhow::bail!("serve: --parallel must be at least 1");
    }
    let cors = auth::cors_layer(&options.cors)?;
    let metrics = Arc::new(metrics::Metrics::default());
    if options.models.models().is_empty() {
        anyhow::bail!("serve: no model to serve");
    }
    let apps: Vec<Arc<App>> = options
        .models
        .models()
        .iter()
        .map(|m| App::new(&options, &m.name, &m.aliases, &metrics))
        .collect();
    let app = apps[0].clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("serve: cannot start the async runtime")?;
    let addr = format!("{}:{}", options.host, options.port);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&addr))
        .with_context(|| format!("serve: cannot listen on {addr}"))?;
    let local: SocketAddr = listener.local_addr()?;
    match &options.models {
        Served::One(m) => app.log(&format!(
            "onebit serve: listening on http://{local} (loading {})",
            m.engine.model.display()
        )),
        Served::Store(models) => app.log(&format!(
            "onebit serve: listening on http://{local} ({} models, each loaded on its first request: {})",
            models.len(),
            models
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
    if let Some(warning) = auth::exposure_warning(local, app.api_key.is_some()) {
        // Always printed, also under --quiet: it is about who can use the server.
        app.error(&warning);
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("onebit-serve".into())
        .spawn(move || match &options.models {
            Served::One(m) => {
                let engine = m.engine.clone();
                runtime.block_on(run(app, engine, options, listener, cors, stopped))
            }
            Served::Store(models) => {
                let front = store::Front::new(apps, models, &options);
                runtime.block_on(store::run(front, listener, cors, stopped))
            }
        })
        .context("serve: cannot start the server thread")?;
    Ok(Running {
        addr: local,
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// Loads the model (on a blocking thread) while the routes answer, then serves until
/// `stopped`.
async fn run(
    app: Arc<App>,
    config: EngineConfig,
    options: ServeOptions,
    listener: tokio::net::TcpListener,
    cors: Option<tower_http::cors::CorsLayer>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> Result<()> {
    let loader = {
        let app = app.clone();
        let (parallel, load_delay) = (options.parallel, options.debug.load);
        tokio::task::spawn_blocking(move || -> Result<()> {
            std::thread::sleep(load_delay);
            load_model(&app, &config, parallel)
        })
    };
    let mut routes = router(app);
    if let Some(cors) = cors {
        // Outermost: a browser's preflight carries no key and is answered here.
        routes = routes.layer(cors);
    }
    let server = tokio::spawn(async move {
        axum::serve(listener, routes)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    match loader.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.context("serve: cannot load the model")),
        Err(e) => anyhow::bail!("serve: the loader failed: {e}"),
    }
    // Loaded: serve until stopped.
    server
        .await
        .context("serve: the server task failed")?
        .context("serve: the server stopped")
}

/// Loads `config` into `app` with `parallel` sessions, and says so.
fn load_model(app: &App, config: &EngineConfig, parallel: usize) -> Result<()> {
    let began = Instant::now();
    let engine = Engine::load(config)?;
    if let Some(note) = engine.context_note() {
        app.log(&format!("onebit: {note}"));
    }
    let ready = Ready::new(engine, parallel)?;
    let ctx = ready.engine.ctx_len().unwrap_or(0);
    let drafter = config.drafter.describe();
    let info = ready.engine.info().clone();
    let _ = app.ready.set(ready);
    app.log(&format!(
        "onebit serve: {} ready in {:.2} s (ctx {ctx}, parallel {parallel}, queue {}, drafter {drafter}, {} threads, {} precision, {} kernel)",
        app.name,
        began.elapsed().as_secs_f64(),
        app.q_len,
        info.threads,
        info.precision.name(),
        info.kernel,
    ));
    Ok(())
}

impl App {
    /// A model's routes' shared state: `name` and `aliases` are the names it answers to.
    fn new(
        options: &ServeOptions,
        name: &str,
        aliases: &[String],
        metrics: &Arc<metrics::Metrics>,
    ) -> Arc<App> {
        let mut names = vec![name.to_string()];
        names.extend(aliases.iter().cloned());
        Arc::new(App {
            name: name.to_string(),
            names,
            ready: OnceLock::new(),
            quiet: options.quiet,
            q_len: options.q_len,
            waiting: AtomicUsize::new(0),
            token_delay: options.debug.token,
            sse_keep_alive: options.sse_keep_alive,
            tokenize_delay: options.debug.tokenize,
            created: encode::unix_now(),
            api_key: options.api_key.clone(),
            metrics: metrics.clone(),
            idle: Default::default(),
            tokenizing: Arc::new(Semaphore::new(
                options.q_len.saturating_add(options.parallel).max(1),
            )),
            log: options.log.clone(),
        })
    }

    /// What `/metrics` reads of this model at a scrape.
    fn gauges(&self) -> metrics::Gauges {
        match self.ready.get() {
            Some(r) => metrics::Gauges {
                queue_depth: self.waiting.load(Ordering::Acquire),
                active_sessions: r.parallel.saturating_sub(r.permits.available_permits()),
                sessions: r.parallel,
                ready: true,
                batch: r.engine.batch_stats(),
                batch_members: r.engine.batch_members(),
                idle_kv_bytes: r.idle_kv_bytes(),
            },
            None => metrics::Gauges::default(),
        }
    }

    fn log(&self, line: &str) {
        if !self.quiet {
            (self.log.0)(line);
        }
    }

    fn error(&self, line: &str) {
        (self.log.0)(line);
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

/// Every route. Only `/health` is open (launchers probe it); the others, and the 404
/// of unknown paths, sit behind the API key check (which passes everything when the
/// server has no key). The serve tests read the `.route(` calls here to knock on each.
fn router(app: Arc<App>) -> Router {
    uncounted_router(app.clone()).layer(axum::middleware::from_fn_with_state(app, count_answers))
}

/// [`router`]'s routes without the count of answers (a server of several models counts
/// once, in front of them).
fn uncounted_router(app: Arc<App>) -> Router {
    let open = Router::new().route("/health", get(health));
    let locked = Router::new()
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*id}", get(openai::retrieve_model))
        .route("/v1/version", get(version))
        .route("/api/version", get(version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/tokenize", post(text::tokenize))
        .route("/detokenize", post(text::detokenize))
        .route("/apply-template", post(text::apply_template))
        .route("/metrics", get(metrics_route))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            auth::require_key,
        ));
    open.merge(locked).with_state(app)
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
    metrics_response(&app.metrics, &app.gauges())
}

fn metrics_response(metrics: &metrics::Metrics, gauges: &metrics::Gauges) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics.render(gauges),
    )
        .into_response()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_is_ollamas_default_tag() {
        assert_eq!(untagged("smollm2:latest"), "smollm2");
        assert_eq!(untagged("smollm2"), "smollm2");
        assert_eq!(untagged("smollm2:7b"), "smollm2:7b");
    }
}
