//! `cargo xtask bench-peer`: onebit and llama.cpp side by side on the same GGUF.
//!
//! Downloads the pinned llama-cpp-python sdist from PyPI (it vendors llama.cpp), builds
//! `llama-bench` once into `target/peer/` (never committed; later runs reuse it), runs it
//! and `onebit bench` on the same model with the same thread count, and prints decode,
//! prefill 128, the 1- and 8-row pass and the 8-row/1-row cost as ratios. Nightly-style:
//! minutes of building on a small machine, so not part of CI.
//!
//! A pass of n rows costs n / (llama-bench's `pp<n>` tokens/s); onebit bench times its
//! passes directly. `--context N` adds a second table at depth N: llama-bench's `-d N`
//! (decode and the 1- and 8-row passes after N tokens of KV cache) and its `pp N` (a
//! prompt of N tokens from empty), beside `onebit bench --context N` (which prefills N
//! tokens, then decodes and times its passes at that depth).
//!
//! A last table (`--streams N`, 4 by default, 0 to skip) sets N concurrent streams
//! against one: llama.cpp's `llama-batched-bench -npl 1,N` (built from the same tree)
//! beside `onebit bench --sessions N`, each the total generated tokens per second.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::llama_cpp::{self, LLAMA_CPP_PYTHON};

const USAGE: &str = "usage: cargo xtask bench-peer [--threads N] [--context N] [--json] \
[--model smollm2|gemma3 | --gguf PATH --model DIR] [--llama-build native|avx2] [--llama-bench-arg ARG ...] \
[--streams N] [-- ONEBIT-BENCH-FLAGS]";

/// Prompt tokens of each stream in the concurrent-streams table (as `onebit bench
/// --sessions` uses), and the tokens each stream generates.
const STREAM_PROMPT: usize = 32;
const STREAM_TOKENS: usize = 128;

struct Options {
    threads: usize,
    context: Option<usize>,
    json: bool,
    gguf: Option<PathBuf>,
    model: Option<PathBuf>,
    /// A model of `cargo xtask fetch-model` (`--model NAME` without `--gguf`).
    fetched: Fetched,
    onebit_extra: Vec<String>,
    /// Extra llama-bench arguments (`--llama-bench-arg`, repeatable), e.g. `--poll 0`.
    llama_extra: Vec<String>,
    /// Which llama.cpp build (`--llama-build`, native by default).
    build: llama_cpp::Build,
    /// Concurrent streams of the streams table (`--streams N`, 4 by default; 0: no table).
    streams: usize,
}

/// The fetched models bench-peer knows by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fetched {
    Smollm2,
    Gemma3,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        threads: 2,
        context: None,
        json: false,
        gguf: None,
        model: None,
        fetched: Fetched::Smollm2,
        onebit_extra: Vec::new(),
        llama_extra: Vec::new(),
        build: llama_cpp::Build::Native,
        streams: 4,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .with_context(|| format!("bench-peer: {name} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--" => {
                o.onebit_extra.extend(it.by_ref().cloned());
                break;
            }
            "--threads" => {
                o.threads = value("--threads")?
                    .parse()
                    .context("bench-peer: --threads takes a positive integer")?;
                if o.threads == 0 {
                    bail!("bench-peer: --threads takes a positive integer");
                }
            }
            "--context" => {
                o.context = Some(
                    value("--context")?
                        .parse()
                        .context("bench-peer: --context takes a token count")?,
                )
            }
            "--gguf" => o.gguf = Some(value("--gguf")?.into()),
            "--model" => o.model = Some(value("--model")?.into()),
            "--json" => o.json = true,
            "--llama-bench-arg" => o.llama_extra.push(value("--llama-bench-arg")?),
            "--streams" => {
                let v = value("--streams")?;
                o.streams = v
                    .parse()
                    .ok()
                    .filter(|&n| n != 1 && n <= 64)
                    .with_context(|| {
                        format!("bench-peer: --streams '{v}': 0 (no streams table) or 2 to 64")
                    })?;
            }
            "--llama-build" => {
                let name = value("--llama-build")?;
                o.build = llama_cpp::Build::named(&name).with_context(|| {
                    format!(
                        "bench-peer: --llama-build '{name}': native (the sdist's default) or avx2"
                    )
                })?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("bench-peer: unknown argument '{other}'\n{USAGE}"),
        }
    }
    match (&o.gguf, &o.model) {
        (Some(_), None) => bail!(
            "bench-peer: --gguf needs --model DIR (the onebit package converted from that GGUF)"
        ),
        // Without --gguf, --model names a fetched model.
        (None, Some(name)) => {
            o.fetched = match name.to_str() {
                Some("smollm2") => Fetched::Smollm2,
                Some("gemma3") => Fetched::Gemma3,
                _ => bail!(
                    "bench-peer: --model '{}' without --gguf names a fetched model (smollm2, gemma3); \
                     for a package directory give its GGUF with --gguf PATH",
                    name.display()
                ),
            };
            o.model = None;
        }
        _ => {}
    }
    Ok(o)
}

