//! The CPU forward against transformers' float32 reference (`../shared/fixtures`):
//! embeddings, every layer's output (through taps), final norm, logits and greedy
//! continuation; then batch invariance and truncate.
//!
//! Tolerance: 1e-3 absolute on hidden states and logits. The reference is float32
//! transformers over exactly the weights the Q4NX encodes, so the only differences are
//! f32 summation order (measured below 3e-5 here); 1e-3 is the fixture's own suggested
//! bound and sits well under the smallest greedy margin used (0.0208).

mod common;
use common::max_diff;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use npu_runtime::kernels::Isa;
use npu_runtime::{
    argmax, CpuOptions, CpuTarget, Forward, KvType, Precision, TapRows, TargetPackage,
};
use q4nx_format::Container;

const TOLERANCE: f32 = 1e-3;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

fn check_reference(dir: &str) {
    let package = std::sync::Arc::new(TargetPackage::open(fixture(dir)).unwrap());
    let reference = Container::open(fixture(dir).join("reference.safetensors")).unwrap();
    let get = |name: &str| reference.tensor(name).unwrap().to_f32().unwrap();
    let tokens: Vec<u32> = reference
        .tensor("tokens")
        .unwrap()
        .to_i64()
        .unwrap()
        .iter()
        .map(|&t| t as u32)
        .collect();
    let h = package.config.hidden_size;
    for kernel in Isa::available() {
        let options = CpuOptions {
            kernel,
            ..Default::default()
        };
        let mut target = CpuTarget::with_options(&package, options).unwrap();
        let sink = Arc::new(Mutex::new(TapRows::new(0)));
        target.set_layer_taps(&[0, 1], sink.clone()).unwrap();
        assert!(
            max_diff(&target.embed(&tokens).unwrap(), &get("embed")) == 0.0,
            "embedding rows are exact"
        );
        let logits = target.forward(&tokens).unwrap();
        let rows = sink.lock().unwrap().clone();
        assert_eq!(rows.rows(), 12);
        let tap = |t: usize| -> Vec<f32> {
            (0..12)
                .flat_map(|i| rows.row(i)[t * h..(t + 1) * h].to_vec())
                .collect()
        };
        let d_hidden0 = max_diff(&tap(0), &get("hidden.0"));
        let d_final = max_diff(&tap(1), &get("final_norm"));
        let d_logits = max_diff(&logits, &get("logits"));
        eprintln!("{dir} {kernel:?}: max |diff| hidden.0 {d_hidden0:.2e}, final_norm {d_final:.2e}, logits {d_logits:.2e}");
        assert!(d_hidden0 < TOLERANCE && d_final < TOLERANCE && d_logits < TOLERANCE);
        assert!(max_diff(target.last_hidden(), &get("final_norm")) < TOLERANCE);

        // Greedy continuation, one token at a time, where the reference's margin exceeds our bound.
        let greedy = reference.tensor("greedy").unwrap().to_i64().unwrap();
        let margins = get("greedy_margin");
        target.clear_layer_taps();
        let mut next = argmax(&logits[11 * 512..]) as u32;
        for (step, (&want, &margin)) in greedy.iter().zip(&margins).enumerate() {
            if margin > 2.0 * TOLERANCE {
                assert_eq!(
                    next as i64, want,
                    "{dir}: greedy step {step} (margin {margin})"
                );
            }
            next = argmax(&target.forward(&[want as u32]).unwrap()) as u32;
        }
    }
}

#[test]
fn tiny_llama_matches_transformers() {
    check_reference("tiny-llama");
}

#[test]
fn tiny_qwen3_matches_transformers() {
    check_reference("tiny-qwen3");
}

/// Deterministic pseudo-random numbers for batch splits.
fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

/// A batched pass gives, row for row, the same bits as one-token passes; tap rows too;
/// truncate rolls back exactly (re-running after a rollback repeats the same bits). At
/// every precision and every KV type, over 150 positions (three 64-position key blocks;
/// rollbacks cross a block boundary).
#[test]
fn batches_equal_single_steps_bit_for_bit() {
    for precision in [Precision::F32, Precision::Q8, Precision::Q8x2] {
        for kv_type in KvType::ALL {
            batch_invariance_at(precision, kv_type);
        }
    }
}

