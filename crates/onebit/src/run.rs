//! `onebit run`: generate text with a target package.

use std::io::{BufRead, IsTerminal, Read, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use npu_runtime::kernels::Isa;
use npu_runtime::{HeadKind, KvType, Precision};
use onebit_engine::{
    stats_json, stats_line, Backend, CancelFlag, Completion, ContextLen, DraftMode, DrafterConfig,
    Engine, EngineConfig, Event, Message, Oracle, OracleRule, Prompt, Request, SamplingConfig,
    Stats, DEFAULT_MAX_NGRAM,
};
use serde_json::json;

use crate::backend::BackendArg;

/// How to open and run a target package; shared by `run` and `bench`.
#[derive(Args, Clone)]
pub struct TargetArgs {
    /// The target package directory (config.json, model.q4nx, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Which weights make the logits: the package's lm_head tiles, the BF16 embedding
    /// (tied models), or auto (the embedding when the tiles were re-quantized from it).
    #[arg(long, value_enum, default_value_t = HeadArg::Auto)]
    pub head: HeadArg,
    /// CPU extensions the kernels may use (auto: all this CPU has).
    #[arg(long, value_enum, default_value_t = KernelArg::Auto)]
    pub kernel: KernelArg,
    /// Activation precision of the projections: q8x2 (two int8 levels per activation,
    /// integer arithmetic: as good as f32 on perplexity), q8 (one int8 level: the
    /// fastest verify passes, measurably less precise), f32 (the exact reference), or
    /// auto (q8x2 on the CPU backend; f32 on sim and npu).
    #[arg(long, value_enum, default_value_t = PrecisionArg::Auto)]
    pub precision: PrecisionArg,
    /// Storage of the KV cache: bf16 (half the memory and traffic of f32; perplexity
    /// within 0.5% of f32, README), q8 (int8 with a scale per position and head), f32
    /// (exact), or auto (bf16 on the CPU backend at the integer precisions; f32 at
    /// --precision f32, the exact reference, and on sim and npu).
    #[arg(long, value_enum, default_value_t = KvTypeArg::Auto)]
    pub kv_type: KvTypeArg,
    /// Where the target runs: cpu, sim (the NPU dispatch plan on a simulated device)
    /// or npu (XRT; needs a build with the `xrt` feature and --kernels).
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
    /// The NPU kernel manifest (JSON; see docs/npu.md), for --backend npu.
    #[arg(long)]
    pub kernels: Option<PathBuf>,
    /// The XRT device index, for --backend npu.
    #[arg(long, default_value_t = 0)]
    pub device: u32,
    /// A Jinja chat template file that replaces the package's (as llama.cpp's
    /// --chat-template-file); refused by name when it cannot be read or parsed.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
}

impl TargetArgs {
    /// The engine options these flags ask for (no drafter; callers add theirs).
    pub fn engine_config(&self) -> Result<EngineConfig> {
        if self.threads == Some(0) {
            bail!("--threads must be at least 1");
        }
        if self.backend != BackendArg::Npu && self.kernels.is_some() {
            bail!("--kernels only applies to --backend npu");
        }
        let mut config = EngineConfig::new(&self.model);
        config.backend = match self.backend {
            BackendArg::Cpu => Backend::Cpu,
            BackendArg::Sim => Backend::Sim,
            BackendArg::Npu => Backend::Npu {
                kernels: self.kernels.clone(),
                device: self.device,
            },
        };
        config.kernel = Some(self.kernel.resolve()?);
        config.precision = self.precision.resolve(self.backend);
        config.threads = self.threads;
        config.head = self.head.kind();
        config.kv_type = self.kv_type.resolve(self.backend, config.precision);
        config.chat_template = self.chat_template.clone();
        Ok(config)
    }

    /// Opens and checks the package (for commands that drive a target directly).
    pub fn package(&self) -> Result<Arc<npu_runtime::TargetPackage>> {
        Ok(Arc::new(npu_runtime::TargetPackage::open(&self.model)?))
    }

    /// A target over `package` on the chosen backend with these options.
    pub fn target<'a>(
        &self,
        package: &'a Arc<npu_runtime::TargetPackage>,
    ) -> Result<onebit_engine::Target<'a>> {
        let c = self.engine_config()?;
        let cpu = c.cpu_options(c.kernel.unwrap_or_else(Isa::detect));
        Ok(onebit_engine::Target::open(package, &c.backend, cpu)?)
    }

    /// Loads an engine with these flags, `drafter` and the context `ctx_len`; prints
    /// why the default context is below the model's limit when memory capped it.
    pub fn engine(
        &self,
        drafter: DrafterConfig,
        draft_max: usize,
        fixed_k: bool,
        ctx_len: ContextLen,
    ) -> Result<Arc<Engine>> {
        let mut config = self.engine_config()?;
        config.drafter = drafter;
        config.draft_max = draft_max;
        config.fixed_k = fixed_k;
        config.ctx_len = ctx_len;
        load(&config)
    }
}

