//! `onebit serve [MODEL]`: the flags, parsed into [`onebit_serve::ServeOptions`]; the
//! server itself is the `onebit-serve` crate. Without a model it serves every model of
//! the store by name, each loaded on its first request.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use onebit_engine::{ContextLen, DrafterConfig, EngineConfig};
use onebit_serve::{Served, ServedModel};

use crate::run::TargetArgs;
use crate::store::Store;

#[derive(Args)]
pub struct ServeArgs {
    /// The target package directory (config.json, model.q4nx, tokenizer.json) or a
    /// stored model's name. Without one: every model of the store (`onebit list`), by
    /// name, each loaded on its first request.
    #[arg(value_name = "MODEL")]
    pub model_dir: Option<PathBuf>,
    /// A DFlash draft package: decode speculatively (same text as without it).
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Prompt-lookup drafting (no model); with --draft, chained with the draft.
    #[arg(long)]
    pub lookup: bool,
    /// Drafts verified per round at most (k).
    #[arg(long, default_value_t = 7)]
    pub draft_max: usize,
    /// Draft k = --draft-max every round instead of adapting k to the measured
    /// acceptance and pass costs (no calibration at load). The text is the same.
    #[arg(long)]
    pub fixed_k: bool,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port (0: any free port; the log line names it). Default: $FLM_SERVE_PORT, else 52625.
    #[arg(long)]
    pub port: Option<u16>,
    /// Context size in tokens: a request's prompt plus max tokens must fit (cap: the
    /// model's max_position_embeddings; default: that, capped so a full-context KV
    /// cache takes at most half of the available memory, with a printed reason).
    #[arg(long, short = 'c')]
    pub ctx_len: Option<usize>,
    /// Requests that may wait for a free session; more are refused with 503.
    #[arg(long, default_value_t = 10)]
    pub q_len: usize,
    /// Sessions generating at once (each its own KV cache over the one model).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub parallel: usize,
    /// Give each session passes of its own instead of running the generating
    /// sessions' next rows together in one pass (continuous batching, the default with
    /// --parallel above 1). Answers are the same either way; for comparisons.
    #[arg(long)]
    pub no_shared_passes: bool,
    /// The model's name in the API (default: the package directory's name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Log errors only (no line per request).
    #[arg(long)]
    pub quiet: bool,
    /// Accepted for `flm serve` compatibility (sockets are not limited); ignored.
    #[arg(long, hide = true)]
    pub socket: Option<usize>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Activation precision of the projections (see `onebit run --help`).
    #[arg(long, value_enum, default_value_t = crate::run::PrecisionArg::Auto)]
    pub precision: crate::run::PrecisionArg,
    /// For tests of queueing and cancellation: sleep this long after every token.
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_token_delay_ms: u64,
    /// How long a shared pass waits at most for a generating session busy elsewhere.
    #[arg(long, hide = true, default_value_t = onebit_engine::DEFAULT_LINGER.as_micros() as u64)]
    pub debug_pass_linger_us: u64,
    /// For tests of readiness: wait this long before loading the model.
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_load_delay_ms: u64,
    /// For tests of where tokenization runs: sleep this long before tokenizing a request.
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_tokenize_delay_ms: u64,
    /// Require `Authorization: Bearer KEY` on every route but /health (401 otherwise).
    /// Default: $ONEBIT_API_KEY, else no key.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Allow browser pages from ORIGIN (or `*`: any) to call the API (CORS headers);
    /// repeat for several origins. Default: no CORS headers.
    #[arg(long, value_name = "ORIGIN")]
    pub cors: Vec<String>,
    /// A Jinja chat template file that replaces the package's (as llama.cpp's
    /// --chat-template-file); refused by name when it cannot be read or parsed.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
}

