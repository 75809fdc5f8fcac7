//! The `q8` family: every variant this CPU has equals the scalar reference bit for bit
//! (shapes with K not a multiple of 256, N not a multiple of 32, 1–16 rows, one and two
//! activation levels); a batched
//! call equals single-row calls; the reference itself equals an independent float64
//! evaluation of the same quantized operands; stacking matrices changes nothing.

use half::bf16;
use onebit_kernels::q8::{self, reference, I8Matrix, Levels, PackedQ4, QuantizedRows};
use onebit_kernels::Isa;
use proptest::prelude::*;
use q4nx_format::{encode_q4_1, Q4Kind, Q4Matrix};

mod common;
use common::values;

fn isas() -> Vec<Isa> {
    let all = Isa::available();
    eprintln!(
        "q8 variants compared: {}",
        all.iter()
            .map(|i| format!("{} ({})", i.name(), q8::variant_name(*i)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    all
}

/// Every variant equals the reference per element, and batch rows equal single rows.
fn check_q4(n_out: usize, k: usize, rows: usize, seed: u64, kind: Q4Kind, levels: Levels) {
    let tiles = encode_q4_1(&values(n_out * k, seed, 0.2), n_out, k).unwrap();
    let w = Q4Matrix::from_bytes("w", &tiles, n_out, k, kind).unwrap();
    let packed = PackedQ4::new(&w);
    let x = values(rows * k, seed + 1, 2.0);
    let mut xq = QuantizedRows::default();
    xq.quantize_levels(&x, rows, k, levels);
    let stride = packed.stride();
    let want: Vec<f32> = (0..rows)
        .flat_map(|i| (0..stride).map(move |r| (i, r)))
        .map(|(i, r)| reference::dot_q4(&packed, r, &xq, i))
        .collect();
    for isa in isas() {
        // NaN where nothing was written would fail the comparison below.
        let mut y = vec![f32::NAN; rows * stride];
        q8::matmul_q4(&packed, &xq, &mut y, isa);
        for (at, (&got, &exp)) in y.iter().zip(&want).enumerate() {
            assert_eq!(
                got.to_bits(),
                exp.to_bits(),
                "{} ({}): row {} out {} of {n_out}x{k}, {rows} rows: {got} vs reference {exp}",
                isa.name(),
                q8::variant_name(isa),
                at / stride,
                at % stride
            );
        }
        for i in 0..rows {
            let mut single = QuantizedRows::default();
            single.quantize_levels(&x[i * k..(i + 1) * k], 1, k, levels);
            let mut one = vec![0f32; stride];
            q8::matmul_q4(&packed, &single, &mut one, isa);
            assert_eq!(
                one,
                y[i * stride..(i + 1) * stride],
                "batch invariance, row {i}"
            );
        }
    }
    // The AMX variant's logic on the tile emulator, on every machine.
    let mut y = vec![f32::NAN; rows * stride];
    q8::amx::matmul_q4_emulated(&packed, &xq, &mut y);
    assert_bits_equal(
        &y,
        &want,
        stride,
        &format!("emulated AMX, {n_out}x{k}, {rows} rows"),
    );
    for i in 0..rows {
        let mut single = QuantizedRows::default();
        single.quantize_levels(&x[i * k..(i + 1) * k], 1, k, levels);
        let mut one = vec![0f32; stride];
        q8::amx::matmul_q4_emulated(&packed, &single, &mut one);
        assert_eq!(
            one,
            y[i * stride..(i + 1) * stride],
            "emulated AMX batch invariance, row {i}"
        );
    }
}

/// `got` equals `want` bit for bit (rows of `stride` outputs), naming the first miss.
fn assert_bits_equal(got: &[f32], want: &[f32], stride: usize, what: &str) {
    for (at, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{what}: row {} out {}: {g} vs reference {w}",
            at / stride,
            at % stride
        );
    }
}

/// An `n_out × k` BF16 matrix of random values (as an embedding's bytes).
fn bf16_weights(n_out: usize, k: usize, seed: u64) -> Vec<u8> {
    values(n_out * k, seed, 0.3)
        .iter()
        .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
        .collect()
}

fn check_i8(n_out: usize, k: usize, rows: usize, seed: u64, levels: Levels) {
    let w = I8Matrix::from_bf16(&bf16_weights(n_out, k, seed), n_out, k);
    let x = values(rows * k, seed + 7, 2.0);
    let mut xq = QuantizedRows::default();
    xq.quantize_levels(&x, rows, k, levels);
    let want: Vec<f32> = (0..rows)
        .flat_map(|i| (0..n_out).map(move |r| (i, r)))
        .map(|(i, r)| reference::dot_i8(&w, r, &xq, i))
        .collect();
    for isa in isas() {
        // NaN where nothing was written would fail the comparison below.
        let mut y = vec![f32::NAN; rows * n_out];
        q8::matmul_i8(&w, &xq, &mut y, isa);
        assert_bits_equal(
            &y,
            &want,
            n_out,
            &format!("{}: int8 {n_out}x{k}", isa.name()),
        );
    }
    let mut y = vec![f32::NAN; rows * n_out];
    q8::amx::matmul_i8_emulated(&w, &xq, &mut y);
    assert_bits_equal(&y, &want, n_out, &format!("emulated AMX: int8 {n_out}x{k}"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn q4_variants_equal_the_reference(
        blocks in 1usize..4, tail in 0usize..32, groups in 1usize..20, rows in 1usize..17,
        seed in 0u64..1000, q4_0 in any::<bool>(), two in any::<bool>(),
    ) {
        let n_out = (blocks - 1) * 32 + tail.max(1);
        let kind = if q4_0 { Q4Kind::Q4_0 } else { Q4Kind::Q4_1 };
        let levels = if two { Levels::Two } else { Levels::One };
        check_q4(n_out, groups * 32, rows, seed, kind, levels);
    }

    /// Quantization gives the baseline's bits on every ISA (codes, scales, sums, code
    /// sums), at both levels, with special values (NaN, ±∞, ±0, huge, subnormal) and
    /// all-zero groups among the inputs.
    #[test]
    fn quantization_is_the_same_on_every_isa(
        groups in 1usize..20, rows in 1usize..9, seed in 0u64..1000, two in any::<bool>(),
        special in proptest::collection::vec((0usize..640, 0usize..7), 0..4),
        zero_group in proptest::option::of(0usize..40),
    ) {
        let levels = if two { Levels::Two } else { Levels::One };
        let k = groups * 32;
        let mut x = values(rows * k, seed, 3.0);
        const SPECIAL: [f32; 7] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 3e38, 1e-40];
        for (at, which) in special {
            if at < x.len() {
                x[at] = SPECIAL[which];
            }
        }
        if let Some(g) = zero_group.filter(|&g| (g + 1) * 32 <= x.len()) {
            x[g * 32..(g + 1) * 32].fill(-0.0);
        }
        quantizes_like_the_baseline_on_every_isa(&x, rows, k, levels);
    }

    #[test]
    fn int8_variants_equal_the_reference(
        n_out in 1usize..300, groups in 1usize..12, rows in 1usize..17, seed in 0u64..1000,
        two in any::<bool>(),
    ) {
        let levels = if two { Levels::Two } else { Levels::One };
        check_i8(n_out, groups * 32, rows, seed, levels);
    }
}

/// Every special value in every lane position, at both levels: each ISA's quantizer
/// gives the baseline's codes and stats (NaN codes as 0, ±∞ saturates the group).
#[test]
fn special_values_quantize_the_same_on_every_isa() {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        3e38,
        1e-40,
        0.5,
    ];
    let k = 64;
    let mut x = values(specials.len() * 32 * k, 9, 3.0);
    for (j, &v) in specials.iter().enumerate() {
        for lane in 0..32 {
            x[(j * 32 + lane) * k + lane] = v;
            x[(j * 32 + lane) * k + 32 + (lane * 7) % 32] = v;
        }
    }
    let rows = x.len() / k;
    for levels in [Levels::One, Levels::Two] {
        quantizes_like_the_baseline_on_every_isa(&x, rows, k, levels);
    }
}

/// Every ISA's quantization of `x` has the baseline's bits: codes, scales, sums and
/// code sums of every level row and group.
fn quantizes_like_the_baseline_on_every_isa(x: &[f32], rows: usize, k: usize, levels: Levels) {
    let mut base = QuantizedRows::default();
    base.quantize_levels_on(Isa::scalar(), x, rows, k, levels);
    for isa in isas() {
        let mut q = QuantizedRows::default();
        q.quantize_levels_on(isa, x, rows, k, levels);
        let name = isa.name();
        for r in 0..q.level_rows() {
            assert_eq!(q.codes(r), base.codes(r), "{name} codes of level row {r}");
            for g in 0..k / 32 {
                let at = format!("{name} level row {r} group {g}");
                assert_eq!(q.sum(r, g).to_bits(), base.sum(r, g).to_bits(), "sum, {at}");
                assert_eq!(
                    q.scale(r, g).to_bits(),
                    base.scale(r, g).to_bits(),
                    "scale, {at}"
                );
                assert_eq!(q.code_sum(r, g), base.code_sum(r, g), "code sum, {at}");
            }
        }
    }
}

#[test]
fn smollm2_shapes() {
    for levels in [Levels::One, Levels::Two] {
        check_q4(576, 576, 8, 1, Q4Kind::Q4_1, levels);
        check_q4(576, 1536, 3, 2, Q4Kind::Q4_1, levels);
        check_i8(100, 576, 9, 3, levels);
    }
}

/// The reference against an independent float64 evaluation of the same operands:
/// dequantized weights (`Q4Matrix::decode`, the format crate's decoder) times the
/// dequantized inputs (`code · dx`; the mins times the float group sums). The only
/// difference is f32 rounding of a few dozen terms: bound 1e-5 of the row's magnitude.
#[test]
fn reference_matches_float64_on_quantized_operands() {
    let (n_out, k, rows) = (70, 320, 3);
    for kind in [Q4Kind::Q4_1, Q4Kind::Q4_0] {
        let tiles = encode_q4_1(&values(n_out * k, 11, 0.2), n_out, k).unwrap();
        let w = Q4Matrix::from_bytes("w", &tiles, n_out, k, kind).unwrap();
        let dense = w.decode();
        let packed = PackedQ4::new(&w);
        let x = values(rows * k, 12, 2.0);
        let xq = QuantizedRows::quantize(&x, rows, k);
        for i in 0..rows {
            for r in 0..n_out {
                let mut exact = 0f64;
                let mut magnitude = 0f64;
                for g in 0..k / 32 {
                    // w = d·code + m: Σ w·x̂ with x̂ = code_x·dx for the d·code part and
                    // the float sum for the m part is what the family computes.
                    for c in 0..32 {
                        let col = g * 32 + c;
                        let wv = dense[r * k + col] as f64;
                        let xv = xq.codes(i)[col] as f64 * xq.scale(i, g) as f64;
                        exact += wv * xv;
                        magnitude += (wv * xv).abs();
                    }
                    // Correct the m part from the quantized inputs to the float sum.
                    let m = w_min(&w, r, g) as f64;
                    let qsum: f64 = (0..32)
                        .map(|c| xq.codes(i)[g * 32 + c] as f64 * xq.scale(i, g) as f64)
                        .sum();
                    exact += m * (xq.sum(i, g) as f64 - qsum);
                }
                let got = reference::dot_q4(&packed, r, &xq, i) as f64;
                assert!(
                    (got - exact).abs() <= 1e-5 * magnitude.max(1e-3),
                    "{kind:?} row {r} input {i}: {got} vs {exact} (magnitude {magnitude})"
                );
            }
        }
    }
}

/// The min of row `r`, group `g`, read from the tile bytes (q4_0: `-8d`).
fn w_min(w: &Q4Matrix, r: usize, g: usize) -> f32 {
    let tile = w.tile(r / 32, g * 32 / 256);
    let s = (g % 8) * 32 + r % 32;
    let at = |o: usize| bf16::from_le_bytes([tile[o], tile[o + 1]]).to_f32();
    match w.kind() {
        Q4Kind::Q4_1 => at(q4nx_format::MIN_OFFSET + 2 * s),
        Q4Kind::Q4_0 => -8.0 * at(2 * s),
    }
}

/// Quantization is per row: codes within ±127, the group's largest magnitude maps to
/// ±127, zero groups stay zero with scale 0, and non-finite inputs neither panic nor
/// produce out-of-range codes.
#[test]
fn quantization_per_group() {
    let mut x = values(96, 5, 3.0);
    x[40] = 10.0;
    x[64..96].fill(0.0);
    let q = QuantizedRows::quantize(&x, 1, 96);
    assert_eq!(q.codes(0)[40], 127);
    assert_eq!(q.scale(0, 1), 10.0 / 127.0);
    assert_eq!(q.scale(0, 2), 0.0);
    assert!(q.codes(0)[64..].iter().all(|&c| c == 0));
    for (c, &v) in q.codes(0)[..32].iter().zip(&x[..32]) {
        let back = *c as f32 * q.scale(0, 0);
        assert!((back - v).abs() <= q.scale(0, 0) * 0.5 + 1e-6, "{v} -> {c}");
    }
    let odd = [f32::NAN, f32::INFINITY, -1.0, 2.0]
        .iter()
        .cycle()
        .take(32)
        .copied()
        .collect::<Vec<_>>();
    let q = QuantizedRows::quantize(&odd, 1, 32);
    assert!(q.codes(0).iter().all(|&c| (-127..=127).contains(&c)));
}

/// Stacked matrices give each part exactly what it gives alone.
#[test]
fn stacking_changes_nothing() {
    let k = 576;
    let parts: Vec<Vec<u8>> = [(64, 1), (40, 2), (96, 3)]
        .iter()
        .map(|&(n, s)| encode_q4_1(&values(n * k, s, 0.2), n, k).unwrap())
        .collect();
    let rows = [64, 40, 96];
    let mats: Vec<Q4Matrix> = parts
        .iter()
        .zip(rows)
        .map(|(t, n)| Q4Matrix::from_bytes("w", t, n, k, Q4Kind::Q4_1).unwrap())
        .collect();
    let stacked = PackedQ4::stack(&[&mats[0], &mats[1], &mats[2]]);
    let x = values(3 * k, 9, 1.0);
    let xq = QuantizedRows::quantize(&x, 3, k);
    let mut y = vec![0f32; 3 * stacked.stride()];
    q8::matmul_q4(&stacked, &xq, &mut y, Isa::detect());
    for (p, m) in mats.iter().enumerate() {
        let alone = PackedQ4::new(m);
        let mut ya = vec![0f32; 3 * alone.stride()];
        q8::matmul_q4(&alone, &xq, &mut ya, Isa::detect());
        let range = stacked.part(p);
        assert_eq!(range.len(), m.rows());
        for i in 0..3 {
            assert_eq!(
                &y[i * stacked.stride() + range.start..i * stacked.stride() + range.end],
                &ya[i * alone.stride()..i * alone.stride() + m.rows()],
                "part {p} input {i}"
            );
        }
    }
}

/// A model's projections packed into one shared buffer ([`PackedQ4::stack_many`]) give
/// each stack exactly what it gives packed alone, past the 2 MiB at which the buffer is
/// an anonymous map advised to use huge pages.
#[test]
fn packing_many_stacks_into_one_buffer_changes_nothing() {
    // Differently shaped stacks: 1.5 MB + 1.1 MB + small ones.
    let shapes = [(96, 576), (40, 576), (1536, 1536), (1024, 1792), (70, 1792)];
    let tiles: Vec<Vec<u8>> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(n, k))| encode_q4_1(&values(n * k, i as u64 + 1, 0.2), n, k).unwrap())
        .collect();
    let m: Vec<Q4Matrix> = tiles
        .iter()
        .zip(shapes)
        .map(|(t, (n, k))| Q4Matrix::from_bytes("w", t, n, k, Q4Kind::Q4_1).unwrap())
        .collect();
    let (a, b, c, d, e) = (&m[0], &m[1], &m[2], &m[3], &m[4]);
    let stacks: [&[&Q4Matrix]; 4] = [&[a, b], &[c], &[d, e], &[b]];
    let many = PackedQ4::stack_many(&stacks);
    assert_eq!(many.len(), stacks.len());
    let total: usize = many.iter().map(PackedQ4::byte_len).sum();
    assert!(
        total > 2 << 20,
        "the shared buffer is past one huge page: {total} bytes"
    );
    for (i, (shared, parts)) in many.iter().zip(stacks).enumerate() {
        let alone = PackedQ4::stack(parts);
        assert_eq!(shared.byte_len(), alone.byte_len(), "stack {i}");
        assert_eq!(shared.stride(), alone.stride(), "stack {i}");
        let k = shared.cols();
        let x = values(3 * k, 11 + i as u64, 1.0);
        let xq = QuantizedRows::quantize(&x, 3, k);
        let mut ys = vec![0f32; 3 * shared.stride()];
        let mut ya = vec![0f32; 3 * alone.stride()];
        q8::matmul_q4(shared, &xq, &mut ys, Isa::detect());
        q8::matmul_q4(&alone, &xq, &mut ya, Isa::detect());
        assert_eq!(ys, ya, "stack {i}: shared buffer against packed alone");
    }
}

