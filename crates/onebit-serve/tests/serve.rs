//! The server over real HTTP: started in this process on an ephemeral port against a
//! tiny package (tiny-llama's GGUF converted, so its tokenizer really encodes), a
//! blocking HTTP client, every route and every error status matched on its message.
//! (`onebit serve`'s own flags — the default context, `ONEBIT_API_KEY` — and the
//! comparison with `onebit perplexity` are tested in the `onebit` crate.)

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::Server;
use test_support::http::client;

/// tiny-llama converted (model, config, a tokenizer that encodes) into a temp dir.
fn tiny() -> (tempfile::TempDir, PathBuf) {
    common::tiny_llama_package()
}

fn chat(content: &str, max_tokens: u64) -> Value {
    json!({
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// The `data:` payloads of an SSE body, checking the framing on the way.
fn sse_events(body: &str) -> Vec<String> {
    assert!(body.ends_with("data: [DONE]\n\n"), "{body:?}");
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            assert!(e.starts_with("data: "), "not an SSE data event: {e:?}");
            assert!(!e.contains('\n'), "one line per event: {e:?}");
            e["data: ".len()..].to_string()
        })
        .collect()
}

#[test]
fn every_route_answers_in_its_shape() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    assert_eq!(s.get("/health"), (200, json!({"status": "ok"})));
    let (st, v) = s.get("/v1/models");
    assert_eq!(st, 200);
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "tiny-llama");
    assert_eq!(v["data"][0]["object"], "model");
    let (st, v) = s.get("/api/tags");
    assert_eq!(st, 200);
    let m = &v["models"][0];
    assert_eq!(m["name"], "tiny-llama");
    assert_eq!(m["details"]["family"], "llama");
    assert_eq!(m["details"]["quantization_level"], "Q4_1");
    assert!(m["size"].as_u64().unwrap() > 500_000, "{m}");
    assert!(m["modified_at"].as_str().unwrap().ends_with('Z'), "{m}");
    let (st, v) = s.get("/api/version");
    assert_eq!(st, 200);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s.get("/v1/version").0, 200);
    let (st, v) = s.get("/api/ps");
    assert_eq!(st, 200);
    assert_eq!(v["models"][0]["name"], "tiny-llama");
    let (st, v) = s.post("/api/show", &json!({"model": "tiny-llama"}));
    assert_eq!(st, 200);
    assert_eq!(v["model_info"]["general.architecture"], "llama");
    assert_eq!(v["model_info"]["llama.context_length"], 256);
    assert!(v["template"].as_str().unwrap().contains("<|im_start|>"));

    // Chat, not streaming.
    let (st, v) = s.post("/v1/chat/completions", &chat("Hello there", 8));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], "tiny-llama");
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["message"]["role"], "assistant");
    assert!(c["message"]["content"].is_string());
    assert!(["stop", "length"].contains(&c["finish_reason"].as_str().unwrap()));
    let u = &v["usage"];
    let completion = u["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&completion), "{u}");
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + completion
    );
    assert!(u["prompt_tokens_details"]["cached_tokens"].is_u64());
    let t = &v["timings"];
    for key in [
        "cache_n",
        "prompt_n",
        "prompt_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_second",
    ] {
        assert!(t[key].is_number(), "timings.{key}: {t}");
    }
    assert_eq!(t["predicted_n"], u["completion_tokens"]);
    assert!(t.get("draft_n").is_none(), "no drafter, no draft_n: {t}");

    // Legacy completions, with token ids as the prompt.
    let (st, v) = s.post(
        "/v1/completions",
        &json!({"prompt": [1, 17, 300], "max_tokens": 5, "temperature": 0}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(v["choices"][0]["text"].is_string());
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    // Ollama, not streaming.
    let (st, v) = s.post(
        "/api/generate",
        &json!({"model": "tiny-llama", "prompt": "Hi", "stream": false, "options": {"num_predict": 4, "temperature": 0}}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["done"], true);
    assert!(v["response"].is_string());
    assert_eq!(v["eval_count"], 4);
    assert_eq!(v["done_reason"], "length");
    for key in [
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_duration",
    ] {
        assert!(v[key].is_u64(), "{key}: {v}");
    }
    // One log line per request.
    s.wait_log("/v1/chat/completions 200 prompt ", 1);
    s.wait_log("/api/generate 200 prompt ", 1);
}

/// While a streamed OpenAI answer has nothing to send (here: 150 ms a token against a
/// 40 ms keep-alive), the server sends SSE comments (`: keep-alive`), which SSE clients
/// skip; the data events are the same as without them. Ollama's NDJSON gets none.
#[test]
fn silent_sse_streams_send_keep_alive_comments() {
    let (_dir, pkg) = tiny();
    let s = Server::start(
        &pkg,
        &["--debug-token-delay-ms", "150", "--sse-keep-alive-ms", "40"],
        true,
    );
    let (_, whole) = s.post("/v1/chat/completions", &chat("Tell me a story", 3));
    let mut body = chat("Tell me a story", 3);
    body["stream"] = json!(true);
    let (st, _, text) = s.post_raw("/v1/chat/completions", &body);
    assert_eq!(st, 200);
    let comments = text.matches(": keep-alive\n\n").count();
    assert!(comments >= 2, "{text:?}");
    let data = text.replace(": keep-alive\n\n", "");
    let events = sse_events(&data);
    let content: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(content, whole["choices"][0]["message"]["content"]);
    let (st, _, ndjson) = s.post_raw(
        "/api/generate",
        &json!({"model": "tiny-llama", "prompt": "Once", "options": {"num_predict": 2}}),
    );
    assert_eq!(st, 200);
    assert!(!ndjson.contains("keep-alive"), "{ndjson:?}");
}

#[test]
fn sse_streams_are_framed_and_end_with_done() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let (_, whole) = s.post("/v1/chat/completions", &chat("Tell me a story", 12));
    let mut body = chat("Tell me a story", 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (st, ct, text) = s.post_raw("/v1/chat/completions", &body);
    assert_eq!(st, 200);
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let events = sse_events(&text);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let id = chunks[0]["id"].clone();
    let mut content = String::new();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], id);
        assert_eq!(c["created"], chunks[0]["created"]);
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            content.push_str(t);
        }
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    // Every chunk but the usage chunk carries "usage": null; the usage chunk has no choices.
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    for key in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage["usage"][key], whole["usage"][key], "{key}");
    }
    for c in &chunks[..chunks.len() - 1] {
        assert!(c["usage"].is_null(), "{c}");
    }
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(
        finish["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    assert_eq!(content, whole["choices"][0]["message"]["content"]);

    // Legacy completions stream the same way, and without include_usage there is no
    // usage chunk.
    let (st, ct, text) = s.post_raw(
        "/v1/completions",
        &json!({"prompt": "Once upon", "max_tokens": 6, "temperature": 0, "stream": true}),
    );
    assert_eq!(st, 200);
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let events = sse_events(&text);
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"].as_array().unwrap().len(), 1, "{v}");
        assert!(v.get("usage").is_none(), "{v}");
    }
}

