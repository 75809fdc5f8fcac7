//! The attention family and the KV layout: every variant this CPU has equals the scalar
//! reference bit for bit at every KV type; a batch of rows equals each row alone; the
//! work split and the thread count change nothing; the reference is within a measured
//! bound of an f64 softmax over the stored keys and values; `exp2` is within its stated
//! error; bf16 and q8 storage round as documented; `truncate` is exact.

use onebit_kernels::attention::{self, attention_split, attention_visible, exp2, Split, BLOCK};
use onebit_kernels::kv::{KvHeadView, KvLayer, KvType};
use onebit_kernels::team::Team;
use onebit_kernels::Isa;
use proptest::prelude::*;

mod common;
use common::values;

struct Case {
    layer: KvLayer,
    queries: Vec<f32>,
    n: usize,
    p0: usize,
    heads: usize,
    scale: f32,
}

fn case(
    kv_type: KvType,
    kvh: usize,
    group: usize,
    hd: usize,
    len: usize,
    n: usize,
    seed: u64,
) -> Case {
    let mut layer = KvLayer::new(kv_type, kvh, hd);
    let k = values(len * kvh * hd, seed, 4.0);
    let v = values(len * kvh * hd, seed + 1, 2.0);
    // Append in uneven pieces, as prefill chunks and decode steps do.
    let mut at = 0;
    let mut piece = 1 + (seed as usize % 37);
    while at < len {
        let m = piece.min(len - at);
        let w = kvh * hd;
        layer.append(&k[at * w..(at + m) * w], &v[at * w..(at + m) * w], m);
        at += m;
        piece = piece * 3 % 101 + 1;
    }
    let heads = kvh * group;
    Case {
        layer,
        queries: values(n * heads * hd, seed + 2, 3.0),
        n,
        p0: len - n,
        heads,
        scale: 1.0 / (hd as f32).sqrt(),
    }
}

fn run(c: &Case, isa: Isa, split: Split) -> Vec<f32> {
    let hd = c.layer.head_dim();
    let mut out = vec![0f32; c.n * c.heads * hd];
    attention_split(
        isa, &c.layer, &c.queries, c.n, c.p0, c.heads, c.scale, &mut out, split,
    );
    out
}

/// Row `i` of `c` alone, over a layer holding only the positions up to it.
fn row_alone(c: &Case, i: usize) -> Case {
    let width = c.heads * c.layer.head_dim();
    let mut layer = c.layer.clone();
    layer.truncate(c.p0 + i + 1);
    Case {
        layer,
        queries: c.queries[i * width..(i + 1) * width].to_vec(),
        n: 1,
        p0: c.p0 + i,
        heads: c.heads,
        scale: c.scale,
    }
}