fn target(package: &Arc<TargetPackage>, precision: Precision) -> CpuTarget {
    target_kv(package, precision, KvType::F32)
}

fn target_kv(package: &Arc<TargetPackage>, precision: Precision, kv_type: KvType) -> CpuTarget {
    let options = CpuOptions {
        precision,
        kv_type,
        ..Default::default()
    };
    CpuTarget::with_options(package, options).unwrap()
}

const POSITIONS: usize = 150;

fn batch_invariance_at(precision: Precision, kv_type: KvType) {
    for dir in ["tiny-llama", "tiny-qwen3"] {
        let package = std::sync::Arc::new(TargetPackage::open(fixture(dir)).unwrap());
        let mut rng = 7u64;
        let tokens: Vec<u32> = (0..POSITIONS)
            .map(|_| (lcg(&mut rng) % 512) as u32)
            .collect();
        let target =
            |package: &Arc<TargetPackage>, precision| target_kv(package, precision, kv_type);
        let what = format!("{dir} {precision:?} {} KV", kv_type.name());
        let run = |splits: &[usize]| -> (Vec<f32>, TapRows) {
            let mut t = target(&package, precision);
            let sink = Arc::new(Mutex::new(TapRows::new(0)));
            t.set_layer_taps(&[1, 0], sink.clone()).unwrap();
            let mut logits = Vec::new();
            let mut at = 0;
            for &len in splits {
                logits.extend(t.forward(&tokens[at..at + len]).unwrap());
                at += len;
            }
            let rows = sink.lock().unwrap().clone();
            (logits, rows)
        };
        let singles = run(&[1; POSITIONS]);
        for trial in 0..4 {
            let mut splits = Vec::new();
            let mut left = POSITIONS;
            while left > 0 {
                let n = 1 + (lcg(&mut rng) as usize % 70).min(left - 1);
                splits.push(n);
                left -= n;
            }
            let batched = run(&splits);
            assert!(
                batched.0 == singles.0,
                "{what}: logits differ for splits {splits:?} (trial {trial})"
            );
            assert!(
                batched.1 == singles.1,
                "{what}: tap rows differ for splits {splits:?}"
            );
        }

        // Rollback: run 100, truncate to 60, run 40 different tokens, truncate to 60 and
        // replay the original 40: bits equal the uninterrupted run.
        let mut t = target(&package, precision);
        let full = t.forward(&tokens[..100]).unwrap();
        t.truncate(60).unwrap();
        assert_eq!(t.position(), 60);
        t.forward(&tokens[100..140]).unwrap();
        t.truncate(60).unwrap();
        let replay = t.forward(&tokens[60..100]).unwrap();
        assert!(
            replay == full[60 * 512..],
            "{what}: replay after truncate differs"
        );
        // A prefill's last-row logits are the last row of the full pass.
        let mut t = target(&package, precision);
        let last = t.forward_last(&tokens[..100]).unwrap();
        assert!(last == full[99 * 512..], "{what}: forward_last differs");
        assert_eq!(t.position(), 100);
        assert!(t.truncate(101).is_err());
    }
}

#[test]
fn bad_inputs_are_refused_by_name() {
    let package = std::sync::Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    let mut t = CpuTarget::new(&package).unwrap();
    assert_eq!(
        t.forward(&[512]).unwrap_err().to_string(),
        "target: token id 512 is outside the vocabulary of 512"
    );
    let sink = Arc::new(Mutex::new(TapRows::new(0)));
    assert_eq!(
        t.set_layer_taps(&[2], sink).unwrap_err().to_string(),
        "target: tap layer 2 does not exist (the model has 2 layers)"
    );
    t.forward(&[1, 2]).unwrap();
    assert_eq!(
        t.truncate(3).unwrap_err().to_string(),
        "target: cannot truncate to 3 positions: only 2 are cached"
    );
}

