//! A server of several models (`onebit serve` with no model: every model of the store),
//! each loaded on its first request.
//!
//! Each model is an [`App`] of its own — its sessions, queue, `keep_alive` and names —
//! behind the same router a one-model server has. The front answers what concerns all
//! of them (`/health`, `/v1/models`, `/api/tags`, `/api/ps`, `/metrics`) and forwards a
//! generation or text request to the model its body names (`model`, or Ollama's `name`
//! on `/api/show`), loading that model first if it is not loaded (one load at a time
//! per model; requests for it wait; a failed load is a 500 naming the model and is
//! tried again by the next request). A body that names no model goes to the only
//! model, or is refused with the names to choose from. Loaded models stay loaded (the
//! weights are mapped; `keep_alive` frees their KV caches). The counters of `/metrics`
//! are the server's (shared by the models); its gauges are the models' added.

use std::sync::Arc;

use anyhow::Result;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use onebit_engine::{EngineConfig, ModelFacts};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::error::{error_response, ApiError};
use crate::routes::{ollama, openai};
use crate::{
    auth, count_answers, load_model, metrics, metrics_response, not_found, read_body,
    uncounted_router, version,
};
use crate::{App, ServeOptions, ServedModel};

/// One model of the server: its state, its routes and how it loads.
struct Model {
    app: Arc<App>,
    routes: Router,
    engine: EngineConfig,
    /// Read from its `config.json` once, for the listings before it loads.
    facts: Option<ModelFacts>,
    parallel: usize,
    /// Held while the model loads: the requests that wait for it queue here.
    loading: tokio::sync::Mutex<()>,
}

/// The models, in the order given.
pub(crate) struct Front {
    models: Vec<Model>,
}

impl Front {
    /// The `models` over their `apps` (one each, in order).
    pub(crate) fn new(
        apps: Vec<Arc<App>>,
        models: &[ServedModel],
        options: &ServeOptions,
    ) -> Arc<Front> {
        let models = apps
            .into_iter()
            .zip(models)
            .map(|(app, m)| Model {
                routes: uncounted_router(app.clone()),
                app,
                facts: ModelFacts::read(&m.engine.model).ok(),
                engine: m.engine.clone(),
                parallel: options.parallel,
                loading: tokio::sync::Mutex::new(()),
            })
            .collect();
        Arc::new(Front { models })
    }

    fn find(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.app.serves(name))
    }

    /// The model a request's body names (`model`, else `name`); without one, the only
    /// model, else a 400 that lists the names.
    fn pick(&self, body: &[u8]) -> Result<&Model, ApiError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid(None, format!("the request body is not valid JSON: {e}"))
        })?;
        let named = ["model", "name"]
            .iter()
            .find_map(|k| value.get(k).and_then(Value::as_str))
            .filter(|n| !n.is_empty());
        match named {
            Some(name) => self.find(name).ok_or_else(|| ApiError::unknown_model(name)),
            None if self.models.len() == 1 => Ok(&self.models[0]),
            None => Err(ApiError::invalid(
                Some("model"),
                format!(
                    "this server serves {} models: name one in 'model' ({})",
                    self.models.len(),
                    self.names().join(", ")
                ),
            )),
        }
    }

    fn names(&self) -> Vec<&str> {
        self.models.iter().map(|m| m.app.name.as_str()).collect()
    }
}

/// Loads `model` unless it is loaded (one load at a time; waiters find it loaded).
async fn ensure_loaded(model: &Model) -> Result<(), ApiError> {
    if model.app.ready.get().is_some() {
        return Ok(());
    }
    let _loading = model.loading.lock().await;
    if model.app.ready.get().is_some() {
        return Ok(());
    }
    let (app, engine, parallel) = (model.app.clone(), model.engine.clone(), model.parallel);
    app.log(&format!(
        "onebit serve: loading {} ({}) for its first request",
        app.name,
        engine.model.display()
    ));
    let loaded = tokio::task::spawn_blocking(move || load_model(&app, &engine, parallel)).await;
    let failure = match loaded {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => format!("{e:#}"),
        Err(e) => format!("the loader failed: {e}"),
    };
    let message = format!(
        "serve: cannot load the model {} ({}): {failure}",
        model.app.name,
        model.engine.model.display()
    );
    model.app.error(&message);
    Err(ApiError::internal(message))
}

