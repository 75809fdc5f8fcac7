//! One draft round at the Bolt geometry (5 layers, hidden 2560, block 8, taps 5):
//! fold 1..8 newly committed tap rows into the cache, then draft a block of 8.
//! The head (the target's LM head) is not part of the draft's cost and is left out.
//!
//! Next to it, when `cargo xtask fetch-model smollm2` has been run: one 8-row verify
//! pass of SmolLM2 on the CPU backend (the round's other half), so the two read side
//! by side.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use dflash_draft::synthetic::{bolt_config, write_synthetic};
use dflash_draft::{draft_forward_cached, load_draft, DraftHooks, DraftKvCache};

struct Hooks;

impl DraftHooks for Hooks {
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        tokens
            .iter()
            .flat_map(|&t| (0..2560).map(move |i| ((t as usize + i) % 13) as f32 * 0.01))
            .collect()
    }
    fn pick(&self, _hidden: &[f32], n: usize) -> Vec<u32> {
        vec![0; n]
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), &bolt_config(), 1).unwrap();
    let draft = load_draft(dir.path()).unwrap();
    let w = draft.weights().unwrap();
    let width = w.config.context_width();
    let row: Vec<f32> = (0..width)
        .map(|i| ((i * 7) % 101) as f32 / 100.0 - 0.5)
        .collect();
    let block = [7u32, 1, 1, 1, 1, 1, 1, 1];
    let mut g = c.benchmark_group("bolt_draft_round");
    g.sample_size(10);
    for new in [1usize, 8] {
        let rows: Vec<f32> = row.iter().cycle().take(new * width).cloned().collect();
        // A context of 256 committed positions, as after a short prompt.
        let mut base = DraftKvCache::new(&w.config);
        let ctx: Vec<f32> = row.iter().cycle().take(256 * width).cloned().collect();
        base.fold(&w, &ctx, 256).unwrap();
        g.bench_with_input(BenchmarkId::new("fold_and_draft", new), &new, |b, &new| {
            b.iter_batched(
                || base.clone(),
                |mut cache| {
                    draft_forward_cached(&w, &mut cache, &rows, new, &block, 256 + new, &Hooks)
                        .unwrap()
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();

    let smollm2 =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/models/smollm2");
    if !smollm2.join("model.q4nx").is_file() {
        eprintln!("skipped: smollm2_verify: run `cargo xtask fetch-model smollm2` first");
        return;
    }
    use npu_runtime::{CpuTarget, Forward, TargetPackage};
    let package = TargetPackage::open(&smollm2).unwrap();
    let mut target = CpuTarget::new(&package).unwrap();
    let prompt: Vec<u32> = (0..256).map(|i| (i * 7919 % 49152) as u32).collect();
    target.forward(&prompt).unwrap();
    let verify: Vec<u32> = (0..8).map(|i| (i * 104729 % 49152) as u32).collect();
    let mut g = c.benchmark_group("smollm2_verify");
    g.sample_size(10);
    g.bench_function("8_rows_after_256", |b| {
        b.iter(|| {
            let logits = target.forward(&verify).unwrap();
            target.truncate(256).unwrap();
            logits
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