#[test]
fn ollama_streams_ndjson() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let (st, ct, text) = s.post_raw(
        "/api/chat",
        &json!({"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 6, "temperature": 0}}),
    );
    assert_eq!(st, 200);
    assert_eq!(ct, "application/x-ndjson");
    assert!(text.ends_with('\n'));
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (last, pieces) = lines.split_last().unwrap();
    let mut content = String::new();
    for l in pieces {
        assert_eq!(l["done"], false);
        assert_eq!(l["model"], "tiny-llama");
        assert_eq!(l["message"]["role"], "assistant");
        content.push_str(l["message"]["content"].as_str().unwrap());
    }
    assert_eq!(last["done"], true);
    assert_eq!(last["eval_count"], 6);
    assert_eq!(last["done_reason"], "length");
    let (_, whole) = s.post(
        "/api/chat",
        &json!({"model": "tiny-llama", "stream": false, "messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 6, "temperature": 0}}),
    );
    assert_eq!(whole["message"]["content"], content.as_str());
    assert_eq!(whole["done"], true);
}

/// Asserts an OpenAI error object with `status` whose message contains `message`.
fn assert_error(got: (u16, Value), status: u16, message: &str) -> Value {
    let (st, v) = got;
    assert_eq!(st, status, "{v}");
    let e = &v["error"];
    assert!(
        e["message"].as_str().unwrap().contains(message),
        "{message:?} not in {e}"
    );
    assert!(e["type"].is_string(), "{e}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{e}");
    e.clone()
}

#[test]
fn errors_are_openai_objects_matched_on_their_message() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &["--ctx-len", "128"], true);
    let raw = |path: &str, body: &str| -> (u16, Value) {
        let r = client()
            .post(s.url(path))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap())
    };
    assert_error(
        raw("/v1/chat/completions", "{\"messages\": ["),
        400,
        "malformed JSON body",
    );
    let e = assert_error(
        raw(
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": 7}]}"#,
        ),
        400,
        "invalid field 'messages[0].content'",
    );
    assert_eq!(e["param"], "messages[0].content");
    let e = assert_error(
        raw(
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#,
        ),
        400,
        "invalid field 'temperature'",
    );
    assert_eq!(e["param"], "temperature");
    assert_error(
        s.post("/v1/chat/completions", &json!({"model": "tiny-llama"})),
        400,
        "'messages' is required",
    );
    let mut body = chat("x", 4);
    body["n"] = json!(2);
    let e = assert_error(s.post("/v1/chat/completions", &body), 400, "'n' must be 1");
    assert_eq!(e["param"], "n");
    let mut body = chat("x", 4);
    body["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
    assert_error(
        s.post("/v1/chat/completions", &body),
        400,
        "'tools' is not supported",
    );
    let mut body = chat("x", 4);
    body["temperature"] = json!(-1);
    let e = assert_error(
        s.post("/v1/chat/completions", &body),
        400,
        "temperature must be a finite number >= 0, got -1",
    );
    assert_eq!(e["param"], "temperature");
    let mut body = chat("x", 4);
    body["messages"][0]["role"] = json!("wizard");
    assert_error(
        s.post("/v1/chat/completions", &body),
        400,
        "messages[0].role: 'wizard' is not one of",
    );
    let mut body = chat("x", 4);
    body["model"] = json!("gpt-17");
    let e = assert_error(
        s.post("/v1/chat/completions", &body),
        404,
        "The model 'gpt-17' does not exist",
    );
    assert_eq!(e["code"], "model_not_found");
    assert_eq!(e["type"], "invalid_request_error");
    // Context: 128 positions here.
    let e = assert_error(
        s.post(
            "/v1/completions",
            &json!({"prompt": [1, 2, 3], "max_tokens": 200}),
        ),
        400,
        "the prompt has 3 tokens and max_tokens is 200, but the context holds 128 tokens",
    );
    assert_eq!(e["code"], "exceed_context_size_error");
    assert_error(
        s.post("/v1/completions", &json!({"prompt": [1, 2, 999999]})),
        400,
        "target: token id 999999 is outside the vocabulary of 512",
    );
    // 413 on an oversized body.
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(onebit_max_body() + 10));
    assert_error(
        raw("/v1/completions", &big),
        413,
        "the request body exceeds 4194304 bytes",
    );
    // Unknown routes.
    let (st, v) = s.get("/v1/nothing");
    assert_eq!(st, 404);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no route for GET /v1/nothing"));
    // Ollama's native error shape.
    let (st, v) = s.post(
        "/api/chat",
        &json!({"model": "llama9", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(st, 404);
    assert_eq!(v, json!({"error": "model 'llama9' not found"}));
    let (st, v) = s.post("/api/show", &json!({"model": "llama9"}));
    assert_eq!(st, 404);
    assert_eq!(v, json!({"error": "model 'llama9' not found"}));
    // The server is still fine.
    assert_eq!(s.post("/v1/chat/completions", &chat("x", 2)).0, 200);
}

/// A chat whose template refuses it (Gemma 3's, over two user turns in a row) is the
/// client's error: 400 with the template's own text, in both APIs' shapes (a 5xx would
/// make the OpenAI SDK retry it), and the server stays fine.
#[test]
fn a_template_refusal_is_a_400_with_its_text() {
    let (_dir, pkg) = tiny();
    let template = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../onebit-engine/tests/templates/gemma3.jinja"),
    )
    .unwrap();
    let config_path = pkg.join("config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["chat_template"] = json!(template);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let s = Server::start(&pkg, &[], true);
    let turns = json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]);
    let mut body = chat("x", 4);
    body["messages"] = turns.clone();
    let e = assert_error(
        s.post("/v1/chat/completions", &body),
        400,
        "the chat template refused the messages: Conversation roles must alternate user/assistant/user/assistant/...",
    );
    assert_eq!(e["param"], "messages");
    assert_eq!(e["type"], "invalid_request_error");
    let (st, v) = s.post(
        "/api/chat",
        &json!({"model": "tiny-llama", "messages": turns, "stream": false}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("Conversation roles must alternate"),
        "{v}"
    );
    // Alternating turns render and answer.
    assert_eq!(s.post("/v1/chat/completions", &chat("x", 2)).0, 200);
}

fn onebit_max_body() -> usize {
    4 << 20
}

#[test]
fn health_is_503_while_loading_then_200() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &["--debug-load-delay-ms", "1500"], false);
    let (st, v) = s.get("/health");
    assert_eq!(st, 503);
    assert_eq!(
        v,
        json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    );
    let r = client().get(s.url("/api/tags")).send().unwrap();
    assert_eq!(r.status(), 503);
    assert_error(
        s.post("/v1/chat/completions", &chat("x", 2)),
        503,
        "Loading model",
    );
    let start = Instant::now();
    while s.get("/health").0 != 200 {
        assert!(start.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.get("/api/tags").0, 200);
}

#[test]
fn concurrent_answers_equal_sequential_ones() {
    let (_dir, pkg) = tiny();
    let s = Arc::new(Server::start(
        &pkg,
        &["--parallel", "2", "--q-len", "16"],
        true,
    ));
    let prompts: Vec<String> = (0..6).map(|i| format!("Prompt number {i} says")).collect();
    let sequential: Vec<Value> = prompts
        .iter()
        .map(|p| s.post("/v1/chat/completions", &chat(p, 16)).1["choices"][0]["message"].clone())
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .cloned()
        .map(|p| {
            let s = s.clone();
            std::thread::spawn(move || {
                let (st, v) = s.post("/v1/chat/completions", &chat(&p, 16));
                assert_eq!(st, 200, "{v}");
                v["choices"][0]["message"].clone()
            })
        })
        .collect();
    let concurrent: Vec<Value> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(concurrent, sequential);
}

#[test]
fn a_follow_up_turn_reuses_the_cached_prefix() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let first = chat("The first question is about cats and dogs", 10);
    let (_, a) = s.post("/v1/chat/completions", &first);
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let answer = a["choices"][0]["message"]["content"].as_str().unwrap();
    let mut second = first.clone();
    second["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": answer}));
    second["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "And the second?"}));
    let (st, b) = s.post("/v1/chat/completions", &second);
    assert_eq!(st, 200, "{b}");
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let first_prompt = a["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= first_prompt,
        "cached {cached} < {first_prompt}: {b}"
    );
    assert_eq!(b["timings"]["cache_n"].as_u64().unwrap(), cached);
    assert_eq!(
        b["timings"]["prompt_n"].as_u64().unwrap() + cached,
        b["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    // The answer equals a fresh server's (reuse never changes the text).
    let fresh = Server::start(&pkg, &[], true);
    let (_, c) = fresh.post("/v1/chat/completions", &second);
    assert_eq!(c["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(c["choices"], b["choices"]);
}

#[test]
fn stop_strings_end_the_text_before_them() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let body =
        json!({"prompt": [1, 40, 50], "max_tokens": 40, "temperature": 0, "ignore_eos": true});
    let (_, v) = s.post("/v1/completions", &body);
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 12, "{text:?}");
    let stop: String = chars[8..11].iter().collect();
    let mut with_stop = body.clone();
    with_stop["stop"] = json!(["\u{1}never", stop]);
    let (_, w) = s.post("/v1/completions", &with_stop);
    let expected = &text[..text.find(&stop).unwrap()];
    assert_eq!(w["choices"][0]["text"], expected, "stop {stop:?}");
    assert_eq!(w["choices"][0]["finish_reason"], "stop");
    // Streamed: the same text, the stop string never sent.
    with_stop["stream"] = json!(true);
    let (_, _, raw) = s.post_raw("/v1/completions", &with_stop);
    let events = sse_events(&raw);
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, expected);
}

/// Sends a raw HTTP/1.1 POST on a socket and returns it (unread).
fn raw_post(s: &Server, path: &str, body: &Value) -> std::net::TcpStream {
    let addr = s.base.trim_start_matches("http://");
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    let body = body.to_string();
    write!(
        sock,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    sock
}

#[test]
fn a_disconnect_cancels_the_generation_and_frees_the_session() {
    let (_dir, pkg) = tiny();
    // 20 ms a token: 200 tokens would hold the only session for 4 s.
    let s = Server::start(&pkg, &["--debug-token-delay-ms", "20"], true);
    let long = json!({"prompt": [1, 5, 9], "max_tokens": 200, "temperature": 0, "ignore_eos": true, "stream": true});
    // Streaming: read the first event, then go away.
    let mut sock = raw_post(&s, "/v1/completions", &long);
    let mut first = [0u8; 64];
    let n = sock.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    drop(sock);
    let start = Instant::now();
    let (st, _) = s.post(
        "/v1/completions",
        &json!({"prompt": [1, 2], "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(st, 200);
    let waited = start.elapsed();
    assert!(waited < Duration::from_millis(2500), "waited {waited:?}");
    // Not streaming: the client goes away while waiting for the whole answer.
    let mut whole = long.clone();
    whole["stream"] = json!(false);
    let sock = raw_post(&s, "/v1/completions", &whole);
    std::thread::sleep(Duration::from_millis(300));
    drop(sock);
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    let (st, _) = s.post(
        "/v1/completions",
        &json!({"prompt": [1, 2], "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(st, 200);
    let waited = start.elapsed();
    assert!(waited < Duration::from_millis(2500), "waited {waited:?}");
    s.wait_log("stop: cancelled", 2);
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let (_dir, pkg) = tiny();
    let s = Arc::new(Server::start(
        &pkg,
        &["--q-len", "1", "--debug-token-delay-ms", "20"],
        true,
    ));
    let long =
        json!({"prompt": [1, 5, 9], "max_tokens": 100, "temperature": 0, "ignore_eos": true});
    let running = {
        let (s, long) = (s.clone(), long.clone());
        std::thread::spawn(move || s.post("/v1/completions", &long))
    };
    std::thread::sleep(Duration::from_millis(300));
    let queued = {
        let s = s.clone();
        std::thread::spawn(move || {
            s.post(
                "/v1/completions",
                &json!({"prompt": [1, 2], "max_tokens": 2, "temperature": 0}),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let r = client()
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": [1, 2], "max_tokens": 2}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the queue (--q-len 1) is full"),
        "{v}"
    );
    assert_eq!(v["error"]["code"], "queue_full");
    assert_eq!(running.join().unwrap().0, 200);
    assert_eq!(queued.join().unwrap().0, 200);
}

#[test]
fn the_openai_python_package_chats_with_smollm2() {
    let Some(pkg) =
        test_support::fetched_model!("smollm2", "the_openai_python_package_chats_with_smollm2")
    else {
        return;
    };
    // The pinned clients of `cargo xtask client-env` (as `crates/onebit/tests/serve_clients.rs`
    // uses them): nothing is installed at test time.
    let python =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/client-venv/bin/python");
    if !python.exists() {
        test_support::skip!(
            "the_openai_python_package_chats_with_smollm2",
            "the Python clients are not installed in target/client-venv (run `cargo xtask client-env`)"
        );
        return;
    }
    let s = Server::start(&pkg, &["--alias", "smollm2"], true);
    let script = r#"
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
r = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=24,
    messages=[{"role": "user", "content": "What is the capital of France?"}])
whole = r.choices[0].message.content
assert whole.strip(), whole
assert r.choices[0].finish_reason in ("stop", "length")
assert r.usage.completion_tokens > 0
parts = []
for chunk in client.chat.completions.create(model="smollm2", temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "What is the capital of France?"}]):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
assert "".join(parts) == whole, ("".join(parts), whole)
try:
    client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    raise SystemExit("no error for an unknown model")
except openai.NotFoundError as e:
    assert "does not exist" in str(e), e
# Logprobs through the SDK's types: chat (whole and streamed) and completions' echo.
r = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=8, logprobs=True,
    top_logprobs=3, messages=[{"role": "user", "content": "What is the capital of France?"}])
content = r.choices[0].logprobs.content
assert len(content) == r.usage.completion_tokens, content
assert content[0].top_logprobs[0].token == content[0].token and content[0].logprob <= 0, content[0]
assert bytes(content[0].bytes).decode("utf-8", "replace") == content[0].token
streamed = []
for chunk in client.chat.completions.create(model="smollm2", temperature=0, max_tokens=8, logprobs=True,
        top_logprobs=3, stream=True, messages=[{"role": "user", "content": "What is the capital of France?"}]):
    if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
        streamed.extend(chunk.choices[0].logprobs.content)
assert [e.logprob for e in streamed] == [e.logprob for e in content]
c = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=1,
    echo=True, logprobs=1, temperature=0)
lp = c.choices[0].logprobs
assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp
assert all(v <= 0 for v in lp.token_logprobs[1:]), lp
assert c.choices[0].text.startswith("The capital of France is") or "capital" in c.choices[0].text, c
# Penalties and the extension fields.
p = client.chat.completions.create(model="smollm2", max_tokens=8, seed=3, temperature=0.7,
    presence_penalty=0.5, frequency_penalty=0.5,
    extra_body={"top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1},
    messages=[{"role": "user", "content": "What is the capital of France?"}])
assert p.choices[0].message.content is not None
print("ok", whole)
"#;
    let out = Command::new(&python)
        .args(["-c", script, &s.base])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}\n{:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok"));
}

#[test]
fn a_drafting_server_reports_drafts_and_answers_as_a_plain_one() {
    let (_dir, pkg) = tiny();
    let plain = Server::start(&pkg, &[], true);
    let lookup = Server::start(&pkg, &["--lookup", "--fixed-k"], true);
    let prompt: Vec<u32> = (0..40).map(|i| [5u32, 6, 7, 8][i % 4]).collect();
    let body = json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let (_, a) = plain.post("/v1/completions", &body);
    let (st, b) = lookup.post("/v1/completions", &body);
    assert_eq!(st, 200, "{b}");
    assert_eq!(a["choices"], b["choices"]);
    assert!(a["timings"].get("draft_n").is_none(), "{a}");
    let t = &b["timings"];
    assert!(t["draft_n"].is_u64(), "{t}");
    assert!(
        t["draft_n_accepted"].as_u64().unwrap() <= t["draft_n"].as_u64().unwrap(),
        "{t}"
    );
    // The counters by drafter: lookup drafted everything.
    assert!(a["timings"].get("drafters").is_none(), "{a}");
    assert_drafted_by_lookup(t);
    lookup.wait_log("drafts ", 1);
    // Ollama's final object carries the same counters, whole and streamed.
    let body = json!({"model": "tiny-llama", "prompt": "one two three ".repeat(12), "raw": true, "stream": false,
        "options": {"temperature": 0, "num_predict": 24}});
    let (_, a) = plain.post("/api/generate", &body);
    let (st, b) = lookup.post("/api/generate", &body);
    assert_eq!(st, 200, "{b}");
    assert_eq!(a["response"], b["response"]);
    assert!(a.get("draft_n").is_none(), "{a}");
    assert!(b["draft_n"].as_u64().unwrap() > 0, "{b}");
    assert!(
        b["draft_n_accepted"].as_u64().unwrap() <= b["draft_n"].as_u64().unwrap(),
        "{b}"
    );
    assert!(a.get("drafters").is_none(), "{a}");
    assert_drafted_by_lookup(&b);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, _, text) = lookup.post_raw("/api/generate", &streamed);
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["done"], true, "{last}");
    assert!(last["draft_n"].as_u64().unwrap() > 0, "{last}");
    assert!(
        last["draft_n_accepted"].as_u64().unwrap() <= last["draft_n"].as_u64().unwrap(),
        "{last}"
    );
    assert_drafted_by_lookup(&last);
}

/// `v`'s `drafters` holds lookup alone, with the totals `draft_n` and `draft_n_accepted`
/// and at least one round.
fn assert_drafted_by_lookup(v: &Value) {
    let by = v["drafters"].as_object().unwrap();
    assert_eq!(by.keys().collect::<Vec<_>>(), ["lookup"], "{v}");
    let l = &by["lookup"];
    assert_eq!(l["draft_n"], v["draft_n"], "{v}");
    assert_eq!(l["draft_n_accepted"], v["draft_n_accepted"], "{v}");
    assert!(l["rounds"].as_u64().unwrap() > 0, "{v}");
}

/// Ollama's `options.num_ctx` is the request's context within the server's `--ctx-len`:
/// a request that does not fit it is refused with its number, an unbounded one stops at
/// it, and a `num_ctx` beyond the server's (or below 1) is refused by name.
#[test]
fn ollama_num_ctx_is_honoured_within_the_servers_context() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &["--ctx-len", "128"], true);
    let body = |options: Value| {
        json!({"model": "tiny-llama", "prompt": "one two three four", "raw": true,
        "stream": false, "options": options})
    };
    let (st, v) = s.post(
        "/api/generate",
        &body(json!({"num_ctx": 16, "num_predict": 64})),
    );
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("the context holds 16 tokens"),
        "{v}"
    );
    // Without num_predict: generates up to the request's context, not the server's.
    let (st, v) = s.post(
        "/api/generate",
        &body(json!({"num_ctx": 16, "temperature": 0})),
    );
    assert_eq!(st, 200, "{v}");
    let used = v["prompt_eval_count"].as_u64().unwrap() + v["eval_count"].as_u64().unwrap();
    assert!(used <= 16, "{v}");
    let (st, wide) = s.post("/api/generate", &body(json!({"temperature": 0})));
    assert_eq!(st, 200, "{wide}");
    if v["done_reason"] == "length" {
        assert_eq!(used, 16, "{v}");
        assert!(
            wide["eval_count"].as_u64().unwrap() > v["eval_count"].as_u64().unwrap(),
            "{wide}"
        );
    }
    for (n, says) in [
        (
            json!(129),
            "'options.num_ctx' is 129, more than this server's context of 128 tokens",
        ),
        (json!(0), "'options.num_ctx' must be at least 1, got 0"),
        (json!(-5), "'options.num_ctx' must be at least 1, got -5"),
    ] {
        let (st, v) = s.post("/api/generate", &body(json!({"num_ctx": n})));
        assert_eq!(st, 400, "{v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{v}");
    }
}

/// A sampled completion of 24 tokens past end-of-sequence from a fixed token prompt.
fn sampled(seed: Option<i64>) -> Value {
    let mut body =
        json!({"prompt": [1, 40, 50], "max_tokens": 24, "temperature": 0.9, "ignore_eos": true});
    if let Some(s) = seed {
        body["seed"] = json!(s);
    }
    body
}

/// Without a seed each request draws a fresh one, reported in the response; the same
/// seed gives the same answer.
///
/// Served: the tiny-qwen3 fixture, whose tokenizer spells each of its 512 ids as its own
/// piece (`<0xB1>`, `rr`, ...), so different tokens make different text (tiny-llama's
/// converted byte-fallback tokenizer turns many ids into the same U+FFFD). Its weights
/// are random and its next-token distributions broad: of 200 seeded 24-token samples
/// from this prompt at temperature 0.9, pairs agreed on the first token 8.6% of the
/// time, on the first two 1.0%, three 0.2%, four 0.015%, six never. At that rate of
/// about a tenth per token, two 24-token answers agree with a probability near 1e-20.
#[test]
fn unseeded_requests_draw_a_fresh_seed_and_a_seed_replays() {
    let s = Server::start(&common::fixture("tiny-qwen3"), &[], true);
    let (st, a) = s.post("/v1/completions", &sampled(None));
    assert_eq!(st, 200, "{a}");
    let (_, b) = s.post("/v1/completions", &sampled(None));
    let (seed_a, seed_b) = (a["seed"].as_i64().unwrap(), b["seed"].as_i64().unwrap());
    assert_ne!(seed_a, seed_b);
    // Below 2^53, so a JavaScript client can send it back unchanged.
    assert!((0..1 << 53).contains(&seed_a), "{seed_a}");
    assert_ne!(
        a["choices"][0]["text"], b["choices"][0]["text"],
        "two unseeded answers at temperature 0.9 are equal"
    );
    // The reported seed replays the answer, once or twice.
    for _ in 0..2 {
        let (_, r) = s.post("/v1/completions", &sampled(Some(seed_a)));
        assert_eq!(r["choices"][0]["text"], a["choices"][0]["text"]);
        assert_eq!(r["seed"], seed_a);
    }
    // -1 is "random" (llama.cpp's and Ollama's spelling), a negative seed otherwise is a seed.
    let (_, r) = s.post("/v1/completions", &sampled(Some(-1)));
    assert!(r["seed"].as_i64().unwrap() >= 0, "{r}");
    let (_, n1) = s.post("/v1/completions", &sampled(Some(-7)));
    let (_, n2) = s.post("/v1/completions", &sampled(Some(-7)));
    assert_eq!(n1["seed"], -7);
    assert_eq!(n1["choices"], n2["choices"]);
    // Streamed chunks carry the seed too, and the streamed text replays.
    let mut body = sampled(Some(seed_a));
    body["stream"] = json!(true);
    let (_, _, raw) = s.post_raw("/v1/completions", &body);
    let events = sse_events(&raw);
    let mut text = String::new();
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert_eq!(v["seed"], seed_a, "{v}");
        text.push_str(v["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(text, a["choices"][0]["text"].as_str().unwrap());
    // Chat.
    let mut chat_body = chat("Tell me something", 16);
    chat_body["model"] = json!("tiny-qwen3");
    chat_body["temperature"] = json!(0.9);
    let (_, c) = s.post("/v1/chat/completions", &chat_body);
    chat_body["seed"] = c["seed"].clone();
    let (_, d) = s.post("/v1/chat/completions", &chat_body);
    assert_eq!(c["choices"], d["choices"]);
    // Ollama: the seed is in the final object, streamed or not.
    let ollama = |seed: Option<i64>, stream: bool| {
        let mut options = json!({"num_predict": 16, "temperature": 0.9});
        if let Some(seed) = seed {
            options["seed"] = json!(seed);
        }
        let body = json!({"model": "tiny-qwen3", "prompt": "Once upon a time", "stream": stream, "options": options});
        let (_, _, raw) = s.post_raw("/api/generate", &body);
        let lines: Vec<Value> = raw
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let text: String = lines
            .iter()
            .map(|l| l["response"].as_str().unwrap())
            .collect();
        (lines.last().unwrap()["seed"].as_i64().unwrap(), text)
    };
    let (seed_o, text_o) = ollama(None, false);
    let (seed_p, _) = ollama(None, true);
    assert_ne!(seed_o, seed_p);
    assert_eq!(ollama(Some(seed_o), true), (seed_o, text_o.clone()));
    assert_eq!(ollama(Some(seed_o), false), (seed_o, text_o));
}

#[test]
fn models_are_retrieved_by_name_and_latest_is_the_plain_name() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let (_, list) = s.get("/v1/models");
    for id in ["tiny-llama", "tiny-llama:latest"] {
        let (st, v) = s.get(&format!("/v1/models/{id}"));
        assert_eq!(st, 200, "{v}");
        assert_eq!(v, list["data"][0]);
    }
    let (st, v) = s.get("/v1/models/gpt-17");
    let e = assert_error((st, v), 404, "The model 'gpt-17' does not exist");
    assert_eq!(e["code"], "model_not_found");
    assert_eq!(s.get("/v1/models/tiny-llama:7b").0, 404);
    // Everywhere a model is named.
    let mut body = chat("Hi", 2);
    body["model"] = json!("tiny-llama:latest");
    assert_eq!(s.post("/v1/chat/completions", &body).0, 200);
    let (st, v) = s.post(
        "/v1/completions",
        &json!({"model": "tiny-llama:latest", "prompt": "Hi", "max_tokens": 2}),
    );
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.post(
        "/api/chat",
        &json!({"model": "tiny-llama:latest", "stream": false, "messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 2}}),
    );
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.post(
        "/api/generate",
        &json!({"model": "tiny-llama:latest", "stream": false, "prompt": "Hi", "options": {"num_predict": 2}}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        s.post("/api/show", &json!({"model": "tiny-llama:latest"}))
            .0,
        200
    );
    assert_eq!(
        s.post("/api/generate", &json!({"model": "tiny-llama:latest"}))
            .0,
        200
    );
    let (st, v) = s.post("/api/show", &json!({"model": "tiny-llama:7b"}));
    assert_eq!(
        (st, v),
        (404, json!({"error": "model 'tiny-llama:7b' not found"}))
    );
}

#[test]
fn llama_server_text_routes_tokenize_detokenize_and_apply_the_template() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let (st, plain) = s.post("/tokenize", &json!({"content": "Hello world"}));
    assert_eq!(st, 200, "{plain}");
    let plain: Vec<u64> = serde_json::from_value(plain["tokens"].clone()).unwrap();
    assert!(!plain.is_empty());
    let (_, special) = s.post(
        "/tokenize",
        &json!({"content": "Hello world", "add_special": true}),
    );
    let special: Vec<u64> = serde_json::from_value(special["tokens"].clone()).unwrap();
    // add_special puts the tokenizer's BOS in front (llama-server's default is false).
    assert_eq!(special.len(), plain.len() + 1, "{special:?} vs {plain:?}");
    assert_eq!(&special[1..], &plain[..]);
    let (st, v) = s.post("/detokenize", &json!({"tokens": plain}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["content"].as_str().unwrap().trim_start(), "Hello world");
    // /apply-template gives the text a chat becomes: tokenized, exactly the chat's prompt.
    let messages =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]);
    let (st, v) = s.post("/apply-template", &json!({"messages": messages}));
    assert_eq!(st, 200, "{v}");
    let prompt = v["prompt"].as_str().unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    );
    // A chat prompt holds the tokenizer's BOS once (tiny-llama's adds one; the template
    // writes none), as `add_special` tokenizes it.
    let (_, tokens) = s.post(
        "/tokenize",
        &json!({"content": prompt, "add_special": true}),
    );
    let (_, c) = s.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 1, "temperature": 0}),
    );
    assert_eq!(
        c["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        tokens["tokens"].as_array().unwrap().len()
    );
    // Refusals, by name.
    assert_error(
        s.post("/tokenize", &json!({})),
        400,
        "'content' is required",
    );
    assert_error(
        s.post("/tokenize", &json!({"content": "x", "with_pieces": true})),
        400,
        "'with_pieces' is not supported",
    );
    let e = assert_error(
        s.post("/detokenize", &json!({"tokens": [5, 4294967297u64]})),
        400,
        "tokens[1]: token id 4294967297 is not a token id",
    );
    assert_eq!(e["param"], "tokens[1]");
    assert_error(
        s.post("/detokenize", &json!({"tokens": [5, 999999]})),
        400,
        "tokens: target: token id 999999 is outside the vocabulary of 512",
    );
    assert_error(
        s.post(
            "/apply-template",
            &json!({"messages": [{"role": "user", "content": null}]}),
        ),
        400,
        "messages[0].content is null or missing",
    );
    assert_error(
        s.post("/apply-template", &json!({"messages": []})),
        400,
        "'messages' must hold at least one message",
    );
}