/// Loads an engine of `config`, printing the reason of a memory-capped context (one
/// line on standard error: it decides which requests are refused).
pub fn load(config: &EngineConfig) -> Result<Arc<Engine>> {
    let engine = Engine::load(config)?;
    if let Some(note) = engine.context_note() {
        eprintln!("onebit: {note}");
    }
    Ok(engine)
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The prompt; read from standard input when neither this nor --prompt-tokens is given.
    #[arg(long, conflicts_with = "prompt_tokens")]
    pub prompt: Option<String>,
    /// Raw prompt token ids, comma-separated (no tokenizer or template involved).
    #[arg(long, value_delimiter = ',')]
    pub prompt_tokens: Option<Vec<u32>>,
    /// Tokens to generate at most (default: 256, or what the context leaves after the
    /// prompt if that is less; an explicit value that does not fit is refused).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Positions the run may use, prompt included (default: the model's
    /// max_position_embeddings, capped so a full-context KV cache takes at most half of
    /// the available memory, with a printed reason; more than the model's is refused).
    /// The KV cache grows with use.
    #[arg(long)]
    pub ctx_len: Option<usize>,

    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Keep tokens at least P times as likely as the most likely (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// llama.cpp's repeat penalty over the last --repeat-last-n context tokens (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Context tokens the repeat penalty looks back over (-1: the whole context).
    #[arg(long, default_value = "64", allow_negative_numbers = true, value_parser = parse_last_n)]
    pub repeat_last_n: usize,
    /// OpenAI's presence penalty over the generated tokens, in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty over the generated tokens, in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Wrap the prompt in the model's chat template as a user turn.
    #[arg(long)]
    pub chat: bool,
    /// With --chat: a system turn replacing the template's default one.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// A DFlash draft package: decode speculatively (same text as without it).
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Drafts verified per round at most (k).
    #[arg(long, default_value_t = 7)]
    pub draft_max: usize,
    /// Side by side: plain greedy decoding, then speculative decoding with an oracle
    /// drafter that knows that continuation (always right, every third wrong, never
    /// right) — the engine's round cost without a trained draft. Prints both texts and speeds.
    #[arg(long, value_parser = ["always", "every-third", "never"], conflicts_with = "draft")]
    pub oracle: Option<String>,
    /// Prompt-lookup drafting (no model): draft what followed the latest earlier
    /// occurrence of the longest suffix n-gram of prompt + output. With --draft, the
    /// two are chained: each round takes lookup's proposal or the draft's, whichever
    /// has been accepting more.
    #[arg(long, conflicts_with = "oracle")]
    pub lookup: bool,
    /// With --lookup: the longest suffix n-gram matched (down to 1).
    #[arg(long, default_value_t = DEFAULT_MAX_NGRAM, requires = "lookup", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=32))]
    pub lookup_ngram: usize,
    /// Draft --draft-max tokens every round instead of choosing k (0..=--draft-max)
    /// each round from the timed pass costs and the acceptance so far.
    #[arg(long)]
    pub fixed_k: bool,
    /// With --lookup: decode plainly first, then with lookup; print both texts, whether
    /// they are equal, and the speed-up.
    #[arg(long, requires = "lookup")]
    pub compare: bool,
}

/// `--kernel` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelArg {
    Auto,
    Scalar,
    Avx2,
    Avx2vnni,
    Avx512,
    Avx512vbmi,
    Avx512vnni,
    /// AVX-512 VNNI, with AMX tiles for the int8 head's passes of 8 rows and more.
    Amx,
}

