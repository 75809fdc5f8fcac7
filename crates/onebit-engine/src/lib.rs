//! # onebit-engine
//!
//! The generation layer between the model crates and the front ends (`onebit run`,
//! `onebit bench`, `onebit serve`). It owns what a front end must not re-implement:
//!
//! - [`Engine::load`]: the target package (checked once), its backend, the tokenizer
//!   (a corrupt `tokenizer.json` is an error, never "no tokenizer"), the chat template,
//!   the drafter (a DFlash draft package checked against the target, or prompt lookup)
//!   and the adaptive draft length's pass costs, timed once at load.
//! - [`Engine::session`]: per-sequence state — the target's KV cache, the tap sink a
//!   DFlash draft reads, and the token history. A [`Session`] is `'static + Send`, so a
//!   server moves it into a blocking thread.
//! - [`Session::generate`]: one request ([`Request`]: a prompt, chat messages or token
//!   ids; max tokens; sampling; stop strings; drafting on or off) streamed to a [`Sink`]
//!   that can stop it, checked for cancellation ([`CancelFlag`]) between prefill chunks
//!   and between tokens, detokenized incrementally (bounded work per token, UTF-8
//!   sequences split across tokens held back), with stop strings held back until they
//!   cannot match. It returns a [`Completion`]: tokens, text, [`StopReason`], timings and
//!   the speculative statistics. A failing drafter is an error, not plain decoding.
//!
//! **Prefix reuse**: a session keeps its KV cache and the tokens it holds; a request
//! whose prompt starts with them (the next turn of a chat) runs only the new tokens
//! ([`Completion::cached_tokens`]); otherwise the cache is cut back to the common prefix.
//! The KV cache, the tap sink and the history always describe the same positions; a
//! failed generation resets the session rather than leave them out of step.
//!
//! ```no_run
//! use onebit_engine::{CancelFlag, Engine, EngineConfig, Event, Prompt, Request};
//! use std::ops::ControlFlow;
//!
//! let engine = Engine::load(&EngineConfig::new("target/models/smollm2"))?;
//! let mut session = engine.session()?;
//! let request = Request::new(Prompt::chat_user("Write a haiku."), 64);
//! let mut print = |e: Event<'_>| {
//!     if let Event::Token { text, .. } | Event::Text(text) = e {
//!         print!("{text}");
//!     }
//!     ControlFlow::Continue(())
//! };
//! let done = session.generate(&request, &mut print, &CancelFlag::new())?;
//! println!("\n{:?}, {:.1} tok/s", done.stop, done.decode_tokens_per_second());
//! # Ok::<(), onebit_engine::EngineError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
pub mod context;
mod error;
mod hooks;
mod report;
mod text;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use npu_runtime::kernels::Isa;
pub use npu_runtime::{BatchStats, DEFAULT_LINGER};
use npu_runtime::{
    CpuModel, CpuOptions, Forward, HeadKind, KvType, PassBatcher, Precision, TapRows, TapSink,
    TargetPackage,
};

pub use backend::{Backend, PassProfile, Stage, Target};
pub use context::ContextLen;
pub use error::{EngineError, Result};
pub use hooks::PackageHooks;
pub use report::{stats_json, stats_line};
pub use text::{
    render_chat, ChatTokens, Detokenizer, Message, StopMatcher, StopScan, Text,
    FALLBACK_CHAT_TEMPLATE,
};

/// Prompt positions run per prefill pass; cancellation is checked between them. The
/// one chunk size of every prefill (`mtp::run`, `onebit bench` and the engine).
pub use mtp::PREFILL_CHUNK;

/// Prompt lookup's longest suffix n-gram by default ([`DrafterConfig::Lookup`]).
pub use mtp::DEFAULT_MAX_NGRAM;

/// Sampling parameters and their refusals, and log-probabilities (the engine's
/// vocabulary for front ends, which need not name `mtp`).
pub use mtp::{SamplingConfig, SamplingError, TokenLogprob, MAX_TOP_LOGPROBS};

/// A run's speculative statistics, and one drafter's share of them.
pub use mtp::{DrafterStats, Stats};

/// Which drafts an [`Oracle`] gets right.
pub use mtp::OracleRule;

/// An oracle drafter for [`Session::generate_oracle`]: it knows the continuation (plain
/// decoding's tokens after the prompt) and proposes it always right, every third wrong
/// or never right ([`OracleRule`]) — the engine's round cost without a trained draft. A
/// measuring device (`onebit run --oracle`, `onebit bench --oracle`), not a drafter a
/// request can ask for.
#[derive(Clone, Debug)]
pub struct Oracle {
    /// Which drafts are right.
    pub rule: OracleRule,
    /// The tokens plain decoding emitted after the prompt.
    pub continuation: Vec<u32>,
}

/// A drafter a session method supplies instead of the engine's (the oracle), with its
/// draft-length policy.
struct Custom {
    oracle: Oracle,
    adaptive: Option<mtp::AdaptiveConfig>,
}

/// Prompt positions whose full logits one prompt-logprobs pass computes at most (rows ×
/// vocabulary floats: 64 rows of a 152k vocabulary are 39 MB).
const PROMPT_LOGPROBS_CHUNK: usize = 64;

/// Which drafter speculative decoding uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DrafterConfig {
    /// None: plain decoding.
    #[default]
    None,
    /// Prompt lookup (no model) with suffix n-grams up to `ngram`.
    Lookup {
        /// The longest suffix n-gram matched.
        ngram: usize,
    },
    /// A DFlash draft package (checked against the target at load).
    DFlash {
        /// The draft package directory.
        dir: PathBuf,
    },
    /// Prompt lookup chained with a DFlash draft ([`mtp::ChainedHead`]): each round
    /// takes the proposal of the drafter that has been accepting more.
    Chained {
        /// The draft package directory.
        dir: PathBuf,
        /// Lookup's longest suffix n-gram.
        ngram: usize,
    },
}