/// Softmax attention of one query head over `positions` of `view`, in f64 over the
/// stored keys and values; `vmax` grows to the largest |value| read.
fn f64_attention(
    view: &KvHeadView<'_>,
    q: &[f32],
    scale: f32,
    positions: std::ops::Range<usize>,
    vmax: &mut f64,
) -> Vec<f64> {
    let scores: Vec<f64> = positions
        .clone()
        .map(|t| {
            q.iter()
                .zip(&view.key_f32(t))
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * scale as f64
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let total: f64 = p.iter().sum();
    let mut out = vec![0f64; q.len()];
    for (t, &pt) in positions.zip(&p) {
        for (d, &v) in view.value_f32(t).iter().enumerate() {
            out[d] += pt / total * v as f64;
            *vmax = vmax.max((v as f64).abs());
        }
    }
    out
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
    }
    assert_eq!(got.len(), want.len());
}

fn isas() -> Vec<Isa> {
    let all = Isa::available();
    eprintln!(
        "attention variants compared: {}",
        all.iter()
            .map(|i| format!("{} ({})", i.name(), attention::variant_name(*i)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    all
}

/// Every variant and every split equals the reference; every row equals itself alone.
fn check(kv_type: KvType, kvh: usize, group: usize, hd: usize, len: usize, n: usize, seed: u64) {
    let c = case(kv_type, kvh, group, hd, len, n, seed);
    let want = run(&c, Isa::scalar(), Split::Rows);
    let what = |isa: Isa, s: &str| {
        format!(
            "{} ({}) {s}, {} kv, {kvh} kv heads x {group}, hd {hd}, len {len}, {n} rows",
            isa.name(),
            attention::variant_name(isa),
            kv_type.name()
        )
    };
    for isa in isas() {
        for split in [
            Split::Rows,
            Split::Blocks { per: 1 },
            Split::Blocks { per: 3 },
            Split::Auto,
        ] {
            assert_bits(
                &run(&c, isa, split),
                &want,
                &what(isa, &format!("{split:?}")),
            );
        }
        // Each row alone, over a layer holding only what that row sees.
        let width = c.heads * hd;
        for i in 0..n {
            let single = row_alone(&c, i);
            assert_bits(
                &run(&single, isa, Split::Auto),
                &want[i * width..(i + 1) * width],
                &what(isa, &format!("row {i} alone")),
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn variants_and_splits_equal_the_reference(
        kv in 0usize..3, kvh in 1usize..4, group in 1usize..6,
        hd in prop::sample::select(vec![16usize, 32, 48, 64, 128, 40]),
        len in 1usize..300, rows in 1usize..6, seed in 0u64..1000,
    ) {
        let n = rows.min(len);
        check(KvType::ALL[kv], kvh, group, hd, len, n, seed);
    }
}

/// `attention_visible`: each row, whatever it sees (the whole layer, as a DFlash block's
/// rows do, or any other count), equals a causal 1-row pass over just those positions,
/// on every variant and split.
fn check_visible(c: &Case, seed: u64) {
    let (hd, len, n) = (c.layer.head_dim(), c.layer.len(), c.n);
    let width = c.heads * hd;
    // Row 0 sees everything; the others a pseudo-random count in 1..=len.
    let counts: Vec<usize> = (0..n)
        .map(|i| match i {
            0 => len,
            _ => 1 + (seed as usize * 7919 + i * 104_729) % len,
        })
        .collect();
    for isa in isas() {
        for split in [Split::Rows, Split::Blocks { per: 2 }, Split::Auto] {
            let mut out = vec![0f32; n * width];
            attention_visible(
                isa,
                &c.layer,
                &c.queries,
                n,
                &|i| counts[i],
                c.heads,
                c.scale,
                &mut out,
                split,
            );
            for (i, &v) in counts.iter().enumerate() {
                let mut alone = c.layer.clone();
                alone.truncate(v);
                let single = Case {
                    layer: alone,
                    queries: c.queries[i * width..(i + 1) * width].to_vec(),
                    n: 1,
                    p0: v - 1,
                    heads: c.heads,
                    scale: c.scale,
                };
                assert_bits(
                    &out[i * width..(i + 1) * width],
                    &run(&single, Isa::scalar(), Split::Rows),
                    &format!("{} {split:?}: row {i} seeing {v} of {len}", isa.name()),
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn rows_that_see_any_count_equal_a_causal_row_alone(
        kv in 0usize..3, kvh in 1usize..4, group in 1usize..4,
        hd in prop::sample::select(vec![16usize, 64, 40]),
        len in 1usize..200, rows in 1usize..9, seed in 0u64..1000,
    ) {
        check_visible(&case(KvType::ALL[kv], kvh, group, hd, len, rows.min(len), seed), seed);
    }
}

#[test]
#[should_panic(expected = "sees 0 positions")]
fn a_row_that_sees_nothing_is_refused() {
    let c = case(KvType::F32, 1, 1, 16, 4, 1, 3);
    let mut out = vec![0f32; 16];
    attention_visible(
        Isa::scalar(),
        &c.layer,
        &c.queries,
        1,
        &|_| 0,
        1,
        c.scale,
        &mut out,
        Split::Auto,
    );
}

#[test]
fn block_edges_and_smollm2_geometry() {
    for kv_type in KvType::ALL {
        for len in [1, 63, 64, 65, 127, 128, 129, 200] {
            check(kv_type, 3, 3, 64, len, 1.min(len), len as u64);
            check(kv_type, 3, 3, 64, len, 4.min(len), len as u64 + 1);
        }
        check(kv_type, 2, 8, 128, 300, 3, 9);
    }
}

/// The thread count (a team of 1 or 2, rayon pools of 1 or 2) changes nothing.
#[test]
fn independent_of_the_thread_count() {
    for kv_type in KvType::ALL {
        for (len, n) in [(1000, 1), (700, 5), (130, 17)] {
            let c = case(kv_type, 3, 3, 64, len, n, 77);
            let want = run(&c, Isa::scalar(), Split::Rows);
            for isa in Isa::available() {
                for threads in [1, 2] {
                    let team = Team::new(threads, "attn-test").unwrap();
                    let got = team.install(|| run(&c, isa, Split::Auto));
                    assert_bits(&got, &want, &format!("{} team of {threads}", isa.name()));
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let got = pool.install(|| run(&c, isa, Split::Auto));
                    assert_bits(
                        &got,
                        &want,
                        &format!("{} rayon pool of {threads}", isa.name()),
                    );
                }
            }
        }
    }
}

/// `exp2` against `f64::exp2` on `[-125, 0]`: relative error at most 1.2e-7 (measured
/// 8.0e-8 over 2M points), and 0
/// below `EXP2_MIN`; the SIMD variants share it through the attention tests above.
#[test]
fn exp2_is_within_its_stated_error() {
    let mut worst = 0f64;
    let steps = 2_000_000;
    for i in 0..=steps {
        let x = -125.0 * (i as f64 / steps as f64);
        let x = x as f32;
        let got = exp2(x) as f64;
        let want = (x as f64).exp2();
        worst = worst.max(((got - want) / want).abs());
    }
    for x in [0.0f32, -0.0, -0.5, -1.0, -1e-8, -124.999] {
        let want = (x as f64).exp2();
        worst = worst.max(((exp2(x) as f64 - want) / want).abs());
    }
    eprintln!("exp2: worst relative error {worst:.3e}");
    assert!(worst <= 1.2e-7, "exp2 relative error {worst:e}");
    assert_eq!(exp2(0.0), 1.0);
    assert_eq!(exp2(-125.5), 0.0);
    assert_eq!(exp2(f32::NEG_INFINITY), 0.0);
}

/// The reference against softmax attention evaluated in f64 over the same stored keys
/// and values (the storage rounding is the KV type's, tested separately): the error is
/// within 1e-6 of the largest |value| (measured: 1.5e-7, up to 2048 positions).
#[test]
fn reference_is_close_to_f64_attention() {
    let mut worst = 0f64;
    for kv_type in KvType::ALL {
        for (len, n, seed) in [(1, 1, 1), (50, 3, 2), (333, 4, 3), (2048, 2, 4)] {
            let c = case(kv_type, 2, 2, 64, len, n, seed);
            let got = run(&c, Isa::scalar(), Split::Rows);
            let hd = 64;
            let group = 2;
            let mut vmax = 0f64;
            for i in 0..n {
                for h in 0..c.heads {
                    let view = c.layer.head(h / group);
                    let q = &c.queries[(i * c.heads + h) * hd..(i * c.heads + h + 1) * hd];
                    let want = f64_attention(&view, q, c.scale, 0..c.p0 + i + 1, &mut vmax);
                    let o = &got[(i * c.heads + h) * hd..(i * c.heads + h + 1) * hd];
                    for (g, w) in o.iter().zip(&want) {
                        worst = worst.max((*g as f64 - w).abs() / vmax);
                    }
                }
            }
        }
    }
    eprintln!("attention reference vs f64: worst error {worst:.3e} of max |v|");
    assert!(worst <= 1e-6, "reference vs f64: {worst:e}");
}

/// bf16 keys and values are the inputs rounded to nearest even; q8 ones are within half a
/// step of `d = max|v| / 127` per (position, kv head); f32 ones are exact.
#[test]
fn storage_rounds_as_documented() {
    let (kvh, hd, len) = (3, 64, 150);
    let k = values(len * kvh * hd, 5, 4.0);
    let v = values(len * kvh * hd, 6, 2.0);
    for kv_type in KvType::ALL {
        let mut layer = KvLayer::new(kv_type, kvh, hd);
        layer.append(&k, &v, len);
        for h in 0..kvh {
            let view = layer.head(h);
            for t in 0..len {
                let at = (t * kvh + h) * hd;
                for (src, got) in [(&k, view.key_f32(t)), (&v, view.value_f32(t))] {
                    let want = &src[at..at + hd];
                    let amax = want.iter().fold(0f32, |a, &x| a.max(x.abs()));
                    for (&w, &g) in want.iter().zip(&got) {
                        match kv_type {
                            KvType::F32 => assert_eq!(w.to_bits(), g.to_bits()),
                            KvType::Bf16 => {
                                assert_eq!(half::bf16::from_f32(w).to_f32().to_bits(), g.to_bits())
                            }
                            KvType::Q8 => {
                                assert!((w - g).abs() <= amax / 127.0 * 0.5001, "{w} vs {g}")
                            }
                        }
                    }
                }
            }
        }
        let expected = kv_type.bytes_per_position(hd) * kvh * len;
        let blocks_extra = match kv_type {
            // Keys (and their q8 scales) are allocated in whole blocks.
            KvType::F32 => (len.div_ceil(BLOCK) * BLOCK - len) * kvh * hd * 4,
            KvType::Bf16 => (len.div_ceil(BLOCK) * BLOCK - len) * kvh * hd * 2,
            KvType::Q8 => (len.div_ceil(BLOCK) * BLOCK - len) * kvh * (hd + 4),
        };
        assert_eq!(
            layer.byte_len(),
            expected + blocks_extra,
            "{}",
            kv_type.name()
        );
    }
}

/// Memory grows with use, one key block at a time; `truncate` leaves exactly what
/// appending the kept positions alone builds, and appending again repeats the bits.
#[test]
fn growth_and_truncate_are_exact() {
    let (kvh, hd, len) = (2, 32, 260);
    let k = values(len * kvh * hd, 11, 4.0);
    let v = values(len * kvh * hd, 12, 2.0);
    let w = kvh * hd;
    for kv_type in KvType::ALL {
        let mut full = KvLayer::new(kv_type, kvh, hd);
        for t in 0..len {
            full.append(&k[t * w..(t + 1) * w], &v[t * w..(t + 1) * w], 1);
            assert_eq!(full.key_elements(0), (t + 1).div_ceil(BLOCK) * BLOCK * hd);
        }
        for keep in [0, 1, 63, 64, 65, 128, 200, 259, 260] {
            let mut cut = full.clone();
            cut.truncate(keep);
            let mut fresh = KvLayer::new(kv_type, kvh, hd);
            fresh.append(&k[..keep * w], &v[..keep * w], keep);
            assert_eq!(cut, fresh, "{} truncate to {keep}", kv_type.name());
            cut.append(&k[keep * w..], &v[keep * w..], len - keep);
            assert_eq!(
                cut,
                full,
                "{} truncate to {keep} and replay",
                kv_type.name()
            );
        }
    }
}

/// The row-major reads a per-row kernel takes (the DFlash draft's context): every range
/// of positions, across block edges, gives each position's `key_f32` / `value_f32`
/// bits; f32 values are the store itself (borrowed), the other types widened copies.
#[test]
fn rows_of_a_range_equal_the_position_vectors() {
    let (kvh, hd, len) = (2, 48, 140);
    let k = values(len * kvh * hd, 21, 4.0);
    let v = values(len * kvh * hd, 22, 2.0);
    for kv_type in KvType::ALL {
        let mut layer = KvLayer::new(kv_type, kvh, hd);
        layer.append(&k, &v, len);
        let mut keys = vec![7.0; 3];
        for h in 0..kvh {
            let view = layer.head(h);
            for range in [
                0..0,
                0..1,
                0..len,
                5..64,
                63..65,
                64..128,
                100..140,
                139..140,
            ] {
                view.keys_rows_into(range.clone(), &mut keys);
                let values = view.values_rows(range.clone());
                assert_eq!(keys.len(), range.len() * hd, "{}", kv_type.name());
                assert_eq!(values.len(), range.len() * hd, "{}", kv_type.name());
                assert_eq!(
                    matches!(values, std::borrow::Cow::Borrowed(_)),
                    kv_type == KvType::F32,
                    "{}: only f32 values are borrowed",
                    kv_type.name()
                );
                for (i, t) in range.clone().enumerate() {
                    let row = i * hd..(i + 1) * hd;
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&keys[row.clone()]),
                        bits(&view.key_f32(t)),
                        "{} head {h} key {t} of {range:?}",
                        kv_type.name()
                    );
                    assert_eq!(
                        bits(&values[row]),
                        bits(&view.value_f32(t)),
                        "{} head {h} value {t} of {range:?}",
                        kv_type.name()
                    );
                }
            }
        }
        // Past what the head holds is refused by name.
        let view = layer.head(0);
        let err = std::panic::catch_unwind(|| view.values_rows(len - 1..len + 1)).unwrap_err();
        let message = err.downcast_ref::<String>().unwrap();
        assert!(message.contains("kv: values of positions"), "{message}");
    }
}

/// Several sequences' rows in one call ([`attention::attention_many`], a pass shared by
/// sessions) give each row exactly the bits of its own sequence's call, at every KV
/// type, on every variant, under one and two threads: sequences of different lengths
/// (one past several key blocks), decode rows and multi-row blocks side by side.
#[test]
fn sequences_together_equal_each_alone() {
    use attention::SequenceRows;
    let team = Team::new(2, "attention-many").unwrap();
    for kv_type in KvType::ALL {
        // (kv heads 3 × group 3, head_dim 64: SmolLM2's geometry.)
        let cases: Vec<Case> = [(150, 1, 11), (7, 3, 12), (64, 1, 13), (200, 5, 14)]
            .iter()
            .map(|&(len, n, seed)| case(kv_type, 3, 3, 64, len, n, seed))
            .collect();
        for isa in Isa::available() {
            let alone: Vec<f32> = cases
                .iter()
                .flat_map(|c| run(c, isa, Split::Auto))
                .collect();
            let mut at = 0;
            let sequences: Vec<SequenceRows<'_>> = cases
                .iter()
                .map(|c| {
                    at += c.n;
                    SequenceRows {
                        layer: &c.layer,
                        rows: at - c.n..at,
                        p0: c.p0,
                        window: None,
                    }
                })
                .collect();
            let queries: Vec<f32> = cases.iter().flat_map(|c| c.queries.clone()).collect();
            for threads in [1, 2] {
                let mut together = vec![0f32; alone.len()];
                let mut call = || {
                    attention::attention_many(
                        isa,
                        &sequences,
                        &queries,
                        9,
                        cases[0].scale,
                        &mut together,
                    )
                };
                match threads {
                    1 => call(),
                    _ => team.install(call),
                }
                assert_bits(
                    &together,
                    &alone,
                    &format!("{} {} kv, {threads} threads", isa.name(), kv_type.name()),
                );
            }
        }
    }
}

fn run_window(c: &Case, isa: Isa, split: Split, window: Option<usize>) -> Vec<f32> {
    let hd = c.layer.head_dim();
    let mut out = vec![0f32; c.n * c.heads * hd];
    attention::attention_window(
        isa, &c.layer, &c.queries, c.n, c.p0, c.heads, c.scale, window, &mut out, split,
    );
    out
}

/// A sliding-window layer's attention: every variant and split equals the scalar
/// reference bit for bit, each row equals itself alone, the result is within the
/// reference's bound of an f64 softmax over exactly the last `w` positions (a window
/// starting anywhere inside a key block), and a window wider than the context is plain
/// causal attention, bit for bit.
#[test]
fn sliding_window_sees_exactly_its_last_positions() {
    let hd = 64;
    let group = 2;
    let mut worst = 0f64;
    for kv_type in KvType::ALL {
        for (len, n, w, seed) in [
            (10, 10, 4, 1),
            (200, 5, 70, 2),
            (300, 3, 64, 3),
            (333, 40, 129, 4),
            (90, 2, 1, 5),
        ] {
            let c = case(kv_type, 2, group, hd, len, n, seed);
            let want = run_window(&c, Isa::scalar(), Split::Rows, Some(w));
            for isa in Isa::available() {
                for split in [
                    Split::Rows,
                    Split::Blocks { per: 1 },
                    Split::Blocks { per: 2 },
                    Split::Auto,
                ] {
                    assert_bits(
                        &run_window(&c, isa, split, Some(w)),
                        &want,
                        &format!("{} {split:?} window {w} len {len}", isa.name()),
                    );
                }
                let width = c.heads * hd;
                for i in [0, n - 1] {
                    let single = row_alone(&c, i);
                    assert_bits(
                        &run_window(&single, isa, Split::Auto, Some(w)),
                        &want[i * width..(i + 1) * width],
                        &format!("{} window {w}: row {i} alone", isa.name()),
                    );
                }
            }
            // Against f64 over the window only.
            let mut vmax = 0f64;
            for i in 0..n {
                let end = c.p0 + i + 1;
                let start = end.saturating_sub(w);
                for h in 0..c.heads {
                    let view = c.layer.head(h / group);
                    let q = &c.queries[(i * c.heads + h) * hd..(i * c.heads + h + 1) * hd];
                    let expect = f64_attention(&view, q, c.scale, start..end, &mut vmax);
                    let o = &want[(i * c.heads + h) * hd..(i * c.heads + h + 1) * hd];
                    for (g, e) in o.iter().zip(&expect) {
                        worst = worst.max((*g as f64 - e).abs() / vmax);
                    }
                }
            }
            assert_bits(
                &run_window(&c, Isa::scalar(), Split::Rows, Some(len + 1)),
                &run(&c, Isa::scalar(), Split::Rows),
                "a window past the context is causal attention",
            );
        }
    }
    eprintln!(
        "sliding-window attention vs f64 over the window: worst error {worst:.3e} of max |v|"
    );
    assert!(worst <= 1e-6, "windowed reference vs f64: {worst:e}");
}

/// Sequences with sliding windows in one [`attention::attention_many`] call give each
/// row the bits of its own windowed call (a shared pass over sliding-window layers).
#[test]
fn windowed_sequences_together_equal_each_alone() {
    use attention::SequenceRows;
    for kv_type in KvType::ALL {
        let cases: Vec<(Case, Option<usize>)> = [
            (150, 1, 21, Some(70)),
            (9, 3, 22, Some(4)),
            (200, 5, 23, None),
        ]
        .into_iter()
        .map(|(len, n, seed, w)| (case(kv_type, 1, 4, 64, len, n, seed), w))
        .collect();
        for isa in Isa::available() {
            let alone: Vec<f32> = cases
                .iter()
                .flat_map(|(c, w)| run_window(c, isa, Split::Auto, *w))
                .collect();
            let mut at = 0;
            let sequences: Vec<SequenceRows<'_>> = cases
                .iter()
                .map(|(c, w)| {
                    at += c.n;
                    SequenceRows {
                        layer: &c.layer,
                        rows: at - c.n..at,
                        p0: c.p0,
                        window: *w,
                    }
                })
                .collect();
            let queries: Vec<f32> = cases.iter().flat_map(|(c, _)| c.queries.clone()).collect();
            let mut together = vec![0f32; alone.len()];
            attention::attention_many(
                isa,
                &sequences,
                &queries,
                4,
                cases[0].0.scale,
                &mut together,
            );
            assert_bits(
                &together,
                &alone,
                &format!("{} {} kv windowed", isa.name(), kv_type.name()),
            );
        }
    }
}
