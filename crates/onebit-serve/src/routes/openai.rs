//! OpenAI's routes: `/v1/models`, `/v1/models/{id}`, `/v1/chat/completions`,
//! `/v1/completions`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::error::{error_response, ApiError};
use crate::generate::generate_route;
use crate::request::Route;
use crate::App;

/// The served model as an OpenAI model object.
pub(crate) fn model_object(app: &App) -> Value {
    json!({"id": app.name, "object": "model", "created": app.created, "owned_by": "onebit"})
}

pub(crate) async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_object(&app)]})).into_response()
}

/// OpenAI's `GET /v1/models/{id}` (the SDK's `models.retrieve`).
pub(crate) async fn retrieve_model(
    State(app): State<Arc<App>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if app.serves(&id) {
        axum::Json(model_object(&app)).into_response()
    } else {
        error_response(&ApiError::unknown_model(&id), false)
    }
}

pub(crate) async fn chat_completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate_route(app, headers, body, Route::Chat).await
}

pub(crate) async fn completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate_route(app, headers, body, Route::Completions).await
}