impl DrafterConfig {
    /// The drafter the command-line flags ask for (`--draft DIR`, `--lookup`, both to
    /// chain them), the one rule `run`, `bench` and `serve` share.
    pub fn from_flags(draft: Option<&Path>, lookup: bool, ngram: usize) -> DrafterConfig {
        match (draft, lookup) {
            (Some(dir), true) => DrafterConfig::Chained {
                dir: dir.to_path_buf(),
                ngram,
            },
            (Some(dir), false) => DrafterConfig::DFlash {
                dir: dir.to_path_buf(),
            },
            (None, true) => DrafterConfig::Lookup { ngram },
            (None, false) => DrafterConfig::None,
        }
    }

    /// A short name for reports (`none`, `lookup`, `dflash DIR`, `lookup+dflash DIR`).
    pub fn describe(&self) -> String {
        match self {
            DrafterConfig::None => "none".into(),
            DrafterConfig::Lookup { .. } => "lookup".into(),
            DrafterConfig::DFlash { dir } => format!("dflash {}", dir.display()),
            DrafterConfig::Chained { dir, .. } => format!("lookup+dflash {}", dir.display()),
        }
    }

    /// The DFlash draft package, when the drafter has one.
    fn draft_dir(&self) -> Option<&Path> {
        match self {
            DrafterConfig::DFlash { dir } | DrafterConfig::Chained { dir, .. } => Some(dir),
            _ => None,
        }
    }
}

/// How to load an [`Engine`].
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The target package directory (config.json, model.q4nx, tokenizer.json).
    pub model: PathBuf,
    /// Where the target runs.
    pub backend: Backend,
    /// The CPU kernel variant (`None`: the fastest this CPU has).
    pub kernel: Option<Isa>,
    /// The projections' precision (the CPU backend's default is [`Precision::auto`]).
    pub precision: Precision,
    /// Worker threads (`None`: all cores).
    pub threads: Option<usize>,
    /// The head (`None`: the package's default at this precision).
    pub head: Option<HeadKind>,
    /// The KV cache's storage (the CPU backend's default at the integer precisions is
    /// bf16; the NPU backends keep f32).
    pub kv_type: KvType,
    /// The drafter.
    pub drafter: DrafterConfig,
    /// Drafts per round at most (k).
    pub draft_max: usize,
    /// Draft `draft_max` every round instead of choosing k from the timed costs.
    pub fixed_k: bool,
    /// The context a request must fit (prompt + max tokens): given, a launcher's
    /// number capped at the model's limit, the model's limit capped by available memory,
    /// or no check ([`ContextLen`], resolved at load).
    pub ctx_len: ContextLen,
    /// Sessions that generate at the same time share passes (continuous batching on the
    /// CPU backend, [`npu_runtime::PassBatcher`]): each pass runs every generating
    /// session's next rows at once. Answers are bit for bit those of sessions alone;
    /// the other backends ignore it.
    pub share_passes: bool,
    /// How long a shared pass waits at most for a member busy elsewhere
    /// ([`PassBatcher::linger`]).
    pub pass_linger: std::time::Duration,
    /// A Jinja chat template file that replaces the package's (`--chat-template FILE`,
    /// as llama.cpp's `--chat-template-file`): read and checked at load.
    pub chat_template: Option<PathBuf>,
}

impl EngineConfig {
    /// The CPU options these settings mean (the kernel already resolved).
    pub fn cpu_options(&self, kernel: Isa) -> CpuOptions {
        CpuOptions {
            kernel,
            threads: self.threads,
            precision: self.precision,
            head: self.head,
            kv_type: self.kv_type,
        }
    }

    /// Defaults for `model`: CPU, all cores, the default precision and head, no drafter.
    pub fn new(model: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            model: model.into(),
            backend: Backend::Cpu,
            kernel: None,
            precision: Precision::auto(),
            threads: None,
            head: None,
            kv_type: KvType::Bf16,
            drafter: DrafterConfig::None,
            draft_max: 7,
            fixed_k: false,
            ctx_len: ContextLen::Unchecked,
            share_passes: false,
            pass_linger: DEFAULT_LINGER,
            chat_template: None,
        }
    }
}

/// The loaded draft package. Its weights borrow the mapped package, and every session's
/// drafter borrows the weights, so it stays mapped for the rest of the process (an
/// engine is loaded once per process by every front end).
struct LoadedDraft {
    model: &'static dflash_draft::DraftModel,
    weights: &'static dflash_draft::DraftWeights<'static>,
}

/// What runs the target, for reports.
#[derive(Clone, Debug)]
pub struct TargetInfo {
    /// The backend (`cpu`, `sim: ...`, `npu: ...`).
    pub backend: String,
    /// The CPU kernel variant.
    pub kernel: String,
    /// The projections' precision.
    pub precision: Precision,
    /// The head in use.
    pub head: HeadKind,
    /// The KV cache's storage.
    pub kv_type: KvType,
    /// Worker threads.
    pub threads: usize,
    /// Weight bytes one pass reads.
    pub weight_bytes_per_pass: usize,
}

/// What a model is, for front ends that describe it (Ollama's `/api/show` and
/// `/api/tags`) without reading the package's config themselves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFacts {
    /// The architecture family in lower case (`llama`, `qwen3`, `gemma3`).
    pub family: String,
    /// Parameters, counted from the config's sizes (embedding, layers, head unless tied).
    pub parameters: u64,
    /// The model's own context limit (`max_position_embeddings`).
    pub max_positions: usize,
    /// The hidden size.
    pub hidden_size: usize,
    /// Transformer layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
}

impl ModelFacts {
    /// The facts of the package in `dir` from its `config.json` alone (the weights are
    /// not opened): what a server lists for a model before it loads.
    pub fn read(dir: &Path) -> Result<ModelFacts> {
        Ok(ModelFacts::of(&npu_runtime::TargetConfig::read(dir)?))
    }

