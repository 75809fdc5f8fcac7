//! Cached and scratch draft forwards agree bit for bit over many rounds of random
//! commits (synthetic draft, random tap rows).

use dflash_draft::synthetic::{small_config, write_synthetic};
use dflash_draft::{
    draft_forward, draft_forward_cached, load_draft, DraftHooks, DraftKvCache, DraftPrecision,
};
use onebit_kernels::kv::KvType;
use onebit_kernels::Isa;

struct Hooks;

impl DraftHooks for Hooks {
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        tokens
            .iter()
            .flat_map(|&t| {
                (0..64).map(move |i| (((t as usize * 31 + i * 7) % 97) as f32 - 48.0) / 50.0)
            })
            .collect()
    }
    fn pick(&self, hidden: &[f32], n: usize) -> Vec<u32> {
        (0..n)
            .map(|i| npu_runtime::argmax(&hidden[i * 64..(i + 1) * 64]) as u32)
            .collect()
    }
}

fn lcg(s: &mut u64) -> u64 {
    *s = s
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *s >> 33
}

/// At the default precision (`q8`, what the CLI runs) and at the f32 reference.
#[test]
fn cached_equals_scratch_over_random_rounds() {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), &small_config(), 5).unwrap();
    let draft = load_draft(dir.path()).unwrap();
    assert_eq!(
        draft.weights().unwrap().precision(),
        DraftPrecision::Q8,
        "the default"
    );
    for precision in [DraftPrecision::Q8, DraftPrecision::F32] {
        let w = draft.weights_at(Isa::detect(), precision).unwrap();
        assert_eq!(w.precision(), precision);
        cached_equals_scratch(&w);
    }
}