#[test]
fn hostile_sizes_ids_and_nulls_get_named_400s() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let e = assert_error(
        s.post(
            "/v1/completions",
            &json!({"prompt": [1, 2], "max_tokens": u64::MAX}),
        ),
        400,
        "the prompt has 2 tokens and max_tokens is 18446744073709551615, but the context holds 256 tokens",
    );
    assert_eq!(e["param"], "max_tokens");
    let mut body = chat("x", 1);
    body["max_tokens"] = json!(u64::MAX - 1);
    body["max_completion_tokens"] = json!(u64::MAX);
    assert_error(
        s.post("/v1/chat/completions", &body),
        400,
        "max_completion_tokens is 18446744073709551615",
    );
    let (st, v) = s.post(
        "/api/generate",
        &json!({"prompt": "x", "stream": false, "options": {"num_predict": i64::MAX}}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("options.num_predict is 9223372036854775807"),
        "{v}"
    );
    let e = assert_error(
        s.post(
            "/v1/completions",
            &json!({"prompt": [4294967297u64, 5], "max_tokens": 2}),
        ),
        400,
        "prompt[0]: token id 4294967297 is not a token id",
    );
    assert_eq!(e["param"], "prompt[0]");
    let e = assert_error(
        s.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": null}], "max_tokens": 2}),
        ),
        400,
        "messages[1].content is null or missing",
    );
    assert_eq!(e["param"], "messages[1].content");
    let (st, v) = s.post(
        "/api/chat",
        &json!({"stream": false, "messages": [{"role": "user"}]}),
    );
    assert_eq!(st, 400);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("messages[0].content is null or missing"),
        "{v}"
    );
    // The server is still fine.
    assert_eq!(s.post("/v1/chat/completions", &chat("x", 2)).0, 200);
    assert_eq!(s.get("/health").0, 200);
}

