//! `onebit perplexity --model DIR --file TEXT`: how well the model predicts a text, and
//! with `--compare-precision`, how far one precision's predictions are from another's
//! (the way llama.cpp's `llama-perplexity --kl-divergence` holds quantized models to
//! their reference).
//!
//! The text is tokenized whole and cut into non-overlapping windows of `--ctx` tokens;
//! each window is one pass from an empty cache, and, as llama-perplexity does, only the
//! tokens of its second half are scored, so every scored token sees at least `ctx / 2`
//! tokens of context. Perplexity is `exp(mean NLL)`; probabilities are computed in f64
//! from each pass's f32 logits.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use npu_runtime::Forward;
use serde_json::json;

use crate::run::{KvTypeArg, PrecisionArg, TargetArgs};

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The text to score (UTF-8).
    #[arg(long)]
    pub file: PathBuf,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Score the same windows at this precision too, and report the KL divergence of
    /// the main precision's next-token distributions from this one's, and top-1
    /// agreement (e.g. `--precision q8 --compare-precision f32`).
    #[arg(long, value_enum)]
    pub compare_precision: Option<PrecisionArg>,
    /// Score the same windows with this KV type too (with --compare-precision, both
    /// change), and report the same comparison (e.g. `--kv-type bf16
    /// --compare-kv-type f32`).
    #[arg(long, value_enum)]
    pub compare_kv_type: Option<KvTypeArg>,
    /// Windows to score at most (default: all).
    #[arg(long)]
    pub windows: Option<usize>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// With --json: also every scored token's log-probability (natural log, f64, in
    /// order: `token_logprobs`) and the index of the first scored token of a window
    /// (`first_scored`), to compare with a server's `echo` log-probabilities.
    #[arg(long, requires = "json")]
    pub token_logprobs: bool,
}

/// `log softmax(logits)[token]` and the whole log-distribution, in f64.
fn log_probs(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    logits.iter().map(|&l| l as f64 - log_z).collect()
}

/// Comparison figures between two precisions.
struct Comparison {
    kld: Vec<f64>,
    top1_equal: usize,
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    if args.ctx < 2 {
        bail!("perplexity: --ctx must be at least 2, got {}", args.ctx);
    }
    let package = args.target.package()?;
    if args.ctx > package.config.max_positions {
        bail!(
            "perplexity: --ctx {} exceeds the model's {} positions",
            args.ctx,
            package.config.max_positions
        );
    }
    let text = onebit_engine::Text::open(&args.target.model)?
        .context("perplexity: the package has no tokenizer.json")?;
    let content = std::fs::read_to_string(&args.file)
        .with_context(|| format!("perplexity: cannot read {}", args.file.display()))?;
    let tokens = text.encode(&content, false)?;
    let windows = (tokens.len() / args.ctx).min(args.windows.unwrap_or(usize::MAX));
    if windows == 0 {
        bail!(
            "perplexity: {} has {} tokens, fewer than one window of --ctx {}",
            args.file.display(),
            tokens.len(),
            args.ctx
        );
    }
    let vocab = package.config.vocab_size;
    let mut main = args.target.target(&package)?;
    let mut other = match (args.compare_precision, args.compare_kv_type) {
        (None, None) => None,
        (p, kv) => {
            let mut t = args.target.clone();
            t.precision = p.unwrap_or(t.precision);
            // Without --compare-kv-type the comparison keeps the main KV type (`auto`
            // would otherwise follow the compared precision).
            t.kv_type = kv.unwrap_or(KvTypeArg::of(main.kv_type()));
            Some(t.target(&package)?)
        }
    };
    let first_scored = args.ctx / 2;
    let progress = if std::io::stderr().is_terminal() && !args.json {
        let bar = ProgressBar::new(windows as u64);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} windows, {eta} left")
                .expect("progress template")
                .progress_chars("=> "),
        );
        bar.set_message("perplexity");
        Some(bar)
    } else {
        None
    };
    let mut nll: Vec<f64> = Vec::new();
    let mut other_nll: Vec<f64> = Vec::new();
    let mut cmp = Comparison {
        kld: Vec::new(),
        top1_equal: 0,
    };
    let start = std::time::Instant::now();
    for w in 0..windows {
        let window = &tokens[w * args.ctx..(w + 1) * args.ctx];
        main.truncate(0)?;
        let logits = main.forward(window)?;
        let other_logits = match other.as_mut() {
            Some(t) => {
                t.truncate(0)?;
                Some(t.forward(window)?)
            }
            None => None,
        };
        // Row i predicts token i + 1.
        for i in first_scored.saturating_sub(1)..args.ctx - 1 {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let lp = log_probs(row);
            let next = window[i + 1] as usize;
            nll.push(-lp[next]);
            if let Some(ol) = &other_logits {
                let orow = &ol[i * vocab..(i + 1) * vocab];
                let olp = log_probs(orow);
                other_nll.push(-olp[next]);
                // KL(reference || main) with the compared precision as the reference.
                let kl: f64 = olp.iter().zip(&lp).map(|(&r, &m)| r.exp() * (r - m)).sum();
                cmp.kld.push(kl.max(0.0));
                if npu_runtime::argmax(row) == npu_runtime::argmax(orow) {
                    cmp.top1_equal += 1;
                }
            }
        }
        if let Some(bar) = &progress {
            bar.inc(1);
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let ppl = |nll: &[f64]| (nll.iter().sum::<f64>() / nll.len() as f64).exp();
    let scored = nll.len();
    let compare = other.as_ref().map(|t| {
        let mut sorted = cmp.kld.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let p99 = sorted[((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1];
        (
            (t.precision().name(), t.kv_type().name()),
            ppl(&other_nll),
            cmp.kld.iter().sum::<f64>() / cmp.kld.len() as f64,
            p99,
            cmp.top1_equal as f64 / scored as f64,
        )
    });
    if args.json {
        let mut obj = json!({
            "model": args.target.model.display().to_string(),
            "file": args.file.display().to_string(),
            "precision": main.precision().name(),
            "kv_type": main.kv_type().name(),
            "head": main.head().name(),
            "ctx": args.ctx,
            "windows": windows,
            "tokens": scored,
            "perplexity": ppl(&nll),
            "seconds": start.elapsed().as_secs_f64(),
        });
        if args.token_logprobs {
            obj["first_scored"] = json!(first_scored);
            obj["token_logprobs"] = json!(nll.iter().map(|x| -x).collect::<Vec<f64>>());
        }
        if let Some(((precision, kv_type), perplexity, kld_mean, kld_p99, top1)) = compare {
            obj["compare"] = json!({
                "precision": precision,
                "kv_type": kv_type,
                "perplexity": perplexity,
                "kld_mean": kld_mean,
                "kld_p99": kld_p99,
                "top1_agreement": top1,
            });
        }
        println!("{obj}");
    } else {
        println!(
            "{}: {} windows of {} tokens, {} tokens scored, {} precision, {} KV, {} head",
            args.file.display(),
            windows,
            args.ctx,
            scored,
            main.precision().name(),
            main.kv_type().name(),
            main.head().name()
        );
        println!("perplexity: {:.4}", ppl(&nll));
        if let Some(((precision, kv_type), perplexity, kld_mean, kld_p99, top1)) = compare {
            println!(
                "at {precision} precision, {kv_type} KV: perplexity {perplexity:.4} (ratio {:.4}); KL divergence from it: mean {kld_mean:.6}, p99 {kld_p99:.6}; top-1 agreement {:.2}%",
                ppl(&nll) / perplexity,
                top1 * 100.0
            );
        }
    }
    Ok(())
}