/// At q8 (and at f32 with bf16 or q8 KV, where only attention is ISA-specific) every
/// variant this CPU has gives the whole forward the scalar reference's bits, over 100
/// positions (two key blocks).
#[test]
fn q8_forward_is_the_same_on_every_isa() {
    for dir in ["tiny-llama", "tiny-qwen3"] {
        let package = std::sync::Arc::new(TargetPackage::open(fixture(dir)).unwrap());
        let tokens: Vec<u32> = (0..100).map(|i| (i * 37 % 512) as u32).collect();
        for (precision, kv_type) in [
            (Precision::Q8, KvType::F32),
            (Precision::Q8x2, KvType::Bf16),
            (Precision::Q8x2, KvType::Q8),
        ] {
            let run = |isa: Isa| {
                let options = CpuOptions {
                    kernel: isa,
                    precision,
                    kv_type,
                    ..Default::default()
                };
                let mut t = CpuTarget::with_options(&package, options).unwrap();
                t.forward(&tokens).unwrap()
            };
            let reference = run(Isa::scalar());
            for isa in Isa::available() {
                assert!(
                    run(isa) == reference,
                    "{dir}: {precision:?}, {} KV: forward on {} differs",
                    kv_type.name(),
                    isa.name()
                );
            }
        }
    }
}

/// bf16 and q8 KV against f32 KV (the same f32 projections) on the tiny fixtures, 100
/// positions: the max |diff| of the logits, measured, stays under the stated bounds, and
/// the KV memory is the type's bytes per position (grown a key block at a time).
#[test]
fn kv_types_stay_close_to_f32_kv() {
    for dir in ["tiny-llama", "tiny-qwen3"] {
        let package = std::sync::Arc::new(TargetPackage::open(fixture(dir)).unwrap());
        let c = &package.config;
        let tokens: Vec<u32> = (0..100).map(|i| (i * 53 % 512) as u32).collect();
        let mut reference = target_kv(&package, Precision::F32, KvType::F32);
        let want = reference.forward(&tokens).unwrap();
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (kv_type, bound) in [
            (KvType::Bf16, BF16_KV_TOLERANCE),
            (KvType::Q8, Q8_KV_TOLERANCE),
        ] {
            let mut t = target_kv(&package, Precision::F32, kv_type);
            assert_eq!(t.kv_type(), kv_type);
            let d = max_diff(&t.forward(&tokens).unwrap(), &want);
            eprintln!(
                "{dir} {} KV: max |diff| logits vs f32 KV {d:.2e} (max |logit| {scale:.2})",
                kv_type.name()
            );
            assert!(
                d < bound,
                "{dir} {} KV: logits differ by {d}",
                kv_type.name()
            );
            let blocks = 100usize.div_ceil(64) * 64;
            let per_head = match kv_type {
                KvType::F32 => blocks * c.head_dim * 4 + 100 * c.head_dim * 4,
                KvType::Bf16 => blocks * c.head_dim * 2 + 100 * c.head_dim * 2,
                KvType::Q8 => blocks * (c.head_dim + 4) + 100 * (c.head_dim + 4),
            };
            assert_eq!(t.kv_bytes(), per_head * c.num_kv_heads * c.num_layers);
        }
    }
}

/// bf16 KV vs f32 KV, max |diff| of the logits on these random-weight models, measured:
/// 8.0e-2 (tiny-llama, max |logit| 14.9), 1.7e-2 (tiny-qwen3, 13.0); bound about 3x the
/// worst. Quality on real text: `onebit perplexity` (README).
const BF16_KV_TOLERANCE: f32 = 0.25;
/// q8 KV vs f32 KV, measured: 0.27 (tiny-llama), 7.2e-2 (tiny-qwen3); bound about 3x.
const Q8_KV_TOLERANCE: f32 = 0.8;

/// q8 against transformers' float32 reference on the tiny fixtures. int8 activations
/// round each input by up to half a step (1/254 of its group's largest magnitude); on
/// these random-weight models that compounds to a max |diff| of the logits of 0.61
/// (tiny-llama, max |logit| 16.1) and 0.41 (tiny-qwen3, 12.7), measured. The bound,
/// 1.0, is ~1.6x the worst; greedy steps are checked where the reference's margin
/// exceeds twice it. Quality on real text is measured by `onebit perplexity` (README).
#[test]
fn q8_stays_close_to_transformers() {
    for (precision, tolerance) in [(Precision::Q8, 1.0), (Precision::Q8x2, Q8X2_TOLERANCE)] {
        close_to_transformers(precision, tolerance);
    }
}