#[test]
fn ollama_preloads_and_unloads_without_generating() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    for body in [
        json!({"model": "tiny-llama"}),
        json!({"model": "tiny-llama", "prompt": ""}),
    ] {
        let (st, v) = s.post("/api/generate", &body);
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["done"], true);
        assert_eq!(v["done_reason"], "load");
        assert_eq!(v["response"], "");
        assert!(v.get("eval_count").is_none(), "nothing generated: {v}");
    }
    let (_, v) = s.post("/api/chat", &json!({"model": "tiny-llama", "messages": []}));
    assert_eq!(v["done_reason"], "load");
    assert_eq!(v["message"], json!({"role": "assistant", "content": ""}));
    assert_eq!(
        s.post("/api/generate", &json!({"model": "llama9"})),
        (404, json!({"error": "model 'llama9' not found"}))
    );
    // A repeated prompt reuses the session's cache; after an unload it does not.
    let body = chat("The same question twice", 2);
    s.post("/v1/chat/completions", &body);
    let (_, v) = s.post("/v1/chat/completions", &body);
    assert!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    for keep_alive in [json!(0), json!("0s"), json!("0")] {
        let (st, v) = s.post(
            "/api/generate",
            &json!({"model": "tiny-llama", "keep_alive": keep_alive}),
        );
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["done_reason"], "unload");
        let (_, v) = s.post("/v1/chat/completions", &body);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }
    let (_, v) = s.post(
        "/api/chat",
        &json!({"model": "tiny-llama", "messages": [], "keep_alive": 0}),
    );
    assert_eq!(v["done_reason"], "unload");
    // A generation with keep_alive 0 leaves nothing cached behind it.
    s.post("/v1/chat/completions", &body);
    let (st, v) = s.post(
        "/api/chat",
        &json!({"stream": false, "keep_alive": 0, "messages": [{"role": "user", "content": "The same question twice"}], "options": {"num_predict": 2}}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["done"], true);
    let (_, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // Any other keep_alive is accepted; a malformed one is refused by name.
    assert_eq!(
        s.post(
            "/api/generate",
            &json!({"model": "tiny-llama", "keep_alive": "1h30m"})
        )
        .1["done_reason"],
        "load"
    );
    let (st, v) = s.post(
        "/api/generate",
        &json!({"model": "tiny-llama", "keep_alive": "soon"}),
    );
    assert_eq!(st, 400);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("'keep_alive' must be"),
        "{v}"
    );
}

