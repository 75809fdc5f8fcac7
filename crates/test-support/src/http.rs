//! A server under test seen over HTTP: its base URL and the log lines it has written,
//! shared by the CLI's tests (`onebit serve` as a process) and onebit-serve's (the
//! server started in the test process), which differ only in how the server runs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A blocking client with a timeout long enough for a slow debug-build generation.
pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("test-support: cannot build the HTTP client")
}

/// The base URL of a running server and its collected log lines.
pub struct HttpServer {
    /// `http://ADDR`.
    pub base: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl HttpServer {
    /// The server at `base`, whose log lines are pushed into `log` as it writes them.
    pub fn new(base: String, log: Arc<Mutex<Vec<String>>>) -> HttpServer {
        HttpServer { base, log }
    }

    /// Waits (up to 60 s) until `/health` answers 200.
    pub fn wait_ready(&self) {
        let start = Instant::now();
        loop {
            if let Ok(r) = client().get(self.url("/health")).send() {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "not ready: {:?}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `base` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The log lines so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits (up to 10 s) until `count` log lines contain `needle`.
    pub fn wait_log(&self, needle: &str, count: usize) {
        let start = Instant::now();
        while self.log().iter().filter(|l| l.contains(needle)).count() < count {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{count} x {needle:?} not in {:?}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// POSTs `body` as JSON; the status and the JSON answer.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = client().post(self.url(path)).json(body).send().unwrap();
        let status = r.status().as_u16();
        let text = r.text().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
        )
    }

    /// GETs `path`; the status and the JSON answer.
    pub fn get(&self, path: &str) -> (u16, Value) {
        let r = client().get(self.url(path)).send().unwrap();
        let status = r.status().as_u16();
        (status, r.json().unwrap())
    }

    /// The raw body of a POST (for streams), with its status and content type.
    pub fn post_raw(&self, path: &str, body: &Value) -> (u16, String, String) {
        let r = client().post(self.url(path)).json(body).send().unwrap();
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, ct, r.text().unwrap())
    }
}
