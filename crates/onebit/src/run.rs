//! `onebit run`: generate text with a target package.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use npu_runtime::kernels::Isa;
use npu_runtime::{CpuOptions, Forward, HeadKind, KvType, Precision, TargetPackage};

use crate::backend::{check_npu_options, BackendArg, NpuOptions, Target};
use serde_json::json;

use crate::text::{render_chat, StreamDecoder, Text};
use mtp::{RunOptions, SamplingConfig, StopReason};

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
}

impl TargetArgs {
    /// Opens and checks the package.
    pub fn package(&self) -> Result<std::sync::Arc<TargetPackage>> {
        Ok(std::sync::Arc::new(TargetPackage::open(&self.model)?))
    }

    /// A target over `package` on the chosen backend with these options.
    pub fn target<'a>(&self, package: &'a std::sync::Arc<TargetPackage>) -> Result<Target<'a>> {
        if self.threads == Some(0) {
            bail!("--threads must be at least 1");
        }
        let npu = NpuOptions {
            kernels: self.kernels.clone(),
            device: self.device,
        };
        check_npu_options(self.backend, &npu)?;
        let precision = self.precision.resolve(self.backend);
        let cpu = CpuOptions {
            kernel: self.kernel.resolve()?,
            threads: self.threads,
            precision,
            head: self.head.kind(),
            kv_type: self.kv_type.resolve(self.backend, precision),
        };
        Target::open(package, self.backend, cpu, &npu)
    }
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
    /// max_position_embeddings; more is refused). The KV cache grows with use.
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
    /// occurrence of the longest suffix n-gram of prompt + output.
    #[arg(long, conflicts_with_all = ["draft", "oracle"])]
    pub lookup: bool,
    /// With --lookup: the longest suffix n-gram matched (down to 1).
    #[arg(long, default_value_t = mtp::DEFAULT_MAX_NGRAM, requires = "lookup", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=32))]
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

/// The adaptive draft length's settings for `fixed_k`, with pass costs calibrated on
/// `target` (before any layer taps are set), and the seconds the calibration took.
pub fn adaptive_config(
    fixed_k: bool,
    target: &mut dyn Forward,
    draft_max: usize,
) -> Result<(Option<mtp::AdaptiveConfig>, f64)> {
    if fixed_k || draft_max == 0 {
        return Ok((None, 0.0));
    }
    let start = Instant::now();
    let calibration = mtp::calibrate(target, draft_max + 1, 1)?;
    Ok((
        Some(mtp::AdaptiveConfig {
            calibration: Some(calibration),
            ..mtp::AdaptiveConfig::default()
        }),
        start.elapsed().as_secs_f64(),
    ))
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

/// `--head` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HeadArg {
    Auto,
    Tiles,
    Embedding,
    /// An int8 copy of the embedding (the default for re-quantized tied heads at q8).
    EmbeddingInt8,
}

impl HeadArg {
    /// The chosen head (auto keeps the package default).
    pub fn kind(self) -> Option<HeadKind> {
        match self {
            HeadArg::Auto => None,
            HeadArg::Tiles => Some(HeadKind::Tiles),
            HeadArg::Embedding => Some(HeadKind::Embedding),
            HeadArg::EmbeddingInt8 => Some(HeadKind::EmbeddingInt8),
        }
    }
}

/// The prompt as token ids, and its text when there is one.
pub fn prompt_ids(
    args: &RunArgs,
    package: &TargetPackage,
    text: Option<&Text>,
) -> Result<Vec<u32>> {
    if let Some(ids) = &args.prompt_tokens {
        if ids.is_empty() {
            bail!("run: --prompt-tokens is empty");
        }
        return Ok(ids.clone());
    }
    let text = text.context("run: no tokenizer.json in the package; use --prompt-tokens")?;
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
    let ids = if args.chat {
        let template = package
            .config
            .chat_template
            .as_deref()
            .context("run: --chat needs a chat_template in config.json")?;
        let rendered = render_chat(template, args.system.as_deref(), prompt.trim_end(), "", "")?;
        text.encode(&rendered, false)?
    } else {
        text.encode(&prompt, true)?
    };
    if ids.is_empty() {
        bail!("run: the prompt is empty");
    }
    Ok(ids)
}

/// A draft head for `--draft DIR` over this target package.
pub struct DraftSetup {
    pub draft: dflash_draft::DraftModel,
}

