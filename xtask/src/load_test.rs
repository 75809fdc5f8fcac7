//! `cargo xtask load-test [--requests N] [--concurrency C] [--parallel P]`: starts
//! `onebit serve` (release build) on the tiny-llama fixture on a loopback port and sends it
//! N requests (default 200) from C client threads (default 8), a mix of the OpenAI and
//! Ollama routes, streaming and not. Prints p50/p99 latency and throughput; fails on any
//! error status, a malformed answer, or a server that is not alive at the end. Bounded:
//! every request has a 60 s timeout and the whole run stops after 10 minutes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{shared_fixtures, workspace_root};

/// One HTTP/1.1 exchange on a fresh connection: status and body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    let mut sock = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    sock.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        sock,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    sock.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .context("no end of the response head")?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .context("no status")?
        .parse()?;
    // Chunked bodies: join the chunks.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = rest;
        loop {
            let (size, tail) = rest.split_once("\r\n").context("bad chunk")?;
            let n = usize::from_str_radix(size.trim(), 16)?;
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        out
    } else {
        rest.to_string()
    };
    Ok((status, body))
}

/// Request `i`'s route and body, and a check of its answer.
fn request(i: usize) -> (&'static str, String, fn(&str) -> bool) {
    let words = ["alpha", "beta", "gamma", "delta", "epsilon"];
    let content = format!("Request {i}: tell me about {}", words[i % words.len()]);
    match i % 4 {
        0 => (
            "/v1/chat/completions",
            format!(
                r#"{{"messages":[{{"role":"user","content":"{content}"}}],"max_tokens":24,"temperature":0}}"#
            ),
            |b| b.contains("\"chat.completion\"") && b.contains("\"usage\""),
        ),
        1 => (
            "/v1/chat/completions",
            format!(
                r#"{{"messages":[{{"role":"user","content":"{content}"}}],"max_tokens":24,"stream":true,"stream_options":{{"include_usage":true}}}}"#
            ),
            |b| b.ends_with("data: [DONE]\n\n"),
        ),
        2 => (
            "/v1/completions",
            format!(r#"{{"prompt":"{content}","max_tokens":16,"temperature":0.7,"seed":{i}}}"#),
            |b| b.contains("\"text_completion\""),
        ),
        _ => (
            "/api/chat",
            format!(
                r#"{{"messages":[{{"role":"user","content":"{content}"}}],"options":{{"num_predict":16}}}}"#
            ),
            |b| {
                b.trim_end()
                    .lines()
                    .last()
                    .is_some_and(|l| l.contains("\"done\":true"))
            },
        ),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

pub fn run(args: &[String]) -> Result<()> {
    let mut requests = 200usize;
    let mut concurrency = 8usize;
    let mut parallel = 2usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value =
            || -> Result<usize> { Ok(it.next().context("a value is missing")?.parse()?) };
        match a.as_str() {
            "--requests" => requests = value()?,
            "--concurrency" => concurrency = value()?,
            "--parallel" => parallel = value()?,
            other => bail!("load-test: unknown argument '{other}'"),
        }
    }
    let root = workspace_root();
    println!("load-test: building onebit (release)");
    let ok = Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet", "-p", "onebit"])
        .current_dir(&root)
        .status()?
        .success();
    if !ok {
        bail!("load-test: cargo build failed");
    }
    let onebit = root.join("target/release/onebit");
    let pkg = root.join("target/load-test/tiny-llama");
    let ok = Command::new(&onebit)
        .args(["convert", "--quiet", "--force"])
        .arg(shared_fixtures().join("tiny-llama/model.Q4_1.gguf"))
        .arg(&pkg)
        .status()?
        .success();
    if !ok {
        bail!("load-test: converting the tiny-llama fixture failed");
    }
    let mut child = Command::new(&onebit)
        .arg("serve")
        .arg(&pkg)
        .args(["--port", "0", "--parallel", &parallel.to_string()])
        .args(["--q-len", &(concurrency + 2).to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("load-test: cannot start onebit serve")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let errors_seen = Arc::new(Mutex::new(Vec::new()));
    {
        let errors_seen = errors_seen.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                } else if !line.contains(" 200 prompt ") && !line.contains(" ready in ") {
                    errors_seen.lock().expect("log lock").push(line);
                }
            }
        });
    }
    let result = (|| -> Result<()> {
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .context("load-test: the server printed no listening line")?;
        let start = Instant::now();
        while http(&addr, "GET", "/health", "").map(|r| r.0).unwrap_or(0) != 200 {
            if start.elapsed() > Duration::from_secs(60) {
                bail!("load-test: not ready after 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        println!(
            "load-test: ready in {:.2} s; {requests} requests, {concurrency} concurrent, --parallel {parallel}",
            start.elapsed().as_secs_f64()
        );
        let next = Arc::new(AtomicUsize::new(0));
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let deadline = Instant::now() + Duration::from_secs(600);
        let t0 = Instant::now();
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (next, latencies, failures, addr) = (
                    next.clone(),
                    latencies.clone(),
                    failures.clone(),
                    addr.clone(),
                );
                std::thread::spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= requests || Instant::now() > deadline {
                        break;
                    }
                    let (path, body, check) = request(i);
                    let t = Instant::now();
                    match http(&addr, "POST", path, &body) {
                        Ok((200, b)) if check(&b) => latencies
                            .lock()
                            .expect("lock")
                            .push(t.elapsed().as_secs_f64()),
                        Ok((status, b)) => failures.lock().expect("lock").push(format!(
                            "request {i} {path}: {status} {}",
                            b.chars().take(200).collect::<String>()
                        )),
                        Err(e) => failures
                            .lock()
                            .expect("lock")
                            .push(format!("request {i} {path}: {e:#}")),
                    }
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))?;
        }
        let wall = t0.elapsed().as_secs_f64();
        let mut lat = latencies.lock().expect("lock").clone();
        lat.sort_by(f64::total_cmp);
        let failures = failures.lock().expect("lock").clone();
        let alive = http(&addr, "GET", "/health", "").map(|r| r.0).unwrap_or(0) == 200;
        println!(
            "load-test: {} ok, {} errors in {wall:.2} s ({:.1} requests/s); latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; server alive: {}",
            lat.len(),
            failures.len(),
            lat.len() as f64 / wall,
            percentile(&lat, 0.5) * 1e3,
            percentile(&lat, 0.99) * 1e3,
            lat.last().copied().unwrap_or(0.0) * 1e3,
            if alive { "yes" } else { "NO" }
        );
        for f in failures.iter().take(10) {
            println!("  {f}");
        }
        if !failures.is_empty() || lat.len() != requests {
            bail!(
                "load-test: {} of {requests} requests failed",
                requests - lat.len()
            );
        }
        if !alive {
            bail!("load-test: the server is not alive after the run");
        }
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    let logged = errors_seen.lock().expect("log lock").clone();
    if !logged.is_empty() {
        println!("load-test: server log lines other than successes:");
        for l in logged.iter().take(10) {
            println!("  {l}");
        }
    }
    result
}