/// Progress goes to stderr so that `--json` leaves one object on stdout.
macro_rules! step {
    ($($t:tt)*) => { eprintln!("bench-peer: {}", format!($($t)*)) };
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let root = crate::workspace_root();
    let peer = llama_cpp::peer_dir()?;
    let steps = if o.streams > 0 { 6 } else { 5 };

    step!("[1/{steps}] model");
    let (gguf, model) = match (&o.gguf, &o.model) {
        (Some(g), Some(m)) => (g.clone(), m.clone()),
        _ => {
            let (name, gguf, pkg, fetch): (_, _, _, fn() -> Result<PathBuf>) = match o.fetched {
                Fetched::Smollm2 => (
                    "smollm2",
                    crate::models::SMOLLM2_GGUF,
                    crate::models::smollm2_package(),
                    crate::models::fetch_smollm2,
                ),
                Fetched::Gemma3 => (
                    "gemma3",
                    crate::models::GEMMA3_GGUF,
                    crate::models::gemma3_package(),
                    crate::models::fetch_gemma3,
                ),
            };
            let gguf = crate::models::models_dir().join(gguf);
            if !gguf.exists() || !pkg.join("model.q4nx").exists() {
                fetch().with_context(|| {
                    format!("bench-peer: step 'model' (cargo xtask fetch-model {name}) failed")
                })?;
            }
            (gguf, pkg)
        }
    };
    for p in [&gguf, &model] {
        if !p.exists() {
            bail!("bench-peer: step 'model': {} does not exist", p.display());
        }
    }

    step!(
        "[2/{steps}] llama-bench{} (llama-cpp-python {LLAMA_CPP_PYTHON}, cached in {})",
        if o.streams > 0 {
            " and llama-batched-bench"
        } else {
            ""
        },
        peer.display()
    );
    let llama_bench = llama_cpp::ensure_tool(&peer, "llama-bench", o.build)?;
    // Built before anything is timed (minutes of compiling would load the machine).
    let batched = match o.streams {
        0 => None,
        _ => Some(llama_cpp::ensure_tool(
            &peer,
            "llama-batched-bench",
            o.build,
        )?),
    };

    step!("[3/{steps}] onebit (cargo build --release -p onebit)");
    let onebit = build_onebit(&root)?;

    let load_before = load_average();
    step!("[4/{steps}] llama-bench on {}", gguf.display());
    let peer_rows = run_llama_bench(&llama_bench, &gguf, &o, &peer)?;

    step!("[5/{steps}] onebit bench on {}", model.display());
    let ours = run_onebit_bench(&onebit, &model, o.threads, &o.onebit_extra)?;
    let ours_deep = match o.context {
        Some(n) => {
            let mut extra = o.onebit_extra.clone();
            extra.extend(["--context".to_string(), n.to_string()]);
            Some(run_onebit_bench(&onebit, &model, o.threads, &extra)?)
        }
        None => None,
    };

    let streams = match batched {
        None => None,
        Some(batched) => {
            let n = o.streams;
            step!("[6/{steps}] {n} concurrent streams against one: llama-batched-bench and onebit bench --sessions {n}");
            let peer_streams = run_batched_bench(&batched, &gguf, &o, &peer)?;
            let ours = run_onebit_sessions(&onebit, &model, o.threads, n)?;
            Some(StreamFigures::new(peer_streams, &ours)?)
        }
    };

    let report = Report::new(
        &o,
        load_before,
        &root,
        &gguf,
        &model,
        &peer_rows,
        (&ours, ours_deep.as_ref()),
    )?;
    let report = Report { streams, ..report };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report.json())?);
    } else {
        report.print();
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Running both engines.

fn cargo_target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_relative() { root.join(p) } else { p })
        .unwrap_or_else(|| root.join("target"))
}

