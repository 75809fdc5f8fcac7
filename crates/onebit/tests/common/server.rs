//! `onebit serve` run as a process for the CLI tests: started on a free port, its log
//! collected, killed on drop.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use test_support::http::HttpServer;

/// A running server, seen over HTTP through [`HttpServer`]; killed on drop.
pub struct Server {
    child: Child,
    http: HttpServer,
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
        Server::start_model(Some(model), args, env, wait_ready)
    }

    /// [`Server::start_env`], also with no model (`onebit serve` serves the store).
    pub fn start_model(
        model: Option<&Path>,
        args: &[&str],
        env: &[(&str, &Path)],
        wait_ready: bool,
    ) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_onebit"))
            .arg("serve")
            .args(model)
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
            http: HttpServer::new(format!("http://{addr}"), log),
        };
        if wait_ready {
            server.wait_ready();
        }
        server
    }
}

impl std::ops::Deref for Server {
    type Target = HttpServer;

    fn deref(&self) -> &HttpServer {
        &self.http
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