#[test]
fn weight_bytes_are_zeroed_and_large_ones_are_advised_huge() {
    use onebit_kernels::pages::WeightBytes;
    let small = WeightBytes::zeroed(1000);
    assert_eq!(small.len(), 1000);
    assert!(small.iter().all(|&b| b == 0));
    assert!(!small.advised_huge(), "below one huge page: the heap");
    let mut large = WeightBytes::zeroed(5 << 20);
    assert_eq!(large.len(), 5 << 20);
    assert!(large.iter().all(|&b| b == 0));
    // On a Linux kernel with transparent huge pages the advice is taken.
    let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists();
    if cfg!(target_os = "linux") && thp {
        assert!(
            large.advised_huge(),
            "5 MiB on Linux with THP: an advised map"
        );
    }
    large[12345] = 7;
    let copy = large.clone();
    assert_eq!(copy.len(), large.len());
    assert_eq!(copy[12345], 7);
    assert_eq!(*copy, *large);
    assert!(WeightBytes::zeroed(0).is_empty());
}

/// The family against the f32 family on the same weights: int8 activations round each
/// input by at most half a step (max|x_group| / 254), so each output's error is at
/// most Σ_c |w_c| · step / 2. Checked per element against that bound (computed here
/// from the decoded weights, independently of the kernel).
#[test]
fn q8_error_against_f32_is_within_the_rounding_bound() {
    let (n_out, k, rows) = (96, 576, 4);
    let tiles = encode_q4_1(&values(n_out * k, 21, 0.2), n_out, k).unwrap();
    let w = Q4Matrix::from_bytes("w", &tiles, n_out, k, Q4Kind::Q4_1).unwrap();
    let dense = w.decode();
    let x = values(rows * k, 22, 2.0);
    let mut exact = vec![0f32; rows * n_out];
    onebit_kernels::matmul(&w, &x, rows, &mut exact, Isa::scalar());
    let xq = QuantizedRows::quantize(&x, rows, k);
    let packed = PackedQ4::new(&w);
    let mut y = vec![0f32; rows * packed.stride()];
    q8::matmul_q4(&packed, &xq, &mut y, Isa::detect());
    let mut worst = 0f32;
    for i in 0..rows {
        for r in 0..n_out {
            let mut bound = 0f32;
            for c in 0..k {
                bound += dense[r * k + c].abs() * xq.scale(i, c / 32) * 0.5;
            }
            let err = (y[i * packed.stride() + r] - exact[i * n_out + r]).abs();
            worst = worst.max(err / bound);
            assert!(
                err <= bound * 1.01 + 1e-5,
                "row {r} input {i}: error {err} > bound {bound}"
            );
        }
    }
    eprintln!("worst error / rounding bound: {worst:.3}");
}