impl KernelArg {
    /// The kernel to run, refused by name when this CPU lacks it.
    pub fn resolve(self) -> Result<Isa> {
        let name = match self {
            KernelArg::Auto => return Ok(Isa::detect()),
            KernelArg::Scalar => "scalar",
            KernelArg::Avx2 => "avx2",
            KernelArg::Avx2vnni => "avx2+avxvnni",
            KernelArg::Avx512 => "avx2+avx512",
            KernelArg::Avx512vbmi => "avx2+avx512+vbmi",
            KernelArg::Avx512vnni => "avx2+avx512+vnni",
            KernelArg::Amx => "avx2+avx512+vnni+amx",
        };
        Isa::available()
            .into_iter()
            .find(|isa| isa.name() == name)
            .with_context(|| format!("--kernel {name}: this CPU does not support it"))
    }
}

/// `--precision` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    Auto,
    Q8,
    Q8x2,
    F32,
}

impl PrecisionArg {
    /// The precision on `backend`: `auto` is the integer default on the CPU and `f32`
    /// elsewhere; an explicit choice passes through (`Target::open` refuses what the
    /// backend cannot run).
    pub fn resolve(self, backend: BackendArg) -> Precision {
        match (self, backend) {
            (PrecisionArg::F32, _) => Precision::F32,
            (PrecisionArg::Q8, _) => Precision::Q8,
            (PrecisionArg::Q8x2, _) => Precision::Q8x2,
            (PrecisionArg::Auto, BackendArg::Cpu) => Precision::auto(),
            (PrecisionArg::Auto, _) => Precision::F32,
        }
    }
}

/// `--head` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HeadArg {
    Auto,
    Tiles,
    Embedding,
    /// An int8 copy of the embedding (the default for re-quantized tied heads at q8).
    EmbeddingInt8,
    /// The q4 tiles for every row, the int8 embedding for each row's 256 best (the
    /// default where the int8 head outweighs the layers: Gemma 3).
    Screened,
}

impl HeadArg {
    /// The chosen head (auto keeps the package default).
    pub fn kind(self) -> Option<HeadKind> {
        match self {
            HeadArg::Auto => None,
            HeadArg::Tiles => Some(HeadKind::Tiles),
            HeadArg::Embedding => Some(HeadKind::Embedding),
            HeadArg::EmbeddingInt8 => Some(HeadKind::EmbeddingInt8),
            HeadArg::Screened => Some(HeadKind::Screened),
        }
    }
}

/// The prompt `args` give: raw ids, a chat turn, or text (from standard input when
/// neither --prompt nor --prompt-tokens is given).
pub fn prompt(args: &RunArgs, engine: &Engine) -> Result<Prompt> {
    if let Some(ids) = &args.prompt_tokens {
        if ids.is_empty() {
            bail!("run: --prompt-tokens is empty");
        }
        return Ok(Prompt::Tokens(ids.clone()));
    }
    if engine.text().is_none() {
        bail!("run: no tokenizer.json in the package; use --prompt-tokens");
    }
    let prompt = match &args.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("run: cannot read the prompt from standard input")?;
            s
        }
    };
    if args.chat {
        if engine.chat_template().is_none() {
            bail!("run: --chat needs a chat_template in config.json, or --chat-template FILE");
        }
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(Message::new("system", system.as_str()));
        }
        messages.push(Message::new("user", prompt.trim_end()));
        return Ok(Prompt::Chat(messages));
    }
    Ok(Prompt::Text(prompt))
}

/// The drafter `args` ask for.
fn drafter(args: &RunArgs) -> DrafterConfig {
    DrafterConfig::from_flags(args.draft.as_deref(), args.lookup, args.lookup_ngram)
}

/// `--kv-type` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KvTypeArg {
    Auto,
    F32,
    Bf16,
    Q8,
}

impl KvTypeArg {
    /// The explicit choice naming `kv_type`.
    pub fn of(kv_type: KvType) -> KvTypeArg {
        match kv_type {
            KvType::F32 => KvTypeArg::F32,
            KvType::Bf16 => KvTypeArg::Bf16,
            KvType::Q8 => KvTypeArg::Q8,
        }
    }