fn build_onebit(root: &Path) -> Result<PathBuf> {
    let st = crate::cargo_command()
        .args(["build", "--release", "--quiet", "-p", "onebit"])
        .current_dir(root)
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .context("bench-peer: step 'onebit': cannot start cargo build --release -p onebit")?;
    if !st.success() {
        bail!(
            "bench-peer: step 'onebit': cargo build --release -p onebit failed ({st}) in {}",
            root.display()
        );
    }
    let bin = cargo_target_dir(root).join("release/onebit");
    if !bin.exists() {
        bail!(
            "bench-peer: step 'onebit': the build finished but {} is missing",
            bin.display()
        );
    }
    Ok(bin)
}

/// One llama-bench test (a `-p`/`-n`/`-d` combination) and its speed.
#[derive(Clone, Debug)]
struct PeerRow {
    n_prompt: u64,
    n_gen: u64,
    n_depth: u64,
    avg_ts: f64,
    raw: Value,
}

fn run_llama_bench(bin: &Path, gguf: &Path, o: &Options, peer: &Path) -> Result<Vec<PeerRow>> {
    let mut cmd = Command::new(bin);
    cmd.arg("-m")
        .arg(gguf)
        .args(["-t", &o.threads.to_string()])
        // pp1 and pp8: the 1- and 8-row passes; pp128 and tg128: prefill and decode.
        .args(["-n", "128", "-o", "json"]);
    if o.context.is_none() {
        cmd.args(["-p", "1,8,128"]);
    }
    if let Some(n) = o.context {
        // pp N from empty is the long-prompt prefill; every test also runs at depth N.
        cmd.args(["-p", &format!("1,8,128,{n}"), "-d", &format!("0,{n}")]);
    }
    cmd.args(&o.llama_extra);
    let shown = format!("{cmd:?}");
    step!("  {shown}");
    let log = peer.join("llama-bench.log");
    let out = cmd
        .stderr(File::create(&log)?)
        .output()
        .with_context(|| format!("bench-peer: step 'llama-bench': cannot start {shown}"))?;
    if !out.status.success() {
        bail!(
            "bench-peer: step 'llama-bench' failed ({}): {shown}; its stderr is in {}",
            out.status,
            log.display()
        );
    }
    let rows: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "bench-peer: step 'llama-bench': {shown} printed no JSON array (stderr in {})",
            log.display()
        )
    })?;
    let rows = rows
        .as_array()
        .context("bench-peer: llama-bench's JSON is not an array")?;
    rows.iter()
        .map(|r| {
            let num = |k: &str| {
                r.get(k)
                    .and_then(Value::as_f64)
                    .with_context(|| format!("bench-peer: llama-bench's JSON row lacks '{k}'"))
            };
            Ok(PeerRow {
                n_prompt: num("n_prompt")? as u64,
                n_gen: num("n_gen")? as u64,
                n_depth: r.get("n_depth").and_then(Value::as_u64).unwrap_or(0),
                avg_ts: num("avg_ts")?,
                raw: r.clone(),
            })
        })
        .collect()
}

fn run_onebit_bench(bin: &Path, model: &Path, threads: usize, extra: &[String]) -> Result<Value> {
    let mut cmd = Command::new(bin);
    cmd.arg("bench")
        .arg("--model")
        .arg(model)
        .args(["--json", "--threads", &threads.to_string()]);
    // The same work as llama-bench's pp128 and tg128, unless the caller chose otherwise.
    let context = extra.iter().any(|e| e == "--context");
    for (flag, v) in [("--prefill-tokens", "128"), ("--decode-tokens", "128")] {
        let given = extra
            .iter()
            .any(|e| e == flag || e.starts_with(&format!("{flag}=")));
        // At --context N the prompt is the N tokens.
        if !(given || context && flag == "--prefill-tokens") {
            cmd.args([flag, v]);
        }
    }
    cmd.args(extra);
    onebit_json(cmd, "onebit bench")
}

/// Runs `onebit bench --json` (its progress to this stderr) and parses the last JSON
/// object it prints; errors name the bench-peer step.
fn onebit_json(mut cmd: Command, step_name: &str) -> Result<Value> {
    let shown = format!("{cmd:?}");
    step!("  {shown}");
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("bench-peer: step '{step_name}': cannot start {shown}"))?;
    if !out.status.success() {
        bail!(
            "bench-peer: step '{step_name}' failed ({}): {shown}",
            out.status
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| {
            format!("bench-peer: step '{step_name}': {shown} printed no JSON object")
        })?;
    serde_json::from_str(line)
        .with_context(|| format!("bench-peer: step '{step_name}': cannot parse its JSON: {line}"))
}