/// Two levels: every variant equals the reference (which folds the levels' exact sums
/// before its one float sequence); a batch equals single rows; and the error against
/// the f32 family shrinks below 1/100 of the one-level bound (the two-level bound is
/// 1/128 of it).
#[test]
fn two_levels_are_defined_by_the_reference_and_nearly_exact() {
    let (n_out, k, rows) = (96, 576, 5);
    let tiles = encode_q4_1(&values(n_out * k, 31, 0.2), n_out, k).unwrap();
    let w = Q4Matrix::from_bytes("w", &tiles, n_out, k, Q4Kind::Q4_1).unwrap();
    let dense = w.decode();
    let packed = PackedQ4::new(&w);
    let x = values(rows * k, 32, 2.0);
    let mut xq = QuantizedRows::default();
    xq.quantize_levels(&x, rows, k, Levels::Two);
    assert_eq!((xq.rows(), xq.level_rows()), (rows, 2 * rows));
    let stride = packed.stride();
    let mut exact = vec![0f32; rows * n_out];
    onebit_kernels::matmul(&w, &x, rows, &mut exact, Isa::scalar());
    for isa in isas() {
        let y = q8::matmul_q4_levels(&packed, &xq, Levels::Two, isa);
        assert_eq!(y.len(), rows * stride);
        for i in 0..rows {
            let mut single = QuantizedRows::default();
            single.quantize_levels(&x[i * k..(i + 1) * k], 1, k, Levels::Two);
            let one = q8::matmul_q4_levels(&packed, &single, Levels::Two, isa);
            assert_eq!(
                one,
                y[i * stride..(i + 1) * stride],
                "batch invariance, row {i}"
            );
            for r in 0..n_out {
                let want = reference::dot_q4(&packed, r, &xq, i);
                assert_eq!(
                    y[i * stride + r].to_bits(),
                    want.to_bits(),
                    "{}",
                    isa.name()
                );
                let mut bound = 0f32;
                for c in 0..k {
                    // The first level's dx is 128 times the stored two-level scale.
                    bound += dense[r * k + c].abs() * xq.scale(2 * i, c / 32) * 128.0 * 0.5;
                }
                let err = (y[i * stride + r] - exact[i * n_out + r]).abs();
                assert!(
                    err <= bound / 100.0 + 1e-5,
                    "row {r}: error {err}, one-level bound {bound}"
                );
            }
        }
    }
    // The int8 head the same way.
    let head = I8Matrix::from_bf16(&bf16_weights(40, k, 33), 40, k);
    for isa in isas() {
        let y = q8::matmul_i8_levels(&head, &xq, Levels::Two, isa);
        for i in 0..rows {
            for r in 0..40 {
                let want = reference::dot_i8(&head, r, &xq, i);
                assert_eq!(y[i * 40 + r].to_bits(), want.to_bits());
            }
        }
    }
}

