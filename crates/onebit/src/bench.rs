//! `onebit bench --model DIR`: how fast the target runs on this machine, and how far
//! that is from the machine's memory bandwidth.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use npu_runtime::Forward;
use rayon::prelude::*;
use serde_json::json;

use crate::run::TargetArgs;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Decode steps to time.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 128)]
    pub prefill_tokens: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Best-of-three read bandwidth of a 1 GiB buffer summed by `threads` threads, GB/s.
pub fn read_bandwidth(threads: usize) -> f64 {
    let words = (1usize << 30) / 8;
    let buffer: Vec<u64> = (0..words as u64).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool");
    let mut best = 0f64;
    for _ in 0..3 {
        let start = Instant::now();
        let sum: u64 = pool.install(|| {
            buffer
                .par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                .reduce(|| 0, u64::wrapping_add)
        });
        let secs = start.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / secs / 1e9);
    }
    best
}

/// Deterministic token ids inside the vocabulary.
fn tokens(n: usize, vocab: usize, seed: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104729 + 17) % vocab) as u32)
        .collect()
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let package = args.target.package()?;
    let mut target = args.target.target(&package)?;
    let vocab = package.config.vocab_size;
    let threads = target.threads();

    let bandwidth = read_bandwidth(threads);

    // Prefill: one pass over a prompt (best of two).
    let prompt = tokens(args.prefill_tokens, vocab, 1);
    let mut prefill = f64::INFINITY;
    for _ in 0..2 {
        target.truncate(0)?;
        let start = Instant::now();
        target.forward(&prompt)?;
        prefill = prefill.min(start.elapsed().as_secs_f64());
    }

    // Decode: single-token passes after the prompt.
    let steps = tokens(args.decode_tokens, vocab, 2);
    let start = Instant::now();
    for &t in &steps {
        target.forward(&[t])?;
    }
    let decode = start.elapsed().as_secs_f64() / args.decode_tokens.max(1) as f64;

    // n-row passes at a fixed position, rolled back each time.
    let base = target.position();
    let mut rows = Vec::new();
    for n in [1usize, 2, 4, 8, 16] {
        let batch = tokens(n, vocab, 3 + n);
        let reps = 12;
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            let start = Instant::now();
            target.forward(&batch)?;
            best = best.min(start.elapsed().as_secs_f64());
            target.truncate(base)?;
        }
        rows.push((n, best));
    }
    let one = rows[0].1;
    let bytes = target.weight_bytes_per_pass();
    let achieved = bytes as f64 / decode / 1e9;

    if args.json {
        let passes: Vec<_> = rows
            .iter()
            .map(|&(n, t)| json!({"rows": n, "ms": t * 1e3, "cost_vs_1_row": t / one, "rows_per_second": n as f64 / t}))
            .collect();
        println!(
            "{}",
            json!({
                "model": args.target.model.display().to_string(),
                "threads": threads,
                "kernel": target.kernel().name(),
                "head": format!("{:?}", target.head()).to_lowercase(),
                "read_bandwidth_gb_s": bandwidth,
                "weight_bytes_per_token": bytes,
                "prefill_tokens": args.prefill_tokens,
                "prefill_tokens_per_second": args.prefill_tokens as f64 / prefill,
                "decode_tokens_per_second": 1.0 / decode,
                "decode_weight_gb_s": achieved,
                "decode_fraction_of_bandwidth": achieved / bandwidth,
                "passes": passes,
            })
        );
    } else {
        println!(
            "{}: {} threads, {} kernel, {:?} head",
            args.target.model.display(),
            threads,
            target.kernel().name(),
            target.head()
        );
        println!("machine read bandwidth: {bandwidth:.1} GB/s ({threads} threads)");
        println!(
            "prefill: {:.1} tok/s ({} tokens)",
            args.prefill_tokens as f64 / prefill,
            args.prefill_tokens
        );
        println!(
            "decode:  {:.1} tok/s; {:.1} MB of weights per token = {:.1} GB/s, {:.0}% of read bandwidth",
            1.0 / decode,
            bytes as f64 / 1e6,
            achieved,
            100.0 * achieved / bandwidth
        );
        println!("rows  ms/pass  cost vs 1 row  rows/s");
        for (n, t) in rows {
            println!(
                "{n:>4} {:>8.2} {:>14.2} {:>7.0}",
                t * 1e3,
                t / one,
                n as f64 / t
            );
        }
    }
    Ok(())
}
