//! `onebit run`: generate text with a target package.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use npu_runtime::kernels::Kernel;
use npu_runtime::{CpuTarget, Forward, HeadKind, TargetPackage};
use serde_json::json;

use crate::sample::{Sampler, SamplingConfig};
use crate::text::{render_chat, StreamDecoder, Text};

/// How to open and run a target package; shared by `run` and `bench`.
#[derive(Args)]
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
    /// Matmul kernel (auto: the fastest this CPU supports).
    #[arg(long, value_enum, default_value_t = KernelArg::Auto)]
    pub kernel: KernelArg,
}

impl TargetArgs {
    /// Opens and checks the package.
    pub fn package(&self) -> Result<TargetPackage> {
        Ok(TargetPackage::open(&self.model)?)
    }

    /// A CPU target over `package` with these options.
    pub fn target<'a>(&self, package: &'a TargetPackage) -> Result<CpuTarget<'a>> {
        if self.threads == Some(0) {
            bail!("--threads must be at least 1");
        }
        let mut target = CpuTarget::with_options(package, self.kernel.resolve()?, self.threads)?;
        self.head.apply(&mut target)?;
        Ok(target)
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
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
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
}

/// `--kernel` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelArg {
    Auto,
    Scalar,
    Avx2,
    Avx512,
}

impl KernelArg {
    /// The kernel to run, refused by name when this CPU lacks it.
    pub fn resolve(self) -> Result<Kernel> {
        let wanted = match self {
            KernelArg::Auto => return Ok(Kernel::detect()),
            KernelArg::Scalar => Kernel::Scalar,
            KernelArg::Avx2 => Kernel::Avx2,
            KernelArg::Avx512 => Kernel::Avx512,
        };
        if !Kernel::available().contains(&wanted) {
            bail!("--kernel {}: this CPU does not support it", wanted.name());
        }
        Ok(wanted)
    }
}

/// `--head` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HeadArg {
    Auto,
    Tiles,
    Embedding,
}

impl HeadArg {
    /// Applies the choice to a target (auto keeps the package default).
    pub fn apply(self, target: &mut CpuTarget) -> Result<()> {
        match self {
            HeadArg::Auto => Ok(()),
            HeadArg::Tiles => Ok(target.set_head(HeadKind::Tiles)?),
            HeadArg::Embedding => Ok(target.set_head(HeadKind::Embedding)?),
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

pub fn run(args: &RunArgs) -> Result<()> {
    let package = args.target.package()?;
    let text = Text::open(&args.target.model).ok();
    let prompt = prompt_ids(args, &package, text.as_ref())?;
    let mut target = args.target.target(&package)?;
    let mut sampler = Sampler::new(SamplingConfig {
        temperature: args.temp,
        top_p: args.top_p,
        seed: args.seed,
    });
    let eos = package.config.eos_token_ids.clone();
    let vocab = package.config.vocab_size;

    let start = Instant::now();
    let logits = target.forward(&prompt)?;
    let prefill = start.elapsed().as_secs_f64();
    let mut next = sampler.pick(&logits[(prompt.len() - 1) * vocab..]);

    let decode_start = Instant::now();
    let mut out_ids = Vec::new();
    let mut stream = StreamDecoder::default();
    let stdout = std::io::stdout();
    let mut stop_reason = "max_tokens";
    while out_ids.len() < args.max_tokens {
        if !args.ignore_eos && eos.contains(&next) {
            stop_reason = "eos";
            break;
        }
        out_ids.push(next);
        if !args.json {
            if let Some(t) = &text {
                let piece = stream.push(t, next)?;
                let mut lock = stdout.lock();
                lock.write_all(piece.as_bytes())?;
                lock.flush()?;
            }
        }
        if out_ids.len() == args.max_tokens {
            break;
        }
        let logits = target.forward(&[next])?;
        next = sampler.pick(&logits);
    }
    let decode = decode_start.elapsed().as_secs_f64();
    // Decode rate counts target passes after the prefill (the first token comes from it).
    let decode_passes = out_ids.len().saturating_sub(1);
    let generated = match &text {
        Some(t) => t.decode(&out_ids)?,
        None => String::new(),
    };
    let prefill_tps = prompt.len() as f64 / prefill.max(1e-9);
    let decode_tps = decode_passes as f64 / decode.max(1e-9);
    if args.json {
        let obj = json!({
            "prompt_tokens": prompt,
            "tokens": out_ids,
            "text": generated,
            "stop_reason": stop_reason,
            "timings": {
                "prefill_seconds": prefill,
                "prefill_tokens_per_second": prefill_tps,
                "decode_seconds": decode,
                "decode_tokens_per_second": decode_tps,
            },
            "kernel": target.kernel().name(),
            "threads": target.threads(),
        });
        println!("{obj}");
    } else {
        if text.is_none() {
            println!("{out_ids:?}");
        } else {
            println!();
        }
        eprintln!(
            "[prompt {} tokens: {:.1} tok/s | generated {} tokens: {:.1} tok/s decode | stop: {stop_reason} | {} threads, {} kernel]",
            prompt.len(),
            prefill_tps,
            out_ids.len(),
            decode_tps,
            target.threads(),
            target.kernel().name()
        );
    }
    Ok(())
}