    fn of(c: &npu_runtime::TargetConfig) -> ModelFacts {
        let (h, i, v) = (
            c.hidden_size as u64,
            c.intermediate_size as u64,
            c.vocab_size as u64,
        );
        let per_layer = h * c.q_dim() as u64 * 2 + h * c.kv_dim() as u64 * 2 + 3 * h * i + 2 * h;
        let head = if c.tie_word_embeddings { 0 } else { v * h };
        ModelFacts {
            family: format!("{:?}", c.family).to_lowercase(),
            parameters: v * h + head + c.num_layers as u64 * per_layer + h,
            max_positions: c.max_positions,
            hidden_size: c.hidden_size,
            layers: c.num_layers,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            vocab_size: c.vocab_size,
        }
    }

    /// Parameters for people (`135M`, `1.2B`), as Ollama's `parameter_size`.
    pub fn parameter_size(&self) -> String {
        let n = self.parameters as f64;
        if n >= 1e9 {
            format!("{:.1}B", n / 1e9)
        } else {
            format!("{:.0}M", n / 1e6)
        }
    }
}

/// What sessions share.
enum Shared {
    /// The CPU backend: one model (weights, repacked forms, head, thread team).
    Cpu(Arc<CpuModel>),
    /// The NPU backends' targets borrow the package, which therefore stays mapped for
    /// the rest of the process.
    Borrowed(&'static Arc<TargetPackage>),
}

/// Tokens to generate when a request does not say (less when the context ends sooner:
/// [`Engine::max_tokens`]).
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// A loaded model, shared by its sessions.
pub struct Engine {
    config: EngineConfig,
    package: Arc<TargetPackage>,
    shared: Shared,
    text: Option<Text>,
    chat_tokens: ChatTokens,
    /// The template of [`EngineConfig::chat_template`], when one was given.
    chat_template: Option<String>,
    draft: Option<LoadedDraft>,
    adaptive: Option<mtp::AdaptiveConfig>,
    calibration_seconds: f64,
    ctx_len: Option<usize>,
    /// Why the default context is below the model's limit, when memory capped it.
    context_note: Option<String>,
    kernel: Isa,
    info: TargetInfo,
    /// The target opened at load (calibrated there), handed to the first session.
    spare: Mutex<Option<Target<'static>>>,
    /// The CPU sessions' shared passes, when [`EngineConfig::share_passes`] is set.
    batcher: Option<Arc<PassBatcher>>,
    load_seconds: f64,
}

/// Reads a chat template file and checks that it renders a one-turn chat: a missing or
/// non-UTF-8 file, or a template that does not parse, is refused with its path. (A
/// template's own `raise_exception` is left to the chats that trigger it.)
fn read_chat_template(path: &std::path::Path, tokens: &ChatTokens) -> Result<String> {
    let template = std::fs::read_to_string(path).map_err(|e| {
        EngineError::Invalid(format!(
            "engine: --chat-template {}: cannot read it: {e}",
            path.display()
        ))
    })?;
    let probe = [Message {
        role: "user".into(),
        content: "hello".into(),
    }];
    match render_chat(&template, &probe, tokens, true) {
        Ok(_) | Err(EngineError::TemplateException { .. }) => Ok(template),
        Err(e) => Err(EngineError::Invalid(format!(
            "engine: --chat-template {}: {e}",
            path.display()
        ))),
    }
}

/// Keeps `value` for the rest of the process (what borrowing targets and drafters need).
fn keep<T>(value: T) -> &'static T {
    Box::leak(Box::new(value))
}

impl Engine {
    /// Opens and checks the target package, its tokenizer and chat template, the
    /// drafter, and a first target (timing the pass costs for the adaptive draft length).
    pub fn load(config: &EngineConfig) -> Result<Arc<Engine>> {
        let start = Instant::now();
        if config.threads == Some(0) {
            return Err(EngineError::Invalid("--threads must be at least 1".into()));
        }
        let package = Arc::new(TargetPackage::open(&config.model)?);
        context::check(config.ctx_len, &package.config)?;
        let text = Text::open(&config.model)?;
        let chat_tokens = ChatTokens::resolve(
            &config.model,
            text.as_ref(),
            package.config.bos_token_id,
            &package.config.eos_token_ids,
        )?;
        let chat_template = match &config.chat_template {
            Some(path) => Some(read_chat_template(path, &chat_tokens)?),
            None => None,
        };
        let draft = match config.drafter.draft_dir() {
            Some(dir) => {
                let model = dflash_draft::load_draft(dir)?;
                model.check_target(&dflash_draft::TargetShape {
                    name: config.model.display().to_string(),
                    num_layers: package.config.num_layers,
                    hidden_size: package.config.hidden_size,
                    vocab_size: package.config.vocab_size,
                })?;
                let model = keep(model);
                Some(LoadedDraft {
                    weights: keep(model.weights()?),
                    model,
                })
            }
            _ => None,
        };
        let kernel = match config.kernel {
            Some(k) => k,
            None => Isa::detect(),
        };
        let (shared, mut target) = match config.backend {
            Backend::Cpu => {
                let model = CpuModel::load(package.clone(), config.cpu_options(kernel))?;
                let target = Target::Cpu(model.session());
                (Shared::Cpu(model), target)
            }
            _ => {
                let package = keep(package.clone());
                let target = Target::open(package, &config.backend, config.cpu_options(kernel))?;
                (Shared::Borrowed(package), target)
            }
        };
        // Calibrated before any layer taps are set (the passes would write tap rows).
        let drafting = config.drafter != DrafterConfig::None;
        let (adaptive, calibration_seconds) = if drafting && !config.fixed_k && config.draft_max > 0
        {
            let t = Instant::now();
            let costs = mtp::calibrate(&mut target, config.draft_max + 1, mtp::CALIBRATION_ROUNDS)?;
            (
                Some(mtp::AdaptiveConfig {
                    calibration: Some(costs),
                    ..mtp::AdaptiveConfig::default()
                }),
                t.elapsed().as_secs_f64(),
            )
        } else {
            (None, 0.0)
        };
        let info = TargetInfo {
            backend: target.backend(),
            kernel: target.kernel().name(),
            precision: target.precision(),
            head: target.head(),
            kv_type: target.kv_type(),
            threads: target.threads(),
            weight_bytes_per_pass: target.weight_bytes_per_pass(),
        };
        let (ctx_len, context_note) =
            context::resolve(config.ctx_len, &package.config, info.kv_type)?;
        let batcher = match (&shared, config.share_passes) {
            (Shared::Cpu(model), true) => Some(PassBatcher::new(model.clone(), config.pass_linger)),
            _ => None,
        };
        Ok(Arc::new(Engine {
            config: config.clone(),
            package,
            shared,
            text,
            chat_tokens,
            chat_template,
            draft,
            adaptive,
            calibration_seconds,
            ctx_len,
            context_note,
            kernel,
            info,
            spare: Mutex::new(Some(target)),
            batcher,
            load_seconds: start.elapsed().as_secs_f64(),
        }))
    }