/// The default (`q8`) and reference (`f32`) arithmetic draft nearly the same rows,
/// and each is deterministic: the same round twice gives the same bits.
#[test]
fn q8_draft_is_close_to_the_f32_reference_and_repeats_exactly() {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), &small_config(), 5).unwrap();
    let draft = load_draft(dir.path()).unwrap();
    let (q8, f32w) = (draft.weights().unwrap(), draft.reference_weights().unwrap());
    let width = q8.config.context_width();
    let mut rng = 7u64;
    let context: Vec<f32> = (0..9 * width)
        .map(|_| (lcg(&mut rng) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let block = [5u32, 511, 511, 511];
    let run = |w| {
        draft_forward(w, &context, 9, &block, 9, &Hooks)
            .unwrap()
            .hidden
    };
    let (a, b) = (run(&q8), run(&f32w));
    assert!(run(&q8) == a, "q8 draft is not deterministic");
    let (mut diff, mut norm) = (0f32, 0f32);
    for (x, y) in a.iter().zip(&b) {
        diff = diff.max((x - y).abs());
        norm = norm.max(y.abs());
    }
    assert!(a != b, "q8 and f32 are different arithmetic");
    assert!(
        diff < 0.05 * norm,
        "q8 strays {diff} from f32 (max |f32| {norm})"
    );
}

fn cached_equals_scratch(w: &dflash_draft::DraftWeights) {
    let width = w.config.context_width();
    let mut rng = 99u64;
    let row = |rng: &mut u64| -> Vec<f32> {
        (0..width)
            .map(|_| (lcg(rng) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    };
    let mut committed: Vec<f32> = (0..5).flat_map(|_| row(&mut rng)).collect();
    let mut new_rows = committed.clone();
    let mut cache = DraftKvCache::for_weights(w);
    assert!(cache.is_empty());
    assert_eq!(cache.len(), 0);
    for round in 0..30 {
        let pos = committed.len() / width;
        let block: Vec<u32> = std::iter::once((lcg(&mut rng) % 500) as u32)
            .chain([511; 3])
            .collect();
        let cached = draft_forward_cached(
            w,
            &mut cache,
            &new_rows,
            new_rows.len() / width,
            &block,
            pos,
            &Hooks,
        )
        .unwrap();
        let scratch = draft_forward(w, &committed, pos, &block, pos, &Hooks).unwrap();
        assert!(
            cached == scratch,
            "round {round}: cached and scratch differ"
        );
        assert_eq!(cache.len(), pos);
        assert!(!cache.is_empty());
        let commit = 1 + (lcg(&mut rng) % 4) as usize;
        new_rows = (0..commit).flat_map(|_| row(&mut rng)).collect();
        committed.extend_from_slice(&new_rows);
    }
    // A misaligned draft is refused with the position rule in the message.
    let err = draft_forward_cached(w, &mut cache, &[], 0, &[1, 511, 511, 511], 3, &Hooks)
        .unwrap_err()
        .to_string();
    assert!(err.contains("drafting at position 3 over"), "{err}");
}

fn rows(n: usize, width: usize, seed: u64) -> Vec<f32> {
    let mut rng = seed;
    (0..n * width)
        .map(|_| (lcg(&mut rng) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// With a sliding window W, a block row at position p sees context positions from
/// p + 1 - W on: rows before every row's window do not change the output, and the
/// first row inside the window does.
#[test]
fn sliding_window_hides_the_rows_outside_it() {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), &small_config(), 5).unwrap();
    let draft = load_draft(dir.path()).unwrap();
    let mut w = draft.weights().unwrap();
    let width = w.config.context_width();
    let (n, window) = (12usize, 5usize);
    w.config.sliding_window = Some(window);
    let block = [7u32, 511, 511, 511];
    let context = rows(n, width, 3);
    let run = |ctx: &[f32]| draft_forward(&w, ctx, n, &block, n, &Hooks).unwrap().hidden;
    let reference = run(&context);
    // Positions 0 .. n + 1 - window are outside every block row's window.
    let hidden_start = n + 1 - window;
    let mut garbage = context.clone();
    garbage[..hidden_start * width].copy_from_slice(&rows(hidden_start, width, 77));
    assert!(
        run(&garbage) == reference,
        "rows outside the window changed the draft"
    );
    let mut touched = context.clone();
    for v in &mut touched[hidden_start * width..(hidden_start + 1) * width] {
        *v = -*v;
    }
    let h = w.config.hidden_size;
    assert!(
        run(&touched)[..h] != reference[..h],
        "the first row inside the window did not reach the block's first row"
    );
    // After the first layer (before the block's rows have mixed), that position is in
    // the block's first row's window only: the other rows' windows start later.
    let first_layer = |ctx: &[f32]| {
        draft_forward(&w, ctx, n, &block, n, &Hooks)
            .unwrap()
            .layer_outputs[0]
            .clone()
    };
    let (plain, moved) = (first_layer(&context), first_layer(&touched));
    assert!(
        plain[..h] != moved[..h],
        "row 0 does not see its window's first position"
    );
    assert!(
        plain[h..] == moved[h..],
        "a block row sees a context position before its window"
    );
    w.config.sliding_window = None;
    let unwindowed = |ctx: &[f32]| draft_forward(&w, ctx, n, &block, n, &Hooks).unwrap().hidden;
    assert!(
        unwindowed(&garbage) != unwindowed(&context),
        "without a window every row counts"
    );
}

/// `embedding_scale` multiplies the block's embedding rows: scale 2 over the hooks'
/// rows equals scale 1 over rows the hooks already doubled, bit for bit.
#[test]
fn embedding_scale_scales_the_block_embedding() {
    struct Doubled;
    impl DraftHooks for Doubled {
        fn embed(&self, tokens: &[u32]) -> Vec<f32> {
            Hooks.embed(tokens).into_iter().map(|v| v * 2.0).collect()
        }
        fn pick(&self, hidden: &[f32], n: usize) -> Vec<u32> {
            Hooks.pick(hidden, n)
        }
    }
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), &small_config(), 5).unwrap();
    let draft = load_draft(dir.path()).unwrap();
    let mut w = draft.weights().unwrap();
    let width = w.config.context_width();
    let context = rows(6, width, 9);
    let block = [3u32, 511, 511, 511];
    let plain = draft_forward(&w, &context, 6, &block, 6, &Hooks)
        .unwrap()
        .hidden;
    let doubled = draft_forward(&w, &context, 6, &block, 6, &Doubled)
        .unwrap()
        .hidden;
    w.config.embedding_scale = 2.0;
    let scaled = draft_forward(&w, &context, 6, &block, 6, &Hooks)
        .unwrap()
        .hidden;
    assert!(
        scaled == doubled,
        "embedding_scale is not a plain multiply of the embedding"
    );
    assert!(scaled != plain);
}

/// The context cache is the target's KV layout (`onebit_kernels::kv`), f32 unless asked
/// otherwise. At every KV type, truncating to m positions leaves exactly a cache given
/// only those m (across 64-position key blocks), folding the rest again repeats the
/// whole, and truncating past the end changes nothing.
#[test]
fn cache_truncate_is_exact_at_every_kv_type() {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), &small_config(), 5).unwrap();
    let draft = load_draft(dir.path()).unwrap();
    let w = draft.weights().unwrap();
    assert_eq!(
        DraftKvCache::new(&w.config).kv_type(),
        KvType::F32,
        "the default"
    );
    // The loop's cache follows the arithmetic: bf16 at q8, exact storage at the f32
    // reference.
    assert_eq!(DraftKvCache::for_weights(&w).kv_type(), KvType::Bf16);
    let reference = draft.reference_weights().unwrap();
    assert_eq!(DraftKvCache::for_weights(&reference).kv_type(), KvType::F32);
    let width = w.config.context_width();
    let len = 150;
    let context = rows(len, width, 41);
    for kv_type in KvType::ALL {
        let name = kv_type.name();
        let mut full = DraftKvCache::with_kv_type(&w.config, kv_type);
        full.fold(&w, &context, len).unwrap();
        assert_eq!((full.len(), full.kv_type()), (len, kv_type));
        for l in 0..w.config.num_layers {
            let layer = full.layer(l);
            assert_eq!((layer.len(), layer.kv_type()), (len, kv_type), "{name}");
            assert_eq!(layer.kv_heads(), w.config.num_kv_heads);
        }
        for keep in [0, 1, 63, 64, 65, 100, 149, 150] {
            let mut cut = full.clone();
            cut.truncate(keep);
            let mut fresh = DraftKvCache::with_kv_type(&w.config, kv_type);
            fresh.fold(&w, &context[..keep * width], keep).unwrap();
            assert!(cut == fresh, "{name}: truncate to {keep}");
            assert_eq!(
                cut.byte_len(),
                fresh.byte_len(),
                "{name}: truncate to {keep}"
            );
            cut.fold(&w, &context[keep * width..], len - keep).unwrap();
            assert!(cut == full, "{name}: truncate to {keep} and fold again");
        }
        let mut past = full.clone();
        past.truncate(len + 5);
        assert!(past == full, "{name}: truncate past the end");
        let other = if kv_type == KvType::F32 {
            KvType::Bf16
        } else {
            KvType::F32
        };
        let mut converted = DraftKvCache::with_kv_type(&w.config, other);
        converted.fold(&w, &context, len).unwrap();
        assert!(
            converted != full,
            "{name}: another KV type is another cache"
        );
    }
}