    /// The KV type on `backend` at `precision`: `auto` is `bf16` on the CPU backend at
    /// the integer precisions and `f32` otherwise (the exact reference, and the NPU
    /// plan's buffers); an explicit choice passes through (`Target::open` refuses what
    /// the backend cannot store).
    pub fn resolve(self, backend: BackendArg, precision: Precision) -> KvType {
        match (self, backend, precision) {
            (KvTypeArg::F32, _, _) => KvType::F32,
            (KvTypeArg::Bf16, _, _) => KvType::Bf16,
            (KvTypeArg::Q8, _, _) => KvType::Q8,
            (KvTypeArg::Auto, BackendArg::Cpu, Precision::Q8 | Precision::Q8x2) => KvType::Bf16,
            (KvTypeArg::Auto, _, _) => KvType::F32,
        }
    }
}

/// The request `args` ask for, generating at most `max_tokens`.
fn request(args: &RunArgs, prompt: Prompt, draft: DraftMode, max_tokens: usize) -> Request {
    Request {
        sampling: sampling_config(args),
        ignore_eos: args.ignore_eos,
        draft,
        ..Request::new(prompt, max_tokens)
    }
}

/// The sampling parameters `args` ask for (checked by [`SamplingConfig::check`]).
fn sampling_config(args: &RunArgs) -> SamplingConfig {
    SamplingConfig {
        temperature: args.temp,
        top_p: args.top_p,
        seed: args.seed,
        top_k: args.top_k,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
    }
}

/// `--repeat-last-n`: a count, or -1 for the whole context (llama.cpp's convention).
fn parse_last_n(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(-1) => Ok(usize::MAX),
        Ok(n) if n >= 0 => usize::try_from(n).map_err(|e| e.to_string()),
        _ => Err(format!(
            "--repeat-last-n must be a count of tokens or -1 (the whole context), got '{s}'"
        )),
    }
}

/// The text of `ids`, or the ids themselves without a tokenizer.
fn show(engine: &Engine, ids: &[u32]) -> String {
    match engine.text() {
        Some(t) => t.decode(ids).unwrap_or_default(),
        None => format!("{ids:?}"),
    }
}

/// A plain and a speculative completion of the same prompt, and what the speculative one
/// drafted with.
struct SideBySide {
    plain: (Vec<u32>, Timing),
    spec: (Vec<u32>, Timing, Stats),
    prompt: Vec<u32>,
}

/// Tokens per second of decode: the tokens after the first (the first comes from the
/// prefill) over the decode seconds. Shared with `bench` (which imports `run`, so it
/// lives here and `run` imports nothing of `bench`).
pub(crate) fn decode_rate(tokens: usize, seconds: f64) -> f64 {
    tokens.saturating_sub(1) as f64 / seconds.max(1e-9)
}

/// When a completion's tokens came: its decode (first token to last: what speculation
/// makes faster) and its whole time (the prompt's prefill too, the same work in both).
#[derive(Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) decode: f64,
    total: f64,
}

impl Timing {
    fn of(c: &Completion) -> Timing {
        Timing {
            decode: c.timings.predicted_ms / 1e3,
            total: (c.timings.prompt_ms + c.timings.predicted_ms) / 1e3,
        }
    }

    /// Decode tokens per second: the tokens after the first over the decode time.
    fn decode_rate(&self, tokens: usize) -> f64 {
        decode_rate(tokens, self.decode)
    }

    /// Tokens per second over the whole time.
    fn overall_rate(&self, tokens: usize) -> f64 {
        tokens as f64 / self.total.max(1e-9)
    }
}

/// `--oracle RULE`: plain decoding, then an oracle drafter that knows that
/// continuation ([`onebit_engine::Session::generate_oracle`]; an oracle is a measuring device, not a
/// drafter a request can ask for).
fn oracle_runs(args: &RunArgs, rule: &str, engine: &Arc<Engine>) -> Result<SideBySide> {
    let prompt = engine.tokenize(&prompt(args, engine)?)?;
    let max = engine.max_tokens(args.max_tokens, prompt.len())?;
    let mut session = engine.session()?;
    let plain = session.generate(
        &request(args, Prompt::Tokens(prompt.clone()), DraftMode::Off, max),
        &mut onebit_engine::NullSink,
        &CancelFlag::new(),
    )?;
    let oracle = Oracle {
        rule: OracleRule::parse(rule).expect("clap checked"),
        continuation: plain.tokens.clone(),
    };
    // A fresh session: the oracle run prefills as the plain one did.
    let mut session = engine.session()?;
    let spec = session.generate_oracle(
        &request(args, Prompt::Tokens(prompt.clone()), DraftMode::Auto, max),
        &oracle,
        &mut onebit_engine::NullSink,
        &CancelFlag::new(),
    )?;
    Ok(SideBySide {
        plain: (plain.tokens.clone(), Timing::of(&plain)),
        spec: (spec.tokens.clone(), Timing::of(&spec), spec.stats),
        prompt,
    })
}

