//! Ollama's routes: `/api/tags`, `/api/ps`, `/api/show`, `/api/chat`, `/api/generate`,
//! and its load and unload calls (a request with no prompt).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use onebit_engine::ModelFacts;
use serde_json::{json, Value};

use crate::encode;
use crate::error::{error_response, ApiError};
use crate::generate::generate_route;
use crate::request::{self, Route};
use crate::sessions::{release_idle, settle, Ready};
use crate::{read_body, App};

/// Size, modification time and a digest-like tag of the package's weights.
pub(crate) fn package_facts(dir: &std::path::Path) -> (u64, String, String) {
    let meta = std::fs::metadata(dir.join("model.q4nx")).ok();
    let size = meta.as_ref().map(|m| m.len()).unwrap_or(0);
    let mtime = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    let modified = encode::rfc3339(mtime.as_secs(), mtime.subsec_nanos());
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (size, mtime.as_nanos(), dir.display().to_string()).hash(&mut h);
    (size, modified, format!("{:016x}{:016x}", h.finish(), size))
}

/// Ollama's `details` of the served model.
pub(crate) fn details(ready: &Ready) -> Value {
    details_of(Some(&ready.engine.facts()))
}

/// Ollama's `details` of a model with these facts (unknown: empty).
fn details_of(facts: Option<&ModelFacts>) -> Value {
    let family = facts.map_or("", |f| f.family.as_str());
    json!({
        "parent_model": "",
        "format": "q4nx",
        "family": family,
        "families": [family],
        "parameter_size": facts.map(ModelFacts::parameter_size).unwrap_or_default(),
        "quantization_level": "Q4_1",
    })
}

/// A model's `/api/tags` entry from its package's facts ([`package_facts`]).
fn entry(app: &App, (size, modified, digest): (u64, &str, &str), details: Value) -> Value {
    json!({
        "name": app.name,
        "model": app.name,
        "modified_at": modified,
        "size": size,
        "digest": digest,
        "details": details,
    })
}

pub(crate) fn model_entry(app: &App, ready: &Ready) -> Value {
    let facts = (
        ready.package_bytes,
        ready.modified.as_str(),
        ready.digest.as_str(),
    );
    entry(app, facts, details(ready))
}

/// A model not loaded yet (a server of several loads each on its first request), as
/// `/api/tags` lists it: the package's size and date, and `facts` read from its
/// `config.json` (`None` when it could not be read: the load will say why).
pub(crate) fn unloaded_entry(
    app: &App,
    dir: &std::path::Path,
    facts: Option<&ModelFacts>,
) -> Value {
    let (size, modified, digest) = package_facts(dir);
    entry(app, (size, &modified, &digest), details_of(facts))
}

/// A loaded model as `/api/ps` lists it.
pub(crate) fn running_entry(app: &App, ready: &Ready) -> Value {
    let mut m = model_entry(app, ready);
    m["expires_at"] = json!("2318-01-01T00:00:00.000000000Z");
    m["size_vram"] = json!(0);
    m["context_length"] = json!(ready.engine.ctx_len());
    m
}

pub(crate) async fn tags(State(app): State<Arc<App>>) -> Response {
    match app.ready() {
        Ok(r) => axum::Json(json!({"models": [model_entry(&app, r)]})).into_response(),
        Err(e) => error_response(&e, true),
    }
}

pub(crate) async fn ps(State(app): State<Arc<App>>) -> Response {
    match app.ready() {
        Ok(r) => axum::Json(json!({"models": [running_entry(&app, r)]})).into_response(),
        Err(e) => error_response(&e, true),
    }
}

pub(crate) async fn show(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let bytes = read_body(&headers, body).await?;
        let r: request::ShowRequest = request::parse(&bytes)?;
        let model = r.model.or(r.name);
        app.check_model(model.as_deref())?;
        let ready = app.ready()?;
        let c = ready.engine.facts();
        let arch = &c.family;
        Ok::<_, ApiError>(json!({
            "modelfile": "",
            "parameters": "",
            "template": ready.engine.chat_template().unwrap_or(onebit_engine::FALLBACK_CHAT_TEMPLATE),
            "details": details(ready),
            "model_info": {
                "general.architecture": arch,
                "general.parameter_count": c.parameters,
                format!("{arch}.context_length"): ready.engine.ctx_len(),
                format!("{arch}.embedding_length"): c.hidden_size,
                format!("{arch}.block_count"): c.layers,
                format!("{arch}.attention.head_count"): c.heads,
                format!("{arch}.attention.head_count_kv"): c.kv_heads,
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

pub(crate) async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate_route(app, headers, body, Route::OllamaChat).await
}

pub(crate) async fn generate(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate_route(app, headers, body, Route::OllamaGenerate).await
}

/// Ollama's load (nothing to do: the model is loaded at start and stays) or unload (the
/// weights stay, as this server serves one model, but the idle sessions' KV caches are
/// freed), answered as Ollama does, with one object.
pub(crate) fn load_call(app: &Arc<App>, call: request::LoadCall) -> Response {
    let unload = call.keep_alive == Some(request::KeepAlive::Unload);
    if unload {
        if let Ok(ready) = app.ready() {
            release_idle(ready);
        }
    }
    // A preload's keep_alive (`{"model": m, "keep_alive": "5m"}`) sets the idle time.
    settle(app, call.keep_alive);
    let reason = if unload { "unload" } else { "load" };
    let mut v = json!({"model": app.name, "created_at": encode::now_rfc3339()});
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