/// Total generated tokens/s of one stream and of `streams` concurrent ones, for each
/// engine: llama-batched-bench's `pl` 1 and N (its sequences decoded in one batch) and
/// `onebit bench --sessions N` (one at a time, then in shared passes). Both count the
/// generated tokens over the whole time of the requests, their prompts' prefill included.
#[derive(Clone, Debug, PartialEq)]
struct StreamFigures {
    streams: usize,
    peer: (f64, f64),
    ours: (f64, f64),
    /// llama-batched-bench's JSON lines and onebit bench's JSON, kept for the report.
    peer_raw: Vec<Value>,
    ours_raw: Value,
}

impl StreamFigures {
    fn new(peer: (usize, f64, f64, Vec<Value>), ours: &Value) -> Result<StreamFigures> {
        let get = |k: &str| {
            ours[k]
                .as_f64()
                .with_context(|| format!("bench-peer: onebit bench --sessions printed no '{k}'"))
        };
        Ok(StreamFigures {
            streams: peer.0,
            peer: (peer.1, peer.2),
            ours: (
                get("one_at_a_time_tokens_per_second")?,
                get("together_tokens_per_second")?,
            ),
            peer_raw: peer.3,
            ours_raw: ours.clone(),
        })
    }
}

/// llama-batched-bench's JSON lines (returned) and each `pl`'s generated tokens
/// (`pl · tg`) over its whole time `t` (prompts and generation), for 1 and `streams`.
fn batched_rates(jsonl: &str, streams: usize) -> Result<(f64, f64, Vec<Value>)> {
    let lines = jsonl
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(|line| {
            serde_json::from_str::<Value>(line).with_context(|| {
                format!("bench-peer: llama-batched-bench printed a bad JSON line: {line}")
            })
        })
        .collect::<Result<Vec<Value>>>()?;
    let rate = |pl: usize| -> Result<f64> {
        for v in &lines {
            let line = v.to_string();
            if v["pl"].as_u64() == Some(pl as u64) {
                let (tg, t) = (v["tg"].as_f64(), v["t"].as_f64());
                return match (tg, t) {
                    (Some(tg), Some(t)) if t > 0.0 => Ok(pl as f64 * tg / t),
                    _ => bail!(
                        "bench-peer: llama-batched-bench's line for pl {pl} lacks tg or t: {line}"
                    ),
                };
            }
        }
        bail!("bench-peer: llama-batched-bench printed no line for pl {pl}")
    };
    Ok((rate(1)?, rate(streams)?, lines))
}

fn run_batched_bench(
    bin: &Path,
    gguf: &Path,
    o: &Options,
    peer: &Path,
) -> Result<(usize, f64, f64, Vec<Value>)> {
    let n = o.streams;
    let mut cmd = Command::new(bin);
    cmd.arg("-m")
        .arg(gguf)
        .args(["-t", &o.threads.to_string(), "-tb", &o.threads.to_string()])
        .args(["-c", &(n * (STREAM_PROMPT + STREAM_TOKENS)).to_string()])
        .args([
            "-npp",
            &STREAM_PROMPT.to_string(),
            "-ntg",
            &STREAM_TOKENS.to_string(),
        ])
        .args(["-npl", &format!("1,{n}"), "--output-format", "jsonl"]);
    let shown = format!("{cmd:?}");
    step!("  {shown}");
    let log = peer.join("llama-batched-bench.log");
    let out = cmd
        .stderr(File::create(&log)?)
        .output()
        .with_context(|| format!("bench-peer: step 'streams': cannot start {shown}"))?;
    if !out.status.success() {
        bail!(
            "bench-peer: step 'streams' failed ({}): {shown}; its stderr is in {}",
            out.status,
            log.display()
        );
    }
    let (one, many, lines) = batched_rates(&String::from_utf8_lossy(&out.stdout), n)?;
    Ok((n, one, many, lines))
}

fn run_onebit_sessions(bin: &Path, model: &Path, threads: usize, n: usize) -> Result<Value> {
    let extra = [
        "--sessions".to_string(),
        n.to_string(),
        "--tokens".to_string(),
        STREAM_TOKENS.to_string(),
    ];
    let mut cmd = Command::new(bin);
    cmd.arg("bench")
        .arg("--model")
        .arg(model)
        .args(["--json", "--threads", &threads.to_string()])
        .args(extra);
    onebit_json(cmd, "streams")
}

// ---------------------------------------------------------------------------------------
// The report.

/// The figures one engine contributes to a table (None: not measured).
#[derive(Clone, Copy, Default)]
struct Figures {
    decode_tps: Option<f64>,
    prefill_tps: Option<f64>,
    pass1_ms: Option<f64>,
    pass8_ms: Option<f64>,
}

impl Figures {
    fn cost_8_vs_1(&self) -> Option<f64> {
        Some(self.pass8_ms? / self.pass1_ms?)
    }