/// `--oracle RULE` (`rule`) or `--lookup --compare` (`None`): plain and speculative
/// decoding of the same prompt, side by side.
fn side_by_side(args: &RunArgs, rule: Option<&str>) -> Result<()> {
    let flag = if rule.is_some() {
        "--oracle"
    } else {
        "--compare"
    };
    if args.temp > 0.0 {
        bail!("run: {flag} compares greedy decodings; drop --temp");
    }
    let drafter = match rule {
        Some(_) => DrafterConfig::None,
        None => drafter(args),
    };
    let engine = args.target.engine(
        drafter,
        args.draft_max,
        args.fixed_k,
        ContextLen::from_flag(args.ctx_len),
    )?;
    let runs = match rule {
        Some(rule) => oracle_runs(args, rule, &engine)?,
        None => {
            let prompt = engine.tokenize(&prompt(args, &engine)?)?;
            let max = engine.max_tokens(args.max_tokens, prompt.len())?;
            let mut session = engine.session()?;
            let tokens = Prompt::Tokens(prompt.clone());
            let plain = session.generate(
                &request(args, tokens.clone(), DraftMode::Off, max),
                &mut onebit_engine::NullSink,
                &CancelFlag::new(),
            )?;
            session.reset();
            let spec = session.generate(
                &request(args, tokens, DraftMode::Auto, max),
                &mut onebit_engine::NullSink,
                &CancelFlag::new(),
            )?;
            SideBySide {
                plain: (plain.tokens.clone(), Timing::of(&plain)),
                spec: (spec.tokens.clone(), Timing::of(&spec), spec.stats),
                prompt,
            }
        }
    };
    let drafter = match rule {
        Some(rule) => format!("oracle ({rule})"),
        None => format!("lookup (n-grams up to {})", args.lookup_ngram),
    };
    let adaptive = !args.fixed_k && args.draft_max > 0;
    let calibration_seconds = engine.calibration_seconds();
    let k_rule = if adaptive {
        format!("adaptive k <= {}", args.draft_max)
    } else {
        format!("k = {}", args.draft_max)
    };
    let (plain, plain_time) = &runs.plain;
    let (spec, spec_time, stats) = &runs.spec;
    let (p_tps, s_tps) = (
        plain_time.decode_rate(plain.len()),
        spec_time.decode_rate(spec.len()),
    );
    let overall = spec_time.overall_rate(spec.len()) / plain_time.overall_rate(plain.len());
    let equal = plain == spec;
    let info = engine.info();
    if args.json {
        println!(
            "{}",
            json!({
                "prompt_tokens": runs.prompt,
                "drafter": drafter,
                "adaptive": adaptive,
                "draft_max": args.draft_max,
                "calibration_seconds": calibration_seconds,
                "plain": {"tokens": plain, "text": show(&engine, plain), "seconds": plain_time.total, "decode_seconds": plain_time.decode, "tokens_per_second": p_tps},
                "speculative": {"tokens": spec, "text": show(&engine, spec), "seconds": spec_time.total, "decode_seconds": spec_time.decode, "tokens_per_second": s_tps, "stats": stats_json(stats)},
                "speedup_vs_plain": s_tps / p_tps,
                "speedup_vs_plain_with_prefill": overall,
                "texts_equal": equal,
            })
        );
    } else {
        println!(
            "── plain greedy decoding ({} tokens, {p_tps:.1} tok/s decode, {} threads, {} kernel, {} precision)",
            plain.len(),
            info.threads,
            info.kernel,
            info.precision.name()
        );
        println!("{}", show(&engine, plain));
        let what = match rule {
            Some(rule) => format!("an ORACLE ({rule}) that knows the plain continuation — not a trained draft; it measures the engine's round cost, an upper bound"),
            None => format!("prompt lookup (n-grams up to {}; no model, no oracle)", args.lookup_ngram),
        };
        println!(
            "── speculative decoding, {k_rule}, drafter: {what} ({} tokens, {s_tps:.1} tok/s decode, {:.2}x)",
            spec.len(),
            s_tps / p_tps
        );
        println!("{}", show(&engine, spec));
        println!(
            "── texts equal: {} | speed-up {:.2}x decode ({overall:.2}x counting the prompt's prefill, the same in both) | {}{}",
            if equal { "yes" } else { "NO" },
            s_tps / p_tps,
            stats_line(stats),
            if calibration_seconds > 0.0 {
                format!(" | pass costs calibrated at load in {calibration_seconds:.2} s")
            } else {
                String::new()
            }
        );
    }
    if !equal {
        bail!("run: speculative text differs from plain text");
    }
    Ok(())
}