/// Parses the flags and serves until the process is stopped.
pub fn run(args: &ServeArgs) -> Result<()> {
    if args.threads == Some(0) {
        anyhow::bail!("--threads must be at least 1");
    }
    let api_key = match &args.api_key {
        Some(k) => Some(k.clone()),
        None => std::env::var("ONEBIT_API_KEY").ok(),
    };
    let ctx_len = args.ctx_len.map_or(ContextLen::Auto, ContextLen::AtMost);
    let models = match &args.model_dir {
        Some(dir) => {
            let name = args
                .alias
                .clone()
                .unwrap_or_else(|| onebit_engine::model_name(dir));
            let mut one = ServedModel::new(engine_config(args, dir, ctx_len)?, name);
            one.aliases = vec![dir.display().to_string(), onebit_engine::model_name(dir)];
            Served::One(one)
        }
        None => Served::Store(stored_models(args, ctx_len)?),
    };
    let port = match (args.port, std::env::var("FLM_SERVE_PORT")) {
        (Some(p), _) => p,
        (None, Ok(v)) => v
            .parse()
            .with_context(|| format!("serve: FLM_SERVE_PORT={v:?} is not a port number"))?,
        (None, Err(_)) => 52625,
    };
    let mut options = onebit_serve::ServeOptions::new(models);
    options.host = args.host.clone();
    options.port = port;
    options.q_len = args.q_len;
    options.parallel = args.parallel;
    options.quiet = args.quiet;
    options.api_key = api_key;
    options.cors = args.cors.clone();
    options.debug = onebit_serve::DebugDelays {
        token: Duration::from_millis(args.debug_token_delay_ms),
        load: Duration::from_millis(args.debug_load_delay_ms),
        tokenize: Duration::from_millis(args.debug_tokenize_delay_ms),
    };
    onebit_serve::serve(options)
}

/// How the model in `dir` loads with the flags of `args`.
fn engine_config(args: &ServeArgs, dir: &Path, ctx_len: ContextLen) -> Result<EngineConfig> {
    let target = TargetArgs {
        model: dir.to_path_buf(),
        threads: args.threads,
        head: crate::run::HeadArg::Auto,
        kernel: crate::run::KernelArg::Auto,
        precision: args.precision,
        kv_type: crate::run::KvTypeArg::Auto,
        backend: crate::backend::BackendArg::Cpu,
        kernels: None,
        device: 0,
        chat_template: args.chat_template.clone(),
    };
    let mut engine = target.engine_config()?;
    engine.drafter = DrafterConfig::from_flags(
        args.draft.as_deref(),
        args.lookup,
        onebit_engine::DEFAULT_MAX_NGRAM,
    );
    engine.draft_max = args.draft_max;
    engine.fixed_k = args.fixed_k;
    engine.share_passes = args.parallel > 1 && !args.no_shared_passes;
    engine.pass_linger = Duration::from_micros(args.debug_pass_linger_us);
    // --ctx-len as given, capped at the model's own limit (as `flm serve` takes any
    // value); without it, the model's max_position_embeddings capped by available memory
    // (the engine's rule; the reason printed at load: it decides which requests are
    // refused).
    engine.ctx_len = ctx_len;
    Ok(engine)
}

/// Every model of the store, served under its name (`smollm2:135m`); the flags that
/// belong to one model are refused by name.
fn stored_models(args: &ServeArgs, ctx_len: ContextLen) -> Result<Vec<ServedModel>> {
    if args.draft.is_some() {
        anyhow::bail!(
            "serve: --draft drafts for one target: name the model (`onebit serve MODEL --draft DIR`)"
        );
    }
    if args.alias.is_some() {
        anyhow::bail!(
            "serve: --alias names one model: name the model (`onebit serve MODEL --alias NAME`)"
        );
    }
    let store = Store::open()?;
    let models = store.models()?;
    if models.is_empty() {
        anyhow::bail!(
            "serve: no model to serve: the store ({}) is empty; `onebit pull smollm2` fetches one, or name a package directory (`onebit serve DIR`)",
            store.root().display()
        );
    }
    // `smollm2` names `smollm2:135m` when the store holds no other tag of it (as
    // `onebit run smollm2` finds it).
    let tags_of = |model: &str| models.iter().filter(|(n, _, _)| n.model == model).count();
    models
        .iter()
        .map(|(name, dir, _)| {
            Ok(ServedModel {
                engine: engine_config(args, dir, ctx_len)?,
                aliases: if tags_of(&name.model) == 1 {
                    vec![name.model.clone()]
                } else {
                    Vec::new()
                },
                name: name.to_string(),
            })
        })
        .collect()
}
