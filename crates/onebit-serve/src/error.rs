//! Refusals: [`ApiError`] (the status and OpenAI's error object), answered in each
//! API's shape, and the engine's errors mapped onto them (a client's fault is a 4xx, so
//! SDKs do not retry it).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use onebit_engine::{EngineError, Prompt};
use serde_json::{json, Value};

/// A refusal: the status, and the OpenAI error object's fields.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait (503 on a full queue).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 400 naming `param`.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
            retry_after: None,
        }
    }

    /// 404 for a model this server does not serve.
    pub fn unknown_model(name: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model '{name}' does not exist"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
            retry_after: None,
        }
    }

    /// 503 while the model loads.
    pub fn loading() -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "Loading model".into(),
            kind: "unavailable_error",
            param: None,
            code: None,
            retry_after: Some(1),
        }
    }

    /// 503 when the queue is full.
    pub fn queue_full(q_len: usize) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!(
                "the server is busy: every session is generating and the queue (--q-len {q_len}) is full; retry later"
            ),
            kind: "unavailable_error",
            param: None,
            code: Some("queue_full"),
            retry_after: Some(1),
        }
    }

    /// 413 for a body over the limit.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body exceeds {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
            retry_after: None,
        }
    }

    /// 500 for a failure inside the server.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The OpenAI error object.
    pub fn openai_body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// An error as an HTTP response: the OpenAI object, or Ollama's `{"error": "..."}` on
/// the native routes.
pub(crate) fn error_response(e: &ApiError, ollama: bool) -> Response {
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

/// The answer to the engine's refusal of a text request (`field` names what was sent).
pub(crate) fn text_error(e: EngineError, field: &str) -> ApiError {
    match e {
        t @ EngineError::TokenOutOfRange { .. } => {
            ApiError::invalid(Some(field), format!("{field}: {t}"))
        }
        EngineError::NoTokenizer | EngineError::Encode(_) => {
            ApiError::invalid(Some(field), format!("{field}: {e}"))
        }
        other => ApiError::internal(other.to_string()),
    }
}

/// The answer to the engine's refusal to tokenize (or template) `prompt`.
pub(crate) fn prompt_error(e: EngineError, prompt: &Prompt) -> ApiError {
    match e {
        EngineError::Invalid(m) => ApiError::invalid(Some("prompt"), m),
        // The template refused these messages (roles not alternating...): the client's
        // request is at fault, and a 5xx would make SDKs retry it.
        e @ EngineError::TemplateException { .. } => {
            ApiError::invalid(Some("messages"), e.to_string())
        }
        t @ EngineError::TokenOutOfRange { .. } => ApiError::invalid(Some("prompt"), t.to_string()),
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

/// The answer to a failed generation.
pub(crate) fn api_error(e: &EngineError) -> ApiError {
    match e {
        EngineError::ContextOverflow { .. }
        | EngineError::NoRoom { .. }
        | EngineError::Invalid(_)
        | EngineError::TemplateException { .. }
        | EngineError::Sampling(_) => ApiError::invalid(None, e.to_string()),
        _ => ApiError::internal(e.to_string()),
    }
}