    /// A new session (its own KV cache) over this model.
    pub fn session(self: &Arc<Engine>) -> Result<Session> {
        let spare = self.spare.lock().expect("engine lock poisoned").take();
        let mut target = match (spare, &self.shared) {
            (Some(t), _) => t,
            (None, Shared::Cpu(model)) => Target::Cpu(model.session()),
            (None, Shared::Borrowed(package)) => Target::open(
                package,
                &self.config.backend,
                self.config.cpu_options(self.kernel),
            )?,
        };
        if let (Some(batcher), Target::Cpu(t)) = (&self.batcher, &mut target) {
            t.join(batcher.clone())?;
        }
        let sink: TapSink = Arc::new(Mutex::new(TapRows::new(0)));
        if let Some(d) = &self.draft {
            target.set_layer_taps(&d.model.config.target_layer_ids, sink.clone())?;
        }
        Ok(Session {
            engine: self.clone(),
            target,
            taps: sink,
            history: Vec::new(),
        })
    }

    /// The loading options.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The target package (config and mapped weights).
    pub fn package(&self) -> &Arc<TargetPackage> {
        &self.package
    }

    /// The tokenizer, when the package has one.
    pub fn text(&self) -> Option<&Text> {
        self.text.as_ref()
    }

    /// The chat template: the one given by [`EngineConfig::chat_template`], else the
    /// package's, if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template
            .as_deref()
            .or(self.package.config.chat_template.as_deref())
    }

    /// The BOS/EOS strings the chat template sees (the package's own).
    pub fn chat_tokens(&self) -> &ChatTokens {
        &self.chat_tokens
    }

    /// `messages` as the text the model is prompted with: the package's chat template
    /// (the ChatML fallback when it has none) with its BOS/EOS strings, the
    /// assistant's turn opened.
    pub fn render_chat(&self, messages: &[Message]) -> Result<String> {
        let template = self.chat_template().unwrap_or(FALLBACK_CHAT_TEMPLATE);
        render_chat(template, messages, &self.chat_tokens, true)
    }

    /// What the model is, from its config (for front ends that describe it).
    pub fn facts(&self) -> ModelFacts {
        ModelFacts::of(&self.package.config)
    }

    /// What runs the target.
    pub fn info(&self) -> &TargetInfo {
        &self.info
    }

    /// The shared passes' counters, when sessions share passes.
    pub fn batch_stats(&self) -> Option<BatchStats> {
        self.batcher.as_ref().map(|b| b.stats())
    }

    /// Sessions generating in shared passes right now (0 when passes are not shared).
    pub fn batch_members(&self) -> usize {
        self.batcher.as_ref().map_or(0, |b| b.members())
    }

    /// Prompt positions per prefill pass: [`PREFILL_CHUNK`] alone; a quarter of it when
    /// sessions share passes, so a long prompt joining delays the others' next tokens
    /// by a short pass at a time.
    fn prefill_chunk(&self) -> usize {
        match self.batcher {
            Some(_) => PREFILL_CHUNK / 4,
            None => PREFILL_CHUNK,
        }
    }

    /// The context size requests must fit, if one was set.
    pub fn ctx_len(&self) -> Option<usize> {
        self.ctx_len
    }

    /// Why the context is below the model's `max_position_embeddings`, when available
    /// memory capped the default (a front end prints it: it decides which requests are
    /// refused).
    pub fn context_note(&self) -> Option<&str> {
        self.context_note.as_deref()
    }

    /// Tokens to generate after a prompt of `prompt` tokens: `requested` when given
    /// (refused when the two do not fit the context), else [`DEFAULT_MAX_TOKENS`] or what
    /// the context leaves after the prompt if that is less (refused when it leaves
    /// nothing). Without a context, `requested` or the default.
    pub fn max_tokens(&self, requested: Option<usize>, prompt: usize) -> Result<usize> {
        let Some(ctx) = self.ctx_len else {
            return Ok(requested.unwrap_or(DEFAULT_MAX_TOKENS));
        };
        match requested {
            Some(m) => {
                self.check_fits(prompt, m)?;
                Ok(m)
            }
            None if prompt >= ctx => Err(EngineError::NoRoom { prompt, ctx }),
            None => Ok(DEFAULT_MAX_TOKENS.min(ctx - prompt)),
        }
    }

    /// The DFlash draft's configuration, when that is the drafter.
    pub fn draft_config(&self) -> Option<&dflash_draft::DraftConfig> {
        self.draft.as_ref().map(|d| &d.model.config)
    }

    /// Whether a drafter is configured.
    pub fn drafting(&self) -> bool {
        self.config.drafter != DrafterConfig::None
    }

    /// Whether the draft length adapts (a drafter with calibrated pass costs).
    pub fn adaptive(&self) -> bool {
        self.adaptive.is_some()
    }

    /// Seconds the pass-cost calibration took at load (0 without adaptive k).
    pub fn calibration_seconds(&self) -> f64 {
        self.calibration_seconds
    }

    /// Seconds [`Engine::load`] took.
    pub fn load_seconds(&self) -> f64 {
        self.load_seconds
    }

    /// The prompt as token ids (chat messages through the package's template, or the
    /// ChatML fallback when it has none).
    pub fn tokenize(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let ids = match prompt {
            Prompt::Tokens(ids) => ids.clone(),
            Prompt::Text(s) => self
                .text
                .as_ref()
                .ok_or(EngineError::NoTokenizer)?
                .encode(s, true)?,
            Prompt::Chat(messages) => {
                let text = self.text.as_ref().ok_or(EngineError::NoTokenizer)?;
                text.encode_chat(&self.render_chat(messages)?)?
            }
        };
        if ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_ids(&ids)?;
        Ok(ids)
    }

    /// The bytes token `id` stands for ([`Text::token_bytes`]; empty without a tokenizer).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.text
            .as_ref()
            .map(|t| t.token_bytes(id))
            .unwrap_or_default()
    }

    /// Token ids of `text`; `special` adds the tokenizer's own BOS/EOS template.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        self.text
            .as_ref()
            .ok_or(EngineError::NoTokenizer)?
            .encode(text, special)
    }

    /// The text of `ids` with special tokens written out (the inverse of [`Engine::encode`]),
    /// refusing an id outside the vocabulary.
    pub fn detokenize(&self, ids: &[u32]) -> Result<String> {
        self.check_ids(ids)?;
        self.text
            .as_ref()
            .ok_or(EngineError::NoTokenizer)?
            .decode_with_special(ids)
    }

    /// The target's own refusal of an id outside the vocabulary, before anything runs.
    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab = self.package.config.vocab_size;
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { token: bad, vocab });
        }
        Ok(())
    }

    /// Refuses a prompt of `prompt` tokens plus `max_tokens` that does not fit the
    /// context (when one is set). Saturating: a `max_tokens` near `usize::MAX` is
    /// refused, never wrapped around to a small sum.
    pub fn check_fits(&self, prompt: usize, max_tokens: usize) -> Result<()> {
        match self.ctx_len {
            Some(ctx) if prompt.saturating_add(max_tokens) > ctx => {
                Err(EngineError::ContextOverflow {
                    prompt,
                    max_tokens,
                    ctx,
                })
            }
            _ => Ok(()),
        }
    }

    /// The text of `ids` (empty without a tokenizer).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.text {
            Some(t) => t.decode(ids),
            None => Ok(String::new()),
        }
    }
}

