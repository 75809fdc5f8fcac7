//! The serve tests' harness: test packages, and a server started in this process on an
//! ephemeral port (its log lines collected), with a blocking HTTP client.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onebit_engine::{ContextLen, DrafterConfig, EngineConfig};
use onebit_serve::{DebugDelays, Log, Running, ServeOptions, Served, ServedModel};
use serde_json::Value;
use test_support::http::HttpServer;

/// A file or folder of `../shared/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

/// tiny-llama converted from its GGUF (model, config and a tokenizer that encodes) into
/// a temporary folder, as `onebit convert` writes it: the folder (keep it alive) and
/// the package's path.
pub fn tiny_llama_package() -> (tempfile::TempDir, PathBuf) {
    use q4nx_convert::gguf::GgufFile;
    use q4nx_convert::{tokenizer::tokenizer_json, GgufConverter};
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("tiny-llama");
    let file = GgufFile::open(fixture("tiny-llama/model.Q4_1.gguf")).unwrap();
    let converter = GgufConverter::new(&file).unwrap();
    let config = converter.hf_config().unwrap();
    let (tokenizer, _) = tokenizer_json(&file.gguf).unwrap();
    let (writer, _) = converter.convert(&|_, _| {}).unwrap();
    std::fs::create_dir_all(&pkg).unwrap();
    writer.write_file(pkg.join("model.q4nx")).unwrap();
    for (name, value) in [("config.json", &config), ("tokenizer.json", &tokenizer)] {
        std::fs::write(pkg.join(name), serde_json::to_string_pretty(value).unwrap()).unwrap();
    }
    (dir, pkg)
}

/// A running server, seen over HTTP through [`HttpServer`]; stopped on drop.
pub struct Server {
    http: HttpServer,
    running: Running,
}

/// `onebit serve`'s flags the tests use, as options (the `onebit` binary's own parsing
/// is tested in its crate): one thread, any free port.
fn options(model: &Path, args: &[&str], log: Log) -> ServeOptions {
    let mut engine = EngineConfig::new(model);
    engine.threads = Some(1);
    // As `onebit serve` without --ctx-len on a machine with memory to spare: the model's own.
    engine.ctx_len = ContextLen::Unchecked;
    let mut lookup = false;
    let mut draft = None;
    let mut shared = true;
    let mut m = ServedModel::new(engine, onebit_engine::model_name(model));
    m.aliases = vec![model.display().to_string()];
    let mut o = ServeOptions::new(Served::Store(Vec::new()));
    o.log = log;
    let mut debug = DebugDelays::default();
    let mut it = args.iter();
    while let Some(&flag) = it.next() {
        let mut value = || *it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let ms = |v: &str| Duration::from_millis(v.parse().unwrap());
        match flag {
            "--ctx-len" => m.engine.ctx_len = ContextLen::AtMost(value().parse().unwrap()),
            "--parallel" => o.parallel = value().parse().unwrap(),
            "--q-len" => o.q_len = value().parse().unwrap(),
            "--alias" => m.name = value().to_string(),
            "--api-key" => o.api_key = Some(value().to_string()),
            "--cors" => o.cors.push(value().to_string()),
            "--host" => o.host = value().to_string(),
            "--quiet" => o.quiet = true,
            "--lookup" => lookup = true,
            "--draft" => draft = Some(PathBuf::from(value())),
            "--no-shared-passes" => shared = false,
            // k = --draft-max every round: a test counting drafts must not depend on
            // adaptive k's pass costs, timed at load on a machine busy with other tests.
            "--fixed-k" => m.engine.fixed_k = true,
            "--debug-token-delay-ms" => debug.token = ms(value()),
            "--debug-load-delay-ms" => debug.load = ms(value()),
            "--debug-tokenize-delay-ms" => debug.tokenize = ms(value()),
            "--sse-keep-alive-ms" => o.sse_keep_alive = ms(value()),
            other => panic!("the harness does not know {other}"),
        }
    }
    o.debug = debug;
    m.engine.drafter =
        DrafterConfig::from_flags(draft.as_deref(), lookup, onebit_engine::DEFAULT_MAX_NGRAM);
    m.engine.share_passes = o.parallel > 1 && shared;
    if m.engine.ctx_len == ContextLen::Unchecked {
        let config: Value =
            serde_json::from_slice(&std::fs::read(model.join("config.json")).unwrap()).unwrap();
        let max = config["max_position_embeddings"].as_u64().unwrap() as usize;
        m.engine.ctx_len = ContextLen::AtMost(max);
    }
    o.models = Served::One(m);
    o
}

impl Server {
    /// Starts a server on `model` with `onebit serve`'s flags `args` and (unless
    /// `wait_ready` is false) waits for `/health` to say 200.
    pub fn start(model: &Path, args: &[&str], wait_ready: bool) -> Server {
        Server::launch(|log| options(model, args, log), wait_ready)
    }

    /// Starts a server of several models (as `onebit serve` with no model serves the
    /// store): each of `models` under its package directory's name, loaded on its first
    /// request; `args` as for [`Server::start`], applied to each.
    pub fn start_store(models: &[&Path], args: &[&str]) -> Server {
        let store = |log: Log| {
            let mut o = options(models[0], args, log.clone());
            o.models = Served::Store(
                models
                    .iter()
                    .flat_map(|m| options(m, args, log.clone()).models.models().to_vec())
                    .collect(),
            );
            o
        };
        Server::launch(store, true)
    }

    /// Starts the server `options` describes, its log lines collected.
    fn launch(options: impl FnOnce(Log) -> ServeOptions, wait_ready: bool) -> Server {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let log = log.clone();
            Log::to(move |line| log.lock().unwrap().push(line.to_string()))
        };
        let running = onebit_serve::start(options(sink)).unwrap();
        let server = Server {
            http: HttpServer::new(format!("http://{}", running.addr()), log),
            running,
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