impl DraftSetup {
    /// Loads the draft package and checks it against the target.
    pub fn open(
        dir: &std::path::Path,
        package: &TargetPackage,
        target_dir: &std::path::Path,
    ) -> Result<DraftSetup> {
        let draft = dflash_draft::load_draft(dir)?;
        draft.check_target(&dflash_draft::TargetShape {
            name: target_dir.display().to_string(),
            num_layers: package.config.num_layers,
            hidden_size: package.config.hidden_size,
            vocab_size: package.config.vocab_size,
        })?;
        Ok(DraftSetup { draft })
    }
}

/// The statistics as JSON.
pub fn stats_json(s: &mtp::Stats) -> serde_json::Value {
    let passes: Vec<_> = s
        .pass_costs
        .points()
        .iter()
        .map(|&(rows, secs)| json!({"rows": rows, "ms": secs * 1e3}))
        .collect();
    json!({
        "k_histogram": s.k_histogram,
        "probes": s.probes,
        "shadow_probes": s.shadow_probes,
        "draft_share": s.draft_share(),
        "pass_costs": passes,
        "rounds": s.rounds,
        "plain_steps": s.plain_steps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "accepted_per_round": s.accepted_per_round,
        "acceptance_by_position": s.acceptance_by_position(),
        "tokens_per_round": s.tokens_per_round(),
        "seconds": {"target": s.target_seconds, "draft": s.draft_seconds, "sampling": s.sampling_seconds},
    })
}

/// One line of speculative statistics for a terminal.
pub fn stats_line(s: &mtp::Stats) -> String {
    let by_pos: Vec<String> = s
        .acceptance_by_position()
        .iter()
        .map(|a| format!("{:.0}%", a * 100.0))
        .collect();
    let hist: Vec<String> = s
        .k_histogram
        .iter()
        .enumerate()
        .filter(|&(_, &n)| n > 0)
        .map(|(k, n)| format!("{k}:{n}"))
        .collect();
    format!(
        "{} rounds, {} plain steps, {}/{} drafts accepted, {:.2} tokens/round, acceptance by position {} | k chosen {} ({} probes, {} shadow) | time: target {:.2} s, draft {:.3} s ({:.1}%), sampling {:.3} s",
        s.rounds,
        s.plain_steps,
        s.accepted,
        s.drafted,
        s.tokens_per_round(),
        by_pos.join(" "),
        hist.join(" "),
        s.probes,
        s.shadow_probes,
        s.target_seconds,
        s.draft_seconds,
        100.0 * s.draft_share(),
        s.sampling_seconds
    )
}

/// The context in positions: `--ctx-len`, at most the model's `max_position_embeddings`
/// (default: that).
pub fn context_len(ctx_len: Option<usize>, package: &TargetPackage) -> Result<usize> {
    let max = package.config.max_positions;
    match ctx_len {
        None => Ok(max),
        Some(0) => bail!("--ctx-len must be at least 1"),
        Some(n) if n > max => {
            bail!("--ctx-len {n} exceeds the model's max_position_embeddings {max}")
        }
        Some(n) => Ok(n),
    }
}

/// Default tokens to generate when `--max-tokens` is not given (less if the context ends
/// sooner).
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// Tokens to generate: `--max-tokens`, refused (before any work, with both numbers) if
/// the prompt plus it exceed the context; by default 256 clamped to what is left.
pub fn max_tokens(args: &RunArgs, package: &TargetPackage, prompt: usize) -> Result<usize> {
    let ctx = context_len(args.ctx_len, package)?;
    match args.max_tokens {
        Some(m) if prompt + m > ctx => bail!(
            "run: the prompt's {prompt} tokens plus --max-tokens {m} make {}, more than the context of {ctx} positions",
            prompt + m
        ),
        Some(m) => Ok(m),
        None if prompt >= ctx => bail!(
            "run: the prompt's {prompt} tokens leave no room in the context of {ctx} positions"
        ),
        None => Ok(DEFAULT_MAX_TOKENS.min(ctx - prompt)),
    }
}

/// The loop options `args` ask for (fixed k; `run` sets the adaptive settings), for a
/// prompt of `prompt` tokens.
fn run_options(args: &RunArgs, package: &TargetPackage, prompt: usize) -> Result<RunOptions> {
    Ok(RunOptions {
        adaptive: None,
        max_tokens: max_tokens(args, package, prompt)?,
        draft_max: args.draft_max,
        stop_tokens: if args.ignore_eos {
            Vec::new()
        } else {
            package.config.eos_token_ids.clone()
        },
        sampling: sampling_config(args),
    })
}