/// What to generate from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Text, tokenized with the tokenizer's special tokens (BOS).
    Text(String),
    /// Chat messages, rendered by the chat template with the assistant turn opened.
    Chat(Vec<Message>),
    /// Token ids as they are.
    Tokens(Vec<u32>),
}

impl Prompt {
    /// One user turn.
    pub fn chat_user(text: impl Into<String>) -> Prompt {
        Prompt::Chat(vec![Message::new("user", text)])
    }
}

/// Whether a request drafts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftMode {
    /// The engine's drafter, if it has one.
    #[default]
    Auto,
    /// Plain decoding.
    Off,
    /// The engine's drafter, drafting exactly k tokens every round (no adaptive k).
    Fixed(usize),
    /// Only prompt lookup (the engine's `Lookup`, or the lookup half of `Chained`);
    /// refused when the engine has no lookup drafter.
    LookupOnly,
    /// Only the DFlash draft (the engine's `DFlash`, or the draft half of `Chained`);
    /// refused when the engine has no draft.
    DraftOnly,
}

impl DraftMode {
    /// Whether the engine's drafter (`drafter`) can draft this way.
    pub fn available(self, drafter: &DrafterConfig) -> bool {
        match self {
            DraftMode::Auto | DraftMode::Off => true,
            DraftMode::Fixed(_) => *drafter != DrafterConfig::None,
            DraftMode::LookupOnly => matches!(
                drafter,
                DrafterConfig::Lookup { .. } | DrafterConfig::Chained { .. }
            ),
            DraftMode::DraftOnly => matches!(
                drafter,
                DrafterConfig::DFlash { .. } | DrafterConfig::Chained { .. }
            ),
        }
    }
}

/// One generation.
#[derive(Clone, Debug)]
pub struct Request {
    /// The prompt.
    pub prompt: Prompt,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Greedy or sampled (checked by [`mtp::SamplingConfig::check`]).
    pub sampling: mtp::SamplingConfig,
    /// Text that ends the output (not included in it).
    pub stop: Vec<String>,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Drafting on or off.
    pub draft: DraftMode,
    /// `Some(n)`: report each generated token's log-probability with the `n` most
    /// likely alternatives (0..=[`MAX_TOP_LOGPROBS`]) in [`Completion::logprobs`] and
    /// [`Event::Token`].
    pub logprobs: Option<usize>,
    /// Report the prompt's log-probabilities ([`Completion::prompt_logprobs`]; with
    /// `logprobs`' count of alternatives). The whole prompt is then run again (the KV
    /// cache of an earlier request holds no logits), so nothing is reused.
    pub prompt_logprobs: bool,
}

impl Request {
    /// Greedy, no stop strings, the engine's drafter.
    pub fn new(prompt: Prompt, max_tokens: usize) -> Request {
        Request {
            prompt,
            max_tokens,
            sampling: mtp::SamplingConfig {
                temperature: 0.0,
                top_p: 1.0,
                seed: 0,
                ..mtp::SamplingConfig::default()
            },
            stop: Vec::new(),
            ignore_eos: false,
            draft: DraftMode::Auto,
            logprobs: None,
            prompt_logprobs: false,
        }
    }
}