pub fn run(args: &RunArgs) -> Result<()> {
    // The library's check, before anything is loaded.
    sampling_config(args).check()?;
    if let Some(rule) = &args.oracle {
        return side_by_side(args, Some(rule));
    }
    if args.compare {
        return side_by_side(args, None);
    }
    if args.prompt.is_none()
        && args.prompt_tokens.is_none()
        && !args.json
        && std::io::stdin().is_terminal()
    {
        return interactive(args);
    }
    let engine = args.target.engine(
        drafter(args),
        args.draft_max,
        args.fixed_k,
        ContextLen::from_flag(args.ctx_len),
    )?;
    let prompt_ids = engine.tokenize(&prompt(args, &engine)?)?;
    // The context refusal comes before any generation.
    let max = engine.max_tokens(args.max_tokens, prompt_ids.len())?;
    let mut session = engine.session()?;
    let speculative = engine.drafting();
    let stdout = std::io::stdout();
    let stream = !args.json && engine.text().is_some();
    let mut print = |e: Event<'_>| {
        if let (true, Event::Token { text, .. } | Event::Text(text)) = (stream, e) {
            if !text.is_empty() {
                let mut lock = stdout.lock();
                let _ = lock.write_all(text.as_bytes());
                let _ = lock.flush();
            }
        }
        ControlFlow::Continue(())
    };
    let out = session.generate(
        &request(
            args,
            Prompt::Tokens(prompt_ids.clone()),
            DraftMode::Auto,
            max,
        ),
        &mut print,
        &CancelFlag::new(),
    )?;
    let prefill = out.timings.prompt_ms / 1e3;
    let decode = out.timings.predicted_ms / 1e3;
    let decode_tps = out.decode_tokens_per_second();
    let prefill_tps = out.prompt_tokens_per_second();
    let stop_reason = match out.stop {
        onebit_engine::StopReason::Length => "max_tokens",
        onebit_engine::StopReason::Eos => "eos",
        onebit_engine::StopReason::StopString(_) => "stop",
        onebit_engine::StopReason::Cancelled => "callback",
    };
    let info = engine.info();
    let calibration_seconds = engine.calibration_seconds();
    let drafter_name = match (args.lookup, args.draft.is_some()) {
        (true, true) => "lookup+dflash",
        (true, false) => "lookup",
        _ => "dflash",
    };
    if args.json {
        let mut obj = json!({
            "prompt_tokens": prompt_ids,
            "tokens": out.tokens,
            "text": out.text,
            "stop_reason": stop_reason,
            "timings": {
                "prefill_seconds": prefill,
                "prefill_tokens_per_second": prefill_tps,
                "decode_seconds": decode,
                "decode_tokens_per_second": decode_tps,
            },
            "backend": info.backend,
            "kernel": info.kernel,
            "precision": info.precision.name(),
            "kv_type": info.kv_type.name(),
            "head": info.head.name(),
            "threads": info.threads,
        });
        if speculative {
            let mut s = stats_json(&out.stats);
            s["drafter"] = json!(drafter_name);
            s["adaptive"] = json!(engine.adaptive());
            s["draft_max"] = json!(args.draft_max);
            s["calibration_seconds"] = json!(calibration_seconds);
            // Plain decoding's rate in this run: one 1-row pass a token (its timed
            // cost; `--compare` measures a whole plain decode instead).
            if let Some(one) = out.stats.pass_costs.cost(1) {
                s["plain_tokens_per_second_estimate"] = json!(1.0 / one);
                s["speedup_vs_plain_estimate"] = json!(decode_tps * one);
            }
            obj["speculative"] = s;
        }
        println!("{obj}");
    } else {
        if engine.text().is_none() {
            println!("{:?}", out.tokens);
        } else {
            println!();
        }
        eprintln!(
            "[prompt {} tokens: {:.1} tok/s | generated {} tokens: {:.1} tok/s decode | stop: {stop_reason} | {} threads, {} kernel, {} precision, {} KV, {} head]",
            out.prompt_tokens,
            prefill_tps,
            out.tokens.len(),
            decode_tps,
            info.threads,
            info.kernel,
            info.precision.name(),
            info.kv_type.name(),
            info.head.name()
        );
        if speculative {
            let estimate = match out.stats.pass_costs.cost(1) {
                Some(one) => format!(
                    " | ~{:.2}x plain (1-row pass {:.1} ms)",
                    decode_tps * one,
                    one * 1e3
                ),
                None => String::new(),
            };
            eprintln!(
                "[speculative ({drafter_name}, {}): {}{estimate}]",
                if engine.adaptive() {
                    format!(
                        "adaptive k <= {}, calibrated in {calibration_seconds:.2} s",
                        args.draft_max
                    )
                } else {
                    format!("k = {}", args.draft_max)
                },
                stats_line(&out.stats)
            );
        }
    }
    Ok(())
}