/// Ollama's `keep_alive` as an idle timeout: the KV caches a generation leaves stay
/// allocated (and reused) without one; a request with `keep_alive: "1s"` has them freed
/// once the server has been idle that long (`onebit_kv_cache_idle_bytes` falls to 0, a
/// log line says so, the prompt is no longer cached), while the weights stay: the model
/// is still listed and answers the same text.
#[test]
fn keep_alive_frees_the_kv_caches_after_the_idle_time() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let idle_bytes = || scrape(&s)["onebit_kv_cache_idle_bytes"];
    assert_eq!(idle_bytes(), 0.0, "new sessions allocate nothing");
    let body = chat("The same question twice", 4);
    let (_, first) = s.post("/v1/chat/completions", &body);
    let held = idle_bytes();
    assert!(held > 0.0, "a finished generation's cache stays allocated");
    let (_, v) = s.post("/v1/chat/completions", &body);
    assert!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    // The same question through Ollama's route, which sets an idle time of one second.
    let (st, v) = s.post(
        "/api/chat",
        &json!({"stream": false, "keep_alive": "1s", "messages": [{"role": "user", "content": "The same question twice"}], "options": {"num_predict": 4, "temperature": 0}}),
    );
    assert_eq!(st, 200, "{v}");
    // The timer fires one second after the answer and logs after it has freed the
    // caches (`wait_log` allows 10 s for a loaded machine), so the gauge reads 0 as soon
    // as the line is there: a timer that frees nothing fails at once, not at a bound.
    s.wait_log("(keep_alive): the KV caches are freed", 1);
    assert_eq!(
        idle_bytes(),
        0.0,
        "logged as freed, the KV caches still hold bytes: {:?}",
        s.log()
    );
    assert_eq!(s.get("/api/ps").1["models"][0]["name"], "tiny-llama");
    let (_, again) = s.post("/v1/chat/completions", &body);
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        again["choices"][0]["message"]["content"],
        first["choices"][0]["message"]["content"]
    );
}

/// Every route of the server, read from the `.route(` calls in lib.rs (so a route
/// added there is knocked on here too), with `{...}` path parameters filled in.
fn all_routes() -> Vec<(String, String)> {
    let source = include_str!("../src/lib.rs");
    let mut routes = Vec::new();
    for (at, _) in source.match_indices(".route(\"") {
        let rest = &source[at + ".route(\"".len()..];
        let path = &rest[..rest.find('"').unwrap()];
        let after = rest[path.len() + 1..].trim_start_matches([',', ' ', '\n']);
        let method = after[..after.find('(').unwrap()]
            .rsplit("::")
            .next()
            .unwrap();
        let mut filled = String::new();
        let mut inside = false;
        for c in path.chars() {
            match c {
                '{' => inside = true,
                '}' => {
                    inside = false;
                    filled.push_str("tiny-llama");
                }
                _ if !inside => filled.push(c),
                _ => {}
            }
        }
        routes.push((method.to_uppercase(), filled));
    }
    routes
}