/// The AMX variant (hardware where present, the emulator everywhere) on ragged shapes:
/// every row count from 1 to 17 (one more than a tile holds), outputs not a multiple of
/// 16, 32 or 64, K of three groups (not a multiple of 64), both levels.
#[test]
fn amx_ragged_shapes_equal_the_reference() {
    for rows in 1..=17 {
        for levels in [Levels::One, Levels::Two] {
            check_q4(45, 96, rows, rows as u64, Q4Kind::Q4_1, levels);
            check_i8(37, 96, rows, rows as u64, levels);
        }
    }
}

/// The screened head: every ISA equals its reference definition bit for bit (vocabularies
/// not a multiple of the blocks, 1–5 rows, candidates from 1 to more than the rows), a
/// batch's rows equal single rows, and the candidates' logits are the int8 head's.
#[test]
fn the_screened_head_is_its_reference_on_every_isa_and_per_row() {
    let k = 96;
    for (n_out, rows, m, seed) in [
        (37, 1, 4, 1u64),
        (200, 3, 16, 2),
        (50, 5, 64, 3),
        (16, 2, 1, 4),
    ] {
        let bytes = bf16_weights(n_out, k, seed);
        let int8 = I8Matrix::from_bf16(&bytes, n_out, k);
        // The screen: the same weights as q4 tiles (as a package's lm_head re-quantized
        // from its embedding).
        let rounded: Vec<f32> = bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let encoded = encode_q4_1(&rounded, n_out, k).unwrap();
        let q4 = Q4Matrix::from_bytes("lm_head", &encoded, n_out, k, Q4Kind::Q4_1).unwrap();
        let tiles = PackedQ4::new(&q4);
        let x = values(rows * k, seed + 11, 2.0);
        let (mut one, mut two) = (QuantizedRows::default(), QuantizedRows::default());
        one.quantize_levels(&x, rows, k, Levels::One);
        two.quantize_levels(&x, rows, k, Levels::Two);
        let want: Vec<f32> = (0..rows)
            .flat_map(|i| reference::screened_row(&tiles, &int8, &one, &two, i, m))
            .collect();
        for isa in isas() {
            let y = q8::matmul_screened(&tiles, &int8, &one, &two, m, isa);
            assert_bits_equal(
                &y,
                &want,
                n_out,
                &format!("{}: screened {n_out}, m {m}", isa.name()),
            );
            for i in 0..rows {
                let (mut one1, mut two1) = (QuantizedRows::default(), QuantizedRows::default());
                one1.quantize_levels(&x[i * k..(i + 1) * k], 1, k, Levels::One);
                two1.quantize_levels(&x[i * k..(i + 1) * k], 1, k, Levels::Two);
                let alone = q8::matmul_screened(&tiles, &int8, &one1, &two1, m, isa);
                assert_eq!(
                    alone,
                    y[i * n_out..(i + 1) * n_out],
                    "batch invariance, row {i}"
                );
            }
        }
        // The candidates carry the int8 head's values; the others the screen's.
        let mut full = vec![0f32; rows * n_out];
        q8::matmul_i8(&int8, &two, &mut full, Isa::detect());
        let mut screen = vec![0f32; rows * tiles.stride()];
        q8::matmul_q4(&tiles, &one, &mut screen, Isa::detect());
        for i in 0..rows {
            let row = &screen[i * tiles.stride()..i * tiles.stride() + n_out];
            let top = q8::top_rows(row, m);
            assert_eq!(top.len(), m.min(n_out));
            for r in 0..n_out {
                let expect = if top.contains(&r) {
                    full[i * n_out + r]
                } else {
                    row[r]
                };
                assert_eq!(
                    want[i * n_out + r].to_bits(),
                    expect.to_bits(),
                    "row {i} out {r}"
                );
            }
        }
    }
}