/// Two int8 levels carry activations to ~15 bits: measured max |diff| of the logits
/// 3.2e-3 (tiny-llama) and 1.7e-3 (tiny-qwen3); bound 1e-2, about 3x the worst.
const Q8X2_TOLERANCE: f32 = 1e-2;

fn close_to_transformers(precision: Precision, tolerance: f32) {
    let q8_tolerance = tolerance;
    for dir in ["tiny-llama", "tiny-qwen3"] {
        let package = std::sync::Arc::new(TargetPackage::open(fixture(dir)).unwrap());
        let reference = Container::open(fixture(dir).join("reference.safetensors")).unwrap();
        let get = |name: &str| reference.tensor(name).unwrap().to_f32().unwrap();
        let tokens: Vec<u32> = reference
            .tensor("tokens")
            .unwrap()
            .to_i64()
            .unwrap()
            .iter()
            .map(|&t| t as u32)
            .collect();
        let mut t = target(&package, precision);
        let logits = t.forward(&tokens).unwrap();
        let d = max_diff(&logits, &get("logits"));
        let scale = get("logits").iter().fold(0f32, |a, v| a.max(v.abs()));
        let mut f = target(&package, Precision::F32);
        let d32 = max_diff(&f.forward(&tokens).unwrap(), &logits);
        eprintln!("{dir} {precision:?}: max |diff| logits {d:.2e} (vs our f32 {d32:.2e}; max |logit| {scale:.2})");
        assert!(
            d < q8_tolerance,
            "{dir}: {precision:?} logits differ by {d}"
        );
        let greedy = reference.tensor("greedy").unwrap().to_i64().unwrap();
        let margins = get("greedy_margin");
        let mut next = argmax(&logits[11 * 512..]) as u32;
        for (step, (&want, &margin)) in greedy.iter().zip(&margins).enumerate() {
            if margin > 2.0 * q8_tolerance {
                assert_eq!(
                    next as i64, want,
                    "{dir}: {precision:?} greedy step {step} (margin {margin})"
                );
            }
            next = argmax(&t.forward(&[want as u32]).unwrap()) as u32;
        }
    }
}