/// The sampling parameters `args` ask for (checked by [`SamplingConfig::check`]).
fn sampling_config(args: &RunArgs) -> SamplingConfig {
    SamplingConfig {
        temperature: args.temp,
        top_p: args.top_p,
        seed: args.seed,
    }
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
    let package = args.target.package()?;
    let text = Text::open(&args.target.model).ok();
    let prompt = prompt_ids(args, &package, text.as_ref())?;
    let mut options = run_options(args, &package, prompt.len())?;
    let show = |ids: &[u32]| -> String {
        match &text {
            Some(t) => t.decode(ids).unwrap_or_default(),
            None => format!("{ids:?}"),
        }
    };
    let mut target = args.target.target(&package)?;
    let start = Instant::now();
    let plain = mtp::run(&mut target, None, &prompt, &options, &mut |_| true)?;
    let plain_secs = start.elapsed().as_secs_f64();
    let mut stream = prompt.clone();
    stream.extend(&plain.tokens);
    let mut head: Box<dyn mtp::DraftHead> = match rule {
        Some(rule) => Box::new(mtp::OracleHead::new(
            stream,
            package.config.vocab_size,
            mtp::OracleRule::parse(rule).expect("clap checked"),
        )),
        None => Box::new(mtp::LookupHead::new(args.lookup_ngram)),
    };
    let drafter = match rule {
        Some(rule) => format!("oracle ({rule})"),
        None => format!("lookup (n-grams up to {})", args.lookup_ngram),
    };
    let mut target = args.target.target(&package)?;
    let calibration_seconds;
    (options.adaptive, calibration_seconds) =
        adaptive_config(args.fixed_k, &mut target, args.draft_max)?;
    let k_rule = match options.adaptive {
        Some(_) => format!("adaptive k <= {}", args.draft_max),
        None => format!("k = {}", args.draft_max),
    };
    let start = Instant::now();
    let spec = mtp::run(
        &mut target,
        Some(&mut *head),
        &prompt,
        &options,
        &mut |_| true,
    )?;
    let spec_secs = start.elapsed().as_secs_f64();
    let (p_tps, s_tps) = (
        plain.tokens.len() as f64 / plain_secs,
        spec.tokens.len() as f64 / spec_secs,
    );
    let equal = plain.tokens == spec.tokens;
    if args.json {
        println!(
            "{}",
            json!({
                "prompt_tokens": prompt,
                "drafter": drafter,
                "adaptive": options.adaptive.is_some(),
                "draft_max": args.draft_max,
                "calibration_seconds": calibration_seconds,
                "plain": {"tokens": plain.tokens, "text": show(&plain.tokens), "seconds": plain_secs, "tokens_per_second": p_tps},
                "speculative": {"tokens": spec.tokens, "text": show(&spec.tokens), "seconds": spec_secs, "tokens_per_second": s_tps, "stats": stats_json(&spec.stats)},
                "speedup_vs_plain": s_tps / p_tps,
                "texts_equal": equal,
            })
        );
    } else {
        println!(
            "── plain greedy decoding ({} tokens, {p_tps:.1} tok/s, {} threads, {} kernel, {} precision)",
            plain.tokens.len(),
            target.threads(),
            target.kernel().name(),
            target.precision().name()
        );
        println!("{}", show(&plain.tokens));
        let what = match rule {
            Some(rule) => format!("an ORACLE ({rule}) that knows the plain continuation — not a trained draft; it measures the engine's round cost, an upper bound"),
            None => format!("prompt lookup (n-grams up to {}; no model, no oracle)", args.lookup_ngram),
        };
        println!(
            "── speculative decoding, {k_rule}, drafter: {what} ({} tokens, {s_tps:.1} tok/s, {:.2}x)",
            spec.tokens.len(),
            s_tps / p_tps
        );
        println!("{}", show(&spec.tokens));
        println!(
            "── texts equal: {} | speed-up {:.2}x | {}{}",
            if equal { "yes" } else { "NO" },
            s_tps / p_tps,
            stats_line(&spec.stats),
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
    let package = args.target.package()?;
    let text = Text::open(&args.target.model).ok();
    let prompt = prompt_ids(args, &package, text.as_ref())?;
    // The context refusal comes before the model is loaded.
    let mut options = run_options(args, &package, prompt.len())?;
    let mut target = args.target.target(&package)?;
    let speculative = args.draft.is_some() || args.lookup;
    // Calibrated before the draft's layer taps are set (the passes would write tap rows).
    let (adaptive, calibration_seconds) = if speculative {
        adaptive_config(args.fixed_k, &mut target, args.draft_max)?
    } else {
        (None, 0.0)
    };
    options.adaptive = adaptive;
    let draft = match &args.draft {
        Some(dir) => Some(DraftSetup::open(dir, &package, &args.target.model)?),
        None => None,
    };
    let weights = match &draft {
        Some(d) => Some(d.draft.weights()?),
        None => None,
    };
    let sink = std::sync::Arc::new(std::sync::Mutex::new(npu_runtime::TapRows::new(0)));
    let mut head: Option<Box<dyn mtp::DraftHead>> = match (&draft, &weights) {
        (Some(d), Some(w)) => {
            target.set_layer_taps(&d.draft.config.target_layer_ids, sink.clone())?;
            let hooks = target.draft_hooks(&package)?;
            Some(Box::new(mtp::DFlashHead::new(
                w,
                Box::new(hooks),
                sink.clone(),
            )))
        }
        _ if args.lookup => Some(Box::new(mtp::LookupHead::new(args.lookup_ngram))),
        _ => None,
    };

    let stdout = std::io::stdout();
    let mut stream = StreamDecoder::default();
    let mut first_token_at = None;
    let start = Instant::now();
    let mut on_token = |t: u32| -> bool {
        first_token_at.get_or_insert_with(|| start.elapsed().as_secs_f64());
        if !args.json {
            if let Some(tx) = &text {
                if let Ok(piece) = stream.push(tx, t) {
                    let mut lock = stdout.lock();
                    let _ = lock.write_all(piece.as_bytes());
                    let _ = lock.flush();
                }
            }
        }
        true
    };
    let out = match head.as_mut() {
        Some(h) => mtp::run(
            &mut target,
            Some(&mut **h),
            &prompt,
            &options,
            &mut on_token,
        )?,
        None => mtp::run(&mut target, None, &prompt, &options, &mut on_token)?,
    };
    let total = start.elapsed().as_secs_f64();
    let prefill = first_token_at.unwrap_or(total);
    let decode = total - prefill;
    // Decode rate: tokens after the first (which comes from the prefill pass).
    let decode_tps = out.tokens.len().saturating_sub(1) as f64 / decode.max(1e-9);
    let prefill_tps = prompt.len() as f64 / prefill.max(1e-9);
    let generated = match &text {
        Some(t) => t.decode(&out.tokens)?,
        None => String::new(),
    };
    let stop_reason = match out.stop {
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopToken => "eos",
        StopReason::Callback => "callback",
    };
    if args.json {
        let mut obj = json!({
            "prompt_tokens": prompt,
            "tokens": out.tokens,
            "text": generated,
            "stop_reason": stop_reason,
            "timings": {
                "prefill_seconds": prefill,
                "prefill_tokens_per_second": prefill_tps,
                "decode_seconds": decode,
                "decode_tokens_per_second": decode_tps,
            },
            "backend": target.backend(),
            "kernel": target.kernel().name(),
            "precision": target.precision().name(),
            "kv_type": target.kv_type().name(),
            "head": target.head().name(),
            "threads": target.threads(),
        });
        if speculative {
            let mut s = stats_json(&out.stats);
            s["drafter"] = json!(if args.lookup { "lookup" } else { "dflash" });
            s["adaptive"] = json!(options.adaptive.is_some());
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
        if text.is_none() {
            println!("{:?}", out.tokens);
        } else {
            println!();
        }
        eprintln!(
            "[prompt {} tokens: {:.1} tok/s | generated {} tokens: {:.1} tok/s decode | stop: {stop_reason} | {} threads, {} kernel, {} precision, {} KV, {} head]",
            prompt.len(),
            prefill_tps,
            out.tokens.len(),
            decode_tps,
            target.threads(),
            target.kernel().name(),
            target.precision().name(),
            target.kv_type().name(),
            target.head().name()
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
                "[speculative ({}, {}): {}{estimate}]",
                if args.lookup { "lookup" } else { "dflash" },
                match options.adaptive {
                    Some(_) => format!(
                        "adaptive k <= {}, calibrated in {calibration_seconds:.2} s",
                        args.draft_max
                    ),
                    None => format!("k = {}", args.draft_max),
                },
                stats_line(&out.stats)
            );
        }
    }
    Ok(())
}