/// What a generation streams.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event<'a> {
    /// A token was emitted; `text` is the output text it completes (possibly empty:
    /// part of a UTF-8 sequence, or text held back while it may start a stop string).
    Token {
        /// The token id.
        id: u32,
        /// Text released with it.
        text: &'a str,
        /// Its log-probability, when the request asked for them ([`Request::logprobs`]).
        logprob: Option<&'a TokenLogprob>,
    },
    /// Text released at the end of the output (held back until then).
    Text(&'a str),
}

/// Receives a generation's events; `Break` stops the generation (ripgrep's `Sink`).
pub trait Sink {
    /// One event.
    fn event(&mut self, event: Event<'_>) -> ControlFlow<()>;
}

impl<F: FnMut(Event<'_>) -> ControlFlow<()>> Sink for F {
    fn event(&mut self, event: Event<'_>) -> ControlFlow<()> {
        self(event)
    }
}

/// A sink that ignores every event.
pub struct NullSink;

impl Sink for NullSink {
    fn event(&mut self, _: Event<'_>) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
}

/// Shared cancellation: set from any thread, checked by the generation between prefill
/// chunks and between tokens.
#[derive(Clone, Debug, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    /// A flag not set.
    pub fn new() -> CancelFlag {
        CancelFlag::default()
    }
    /// Asks the generation to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }
    /// Whether it was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Why a generation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `max_tokens` tokens were generated.
    Length,
    /// A stop string completed (it is not part of the text).
    StopString(String),
    /// An end-of-sequence token came (not emitted).
    Eos,
    /// The cancel flag was set, or the sink asked to stop.
    Cancelled,
}

impl StopReason {
    /// A short name (`length`, `stop`, `eos`, `cancelled`).
    pub fn name(&self) -> &'static str {
        match self {
            StopReason::Length => "length",
            StopReason::StopString(_) => "stop",
            StopReason::Eos => "eos",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// Where a generation's time went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// From the start of `generate` to the first token (the prefill of the new prompt
    /// tokens and the first pick), milliseconds.
    pub prompt_ms: f64,
    /// From the first token to the last, milliseconds.
    pub predicted_ms: f64,
}

/// What a generation produced.
#[derive(Clone, Debug)]
pub struct Completion {
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens the session already held (not run again).
    pub cached_tokens: usize,
    /// The emitted tokens (stop tokens excluded).
    pub tokens: Vec<u32>,
    /// Their text, cut before a stop string.
    pub text: String,
    /// Why it ended.
    pub stop: StopReason,
    /// Prefill and decode time.
    pub timings: Timings,
    /// Rounds, drafts and acceptance (all zero for plain decoding); by drafter in
    /// `stats.by_drafter` (lookup and the DFlash draft when chained).
    pub stats: mtp::Stats,
    /// Whether a drafter ran.
    pub drafted: bool,
    /// With [`Request::logprobs`]: one per token of `tokens`, in order.
    pub logprobs: Vec<TokenLogprob>,
    /// With [`Request::prompt_logprobs`]: one per prompt token, in order; the first is
    /// `None` (nothing precedes it).
    pub prompt_logprobs: Vec<Option<TokenLogprob>>,
}

impl Completion {
    /// Prompt tokens run (not cached) per second of prefill.
    pub fn prompt_tokens_per_second(&self) -> f64 {
        (self.prompt_tokens - self.cached_tokens) as f64 / (self.timings.prompt_ms / 1e3).max(1e-9)
    }

    /// Decode rate: the tokens after the first (which the prefill pass gives) per
    /// second after the first token (`onebit run`'s and the server's figure).
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / (self.timings.predicted_ms / 1e3).max(1e-9)
    }
}

/// Per-sequence state over a shared [`Engine`]: the target's KV cache, the tap sink, and
/// the tokens they hold.
pub struct Session {
    engine: Arc<Engine>,
    target: Target<'static>,
    taps: TapSink,
    /// The tokens at the positions the KV cache holds.
    history: Vec<u32>,
}

/// Length of the common prefix.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Session {
    /// The engine this session runs on.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The tokens the KV cache holds.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// How many leading tokens of `ids` this session could reuse.
    pub fn reusable(&self, ids: &[u32]) -> usize {
        common_prefix(&self.history, ids).min(ids.len().saturating_sub(1))
    }