/// `onebit run` with no prompt on a terminal: a multi-turn chat. The history is kept
/// and the session's KV cache reused across turns (only each new turn is prefilled);
/// Ctrl-C stops a reply (and quits at the prompt); `/exit` or end of input quits.
fn interactive(args: &RunArgs) -> Result<()> {
    // Each turn must fit the context (the engine refuses one that does not).
    let engine = args.target.engine(
        drafter(args),
        args.draft_max,
        args.fixed_k,
        ContextLen::from_flag(args.ctx_len),
    )?;
    if engine.text().is_none() {
        bail!("run: an interactive chat needs the package's tokenizer.json");
    }
    let mut session = engine.session()?;
    let current: Arc<std::sync::Mutex<Option<CancelFlag>>> = Arc::default();
    {
        let current = current.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("run: cannot watch for Ctrl-C")?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                loop {
                    if tokio::signal::ctrl_c().await.is_err() {
                        return;
                    }
                    match current.lock().expect("cancel lock").as_ref() {
                        Some(flag) => flag.cancel(),
                        None => {
                            eprintln!();
                            std::process::exit(130);
                        }
                    }
                }
            })
        });
    }
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::new("system", system.as_str()));
    }
    eprintln!(
        "onebit: chatting with {} (/exit or end of input quits; Ctrl-C stops a reply)",
        onebit_engine::model_name(&args.target.model)
    );
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        eprint!(">>> ");
        let _ = std::io::stderr().flush();
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(());
        }
        let text = line.trim();
        if text == "/exit" || text == "/bye" {
            return Ok(());
        }
        if text.is_empty() {
            continue;
        }
        messages.push(Message::new("user", text));
        let cancel = CancelFlag::new();
        *current.lock().expect("cancel lock") = Some(cancel.clone());
        let stdout = std::io::stdout();
        let mut print = |e: Event<'_>| {
            let (Event::Token { text, .. } | Event::Text(text)) = e;
            let mut lock = stdout.lock();
            let _ = lock.write_all(text.as_bytes());
            let _ = lock.flush();
            ControlFlow::Continue(())
        };
        // The engine refuses a turn that no longer fits the context (set at load).
        let max = args.max_tokens.unwrap_or(onebit_engine::DEFAULT_MAX_TOKENS);
        let request = request(args, Prompt::Chat(messages.clone()), DraftMode::Auto, max);
        let result = session.generate(&request, &mut print, &cancel);
        *current.lock().expect("cancel lock") = None;
        println!();
        match result {
            Ok(done) => {
                eprintln!(
                    "[{} tokens, {:.1} tok/s | prompt {} tokens, {} reused, first token in {:.0} ms | stop: {}]",
                    done.tokens.len(),
                    done.decode_tokens_per_second(),
                    done.prompt_tokens,
                    done.cached_tokens,
                    done.timings.prompt_ms,
                    done.stop.name()
                );
                messages.push(Message::new("assistant", done.text));
            }
            Err(e) => {
                eprintln!("onebit: error: {e}");
                messages.pop();
            }
        }
    }
}
