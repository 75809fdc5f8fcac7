//! Locked doors: `--api-key` (every route but `/health`), the warning for a listener
//! others can reach without one, and `--cors`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::Response;

use crate::error::{error_response, ApiError};
use crate::App;

/// The API key check: without `--api-key` every request passes; with it, a request
/// must carry `Authorization: Bearer KEY`, else 401 in its API's error shape.
pub(crate) async fn require_key(
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
pub(crate) fn same_key(given: &[u8], key: &[u8]) -> bool {
    let mut diff = usize::from(given.len() != key.len());
    for (i, &k) in key.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(!k) ^ k);
    }
    std::hint::black_box(diff) == 0
}

/// The warning for a listener other clients can reach without a key.
pub(crate) fn exposure_warning(local: SocketAddr, has_key: bool) -> Option<String> {
    if has_key || local.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "onebit serve: warning: listening on {local} without an API key: anyone who can reach this address can use the model (pass --api-key KEY or set ONEBIT_API_KEY)"
    ))
}

/// `--cors`: the CORS layer for these origins (`*`: any), or none.
pub(crate) fn cors_layer(origins: &[String]) -> Result<Option<tower_http::cors::CorsLayer>> {
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
