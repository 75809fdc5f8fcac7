//! One draft round at the Bolt geometry (5 layers, hidden 2560, block 8, taps 5):
//! fold 1..8 newly committed tap rows into the cache, then draft a block of 8.
//! The head (the target's LM head) is not part of the draft's cost and is left out.
//!
//! Next to it: one 8-row verify pass of SmolLM2 on the CPU backend (when `cargo xtask
//! fetch-model smollm2` has been run), and one layer's matmuls of the 4B-class target
//! the Bolt geometry drafts for (36 layers make its pass), so the round's two halves
//! read side by side.

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
        test_support::skip!(
            "smollm2_verify",
            "SmolLM2 not fetched (run `cargo xtask fetch-model smollm2`)"
        );
        return;
    }
    use npu_runtime::{CpuTarget, Forward, TargetPackage};
    let package = std::sync::Arc::new(TargetPackage::open(&smollm2).unwrap());
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

criterion_group!(benches, bench, target_class_layer);
criterion_main!(benches);

/// The matmuls of one layer of the target class the Bolt geometry drafts for (hidden
/// 2560, 32 query / 8 key-value heads of 128, intermediate 9728: a 4B-parameter
/// model of 36 layers) over an 8-row verify batch. 36 of these plus the head are one
/// verify pass of such a target; compare with `bolt_draft_round`.
fn target_class_layer(c: &mut Criterion) {
    use onebit_kernels::{matmul, Isa};
    use q4nx_format::{encode_q4_1, Q4Kind, Q4Matrix};
    let shapes = [
        (4096, 2560),
        (1024, 2560),
        (1024, 2560),
        (2560, 4096),
        (9728, 2560),
        (9728, 2560),
        (2560, 9728),
    ];
    let tiles: Vec<(usize, usize, Vec<u8>)> = shapes
        .iter()
        .map(|&(n, k)| {
            let v: Vec<f32> = (0..n * k)
                .map(|i| ((i * 2654435761usize) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            (n, k, encode_q4_1(&v, n, k).unwrap())
        })
        .collect();
    let weights: Vec<Q4Matrix> = tiles
        .iter()
        .map(|(n, k, t)| Q4Matrix::from_bytes("w", t, *n, *k, Q4Kind::Q4_1).unwrap())
        .collect();
    let kernel = Isa::detect();
    let rows = 8;
    let xs: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(_, k)| (0..rows * k).map(|i| (i % 13) as f32 * 0.1).collect())
        .collect();
    let mut ys: Vec<Vec<f32>> = shapes.iter().map(|&(n, _)| vec![0f32; rows * n]).collect();
    let mut g = c.benchmark_group("target_4b_class_layer");
    g.sample_size(10);
    g.bench_function("8_rows", |b| {
        b.iter(|| {
            for ((w, x), y) in weights.iter().zip(&xs).zip(ys.iter_mut()) {
                matmul(w, x, rows, y, kernel);
            }
        })
    });
    g.finish();
}