/// Sessions of one shared model, run at the same time on several threads, each give the
/// logits a lone session gives: the model is read-only, every session's state is its own,
/// and the shared team takes the threads' regions in turn without mixing them.
#[test]
fn concurrent_sessions_over_one_model_equal_a_lone_session() {
    let package = Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    for precision in [Precision::F32, Precision::Q8x2] {
        let options = CpuOptions {
            precision,
            ..Default::default()
        };
        let model = npu_runtime::CpuModel::load(package.clone(), options).unwrap();
        // Eight sessions of 30 steps, three times over: enough overlapping regions that
        // posters without the team's turn-taking collide (the mutant is caught by chance
        // of timing, so the test gives it many chances).
        let prompts: Vec<Vec<u32>> = (0..8u32)
            .map(|s| (0..20).map(|i| (i * 31 + s * 97) % 512).collect())
            .collect();
        // Prefill, then 30 single-token steps, each session on its own prompt.
        let run = |prompt: &[u32]| {
            let mut session = model.session();
            let mut out = session.forward(prompt).unwrap();
            let vocab = model.config().vocab_size;
            for _ in 0..30 {
                let next = argmax(&out[out.len() - vocab..]) as u32;
                out = session.forward(&[next]).unwrap();
            }
            out
        };
        let alone: Vec<Vec<f32>> = prompts.iter().map(|p| run(p)).collect();
        for _ in 0..3 {
            let together: Vec<Vec<f32>> = std::thread::scope(|scope| {
                let handles: Vec<_> = prompts.iter().map(|p| scope.spawn(|| run(p))).collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(
                alone == together,
                "{}: concurrent sessions differ from lone ones",
                precision.name()
            );
        }
    }
}

/// A chunked prefill gives the whole prompt's last logits and tap rows bit for bit at
/// every chunk size and KV type; cancelling between chunks stops with the chunks run so
/// far cached, and the prefill can go on from there to the same bits.
#[test]
fn chunked_prefill_is_exact_and_cancellable() {
    use std::sync::atomic::AtomicBool;
    let package = Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    let tokens: Vec<u32> = (0..150).map(|i| (i * 71 % 512) as u32).collect();
    for kv_type in KvType::ALL {
        let run = |chunk: usize| {
            let mut t = target_kv(&package, Precision::Q8x2, kv_type);
            let sink = Arc::new(Mutex::new(TapRows::new(0)));
            t.set_layer_taps(&[0, 1], sink.clone()).unwrap();
            let logits = t.prefill(&tokens, chunk, &AtomicBool::new(false)).unwrap();
            assert_eq!(t.position(), tokens.len());
            let rows = sink.lock().unwrap().clone();
            (logits, rows)
        };
        let mut whole = target_kv(&package, Precision::Q8x2, kv_type);
        let sink = Arc::new(Mutex::new(TapRows::new(0)));
        whole.set_layer_taps(&[0, 1], sink.clone()).unwrap();
        let want = whole.forward_last(&tokens).unwrap();
        let want_rows = sink.lock().unwrap().clone();
        for chunk in [1, 5, 63, 64, 100, 150, 1000] {
            let (logits, rows) = run(chunk);
            assert!(
                logits == want,
                "{} KV, chunk {chunk}: logits differ",
                kv_type.name()
            );
            assert!(
                rows == want_rows,
                "{} KV, chunk {chunk}: taps differ",
                kv_type.name()
            );
        }

        // Stop before the third chunk of 40, then go on.
        let mut t = target_kv(&package, Precision::Q8x2, kv_type);
        let mut asked = Vec::new();
        let err = t
            .prefill_with(&tokens, 40, &mut |p| {
                asked.push(p);
                asked.len() < 3
            })
            .unwrap_err();
        assert_eq!(asked, [0, 40, 80]);
        assert_eq!(err.to_string(), "target: prefill cancelled at position 80");
        assert_eq!(t.position(), 80);
        let rest = t
            .prefill(&tokens[80..], 40, &AtomicBool::new(false))
            .unwrap();
        assert!(
            rest == want,
            "{} KV: resumed prefill differs",
            kv_type.name()
        );
    }
    // A flag set before the call stops it before any work.
    let mut t = target(&package, Precision::F32);
    let err = t.prefill(&tokens, 16, &AtomicBool::new(true)).unwrap_err();
    assert_eq!(err.to_string(), "target: prefill cancelled at position 0");
    assert_eq!(t.position(), 0);
}

/// Sessions that share passes through a [`PassBatcher`] each get, bit for bit, the
/// logits and tap rows they get alone: decode steps, speculative blocks with rollbacks
/// and prefill chunks of several sessions at different positions run as one pass. The
/// batcher waits for every member (a linger far longer than the test), so each pass
/// holds every session still running, and a session that finishes leaves at once: the
/// others would otherwise wait out the linger at every step (the watchdog fails that).
#[test]
fn batched_sessions_equal_lone_sessions() {
    let package = Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    for precision in [Precision::F32, Precision::Q8x2] {
        let options = CpuOptions {
            precision,
            kv_type: KvType::Bf16,
            ..Default::default()
        };
        let model = npu_runtime::CpuModel::load(package.clone(), options).unwrap();
        let vocab = model.config().vocab_size;
        // Session s: a prompt of 10 + 25 s tokens prefilled in chunks of 16, then
        // `8 + 4 s` rounds of a block of 1 + (round % 4) rows whose first row is the
        // greedy pick, rolled back to keep half of it (a speculative round's shape).
        let script = move |target: &mut CpuTarget, s: usize| -> (Vec<f32>, TapRows) {
            let sink = Arc::new(Mutex::new(TapRows::new(0)));
            if s.is_multiple_of(2) {
                target.set_layer_taps(&[1, 0], sink.clone()).unwrap();
            }
            let prompt: Vec<u32> = (0..10 + 25 * s as u32)
                .map(|i| (i * 37 + s as u32 * 11) % 512)
                .collect();
            let mut seen = Vec::new();
            let mut last = Vec::new();
            for chunk in prompt.chunks(16) {
                last = target.forward_last(chunk).unwrap();
                seen.extend_from_slice(&last);
            }
            for round in 0..8 + 4 * s {
                let next = argmax(&last[last.len() - vocab..]) as u32;
                let block: Vec<u32> = (0..1 + round % 4)
                    .map(|j| {
                        if j == 0 {
                            next
                        } else {
                            (next + j as u32 * 7) % 512
                        }
                    })
                    .collect();
                let at = target.position();
                let logits = target.forward(&block).unwrap();
                seen.extend_from_slice(&logits);
                let keep = block.len().div_ceil(2);
                target.truncate(at + keep).unwrap();
                sink.lock().unwrap().truncate(at + keep);
                last = logits[(keep - 1) * vocab..keep * vocab].to_vec();
            }
            let rows = sink.lock().unwrap().clone();
            (seen, rows)
        };
        let alone: Vec<_> = (0..4).map(|s| script(&mut model.session(), s)).collect();
        let (together, batcher) = common::in_shared_passes(&model, 4, script);
        for (s, (alone, together)) in alone.iter().zip(&together).enumerate() {
            assert!(
                alone.0 == together.0,
                "{}: session {s}'s logits differ when batched",
                precision.name()
            );
            assert!(
                alone.1 == together.1,
                "{}: session {s}'s tap rows differ when batched",
                precision.name()
            );
        }
        let stats = batcher.stats();
        assert_eq!(batcher.members(), 0);
        assert_eq!(stats.widest, 4, "{stats:?}: the first passes hold all four");
        assert!(stats.passes < stats.parts, "{stats:?}");
    }
}

/// A batched session whose rows are refused gets its error; the sessions sharing the
/// pass get their answers as alone.
#[test]
fn a_refused_part_leaves_the_shared_pass_running() {
    use npu_runtime::PassBatcher;
    use std::time::Duration;
    let package = Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    let model = npu_runtime::CpuModel::load(package, CpuOptions::default()).unwrap();
    let alone = model.session().forward(&[5, 6, 7]).unwrap();
    let batcher = PassBatcher::new(model.clone(), Duration::from_secs(3600));
    let (a, b) = (batcher.member(), batcher.member());
    let (good, bad) = std::thread::scope(|scope| {
        let good = scope.spawn(|| {
            let mut t = model.session();
            t.join(batcher.clone()).unwrap();
            let out = t.forward(&[5, 6, 7]);
            drop(a);
            out
        });
        let bad = scope.spawn(|| {
            let mut t = model.session();
            t.join(batcher.clone()).unwrap();
            let out = t.forward(&[1, 100_000]);
            drop(b);
            (out, t.position())
        });
        (good.join().unwrap(), bad.join().unwrap())
    });
    assert!(good.unwrap() == alone, "the good part's logits differ");
    assert_eq!(
        bad.0.unwrap_err().to_string(),
        "target: token id 100000 is outside the vocabulary of 512"
    );
    assert_eq!(bad.1, 0, "a refused part runs nothing");
    let mut t = model.session();
    t.join(batcher.clone()).unwrap();
    assert!(
        t.forward(&[5, 6, 7]).unwrap() == alone,
        "a lone submit runs at once"
    );
    assert_eq!(batcher.stats().widest, 2);
}

/// A session cannot join a batcher over another model, even one loaded from the same
/// package (its weights are another copy): refused by name, and the session runs alone
/// as before.
#[test]
fn a_session_cannot_join_a_batcher_over_another_model() {
    use npu_runtime::PassBatcher;
    use std::time::Duration;
    let package = Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    let one = npu_runtime::CpuModel::load(package.clone(), CpuOptions::default()).unwrap();
    let other = npu_runtime::CpuModel::load(package, CpuOptions::default()).unwrap();
    let batcher = PassBatcher::new(one.clone(), Duration::from_secs(3600));
    let mut t = other.session();
    assert_eq!(
        t.join(batcher.clone()).unwrap_err().to_string(),
        "target: a session can only share passes with sessions over the same model"
    );
    assert!(t.forward(&[5, 6, 7]).unwrap() == other.session().forward(&[5, 6, 7]).unwrap());
    assert_eq!(
        batcher.stats().passes,
        0,
        "the refused session ran no shared pass"
    );
}