    /// llama-bench's figures at `depth`; a deep table's prefill is `pp depth` from empty
    /// (a long prompt), the others are the usual tests run at that depth.
    fn from_peer_deep(rows: &[PeerRow], depth: u64) -> Self {
        let prefill = rows
            .iter()
            .find(|r| r.n_prompt == depth && r.n_gen == 0 && r.n_depth == 0)
            .map(|r| r.avg_ts);
        Figures {
            prefill_tps: prefill,
            ..Figures::from_peer(rows, depth)
        }
    }

    fn from_peer(rows: &[PeerRow], depth: u64) -> Self {
        let find = |p: u64, g: u64| {
            rows.iter()
                .find(|r| r.n_prompt == p && r.n_gen == g && r.n_depth == depth)
                .map(|r| r.avg_ts)
        };
        Figures {
            decode_tps: find(0, 128),
            prefill_tps: find(128, 0),
            pass1_ms: find(1, 0).map(|ts| 1e3 / ts),
            pass8_ms: find(8, 0).map(|ts| 8e3 / ts),
        }
    }

    fn from_onebit(v: &Value) -> Self {
        let pass = |n: u64| {
            v["passes"]
                .as_array()?
                .iter()
                .find(|p| p["rows"].as_u64() == Some(n))?["ms"]
                .as_f64()
        };
        Figures {
            decode_tps: v["decode_tokens_per_second"].as_f64(),
            prefill_tps: v["prefill_tokens_per_second"].as_f64(),
            pass1_ms: pass(1),
            pass8_ms: pass(8),
        }
    }
}

/// The table's rows: name, which way is better, and the getter.
type Getter = fn(&Figures) -> Option<f64>;
const ROWS: &[(&str, &str, &str, Getter)] = &[
    (
        "decode tok/s",
        "decode_tokens_per_second",
        "higher is better",
        |f| f.decode_tps,
    ),
    (
        "prefill 128 tok/s",
        "prefill_128_tokens_per_second",
        "higher is better",
        |f| f.prefill_tps,
    ),
    ("1-row pass ms", "pass_1_row_ms", "lower is better", |f| {
        f.pass1_ms
    }),
    ("8-row pass ms", "pass_8_rows_ms", "lower is better", |f| {
        f.pass8_ms
    }),
    (
        "8-row / 1-row cost",
        "cost_8_rows_vs_1",
        "lower is better",
        |f| f.cost_8_vs_1(),
    ),
];

struct Report {
    cpu: String,
    /// /proc/loadavg's 1-minute figure before and after the runs.
    load: (f64, f64),
    isa: Vec<(&'static str, bool)>,
    threads: usize,
    llama_version: String,
    onebit_commit: String,
    gguf: PathBuf,
    model: PathBuf,
    onebit_extra: Vec<String>,
    llama_extra: Vec<String>,
    context: Option<usize>,
    peer: Figures,
    peer_deep: Option<Figures>,
    ours: Figures,
    ours_deep: Option<Figures>,
    onebit_raw: Value,
    peer_raw: Vec<Value>,
    streams: Option<StreamFigures>,
}

const ISA: &[&str] = &["avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni"];

fn cpu_info() -> (String, Vec<(&'static str, bool)>) {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let model = field("model name").unwrap_or_else(|| "unknown CPU".into());
    let flags = field("flags").unwrap_or_default();
    let flags: Vec<&str> = flags.split_whitespace().collect();
    (model, ISA.iter().map(|f| (*f, flags.contains(f))).collect())
}

/// The 1-minute load average (0 when /proc/loadavg is unreadable).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn onebit_commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{head} (with uncommitted changes)")
    } else {
        head
    }
}

impl Report {
    fn new(
        o: &Options,
        load_before: f64,
        root: &Path,
        gguf: &Path,
        model: &Path,
        peer_rows: &[PeerRow],
        // `onebit bench`'s JSON, and at --context N its deep run's.
        (onebit, onebit_deep): (&Value, Option<&Value>),
    ) -> Result<Self> {
        let (cpu, isa) = cpu_info();
        let first = peer_rows
            .first()
            .context("bench-peer: llama-bench printed no results")?;
        let commit = first.raw["build_commit"].as_str().unwrap_or("unknown");
        let llama_version = format!(
            "commit {commit} (vendored by llama-cpp-python {LLAMA_CPP_PYTHON}), {} build",
            o.build.name()
        );
        Ok(Report {
            cpu,
            load: (load_before, load_average()),
            isa,
            threads: o.threads,
            llama_version,
            onebit_commit: onebit_commit(root),
            gguf: gguf.to_path_buf(),
            model: model.to_path_buf(),
            onebit_extra: o.onebit_extra.clone(),
            llama_extra: o.llama_extra.clone(),
            context: o.context,
            peer: Figures::from_peer(peer_rows, 0),
            peer_deep: o
                .context
                .map(|n| Figures::from_peer_deep(peer_rows, n as u64)),
            ours: Figures::from_onebit(onebit),
            ours_deep: onebit_deep.map(Figures::from_onebit),
            onebit_raw: onebit.clone(),
            peer_raw: peer_rows.iter().map(|r| r.raw.clone()).collect(),
            streams: None,
        })
    }