/// A request for one model: its body read (and bounded), the model chosen and loaded,
/// then the request handed, whole, to that model's routes.
async fn forward(State(front): State<Arc<Front>>, request: axum::extract::Request) -> Response {
    let ollama = request.uri().path().starts_with("/api/");
    let (mut parts, body) = request.into_parts();
    let bytes = match read_body(&parts.headers, body).await {
        Ok(b) => b,
        Err(e) => return error_response(&e, ollama),
    };
    let model = match front.pick(&bytes) {
        Ok(m) => m,
        Err(e) => return error_response(&e, ollama),
    };
    if let Err(e) = ensure_loaded(model).await {
        return error_response(&e, ollama);
    }
    // The model's router matches the path again.
    parts.extensions.remove::<axum::extract::MatchedPath>();
    let request = axum::extract::Request::from_parts(parts, Body::from(bytes));
    match model.routes.clone().oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

async fn health() -> Response {
    // Serving: each model loads on its first request.
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn models(State(front): State<Arc<Front>>) -> Response {
    let data: Vec<Value> = front
        .models
        .iter()
        .map(|m| openai::model_object(&m.app))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn retrieve_model(State(front): State<Arc<Front>>, Path(id): Path<String>) -> Response {
    match front.find(&id) {
        Some(m) => axum::Json(openai::model_object(&m.app)).into_response(),
        None => error_response(&ApiError::unknown_model(&id), false),
    }
}

async fn tags(State(front): State<Arc<Front>>) -> Response {
    let entries: Vec<Value> = front
        .models
        .iter()
        .map(|m| match m.app.ready.get() {
            Some(ready) => ollama::model_entry(&m.app, ready),
            None => ollama::unloaded_entry(&m.app, &m.engine.model, m.facts.as_ref()),
        })
        .collect();
    axum::Json(json!({"models": entries})).into_response()
}

async fn ps(State(front): State<Arc<Front>>) -> Response {
    let entries: Vec<Value> = front
        .models
        .iter()
        .filter_map(|m| Some(ollama::running_entry(&m.app, m.app.ready.get()?)))
        .collect();
    axum::Json(json!({"models": entries})).into_response()
}

async fn metrics_route(State(front): State<Arc<Front>>) -> Response {
    let gauges = metrics::Gauges::sum(front.models.iter().map(|m| m.app.gauges()));
    metrics_response(&front.models[0].app.metrics, &gauges)
}

/// The routes of a server of several models: those about all of them here, the others
/// forwarded to the model a request names. The API key is checked here (and again by
/// the model's routes); every answer is counted here, once.
fn front_router(front: Arc<Front>) -> Router {
    let first = front.models[0].app.clone();
    let open = Router::new().route("/health", get(health));
    let listing = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(retrieve_model))
        .route("/v1/version", get(version))
        .route("/api/version", get(version))
        .route("/api/tags", get(tags))
        .route("/api/ps", get(ps))
        .route("/metrics", get(metrics_route))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            first.clone(),
            auth::require_key,
        ));
    let mut forwarded = Router::new();
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/api/chat",
        "/api/generate",
        "/api/show",
        "/tokenize",
        "/detokenize",
        "/apply-template",
    ] {
        forwarded = forwarded.route(path, post(forward));
    }
    let forwarded = forwarded.layer(axum::middleware::from_fn_with_state(
        first.clone(),
        auth::require_key,
    ));
    open.merge(listing)
        .merge(forwarded)
        .layer(axum::middleware::from_fn_with_state(first, count_answers))
        .with_state(front)
}

/// Serves the models until `stopped` (none is loaded before its first request).
pub(crate) async fn run(
    front: Arc<Front>,
    listener: tokio::net::TcpListener,
    cors: Option<tower_http::cors::CorsLayer>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> Result<()> {
    let mut routes = front_router(front);
    if let Some(cors) = cors {
        routes = routes.layer(cors);
    }
    axum::serve(listener, routes)
        .with_graceful_shutdown(async {
            let _ = stopped.await;
        })
        .await?;
    Ok(())
}