    /// The target (for measurements that drive it directly).
    pub fn target(&mut self) -> &mut Target<'static> {
        &mut self.target
    }

    /// Forgets everything: an empty KV cache, tap sink and history.
    pub fn reset(&mut self) {
        self.history.clear();
        self.taps
            .lock()
            .expect("tap sink lock poisoned")
            .truncate(0);
        // Truncating to 0 cannot fail on any backend; the history is empty either way.
        let _ = self.target.truncate(0);
    }

    /// [`Session::reset`], and the KV cache's memory given back (on the CPU backend; an
    /// NPU plan's buffers are fixed): what an idle server frees while the weights stay.
    pub fn release(&mut self) {
        self.reset();
        self.target.release_kv();
    }

    /// Bytes the KV cache has allocated (`None` on backends with fixed buffers).
    pub fn kv_capacity_bytes(&self) -> Option<usize> {
        self.target.kv_capacity_bytes()
    }

    /// Cuts the KV cache, tap sink and history back to `len` positions.
    fn rewind(&mut self, len: usize) -> Result<()> {
        if self.target.position() > len {
            self.target.truncate(len)?;
        }
        self.taps
            .lock()
            .expect("tap sink lock poisoned")
            .truncate(len);
        self.history.truncate(len);
        Ok(())
    }

    /// Runs `ids[..len - 1]` (the last token is left to the generation's own pass) with
    /// full logits, in chunks, and scores each prompt token under the row before it.
    /// The positions stay in the KV cache (and the history) as a prefill's would.
    fn prompt_logprobs(
        &mut self,
        ids: &[u32],
        request: &Request,
        cancel: &CancelFlag,
    ) -> Result<Vec<Option<TokenLogprob>>> {
        let vocab = self.engine.package.config.vocab_size;
        let top = request.logprobs.unwrap_or(0);
        let mut out = Vec::with_capacity(ids.len());
        out.push(None);
        let start = self.target.position();
        let body = &ids[..ids.len() - 1];
        for (c, chunk) in body[start..].chunks(PROMPT_LOGPROBS_CHUNK).enumerate() {
            if cancel.is_cancelled() {
                break;
            }
            let logits = self.target.forward(chunk)?;
            let first = start + c * PROMPT_LOGPROBS_CHUNK;
            self.history.extend_from_slice(chunk);
            for (r, row) in logits.chunks_exact(vocab).enumerate() {
                // Row of position p predicts the token at p + 1.
                out.push(Some(mtp::token_logprob(row, ids[first + r + 1], top)));
            }
        }
        Ok(out)
    }

    /// Generates for `request`, streaming to `sink`; see the crate docs. On an error the
    /// session is reset (its state is never left out of step).
    pub fn generate(
        &mut self,
        request: &Request,
        sink: &mut dyn Sink,
        cancel: &CancelFlag,
    ) -> Result<Completion> {
        self.generate_with(request, sink, cancel, None)
    }

    /// [`Session::generate`] with an [`Oracle`] as the drafter instead of the engine's
    /// (the engine may have none). `request.draft` says how: [`DraftMode::Fixed`]`(k)`
    /// drafts k tokens a round; [`DraftMode::Auto`] drafts up to the engine's
    /// `draft_max` with adaptive k (the pass costs timed at load, or now when the engine
    /// has none; fixed k when the engine was loaded with `fixed_k` or `draft_max` 0);
    /// [`DraftMode::Off`] decodes plainly. The text is plain decoding's whatever the
    /// rule: every proposal is verified.
    pub fn generate_oracle(
        &mut self,
        request: &Request,
        oracle: &Oracle,
        sink: &mut dyn Sink,
        cancel: &CancelFlag,
    ) -> Result<Completion> {
        let engine = self.engine.clone();
        let draft_max = engine.config.draft_max;
        let adaptive = match request.draft {
            DraftMode::Auto if !engine.config.fixed_k && draft_max > 0 => match &engine.adaptive {
                Some(a) => Some(a.clone()),
                None => Some(mtp::AdaptiveConfig {
                    calibration: Some(mtp::calibrate(
                        &mut self.target,
                        draft_max + 1,
                        mtp::CALIBRATION_ROUNDS,
                    )?),
                    ..mtp::AdaptiveConfig::default()
                }),
            },
            DraftMode::Auto | DraftMode::Off | DraftMode::Fixed(_) => None,
            DraftMode::LookupOnly | DraftMode::DraftOnly => {
                return Err(EngineError::Invalid(format!(
                    "an oracle run drafts with the oracle: drafting mode {:?} does not apply",
                    request.draft
                )))
            }
        };
        let custom = Custom {
            oracle: oracle.clone(),
            adaptive,
        };
        self.generate_with(request, sink, cancel, Some(custom))
    }

    fn generate_with(
        &mut self,
        request: &Request,
        sink: &mut dyn Sink,
        cancel: &CancelFlag,
        custom: Option<Custom>,
    ) -> Result<Completion> {
        request.sampling.check()?;
        if let Some(n) = request.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return Err(EngineError::Invalid(format!(
                "logprobs: at most {MAX_TOP_LOGPROBS} alternatives a token, got {n}"
            )));
        }
        if custom.is_none() && !request.draft.available(&self.engine.config.drafter) {
            return Err(EngineError::Invalid(format!(
                "drafting mode {:?} needs a drafter the engine was not loaded with ({})",
                request.draft,
                self.engine.config.drafter.describe()
            )));
        }
        let ids = self.engine.tokenize(&request.prompt)?;
        self.engine.check_fits(ids.len(), request.max_tokens)?;
        // A member of the shared passes while it generates: finished, failed or
        // cancelled, it leaves when this drops, and the others stop waiting for it.
        let membership = self.engine.batcher.as_ref().map(|b| b.member());
        let result = self.generate_ids(&ids, request, sink, cancel, custom);
        drop(membership);
        if result.is_err() {
            self.reset();
        }
        result
    }

    fn generate_ids(
        &mut self,
        ids: &[u32],
        request: &Request,
        sink: &mut dyn Sink,
        cancel: &CancelFlag,
        custom: Option<Custom>,
    ) -> Result<Completion> {
        let engine = self.engine.clone();
        let start = Instant::now();
        // Prompt log-probabilities need the logits of every prompt position: none reused.
        let cached = if request.prompt_logprobs {
            0
        } else {
            self.reusable(ids)
        };
        self.rewind(cached)?;
        let mut completion = Completion {
            prompt_tokens: ids.len(),
            cached_tokens: cached,
            tokens: Vec::new(),
            text: String::new(),
            stop: StopReason::Cancelled,
            timings: Timings::default(),
            stats: mtp::Stats::default(),
            drafted: false,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
        };
        if request.prompt_logprobs {
            completion.prompt_logprobs = self.prompt_logprobs(ids, request, cancel)?;
        }
        // Chunked prefill (`Forward::prefill_with`, the flag asked before each chunk): the
        // whole chunks here, the last (partial) chunk, which holds the last prompt token,
        // in the loop's own prefill pass — one pass for a short prompt.
        let cached = self.target.position();
        let chunk = engine.prefill_chunk();
        let whole = (ids.len() - cached).saturating_sub(1) / chunk * chunk;
        let prefilled = self
            .target
            .prefill_with(&ids[cached..cached + whole], chunk, &mut |_| {
                !cancel.is_cancelled()
            });
        match prefilled {
            Ok(_) | Err(npu_runtime::TargetError::Cancelled { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let position = self.target.position();
        self.history.extend_from_slice(&ids[cached..position]);
        if cancel.is_cancelled() {
            completion.timings.prompt_ms = start.elapsed().as_secs_f64() * 1e3;
            return Ok(completion);
        }

        let drafting = request.draft != DraftMode::Off && (custom.is_some() || engine.drafting());
        let options = mtp::RunOptions {
            max_tokens: request.max_tokens,
            draft_max: match request.draft {
                DraftMode::Fixed(k) => k,
                _ => engine.config.draft_max,
            },
            stop_tokens: if request.ignore_eos {
                Vec::new()
            } else {
                engine.package.config.eos_token_ids.clone()
            },
            sampling: request.sampling,
            adaptive: match &custom {
                Some(c) => c.adaptive.clone(),
                None if drafting && !matches!(request.draft, DraftMode::Fixed(_)) => {
                    engine.adaptive.clone()
                }
                None => None,
            },
        };
        // Which halves of the engine's drafter this request uses.
        let (use_lookup, use_draft) = match request.draft {
            DraftMode::LookupOnly => (true, false),
            DraftMode::DraftOnly => (false, true),
            _ => (true, true),
        };
        let mut head: Option<Box<dyn mtp::DraftHead>> = match (&engine.config.drafter, drafting) {
            (_, true) if custom.is_some() => {
                let oracle = &custom.as_ref().expect("matched Some").oracle;
                let mut stream = ids.to_vec();
                stream.extend_from_slice(&oracle.continuation);
                Some(Box::new(mtp::OracleHead::new(
                    stream,
                    engine.package.config.vocab_size,
                    oracle.rule,
                )))
            }
            (DrafterConfig::Lookup { ngram }, true) => Some(Box::new(mtp::LookupHead::new(*ngram))),
            (DrafterConfig::Chained { ngram, .. }, true) if !use_draft => {
                Some(Box::new(mtp::LookupHead::new(*ngram)))
            }
            (DrafterConfig::DFlash { .. } | DrafterConfig::Chained { .. }, true) => {
                let d = engine
                    .draft
                    .as_ref()
                    .expect("a DFlash engine loads its draft");
                let hooks = self.target.draft_hooks(&engine.package)?;
                let dflash = mtp::DFlashHead::new(d.weights, Box::new(hooks), self.taps.clone());
                match &engine.config.drafter {
                    DrafterConfig::Chained { ngram, .. } if use_lookup => Some(Box::new(
                        mtp::ChainedHead::new(mtp::LookupHead::new(*ngram), dflash),
                    )),
                    _ => Some(Box::new(dflash)),
                }
            }
            _ => None,
        };
        completion.drafted = head.is_some();

        let text = engine.text.as_ref();
        let mut detok = Detokenizer::default();
        let mut stops = StopMatcher::new(&request.stop);
        let mut reason: Option<StopReason> = None;
        let mut failure: Option<EngineError> = None;
        let mut first_token: Option<Instant> = None;
        let mut out_text = String::new();
        let logprobs = &mut completion.logprobs;
        let mut on_token = |t: u32, lp: Option<&TokenLogprob>| -> bool {
            first_token.get_or_insert_with(Instant::now);
            if let Some(lp) = lp {
                logprobs.push(lp.clone());
            }
            if cancel.is_cancelled() {
                reason = Some(StopReason::Cancelled);
                return false;
            }
            let piece = match text {
                Some(tx) => match detok.push(tx, t) {
                    Ok(p) => p,
                    Err(e) => {
                        failure = Some(e);
                        return false;
                    }
                },
                None => String::new(),
            };
            let (release, stop) = match stops.push(&piece) {
                StopScan::Release(r) => (r, None),
                StopScan::Stop(before, s) => (before, Some(s)),
            };
            out_text.push_str(&release);
            let flow = sink.event(Event::Token {
                id: t,
                text: &release,
                logprob: lp,
            });
            if let Some(s) = stop {
                reason = Some(StopReason::StopString(s));
                return false;
            }
            if flow.is_break() {
                reason = Some(StopReason::Cancelled);
                return false;
            }
            true
        };
        let head_ref: Option<&mut dyn mtp::DraftHead> = match head.as_mut() {
            Some(h) => Some(h.as_mut()),
            None => None,
        };
        let run = mtp::run_observed(
            &mut self.target,
            head_ref,
            ids,
            position,
            &options,
            request.logprobs,
            &mut on_token,
        );
        let end = Instant::now();
        let out = run?;
        if let Some(e) = failure {
            return Err(e);
        }
        // The KV cache holds the prompt and the emitted tokens, up to the last one run
        // (the last emitted token, or positions of accepted drafts past a stop): keep
        // exactly the committed positions that are there.
        let mut committed = ids.to_vec();
        committed.extend_from_slice(&out.tokens);
        let held = self.target.position().min(committed.len());
        committed.truncate(held);
        self.history = committed;
        self.rewind(held)?;

        let mut stop = match reason {
            Some(r) => r,
            None => match out.stop {
                mtp::StopReason::MaxTokens => StopReason::Length,
                mtp::StopReason::StopToken => StopReason::Eos,
                mtp::StopReason::Callback => StopReason::Cancelled,
            },
        };
        if !matches!(stop, StopReason::StopString(_)) {
            let mut rest = match text {
                Some(tx) => detok.flush(tx)?,
                None => String::new(),
            };
            rest = match stops.push(&rest) {
                StopScan::Release(r) => r + &stops.flush(),
                StopScan::Stop(before, s) => {
                    stop = StopReason::StopString(s);
                    before
                }
            };
            if !rest.is_empty() {
                out_text.push_str(&rest);
                let _ = sink.event(Event::Text(&rest));
            }
        }
        let first = first_token.unwrap_or(end);
        completion.timings = Timings {
            prompt_ms: (first - start).as_secs_f64() * 1e3,
            predicted_ms: (end - first).as_secs_f64() * 1e3,
        };
        completion.tokens = out.tokens;
        completion.text = out_text;
        completion.stop = stop;
        completion.stats = out.stats;
        Ok(completion)
    }
}

/// The package directory's name (a served model's default name).
pub fn model_name(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .as_deref()
        .unwrap_or(dir)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}