    fn isa_line(&self) -> String {
        self.isa
            .iter()
            .map(|(f, on)| format!("{f}{}", if *on { "+" } else { "-" }))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn print(&self) {
        let fmt = |v: Option<f64>| match v {
            Some(x) if x >= 100.0 => format!("{x:.1}"),
            Some(x) => format!("{x:.3}"),
            None => "-".into(),
        };
        println!("CPU:      {}", self.cpu);
        println!("ISA:      {}", self.isa_line());
        println!("threads:  {}", self.threads);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        println!(
            "load:     {:.1} before, {:.1} after ({cores} cores){}",
            self.load.0,
            self.load.1,
            if self.load.0.max(self.load.1) > cores as f64 {
                "; the machine was busy: figures are noisy, and spinning thread barriers (llama.cpp's) suffer most (--threads 1 has none)"
            } else {
                ""
            }
        );
        println!("llama.cpp: {}", self.llama_version);
        if !self.llama_extra.is_empty() {
            println!("llama-bench flags: {}", self.llama_extra.join(" "));
        }
        println!("onebit:   commit {}", self.onebit_commit);
        println!("GGUF:     {}", self.gguf.display());
        println!("package:  {}", self.model.display());
        if !self.onebit_extra.is_empty() {
            println!("onebit bench flags: {}", self.onebit_extra.join(" "));
        }
        println!();
        println!(
            "{:<20} {:>11} {:>11} {:>17}  note",
            "figure", "llama.cpp", "onebit", "onebit/llama.cpp"
        );
        for (name, _, better, get) in ROWS {
            let (p, ours) = (get(&self.peer), get(&self.ours));
            let ratio = p.zip(ours).map(|(p, o)| format!("{:.2}", o / p));
            let note = if better.starts_with("higher") {
                "higher is better; ratio > 1: onebit faster"
            } else if name.starts_with('8') && name.contains('/') {
                "lower: rows amortize better; ratio < 1: onebit amortizes better"
            } else {
                "lower is better; ratio < 1: onebit faster"
            };
            println!(
                "{:<20} {:>11} {:>11} {:>17}  {note}",
                name,
                fmt(p),
                fmt(ours),
                ratio.unwrap_or_else(|| "-".into())
            );
        }
        println!();
        println!("llama.cpp: tg128 (decode), pp128 (prefill), pp1 and pp8 (a pass of n rows = n / pp_n tok/s), each the mean of 5 runs from an empty KV cache.");
        println!("onebit bench: prefill best of 2; decode steps after the prompt; n-row passes best of 12 after those, rolled back each time.");
        if let Some(s) = &self.streams {
            println!();
            println!(
                "{} concurrent streams ({STREAM_PROMPT}-token prompts, {STREAM_TOKENS} tokens each) against one, total generated tok/s:",
                s.streams
            );
            println!(
                "{:<20} {:>11} {:>11} {:>17}",
                "figure", "llama.cpp", "onebit", "onebit/llama.cpp"
            );
            let n = s.streams;
            for (name, p, o) in [
                ("1 stream tok/s".to_string(), s.peer.0, s.ours.0),
                (format!("{n} streams tok/s"), s.peer.1, s.ours.1),
                (
                    format!("{n} streams / 1"),
                    s.peer.1 / s.peer.0,
                    s.ours.1 / s.ours.0,
                ),
            ] {
                println!(
                    "{:<20} {:>11} {:>11} {:>17.2}",
                    name,
                    fmt(Some(p)),
                    fmt(Some(o)),
                    o / p
                );
            }
            println!("llama.cpp: llama-batched-bench -npl 1,{n} (one run; {n} sequences decoded in one batch). onebit: bench --sessions {n}, greedy (the best of 3 runs one at a time, then in shared passes; texts checked equal). Neither takes the flags passed through above.");
        }
        if let (Some(n), Some(deep)) = (self.context, &self.peer_deep) {
            println!();
            println!(
                "at context {n}: llama-bench -d {n} (prefill: pp{n} from empty) beside onebit bench --context {n}:"
            );
            println!(
                "{:<20} {:>11} {:>11} {:>17}",
                "figure", "llama.cpp", "onebit", "onebit/llama.cpp"
            );
            let ours = self.ours_deep.unwrap_or_default();
            for (name, _, _, get) in ROWS {
                let (p, o) = (get(deep), get(&ours));
                let ratio = p.zip(o).map(|(p, o)| format!("{:.2}", o / p));
                // The deep table's prefill is the long prompt (pp N), not pp128.
                let name = name.replace("prefill 128", &format!("prefill {n}"));
                println!(
                    "{:<20} {:>11} {:>11} {:>17}",
                    name,
                    fmt(p),
                    fmt(o),
                    ratio.unwrap_or_else(|| "-".into())
                );
            }
        }
    }

    fn json(&self) -> Value {
        let table = |ours: Option<&Figures>, peer: &Figures| -> Value {
            let mut m = serde_json::Map::new();
            for (_, key, better, get) in ROWS {
                let (p, o) = (get(peer), ours.and_then(get));
                m.insert(
                    key.to_string(),
                    json!({
                        "llama_cpp": p,
                        "onebit": o,
                        "onebit_over_llama_cpp": p.zip(o).map(|(p, o)| o / p),
                        "better": better,
                    }),
                );
            }
            Value::Object(m)
        };
        json!({
            "cpu": self.cpu,
            "isa": self.isa.iter().map(|(f, on)| (f.to_string(), json!(on))).collect::<serde_json::Map<_, _>>(),
            "threads": self.threads,
            "load_average_1min": {"before": self.load.0, "after": self.load.1},
            "llama_cpp": self.llama_version,
            "llama_cpp_python": LLAMA_CPP_PYTHON,
            "onebit_commit": self.onebit_commit,
            "gguf": self.gguf.display().to_string(),
            "model": self.model.display().to_string(),
            "onebit_bench_flags": self.onebit_extra,
            "llama_bench_flags": self.llama_extra,
            "figures": table(Some(&self.ours), &self.peer),
            "context": self.context.zip(self.peer_deep.as_ref()).map(|(n, deep)| json!({
                "tokens": n,
                "figures": table(self.ours_deep.as_ref(), deep),
            })),
            "streams": self.streams.as_ref().map(|s| json!({
                "streams": s.streams,
                "prompt_tokens": STREAM_PROMPT,
                "tokens_per_stream": STREAM_TOKENS,
                "llama_cpp": {"one_stream_tokens_per_second": s.peer.0, "streams_tokens_per_second": s.peer.1, "streams_vs_one": s.peer.1 / s.peer.0},
                "onebit": {"one_stream_tokens_per_second": s.ours.0, "streams_tokens_per_second": s.ours.1, "streams_vs_one": s.ours.1 / s.ours.0},
                "llama_batched_bench_raw": s.peer_raw,
                "onebit_bench_raw": s.ours_raw,
            })),
            "llama_bench_raw": self.peer_raw,
            "onebit_bench_raw": self.onebit_raw,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(p: u64, g: u64, d: u64, ts: f64) -> PeerRow {
        PeerRow {
            n_prompt: p,
            n_gen: g,
            n_depth: d,
            avg_ts: ts,
            raw: Value::Null,
        }
    }

    #[test]
    fn peer_figures_turn_pp_speeds_into_pass_times() {
        let rows = [
            row(1, 0, 0, 100.0),
            row(8, 0, 0, 400.0),
            row(128, 0, 0, 1000.0),
            row(0, 128, 0, 90.0),
            row(1, 0, 512, 50.0),
        ];
        let f = Figures::from_peer(&rows, 0);
        assert_eq!(f.decode_tps, Some(90.0));
        assert_eq!(f.prefill_tps, Some(1000.0));
        assert_eq!(f.pass1_ms, Some(10.0));
        assert_eq!(f.pass8_ms, Some(20.0));
        assert_eq!(f.cost_8_vs_1(), Some(2.0));
        let deep = Figures::from_peer(&rows, 512);
        assert_eq!(deep.pass1_ms, Some(20.0));
        assert_eq!(deep.pass8_ms, None);
        assert_eq!(deep.cost_8_vs_1(), None);
    }

    #[test]
    fn a_deep_table_takes_its_prefill_from_pp_n_at_depth_zero() {
        let rows = [
            row(128, 0, 0, 1000.0),
            row(2048, 0, 0, 225.0),
            row(2048, 0, 2048, 120.0),
            row(128, 0, 2048, 300.0),
            row(0, 128, 2048, 40.0),
            row(1, 0, 2048, 50.0),
        ];
        let deep = Figures::from_peer_deep(&rows, 2048);
        assert_eq!(deep.prefill_tps, Some(225.0));
        assert_eq!(deep.decode_tps, Some(40.0));
        assert_eq!(deep.pass1_ms, Some(20.0));
    }

    #[test]
    fn batched_bench_rates_count_generated_tokens_over_the_whole_time() {
        let jsonl = "main: n_kv_max = 640\n\
            {\"pp\": 32, \"tg\": 128, \"pl\": 1, \"t_pp\": 0.1, \"t_tg\": 1.0, \"t\": 1.28}\n\
            {\"pp\": 32, \"tg\": 128, \"pl\": 4, \"t_pp\": 0.3, \"t_tg\": 2.0, \"t\": 2.56}\n";
        let (one, four, lines) = batched_rates(jsonl, 4).unwrap();
        assert_eq!((one, four, lines.len()), (100.0, 200.0, 2));
        let err = batched_rates(jsonl, 8).unwrap_err().to_string();
        assert!(err.contains("no line for pl 8"), "{err}");
        let err = batched_rates("{\"pl\": 1, \"tg\": 128}", 4)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lacks tg or t"), "{err}");
        let err = batched_rates("{\"pl\": 1,", 4).unwrap_err().to_string();
        assert!(err.contains("printed a bad JSON line"), "{err}");
        let ours =
            json!({"one_at_a_time_tokens_per_second": 150.0, "together_tokens_per_second": 300.0});
        let s = StreamFigures::new((4, 100.0, 200.0, Vec::new()), &ours).unwrap();
        assert_eq!((s.peer, s.ours), ((100.0, 200.0), (150.0, 300.0)));
        assert!(StreamFigures::new((4, 1.0, 2.0, Vec::new()), &json!({})).is_err());
    }

    #[test]
    fn onebit_figures_come_from_its_bench_json() {
        let v = json!({
            "prefill_tokens_per_second": 500.0,
            "decode_tokens_per_second": 80.0,
            "passes": [{"rows": 1, "ms": 12.0}, {"rows": 8, "ms": 30.0}],
        });
        let f = Figures::from_onebit(&v);
        assert_eq!(f.prefill_tps, Some(500.0));
        assert_eq!(f.decode_tps, Some(80.0));
        assert_eq!(f.cost_8_vs_1(), Some(2.5));
    }

    #[test]
    fn arguments() {
        let a = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o = parse(&a(
            "--threads 4 --context 2048 --json --llama-bench-arg --poll --llama-bench-arg 0 -- --head tiles",
        ))
        .unwrap();
        assert_eq!((o.threads, o.context, o.json), (4, Some(2048), true));
        assert_eq!(o.llama_extra, a("--poll 0"));
        assert_eq!(o.onebit_extra, a("--head tiles"));
        assert_eq!(o.fetched, Fetched::Smollm2);
        assert_eq!(o.streams, 4);
        assert_eq!(parse(&a("--streams 0")).unwrap().streams, 0);
        assert_eq!(parse(&a("--streams 8")).unwrap().streams, 8);
        for bad in ["--streams 1", "--streams 65", "--streams x"] {
            let Err(err) = parse(&a(bad)) else {
                panic!("{bad} was accepted")
            };
            assert!(err.to_string().contains("--streams"), "{bad}: {err}");
        }
        assert!(parse(&a("--gguf x.gguf")).is_err());
        let o = parse(&a("--model gemma3")).unwrap();
        assert_eq!((o.fetched, o.model, o.gguf), (Fetched::Gemma3, None, None));
        let o = parse(&a("--gguf g.gguf --model gemma3")).unwrap();
        assert_eq!(o.model, Some(PathBuf::from("gemma3")));
        let e = parse(&a("--model some/dir")).err().unwrap().to_string();
        assert!(e.contains("'some/dir'") && e.contains("--gguf"), "{e}");
        assert!(parse(&a("--threads 0")).is_err());
        assert!(parse(&a("--bogus")).is_err());
        assert_eq!(parse(&a("")).unwrap().build, llama_cpp::Build::Native);
        let o = parse(&a("--llama-build avx2")).unwrap();
        assert_eq!(o.build, llama_cpp::Build::Avx2);
        let e = parse(&a("--llama-build avx512")).err().unwrap().to_string();
        assert!(e.contains("'avx512'"), "{e}");
    }
}