/// At every KV type a cache grown round by round drafts what a cache given all the
/// committed rows at once drafts, bit for bit; at f32 (the default) that is
/// `draft_forward`. bf16 and q8 storage change the draft a little, never wildly.
#[test]
fn draft_rounds_at_every_kv_type() {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), &small_config(), 5).unwrap();
    let draft = load_draft(dir.path()).unwrap();
    let w = draft.reference_weights().unwrap();
    let width = w.config.context_width();
    let mut exact: Vec<Vec<f32>> = Vec::new();
    for kv_type in KvType::ALL {
        let name = kv_type.name();
        let mut rng = 17u64;
        let mut committed = rows(40, width, 5);
        let mut new_rows = committed.clone();
        let mut cache = DraftKvCache::with_kv_type(&w.config, kv_type);
        let (mut diff, mut norm, mut differs) = (0f32, 0f32, false);
        for round in 0..12 {
            let pos = committed.len() / width;
            let block: Vec<u32> = std::iter::once((lcg(&mut rng) % 500) as u32)
                .chain([511; 3])
                .collect();
            let n_new = new_rows.len() / width;
            let cached =
                draft_forward_cached(&w, &mut cache, &new_rows, n_new, &block, pos, &Hooks)
                    .unwrap();
            let mut whole = DraftKvCache::with_kv_type(&w.config, kv_type);
            let at_once =
                draft_forward_cached(&w, &mut whole, &committed, pos, &block, pos, &Hooks).unwrap();
            assert!(
                cached == at_once,
                "{name} round {round}: grown and whole differ"
            );
            assert!(cache == whole, "{name} round {round}: the caches differ");
            match kv_type {
                KvType::F32 => {
                    let scratch = draft_forward(&w, &committed, pos, &block, pos, &Hooks).unwrap();
                    assert!(cached == scratch, "f32 round {round}: not draft_forward");
                    exact.push(cached.hidden);
                }
                _ => {
                    for (x, y) in cached.hidden.iter().zip(&exact[round]) {
                        diff = diff.max((x - y).abs());
                        norm = norm.max(y.abs());
                        differs |= x != y;
                    }
                }
            }
            let commit = 1 + (lcg(&mut rng) % 30) as usize;
            new_rows = rows(commit, width, 100 + round as u64);
            committed.extend_from_slice(&new_rows);
        }
        if kv_type != KvType::F32 {
            assert!(differs, "{name} storage rounds nothing");
            assert!(
                diff < 0.05 * norm,
                "{name} KV strays {diff} from f32 KV (max |f32| {norm})"
            );
        }
    }
}
