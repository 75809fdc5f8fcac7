//! `cargo xtask load-test [--requests N] [--concurrency C] [--parallel P]`: starts
//! `onebit serve` (release build) on the tiny-llama fixture on a loopback port and sends it
//! N requests (default 200) from C client threads (default 8), a mix of the OpenAI and
//! Ollama routes, streaming and not, some streams dropped after their first event, some
//! malformed (each must get its own 4xx). Prints p50/p99 latency, throughput and the
//! server's RSS before and after; fails on any unexpected answer, an internal error in
//! the server's log, a server not alive or with sessions still busy at the end, or RSS
//! growth past a bound. Bounded: every request has a 60 s timeout and the whole run
//! stops after 10 minutes.

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

/// What a request of the mix expects.
#[derive(Clone, Copy)]
enum Expect {
    /// 200 and a body the check accepts.
    Ok(fn(&str) -> bool),
    /// Refused with this status (a malformed request).
    Refused(u16),
    /// A stream the client drops after its first event (the server must cancel it and
    /// go on).
    Cancelled,
}

/// Request `i`'s route, body and expectation: of every 10, chat (whole, streamed),
/// completions, Ollama chat and generate, two streams dropped mid-way, and three
/// malformed requests (bad JSON, an unknown model, a null content).
fn request(i: usize) -> (&'static str, String, Expect) {
    let words = ["alpha", "beta", "gamma", "delta", "epsilon"];
    let content = format!("Request {i}: tell me about {}", words[i % words.len()]);
    match i % 10 {
        0 => (
            "/v1/chat/completions",
            format!(
                r#"{{"messages":[{{"role":"user","content":"{content}"}}],"max_tokens":24,"temperature":0}}"#
            ),
            Expect::Ok(|b| b.contains("\"chat.completion\"") && b.contains("\"usage\"")),
        ),
        1 => (
            "/v1/chat/completions",
            format!(
                r#"{{"messages":[{{"role":"user","content":"{content}"}}],"max_tokens":24,"stream":true,"stream_options":{{"include_usage":true}}}}"#
            ),
            Expect::Ok(|b| b.ends_with("data: [DONE]\n\n")),
        ),
        2 => (
            "/v1/completions",
            format!(r#"{{"prompt":"{content}","max_tokens":16,"temperature":0.7,"seed":{i}}}"#),
            Expect::Ok(|b| b.contains("\"text_completion\"")),
        ),
        3 => (
            "/api/chat",
            format!(
                r#"{{"messages":[{{"role":"user","content":"{content}"}}],"options":{{"num_predict":16}}}}"#
            ),
            Expect::Ok(|b| {
                b.trim_end()
                    .lines()
                    .last()
                    .is_some_and(|l| l.contains("\"done\":true"))
            }),
        ),
        4 => (
            "/api/generate",
            format!(r#"{{"prompt":"{content}","stream":false,"options":{{"num_predict":16}}}}"#),
            Expect::Ok(|b| b.contains("\"done\":true") && b.contains("\"response\"")),
        ),
        5 => (
            "/v1/chat/completions",
            format!(
                r#"{{"messages":[{{"role":"user","content":"{content}"}}],"max_tokens":150,"stream":true,"ignore_eos":true}}"#
            ),
            Expect::Cancelled,
        ),
        6 => (
            "/api/generate",
            format!(r#"{{"prompt":"{content}","options":{{"num_predict":150}}}}"#),
            Expect::Cancelled,
        ),
        7 => (
            "/v1/chat/completions",
            format!(r#"{{"messages":[{{"role":"user","content":"{content}"#),
            Expect::Refused(400),
        ),
        8 => (
            "/v1/completions",
            format!(r#"{{"model":"no-such-model","prompt":"{content}"}}"#),
            Expect::Refused(404),
        ),
        _ => (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":null}],"max_tokens":18446744073709551615}"#
                .to_string(),
            Expect::Refused(400),
        ),
    }
}

/// Sends a streaming request, reads until its first body bytes, and drops the
/// connection: the status.
fn cancel_mid_stream(addr: &str, path: &str, body: &str) -> Result<u16> {
    let mut sock = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    sock.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        sock,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(sock);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .context("no status")?
        .parse()?;
    if status != 200 {
        return Ok(status);
    }
    // The head, then the first chunk's size line and data: generation is under way.
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
    }
    for _ in 0..2 {
        line.clear();
        reader.read_line(&mut line)?;
    }
    Ok(status)
}

/// The server's resident memory, KiB (`VmRSS` of /proc/PID/status).
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("load-test: cannot read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("load-test: no VmRSS in /proc/PID/status")
}

/// The most the server's RSS may grow over a run: its sessions' KV caches (2 × 256
/// positions of tiny-llama, well under a MiB) and allocator slack, with room to spare;
/// a leak per request (200 requests) shows above it.
const RSS_GROWTH_LIMIT_KIB: u64 = 64 * 1024;

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
    // The binary `$ONEBIT_BIN` names (as for fetch-model and the demo), else the
    // release build.
    let onebit = match std::env::var_os("ONEBIT_BIN") {
        Some(bin) => std::path::PathBuf::from(bin),
        None => {
            println!("load-test: building onebit (release)");
            let ok = crate::cargo_command()
                .args(["build", "--release", "--quiet", "-p", "onebit"])
                .current_dir(&root)
                .status()?
                .success();
            if !ok {
                bail!("load-test: cargo build failed");
            }
            root.join("target/release/onebit")
        }
    };
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
                } else if line.contains(" 500 ") || line.contains("panic") {
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
        // The baseline after one answer of each generating route (first-use
        // allocations are not growth).
        for i in 0..5 {
            let (path, body, _) = request(i);
            http(&addr, "POST", path, &body)?;
        }
        let rss_before = rss_kib(child.id())?;
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
                    let (path, body, expect) = request(i);
                    let t = Instant::now();
                    let outcome = match expect {
                        Expect::Cancelled => match cancel_mid_stream(&addr, path, &body) {
                            Ok(200) => Ok(()),
                            Ok(status) => Err(format!("{status} (a stream to cancel)")),
                            Err(e) => Err(format!("{e:#}")),
                        },
                        Expect::Ok(check) => match http(&addr, "POST", path, &body) {
                            Ok((200, b)) if check(&b) => Ok(()),
                            Ok((status, b)) => Err(format!(
                                "{status} {}",
                                b.chars().take(200).collect::<String>()
                            )),
                            Err(e) => Err(format!("{e:#}")),
                        },
                        Expect::Refused(want) => match http(&addr, "POST", path, &body) {
                            Ok((status, b)) if status == want && b.contains("error") => Ok(()),
                            Ok((status, b)) => Err(format!(
                                "{status}, not {want}: {}",
                                b.chars().take(200).collect::<String>()
                            )),
                            Err(e) => Err(format!("{e:#}")),
                        },
                    };
                    match outcome {
                        // Latency of the answers a client waits for in full.
                        Ok(()) => latencies
                            .lock()
                            .expect("lock")
                            .push((matches!(expect, Expect::Ok(_)), t.elapsed().as_secs_f64())),
                        Err(e) => failures
                            .lock()
                            .expect("lock")
                            .push(format!("request {i} {path}: {e}")),
                    }
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))?;
        }
        let wall = t0.elapsed().as_secs_f64();
        let done = latencies.lock().expect("lock").clone();
        let mut lat: Vec<f64> = done.iter().filter(|d| d.0).map(|d| d.1).collect();
        lat.sort_by(f64::total_cmp);
        let failures = failures.lock().expect("lock").clone();
        // The cancelled streams end at their next token; then the sessions are idle.
        let settle = Instant::now();
        while !http(&addr, "GET", "/metrics", "")
            .is_ok_and(|(_, m)| m.lines().any(|l| l == "onebit_sessions_active 0"))
        {
            if settle.elapsed() > Duration::from_secs(60) {
                bail!("load-test: sessions still active 60 s after the run");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let rss_after = rss_kib(child.id())?;
        let alive = http(&addr, "GET", "/health", "").map(|r| r.0).unwrap_or(0) == 200;
        let kinds = |f: fn(&Expect) -> bool| (0..requests).filter(|&i| f(&request(i).2)).count();
        println!(
            "load-test: {} as expected, {} unexpected in {wall:.2} s ({:.1} requests/s): {} whole answers, {} streams dropped mid-way, {} malformed refused",
            done.len(),
            failures.len(),
            done.len() as f64 / wall,
            kinds(|e| matches!(e, Expect::Ok(_))),
            kinds(|e| matches!(e, Expect::Cancelled)),
            kinds(|e| matches!(e, Expect::Refused(_))),
        );
        println!(
            "load-test: latency of the whole answers p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; server alive: {}",
            percentile(&lat, 0.5) * 1e3,
            percentile(&lat, 0.99) * 1e3,
            lat.last().copied().unwrap_or(0.0) * 1e3,
            if alive { "yes" } else { "NO" }
        );
        println!(
            "load-test: server RSS {:.1} MiB before, {:.1} MiB after ({:+.1} MiB; limit +{} MiB)",
            rss_before as f64 / 1024.0,
            rss_after as f64 / 1024.0,
            (rss_after as f64 - rss_before as f64) / 1024.0,
            RSS_GROWTH_LIMIT_KIB / 1024
        );
        for f in failures.iter().take(10) {
            println!("  {f}");
        }
        if !failures.is_empty() || done.len() != requests {
            bail!(
                "load-test: {} of {requests} requests did not get the answer expected",
                requests - done.len()
            );
        }
        if !alive {
            bail!("load-test: the server is not alive after the run");
        }
        if rss_after > rss_before + RSS_GROWTH_LIMIT_KIB {
            bail!(
                "load-test: the server's RSS grew from {rss_before} KiB to {rss_after} KiB, more than {RSS_GROWTH_LIMIT_KIB} KiB"
            );
        }
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    let logged = errors_seen.lock().expect("log lock").clone();
    if !logged.is_empty() {
        println!("load-test: server errors in its log:");
        for l in logged.iter().take(10) {
            println!("  {l}");
        }
        if result.is_ok() {
            bail!(
                "load-test: the server logged {} internal errors",
                logged.len()
            );
        }
    }
    result
}
