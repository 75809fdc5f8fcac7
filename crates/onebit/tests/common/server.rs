//! `onebit serve` run as a process for the CLI tests: started on a free port, its log
//! collected, killed on drop.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running server; killed on drop.
pub struct Server {
    child: Child,
    pub base: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `onebit serve MODEL --port 0 ARGS` and waits for its listening line
    /// (and, unless `wait_ready` is false, for `/health` to say 200).
    pub fn start(model: &Path, args: &[&str], wait_ready: bool) -> Server {
        Server::start_env(model, args, &[], wait_ready)
    }

    /// [`Server::start`] with `env` set for the server process.
    pub fn start_env(
        model: &Path,
        args: &[&str],
        env: &[(&str, &Path)],
        wait_ready: bool,
    ) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_onebit"))
            .arg("serve")
            .arg(model)
            .args(["--port", "0", "--threads", "1"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        let addr = rest.split_whitespace().next().unwrap().to_string();
                        let _ = tx.send(addr);
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no listening line: {:?}", log.lock().unwrap()));
        let server = Server {
            child,
            base: format!("http://{addr}"),
            log,
        };
        if wait_ready {
            let start = Instant::now();
            loop {
                if let Ok(r) = client().get(server.url("/health")).send() {
                    if r.status() == 200 {
                        break;
                    }
                }
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "not ready: {:?}",
                    server.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

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

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = client().post(self.url(path)).json(body).send().unwrap();
        let status = r.status().as_u16();
        let text = r.text().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
        )
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let r = client().get(self.url(path)).send().unwrap();
        let status = r.status().as_u16();
        (status, r.json().unwrap())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}