#[test]
fn an_api_key_locks_every_route_but_health() {
    let routes = all_routes();
    assert!(routes.len() >= 15, "{routes:?}");
    assert!(routes.contains(&("POST".into(), "/tokenize".into())));
    let (_dir, pkg) = tiny();
    let key = "sk-test-0123456789";
    let s = Server::start(&pkg, &["--api-key", key], true);
    let send = |method: &str, path: &str, auth: Option<&str>| {
        let c = client();
        let mut r = match method {
            "GET" => c.get(s.url(path)),
            "POST" => c.post(s.url(path)).json(&json!({})),
            other => panic!("a route with method {other}: add it here"),
        };
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        let r = r.send().unwrap();
        let status = r.status().as_u16();
        let www = r.headers().get("www-authenticate").cloned();
        // JSON, but for /metrics' text.
        let text = r.text().unwrap();
        (
            status,
            www,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    };
    let good = format!("Bearer {key}");
    let mut knocked = 0;
    for (method, path) in &routes {
        if path == "/health" {
            assert_eq!(send(method, path, None).0, 200);
            continue;
        }
        for auth in [None, Some("Bearer sk-wrong"), Some(key), Some("Bearer ")] {
            let (st, www, v) = send(method, path, auth);
            assert_eq!(st, 401, "{method} {path} with {auth:?}: {v}");
            assert_eq!(www.unwrap(), "Bearer");
            // The route's API's error shape.
            if path.starts_with("/api/") {
                assert!(v["error"].as_str().unwrap().contains("--api-key"), "{v}");
            } else {
                assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
                assert!(v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("--api-key"));
            }
        }
        let (st, _, v) = send(method, path, Some(&good));
        assert_ne!(st, 401, "{method} {path}: {v}");
        if method == "GET" {
            assert_eq!(st, 200, "{method} {path}: {v}");
        }
        knocked += 1;
    }
    assert_eq!(knocked, routes.len() - 1);
    // Unknown paths are locked too (they say nothing about the server without a key).
    assert_eq!(send("GET", "/v2/anything", None).0, 401);
    assert_eq!(send("GET", "/v2/anything", Some(&good)).0, 404);
    // A generation with the key (the scheme's name in any case).
    let r = client()
        .post(s.url("/v1/chat/completions"))
        .header("authorization", format!("bearer {key}"))
        .json(&chat("Hi", 2))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[test]
fn cors_headers_only_when_asked_for() {
    let (_dir, pkg) = tiny();
    let origin = "http://webui.example";
    let preflight = |s: &Server| {
        client()
            .request(reqwest::Method::OPTIONS, s.url("/v1/chat/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                // The OpenAI JS SDK's own headers come along in a browser.
                "authorization, content-type, x-stainless-os",
            )
            .send()
            .unwrap()
    };
    let s = Server::start(&pkg, &["--cors", origin, "--api-key", "k"], true);
    // The preflight needs no key (browsers send none with it).
    let r = preflight(&s);
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(r.headers()["access-control-allow-origin"], origin);
    let methods = r.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap();
    assert!(methods.contains("POST"), "{methods}");
    let headers = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(headers.contains("authorization"), "{headers}");
    assert!(headers.contains("x-stainless-os"), "{headers}");
    // Answers (a 401 too, so the page can read why) carry the origin.
    let r = client()
        .get(s.url("/v1/models"))
        .header("origin", origin)
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["access-control-allow-origin"], origin);
    // Another origin is not allowed.
    let r = client()
        .get(s.url("/health"))
        .header("origin", "http://elsewhere.example")
        .send()
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    drop(s);
    // Default: no CORS headers at all.
    let s = Server::start(&pkg, &[], true);
    let r = preflight(&s);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let r = client()
        .get(s.url("/health"))
        .header("origin", origin)
        .send()
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

/// Listening on every interface without a key prints a warning (no request is sent to
/// that listener); on loopback, or with a key, there is none.
#[test]
fn listening_beyond_loopback_without_a_key_warns() {
    let (_dir, pkg) = tiny();
    let warning = "without an API key: anyone who can reach this address can use the model";
    let s = Server::start(
        &pkg,
        &["--host", "0.0.0.0", "--debug-load-delay-ms", "60000"],
        false,
    );
    s.wait_log(warning, 1);
    drop(s);
    let s = Server::start(
        &pkg,
        &[
            "--host",
            "0.0.0.0",
            "--api-key",
            "k",
            "--debug-load-delay-ms",
            "60000",
        ],
        false,
    );
    let quiet = Server::start(&pkg, &[], true);
    quiet.wait_log("ready in", 1);
    assert!(
        s.log().iter().all(|l| !l.contains(warning)),
        "{:?}",
        s.log()
    );
    assert!(
        quiet.log().iter().all(|l| !l.contains(warning)),
        "{:?}",
        quiet.log()
    );
}

/// Tokenizing and templating happen on blocking threads: with every tokenization made
/// to take 3 s, four requests tokenizing at once (two chats, two /tokenize) would hold
/// both of the async runtime's threads if they ran there, and /api/tags (a launcher's
/// health probe) would wait for them (2.6 s or more). The bound leaves a busy machine
/// 1.8 s for the probe.
#[test]
fn tokenization_leaves_the_async_threads_free() {
    let (_dir, pkg) = tiny();
    let s = Arc::new(Server::start(
        &pkg,
        &["--debug-tokenize-delay-ms", "3000", "--parallel", "2"],
        true,
    ));
    let busy: Vec<_> = (0..4)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                if i % 2 == 0 {
                    s.post("/v1/chat/completions", &chat("Hi", 2)).0
                } else {
                    s.post("/tokenize", &json!({"content": "Hi"})).0
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(400));
    let start = Instant::now();
    assert_eq!(s.get("/api/tags").0, 200);
    let waited = start.elapsed();
    assert!(
        waited < Duration::from_millis(1800),
        "/api/tags waited {waited:?}"
    );
    for h in busy {
        assert_eq!(h.join().unwrap(), 200);
    }
}

/// The text-format samples of a /metrics scrape, by series (name and labels).
fn scrape(s: &Server) -> std::collections::HashMap<String, f64> {
    let r = client().get(s.url("/metrics")).send().unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = r.text().unwrap();
    let mut samples = std::collections::HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            assert!(
                line.starts_with("# HELP onebit_") || line.starts_with("# TYPE onebit_"),
                "{line}"
            );
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        samples.insert(series.to_string(), value.parse().unwrap());
    }
    samples
}

#[test]
fn metrics_count_requests_tokens_the_queue_and_sessions() {
    let (_dir, pkg) = tiny();
    let s = Arc::new(Server::start(
        &pkg,
        &["--q-len", "4", "--debug-token-delay-ms", "20"],
        true,
    ));
    let m = scrape(&s);
    assert_eq!(m["onebit_model_loaded"], 1.0);
    assert_eq!(m["onebit_sessions"], 1.0);
    assert_eq!(m["onebit_sessions_active"], 0.0);
    assert_eq!(m["onebit_queue_depth"], 0.0);
    assert_eq!(m["onebit_generated_tokens_total"], 0.0);
    let (_, a) = s.post("/v1/chat/completions", &chat("Count me", 3));
    let (_, b) = s.post(
        "/v1/completions",
        &json!({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(s.post("/v1/chat/completions", &json!({})).0, 400);
    assert_eq!(s.get("/v1/nothing").0, 404);
    let m = scrape(&s);
    let series = |route: &str, status: u16| {
        m.get(&format!(
            "onebit_requests_total{{route=\"{route}\",status=\"{status}\"}}"
        ))
        .copied()
    };
    assert_eq!(series("/v1/chat/completions", 200), Some(1.0), "{m:?}");
    assert_eq!(series("/v1/chat/completions", 400), Some(1.0), "{m:?}");
    assert_eq!(series("/v1/completions", 200), Some(1.0), "{m:?}");
    assert_eq!(
        series("/health", 200),
        Some(1.0),
        "the start's readiness probe: {m:?}"
    );
    assert_eq!(series("unmatched", 404), Some(1.0), "{m:?}");
    // The first scrape is counted once it is answered.
    assert_eq!(series("/metrics", 200), Some(1.0), "{m:?}");
    let sum = |key: &str| a["usage"][key].as_u64().unwrap() + b["usage"][key].as_u64().unwrap();
    assert_eq!(m["onebit_prompt_tokens_total"], sum("prompt_tokens") as f64);
    assert_eq!(
        m["onebit_generated_tokens_total"],
        sum("completion_tokens") as f64
    );
    assert_eq!(
        m["onebit_prompt_tokens_cached_total"],
        (a["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            + b["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()) as f64
    );
    // The histograms: one time to first token per request that generated a token, one
    // time per output token per request of two or more; cumulative buckets ending in
    // +Inf = _count. Each token after the first took at least the 20 ms delay.
    let tokens = [&a, &b].map(|v| v["usage"]["completion_tokens"].as_u64().unwrap());
    let ttft = histogram(&m, "onebit_time_to_first_token_seconds");
    assert_eq!(
        ttft.count,
        tokens.iter().filter(|&&n| n >= 1).count() as f64,
        "{ttft:?}"
    );
    assert!(ttft.sum > 0.0, "{ttft:?}");
    let tpot = histogram(&m, "onebit_time_per_output_token_seconds");
    assert_eq!(
        tpot.count,
        tokens.iter().filter(|&&n| n >= 2).count() as f64,
        "{tpot:?}"
    );
    assert!(tpot.count >= 1.0, "{tokens:?}");
    assert!(tpot.sum >= 0.02 * tpot.count, "{tpot:?}");
    assert_eq!(tpot.le(0.01), 0.0, "{tpot:?}");
    // One generating (20 ms a token for 100 tokens) and two waiting.
    let long =
        json!({"prompt": [1, 5, 9], "max_tokens": 100, "temperature": 0, "ignore_eos": true});
    let busy: Vec<_> = (0..3)
        .map(|i| {
            let (s, long) = (s.clone(), long.clone());
            std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 150 }));
            std::thread::spawn(move || s.post("/v1/completions", &long).0)
        })
        .collect();
    let start = Instant::now();
    let m = loop {
        let m = scrape(&s);
        if m["onebit_queue_depth"] == 2.0 || start.elapsed() > Duration::from_secs(5) {
            break m;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(m["onebit_queue_depth"], 2.0, "{m:?}");
    assert_eq!(m["onebit_sessions_active"], 1.0, "{m:?}");
    for h in busy {
        assert_eq!(h.join().unwrap(), 200);
    }
    let m = scrape(&s);
    assert_eq!(m["onebit_queue_depth"], 0.0);
    assert_eq!(m["onebit_sessions_active"], 0.0);
    assert_eq!(series_of(&m, "/v1/completions", 200), 4.0);
}

/// A histogram of a scrape: its cumulative buckets (bound, count; +Inf last), sum and count.
#[derive(Debug)]
struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Histogram {
    /// The cumulative count of the bucket with bound `le`.
    fn le(&self, le: f64) -> f64 {
        self.buckets.iter().find(|b| b.0 == le).unwrap().1
    }
}

/// Histogram `name` of a scrape, checked for the text format's rules: buckets
/// cumulative (non-decreasing with the bound), the last `+Inf`, equal to `_count`.
fn histogram(m: &std::collections::HashMap<String, f64>, name: &str) -> Histogram {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets: Vec<(f64, f64)> = m
        .iter()
        .filter_map(|(k, &v)| {
            let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            Some((le, v))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(buckets.len() >= 2, "{name}: {buckets:?}");
    assert!(
        buckets.windows(2).all(|w| w[0].1 <= w[1].1),
        "{name}: not cumulative: {buckets:?}"
    );
    let count = m[&format!("{name}_count")];
    assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, count), "{name}");
    Histogram {
        buckets,
        sum: m[&format!("{name}_sum")],
        count,
    }
}

fn series_of(m: &std::collections::HashMap<String, f64>, route: &str, status: u16) -> f64 {
    m[&format!("onebit_requests_total{{route=\"{route}\",status=\"{status}\"}}")]
}

/// The sampling fields beyond temperature and top-p: refused out of range with the
/// field named (Ollama's under `options.`), accepted in range; and they reach the
/// sampler (strong penalties change a greedy answer, as llama.cpp's greedy sampler
/// after its penalties; top_k 1 at any temperature is greedy).
#[test]
fn sampling_fields_are_checked_by_name_and_reach_the_sampler() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    for (field, value, message) in [
        (
            "top_k",
            json!(-1),
            "sampling: top_k must be an integer >= 0 (0 keeps every token), got -1",
        ),
        (
            "min_p",
            json!(1.5),
            "sampling: min_p must be a number in [0, 1], got 1.5",
        ),
        (
            "repeat_penalty",
            json!(0),
            "sampling: repeat_penalty must be a finite number > 0 (1 is off), got 0",
        ),
        (
            "repeat_last_n",
            json!(-2),
            "sampling: repeat_last_n must be an integer >= 0, or -1 for the whole context, got -2",
        ),
        (
            "presence_penalty",
            json!(2.5),
            "sampling: presence_penalty must be a number in [-2, 2], got 2.5",
        ),
        (
            "frequency_penalty",
            json!(-3),
            "sampling: frequency_penalty must be a number in [-2, 2], got -3",
        ),
    ] {
        let mut body = chat("Hi", 4);
        body[field] = value.clone();
        let e = assert_error(s.post("/v1/chat/completions", &body), 400, message);
        assert_eq!(e["param"], field);
        let ollama = json!({"model": "tiny-llama", "prompt": "Hi", "stream": false, "options": {field: value}});
        let (st, v) = s.post("/api/generate", &ollama);
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"], message);
    }
    let (st, v) = s.post(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 1, "top_k": 1e30}),
    );
    assert_eq!(st, 400, "a top_k past 64 bits: {v}");
    let greedy = |extra: Value| -> String {
        let mut body = json!({"prompt": [1, 17, 300, 42], "max_tokens": 24, "temperature": 0, "ignore_eos": true});
        merge_into(&mut body, extra);
        let (st, v) = s.post("/v1/completions", &body);
        assert_eq!(st, 200, "{v}");
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let plain = greedy(json!({}));
    let penalized = greedy(
        json!({"repeat_penalty": 3.0, "repeat_last_n": -1, "presence_penalty": 2.0, "frequency_penalty": 2.0}),
    );
    assert_ne!(plain, penalized, "the penalties reach the sampler");
    assert_eq!(
        greedy(json!({"temperature": 5.0, "top_k": 1, "seed": 3})),
        plain
    );
    assert_eq!(greedy(json!({"min_p": 0.5, "top_p": 0.5})), plain);
    // Ollama's options: top_k 1 at a high temperature is greedy there too.
    let ollama = |options: Value| {
        let (st, v) = s.post(
            "/api/generate",
            &json!({"model": "tiny-llama", "prompt": "Hi", "raw": true, "stream": false, "options": options}),
        );
        assert_eq!(st, 200, "{v}");
        v["response"].as_str().unwrap().to_string()
    };
    assert_eq!(
        ollama(json!({"num_predict": 12, "temperature": 0})),
        ollama(json!({"num_predict": 12, "temperature": 3.0, "top_k": 1, "seed": 5, "min_p": 0.1}))
    );
}

fn merge_into(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

/// The logprobs fields: `top_logprobs` past 20 (or `logprobs` past 20 on completions),
/// `top_logprobs` without `logprobs`, a count in chat's boolean `logprobs`, `echo` on
/// a chat or with a stream: each refused by name.
#[test]
fn logprobs_fields_out_of_range_are_refused_by_name() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let cases = [
        ("/v1/chat/completions", json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs", "'top_logprobs' must be an integer from 0 to 20, got 21"),
        ("/v1/chat/completions", json!({"top_logprobs": 2}), "top_logprobs", "'top_logprobs' needs 'logprobs': true"),
        ("/v1/chat/completions", json!({"logprobs": 3}), "logprobs", "'logprobs' must be true or false on chat completions (the count goes in 'top_logprobs'), got 3"),
        ("/v1/chat/completions", json!({"echo": true}), "echo", "'echo' is not supported by this server"),
        ("/v1/completions", json!({"logprobs": 21}), "logprobs", "'logprobs' must be an integer from 0 to 20, got 21"),
        ("/v1/completions", json!({"logprobs": -1}), "logprobs", "'logprobs' must be an integer from 0 to 20, got -1"),
        ("/v1/completions", json!({"echo": true, "stream": true}), "echo", "'echo' is not supported with 'stream': true (send stream: false)"),
        ("/v1/completions", json!({"max_tokens": 0}), "max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo': true)"),
    ];
    for (path, extra, param, message) in cases {
        let mut body = if path == "/v1/completions" {
            json!({"prompt": "Hi", "max_tokens": 2})
        } else {
            chat("Hi", 2)
        };
        merge_into(&mut body, extra);
        let e = assert_error(s.post(path, &body), 400, message);
        assert_eq!(e["param"], param, "{path}");
    }
    let (st, v) = s.post(
        "/api/chat",
        &json!({"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "stream": false, "logprobs": true, "top_logprobs": 30}),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(
        v["error"],
        "'top_logprobs' must be an integer from 0 to 20, got 30"
    );
}

/// Parses a whole SSE body's JSON events (the `[DONE]` dropped).
fn sse_json(body: &str) -> Vec<Value> {
    sse_events(body)
        .into_iter()
        .filter(|e| e != "[DONE]")
        .map(|e| serde_json::from_str(&e).unwrap())
        .collect()
}

/// Chat logprobs, whole and streamed: one entry a generated token, `{token, logprob,
/// bytes, top_logprobs: [{token, logprob, bytes}]}`, the alternatives most likely first;
/// at temperature 0 the chosen token is the first alternative; `token` is `bytes` as
/// UTF-8; the stream carries the same entries as the whole answer. Completions' legacy
/// shape: `tokens`, `token_logprobs`, `top_logprobs` (dicts) and `text_offset`, whole
/// and streamed alike. Ollama's `logprobs` as chat's entries.
#[test]
fn logprobs_have_openais_shapes_whole_and_streamed() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let mut body = chat("Tell me a story", 12);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    body["ignore_eos"] = json!(true);
    let (st, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(st, 200, "{v}");
    let entries = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(entries.len(), 12);
    for e in &entries {
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{e}");
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        assert_eq!(
            top[0]["token"], e["token"],
            "greedy picks the most likely: {e}"
        );
        assert_eq!(top[0]["logprob"], e["logprob"]);
        for w in top.windows(2) {
            assert!(w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64(), "{e}");
        }
        let bytes: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(e["token"], json!(String::from_utf8_lossy(&bytes)));
    }
    // Without top_logprobs: the chosen tokens' values, no alternatives.
    body.as_object_mut().unwrap().remove("top_logprobs");
    let (_, bare) = s.post("/v1/chat/completions", &body);
    let bare = bare["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(bare.len(), 12);
    for (b, e) in bare.iter().zip(&entries) {
        assert_eq!(b["logprob"], e["logprob"]);
        assert_eq!(b["top_logprobs"], json!([]));
    }
    // Streamed: the same entries, spread over the chunks.
    body["top_logprobs"] = json!(3);
    body["stream"] = json!(true);
    let (st, _, raw) = s.post_raw("/v1/chat/completions", &body);
    assert_eq!(st, 200);
    let streamed: Vec<Value> = sse_json(&raw)
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed, entries);
    // Legacy completions.
    let body = json!({"prompt": [1, 17, 300, 42], "max_tokens": 10, "temperature": 0, "ignore_eos": true, "logprobs": 2});
    let (st, v) = s.post("/v1/completions", &body);
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 10);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 10);
    let offsets = lp["text_offset"].as_array().unwrap();
    assert_eq!(offsets[0], 0);
    for (i, t) in tokens.iter().enumerate().skip(1) {
        let before = tokens[i - 1].as_str().unwrap().chars().count() as u64;
        assert_eq!(
            offsets[i].as_u64().unwrap(),
            offsets[i - 1].as_u64().unwrap() + before,
            "{t}"
        );
    }
    for (top, chosen) in lp["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(lp["token_logprobs"].as_array().unwrap())
    {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 2, "{top:?}");
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(
            best,
            chosen.as_f64().unwrap(),
            "greedy: the chosen token is the best"
        );
    }
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (_, _, raw) = s.post_raw("/v1/completions", &streamed_body);
    let mut joined = (Vec::new(), Vec::new(), Vec::new());
    for c in sse_json(&raw) {
        let l = &c["choices"][0]["logprobs"];
        if l.is_object() {
            joined.0.extend(l["tokens"].as_array().unwrap().clone());
            joined
                .1
                .extend(l["token_logprobs"].as_array().unwrap().clone());
            joined
                .2
                .extend(l["text_offset"].as_array().unwrap().clone());
        }
    }
    assert_eq!(&joined.0, tokens);
    assert_eq!(&joined.1, lp["token_logprobs"].as_array().unwrap());
    assert_eq!(&joined.2, offsets);
    // Ollama: the generated tokens' entries, as chat's.
    let (st, v) = s.post(
        "/api/generate",
        &json!({"model": "tiny-llama", "prompt": "Hi", "stream": false, "logprobs": true, "top_logprobs": 2, "options": {"num_predict": 5, "temperature": 0}}),
    );
    assert_eq!(st, 200, "{v}");
    let l = v["logprobs"].as_array().unwrap();
    assert_eq!(l.len() as u64, v["eval_count"].as_u64().unwrap());
    assert_eq!(l[0]["top_logprobs"].as_array().unwrap().len(), 2);
}

/// With `--parallel 4` the generating sessions share passes (continuous batching), and
/// every answer is byte for byte the one the same request gets alone: greedy and seeded
/// sampling, chat and completions, with and without prompt lookup, a request joining
/// mid-stream, and beside one cancelled mid-stream. The passes really were shared
/// (/metrics: more sessions than passes), and the cancelled session left them (no
/// member is waited for once every request is done).
#[test]
fn shared_passes_answer_as_alone() {
    let (_dir, pkg) = tiny();
    for extra in [&[][..], &["--lookup"][..]] {
        let mut args = vec![
            "--parallel",
            "4",
            "--q-len",
            "16",
            "--debug-token-delay-ms",
            "3",
        ];
        args.extend_from_slice(extra);
        let s = Arc::new(Server::start(&pkg, &args, true));
        let mut seeded = chat("Tell me a story about a dog", 40);
        seeded["temperature"] = json!(0.9);
        seeded["seed"] = json!(42);
        let requests: Vec<(&str, Value)> = vec![
            ("/v1/chat/completions", chat("Prompt number one says", 40)),
            (
                "/v1/completions",
                json!({"prompt": [1, 40, 50, 60], "max_tokens": 60, "temperature": 0, "ignore_eos": true}),
            ),
            ("/v1/chat/completions", seeded),
            // Log-probabilities (the prompt's too, run in full-logit passes) and the
            // penalties are the same in shared passes.
            (
                "/v1/completions",
                json!({"prompt": [1, 40, 50, 60, 70, 80, 90, 100], "max_tokens": 20, "temperature": 0.8, "seed": 7, "ignore_eos": true, "echo": true, "logprobs": 3, "repeat_penalty": 1.5, "presence_penalty": 0.5, "top_k": 20}),
            ),
            // Started 150 ms after the others: joins their passes mid-stream.
            ("/v1/chat/completions", chat("The late one asks", 30)),
        ];
        let answer = |v: &Value| -> Value {
            match &v["choices"][0] {
                c if c["message"].is_object() => json!([c["message"], c["logprobs"]]),
                c => json!([c["text"], c["logprobs"]]),
            }
        };
        let alone: Vec<Value> = requests
            .iter()
            .map(|(path, body)| {
                let (st, v) = s.post(path, body);
                assert_eq!(st, 200, "{v}");
                answer(&v)
            })
            .collect();
        // One more stream that is cancelled after its first event.
        let cancelled = {
            let s = s.clone();
            std::thread::spawn(move || {
                let long = json!({"prompt": [1, 5, 9], "max_tokens": 200, "temperature": 0, "ignore_eos": true, "stream": true});
                let mut sock = raw_post(&s, "/v1/completions", &long);
                let mut first = [0u8; 256];
                let n = sock.read(&mut first).unwrap();
                let head = String::from_utf8_lossy(&first[..n]);
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                std::thread::sleep(Duration::from_millis(100));
                drop(sock);
            })
        };
        let handles: Vec<_> = requests
            .into_iter()
            .enumerate()
            .map(|(i, (path, body))| {
                let s = s.clone();
                std::thread::spawn(move || {
                    if i == 4 {
                        std::thread::sleep(Duration::from_millis(150));
                    }
                    let (st, v) = s.post(path, &body);
                    assert_eq!(st, 200, "{v}");
                    v
                })
            })
            .collect();
        let together: Vec<Value> = handles
            .into_iter()
            .map(|h| answer(&h.join().unwrap()))
            .collect();
        cancelled.join().unwrap();
        for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
            assert_eq!(a, t, "{extra:?}: request {i} differs when sharing passes");
        }
        s.wait_log("stop: cancelled", 1);
        let start = Instant::now();
        let m = loop {
            let m = scrape(&s);
            if m.get("onebit_shared_pass_members") == Some(&0.0) {
                break m;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{extra:?}: a session is still a member after every request ended: {m:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let (passes, sessions) = (
            m["onebit_shared_passes_total"],
            m["onebit_shared_pass_sessions_total"],
        );
        assert!(
            sessions > passes,
            "{extra:?}: no pass was shared ({sessions} sessions in {passes} passes)"
        );
    }
}

/// The `speculative` extension field: every mode a server can honour answers with the
/// plain server's text (greedy and seeded sampling, OpenAI and Ollama routes); `off`
/// drafts nothing, `lookup` drafts; a mode asking for a drafter the server was not
/// started with, or no mode at all, is refused by name.
#[test]
fn every_drafting_mode_answers_with_the_plain_text() {
    let (_dir, pkg) = tiny();
    let plain = Server::start(&pkg, &[], true);
    let lookup = Server::start(&pkg, &["--lookup", "--fixed-k"], true);
    let prompt: Vec<u32> = (0..40).map(|i| [5u32, 6, 7, 8][i % 4]).collect();
    for sampling in [
        json!({"temperature": 0}),
        json!({"temperature": 0.9, "seed": 77}),
    ] {
        let mut body = json!({"prompt": prompt, "max_tokens": 24, "ignore_eos": true});
        merge_into(&mut body, sampling.clone());
        let (st, want) = plain.post("/v1/completions", &body);
        assert_eq!(st, 200, "{want}");
        for mode in ["auto", "off", "lookup"] {
            body["speculative"] = json!({"mode": mode});
            let (st, got) = lookup.post("/v1/completions", &body);
            assert_eq!(st, 200, "{mode}: {got}");
            assert_eq!(got["choices"], want["choices"], "{mode} {sampling}");
            let drafted = got["timings"].get("draft_n").is_some();
            assert_eq!(drafted, mode != "off", "{mode}: {}", got["timings"]);
        }
        // The plain server honours off and auto too.
        for mode in ["auto", "off"] {
            body["speculative"] = json!({"mode": mode});
            let (st, got) = plain.post("/v1/completions", &body);
            assert_eq!(st, 200, "{mode}: {got}");
            assert_eq!(got["choices"], want["choices"], "{mode}");
        }
    }
    let ollama = |mode: &str| {
        json!({"model": "tiny-llama", "prompt": "one two three ".repeat(8), "raw": true, "stream": false,
            "options": {"temperature": 0, "num_predict": 16}, "speculative": {"mode": mode}})
    };
    let (_, want) = plain.post("/api/generate", &ollama("auto"));
    for mode in ["auto", "off", "lookup"] {
        let (st, got) = lookup.post("/api/generate", &ollama(mode));
        assert_eq!(st, 200, "{mode}: {got}");
        assert_eq!(got["response"], want["response"], "{mode}");
    }
    // Refusals: a drafter the server lacks, an unknown mode.
    let (st, e) = lookup.post("/api/generate", &ollama("draft"));
    assert_eq!(st, 400, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains(
            "'speculative.mode' is \"draft\", but this server was started without that drafter"
        ),
        "{e}"
    );
    let e = assert_error(
        plain.post("/v1/chat/completions", &{
            let mut c = chat("hi", 4);
            c["speculative"] = json!({"mode": "lookup"});
            c
        }),
        400,
        "start it with --lookup",
    );
    assert_eq!(e["param"], "speculative.mode", "{e}");
    let e = assert_error(
        plain.post("/v1/chat/completions", &{
            let mut c = chat("hi", 4);
            c["speculative"] = json!({"mode": "fast"});
            c
        }),
        400,
        "'speculative.mode' must be one of auto, off, lookup, draft; got \"fast\"",
    );
    assert_eq!(e["param"], "speculative.mode", "{e}");
}

/// `onebit serve` with no model serves every model of the store: each listed before it
/// loads, loaded on its first request, answering as a server of that model alone; a
/// request names its model, and one that names none or an unknown one is refused by name.
#[test]
fn a_store_server_lists_every_model_and_loads_each_on_its_first_request() {
    let (_dir, llama) = tiny();
    let qwen = common::fixture("tiny-qwen3");
    let s = Server::start_store(&[&llama, &qwen], &["--ctx-len", "128"]);

    // Listed before any loads; none running yet.
    let (st, v) = s.get("/v1/models");
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        test_support::strings_of(&v["data"], "id"),
        ["tiny-llama", "tiny-qwen3"]
    );
    let (st, v) = s.get("/api/tags");
    assert_eq!(st, 200, "{v}");
    let tags = v["models"].as_array().unwrap();
    assert_eq!(tags.len(), 2, "{v}");
    assert_eq!(tags[1]["name"], "tiny-qwen3");
    assert_eq!(tags[1]["details"]["family"], "qwen3", "{v}");
    assert!(tags[1]["size"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(s.get("/api/ps").1, json!({"models": []}));
    assert_eq!(s.get("/v1/models/tiny-qwen3").0, 200);
    assert_eq!(s.get("/v1/models/tiny-qwen3:latest").0, 200);

    // A request names its model: the answer is that model's alone.
    let prompt = json!({"model": "tiny-qwen3", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0});
    let (st, from_store) = s.post("/v1/completions", &prompt);
    assert_eq!(st, 200, "{from_store}");
    let ps = s.get("/api/ps").1;
    assert_eq!(
        test_support::strings_of(&ps["models"], "name"),
        ["tiny-qwen3"],
        "only the model asked for loads"
    );
    s.wait_log("tiny-qwen3 ready", 1);
    let alone = Server::start(&qwen, &["--ctx-len", "128"], true);
    let (st, from_alone) = alone.post("/v1/completions", &prompt);
    assert_eq!(st, 200, "{from_alone}");
    assert_eq!(
        from_store["choices"][0]["text"], from_alone["choices"][0]["text"],
        "the store's answer is the model's own"
    );
    let (st, v) = s.post("/v1/chat/completions", &chat("Hello", 4));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["model"], "tiny-llama");
    assert_eq!(s.get("/api/ps").1["models"].as_array().unwrap().len(), 2);

    // Refusals, by name.
    let mut unnamed = prompt.clone();
    unnamed.as_object_mut().unwrap().remove("model");
    let e = assert_error(
        s.post("/v1/completions", &unnamed),
        400,
        "this server serves 2 models: name one in 'model' (tiny-llama, tiny-qwen3)",
    );
    assert_eq!(e["param"], "model");
    let mut unknown = prompt.clone();
    unknown["model"] = json!("gpt-17");
    assert_error(
        s.post("/v1/completions", &unknown),
        404,
        "The model 'gpt-17' does not exist",
    );
    assert_eq!(
        s.post("/api/generate", &json!({"model": "llama9", "prompt": "x"})),
        (404, json!({"error": "model 'llama9' not found"}))
    );
    let r = client()
        .post(s.url("/v1/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().unwrap().contains("not valid JSON"));
    // The server's counters, and the models' sessions added (one each).
    let metrics = client()
        .get(s.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.contains("onebit_requests_total{route=\"/v1/completions\",status=\"200\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("\nonebit_sessions 2\n"), "{metrics}");
    assert!(metrics.contains("\nonebit_model_loaded 1\n"), "{metrics}");
    assert_eq!(s.get("/health").0, 200);
}

/// With a key, every route of a store server but /health wants it, forwarded or not.
#[test]
fn a_store_server_with_a_key_locks_every_route_but_health() {
    let (_dir, llama) = tiny();
    let qwen = common::fixture("tiny-qwen3");
    let s = Server::start_store(&[&llama, &qwen], &["--ctx-len", "128", "--api-key", "k3y"]);
    assert_eq!(s.get("/health").0, 200);
    for path in [
        "/v1/models",
        "/api/tags",
        "/api/ps",
        "/metrics",
        "/v1/models/tiny-qwen3",
    ] {
        assert_eq!(s.get(path).0, 401, "{path}");
    }
    let (st, _) = s.post("/v1/chat/completions", &chat("Hello", 2));
    assert_eq!(st, 401);
    assert_eq!(s.get("/api/ps").0, 401);
    let r = client()
        .post(s.url("/v1/chat/completions"))
        .bearer_auth("k3y")
        .json(&chat("Hello", 2))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// A stored model that cannot load is a 500 naming it and its package, on each request
/// for it (each tries again); it is still listed, and the other models answer.
#[test]
fn a_store_model_that_cannot_load_is_a_500_naming_it() {
    let (_dir, llama) = tiny();
    let broken_dir = tempfile::tempdir().unwrap();
    let broken = broken_dir.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    let qwen = common::fixture("tiny-qwen3");
    for file in ["config.json", "tokenizer.json"] {
        std::fs::copy(qwen.join(file), broken.join(file)).unwrap();
    }
    // The container cut short: the load refuses it.
    let weights = std::fs::read(qwen.join("model.q4nx")).unwrap();
    std::fs::write(broken.join("model.q4nx"), &weights[..weights.len() / 2]).unwrap();
    let s = Server::start_store(&[&llama, &broken], &["--ctx-len", "128"]);
    assert_eq!(
        test_support::strings_of(&s.get("/v1/models").1["data"], "id"),
        ["tiny-llama", "broken"]
    );
    let ask = json!({"model": "broken", "prompt": "Once", "max_tokens": 2});
    for _ in 0..2 {
        let e = assert_error(
            s.post("/v1/completions", &ask),
            500,
            &format!(
                "serve: cannot load the model broken ({}): ",
                broken.display()
            ),
        );
        assert_eq!(e["type"], "server_error", "{e}");
    }
    s.wait_log("loading broken", 2);
    assert_eq!(s.get("/api/ps").1, json!({"models": []}));
    let (st, v) = s.post("/v1/chat/completions", &chat("Hello", 2));
    assert_eq!(st, 200, "{v}");
}

/// A store with no model is refused by name before anything listens.
#[test]
fn a_store_of_no_models_is_refused() {
    let options = onebit_serve::ServeOptions::new(onebit_serve::Served::Store(Vec::new()));
    let e = onebit_serve::start(options).err().expect("refused");
    assert_eq!(e.to_string(), "serve: no model to serve");
}
