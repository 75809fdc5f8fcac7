//! llama-server's text routes: `/tokenize`, `/detokenize`, `/apply-template`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use onebit_engine::{Engine, Prompt};
use serde_json::{json, Value};

use crate::error::{error_response, prompt_error, text_error, ApiError};
use crate::request;
use crate::{blocking, read_body, App};

/// A text route of llama-server's (`/tokenize`, `/detokenize`, `/apply-template`): the
/// body read, then parsed and answered by `work` over the engine on a blocking thread.
pub(crate) async fn text_route(
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

/// llama-server's `POST /tokenize`: `{"content", "add_special"}` → `{"tokens": [...]}`.
pub(crate) async fn tokenize(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    text_route(app, headers, body, "/tokenize", |app, engine, bytes| {
        let (content, special) = request::parse::<request::TokenizeRequest>(bytes)?.check()?;
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
pub(crate) async fn detokenize(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    text_route(app, headers, body, "/detokenize", |_, engine, bytes| {
        let ids = request::parse::<request::DetokenizeRequest>(bytes)?.check()?;
        let content = engine
            .detokenize(&ids)
            .map_err(|e| text_error(e, "tokens"))?;
        Ok(json!({ "content": content }))
    })
    .await
}

/// llama-server's `POST /apply-template`: `{"messages": [...]}` → `{"prompt"}`, the text
/// a chat request's messages become before tokenization.
pub(crate) async fn apply_template(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    text_route(app, headers, body, "/apply-template", |_, engine, bytes| {
        let messages = request::parse::<request::ApplyTemplateRequest>(bytes)?.check()?;
        // The template's errors are answered as a chat request's are.
        let prompt = engine
            .render_chat(&messages)
            .map_err(|e| prompt_error(e, &Prompt::Chat(messages)))?;
        Ok(json!({ "prompt": prompt }))
    })
    .await
}