/// `top_rows`: the largest values, ties to the lower index, NaN counted as -inf, -0
/// equal to +0, in index order.
#[test]
fn top_rows_keeps_the_largest_with_ties_to_the_lower_index() {
    let v = [1.0, 3.0, f32::NAN, 3.0, -0.0, 0.0, 2.0, f32::NEG_INFINITY];
    assert_eq!(q8::top_rows(&v, 1), [1]);
    assert_eq!(q8::top_rows(&v, 2), [1, 3]);
    assert_eq!(q8::top_rows(&v, 3), [1, 3, 6]);
    assert_eq!(q8::top_rows(&v, 5), [0, 1, 3, 4, 6]);
    // NaN (index 2) ties with -inf (index 7): the lower index stays.
    assert_eq!(q8::top_rows(&v, 7), [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(q8::top_rows(&v, 8), [0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(q8::top_rows(&v, 0), Vec::<usize>::new());
    assert_eq!(q8::top_rows(&[f32::NAN, f32::NAN], 1), [0]);
}

/// From `q8::PARALLEL_VALUES` values on a team of two threads shares the rows out: every
/// row's codes, scales, sums and code sums (both levels) equal that row quantized alone,
/// on every ISA, at sizes on both sides of the threshold and with a row count the
/// threads do not divide.
#[test]
fn rows_shared_out_over_a_team_equal_rows_quantized_alone() {
    let team = onebit_kernels::team::Team::new(2, "q8-test").unwrap();
    let k = 576;
    for rows in [2, 8, 15, 17] {
        assert_eq!(
            rows * k >= q8::PARALLEL_VALUES,
            rows >= 15,
            "the sizes straddle the threshold"
        );
        let x = values(rows * k, 40 + rows as u64, 2.0);
        for levels in [Levels::One, Levels::Two] {
            for isa in Isa::available() {
                let mut all = QuantizedRows::default();
                team.install(|| all.quantize_levels_on(isa, &x, rows, k, levels));
                let count = levels.count();
                for i in 0..rows {
                    let mut alone = QuantizedRows::default();
                    alone.quantize_levels_on(isa, &x[i * k..(i + 1) * k], 1, k, levels);
                    for l in 0..count {
                        let what =
                            format!("{}: {rows} rows, {levels:?}, row {i} level {l}", isa.name());
                        assert_eq!(all.codes(count * i + l), alone.codes(l), "{what}: codes");
                        for g in 0..k / 32 {
                            let (a, b) = ((count * i + l, g), (l, g));
                            assert_eq!(
                                all.scale(a.0, a.1).to_bits(),
                                alone.scale(b.0, b.1).to_bits(),
                                "{what}: scale {g}"
                            );
                            assert_eq!(
                                all.sum(a.0, a.1).to_bits(),
                                alone.sum(b.0, b.1).to_bits(),
                                "{what}: sum {g}"
                            );
                            assert_eq!(
                                all.code_sum(a.0, a.1),
                                alone.code_sum(b.0, b.1),
                                "{what}: code sum {g}"
                            );
                        }
                    }
                }
            }
        }
    }
}
