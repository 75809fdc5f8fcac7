//! The matmul kernels: every kernel equals the defining arithmetic bit for bit, for
//! any batch size (batch invariance), on grids with K and N padding.

use onebit_kernels::matmul::{matmul, reference_dot};
use onebit_kernels::Isa;
use proptest::prelude::*;
use q4nx_format::{encode_q4_1, Q4Kind, Q4Matrix};

fn weights(n: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n * k)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
        })
        .collect()
}

fn kernels() -> Vec<Isa> {
    let k = Isa::available();
    if k.len() == 1 {
        test_support::skip!(
            "SIMD kernel comparisons",
            "this CPU has neither avx2+fma nor avx512f (only the scalar kernel is checked)"
        );
    }
    k
}

fn check(n_out: usize, k: usize, rows: usize, seed: u64) {
    let tiles = encode_q4_1(&weights(n_out, k, seed), n_out, k).unwrap();
    let w = Q4Matrix::from_bytes("w", &tiles, n_out, k, Q4Kind::Q4_1).unwrap();
    let x = weights(rows, k, seed + 1);
    for kernel in kernels() {
        // NaN where nothing was written would fail the comparisons below.
        let mut y = vec![f32::NAN; rows * n_out];
        matmul(&w, &x, rows, &mut y, kernel);
        for i in 0..rows {
            // Batch invariance: row i alone gives the same bits as inside the batch.
            let mut single = vec![0f32; n_out];
            matmul(&w, &x[i * k..(i + 1) * k], 1, &mut single, kernel);
            for r in 0..n_out {
                let want = reference_dot(&w, r, &x[i * k..(i + 1) * k]);
                assert_eq!(
                    y[i * n_out + r].to_bits(),
                    want.to_bits(),
                    "{kernel:?} {n_out}x{k} rows {rows}: ({i},{r})"
                );
                assert_eq!(
                    single[r].to_bits(),
                    want.to_bits(),
                    "{kernel:?} single row ({i},{r})"
                );
            }
        }
    }
}

#[test]
fn kernels_match_the_reference_on_padded_grids() {
    check(64, 256, 1, 1);
    check(45, 96, 3, 2); // N and K both padded
    check(96, 576, 9, 3); // SmolLM2's K; 9 rows = a chunk of 8 and one of 1
    check(32, 800, 17, 4);
}

#[test]
fn decoded_product_is_close_to_a_dense_f64_product() {
    let (n, k) = (70, 320);
    let tiles = encode_q4_1(&weights(n, k, 9), n, k).unwrap();
    let w = Q4Matrix::from_bytes("w", &tiles, n, k, Q4Kind::Q4_1).unwrap();
    let dense = w.decode();
    let x = weights(2, k, 10);
    let mut y = vec![0f32; 2 * n];
    matmul(&w, &x, 2, &mut y, Isa::detect());
    for i in 0..2 {
        for r in 0..n {
            let exact: f64 = (0..k)
                .map(|c| dense[r * k + c] as f64 * x[i * k + c] as f64)
                .sum();
            assert!(
                (y[i * n + r] as f64 - exact).abs() < 1e-5,
                "({i},{r}) {} vs {exact}",
                y[i * n + r]
            );
        }
    }
}

#[test]
fn q4_0_tiles_multiply_with_signed_codes() {
    let (n, k) = (32, 64);
    let tiles = encode_q4_1(&weights(n, k, 5), n, k).unwrap();
    let w = Q4Matrix::from_bytes("w", &tiles, n, k, Q4Kind::Q4_0).unwrap();
    let dense = w.decode();
    let x = weights(1, k, 6);
    let mut y = vec![0f32; n];
    matmul(&w, &x, 1, &mut y, Isa::detect());
    for r in 0..n {
        let exact: f64 = (0..k).map(|c| dense[r * k + c] as f64 * x[c] as f64).sum();
        assert!((y[r] as f64 - exact).abs() < 1e-4);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn batch_invariance_on_random_shapes(n_out in 1usize..100, groups in 1usize..20, rows in 1usize..12, seed in 0u64..1000) {
        check(n_out, groups * 32, rows, seed);
    }
}

proptest! {
    /// The attention dot product is one fixed sequence of f32 operations: the FMA
    /// path (when this CPU has it) and the portable path give the same bits, for any
    /// length (tails included), and both are close to a float64 dot product.
    #[test]
    fn attention_dot_is_the_same_bits_on_every_path(
        values in proptest::collection::vec(-4.0f32..4.0, 0..400),
    ) {
        let n = values.len() / 2;
        let (a, b) = values.split_at(n);
        let b = &b[..n];
        let fast = onebit_kernels::dot(onebit_kernels::Isa::detect(), a, b);
        let portable = onebit_kernels::dot_portable(a, b);
        prop_assert_eq!(fast.to_bits(), portable.to_bits());
        let exact: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let magnitude: f64 = a.iter().zip(b).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
        prop_assert!((fast as f64 - exact).abs() <= 1e-6 * magnitude.max(1.0), "{fast} vs {exact}");
    }
}

proptest! {
    /// Attention gives the same bits with hardware FMA and without.
    #[test]
    fn attention_is_the_same_bits_on_every_path(
        seed in 0u64..1000,
        len in 1usize..40,
        dim in prop::sample::select(vec![16usize, 64, 72, 128]),
    ) {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let query: Vec<f32> = (0..dim).map(|_| next()).collect();
        let keys: Vec<f32> = (0..len * dim).map(|_| next()).collect();
        let values: Vec<f32> = (0..len * dim).map(|_| next()).collect();
        let (mut a, mut b) = (vec![0f32; dim], vec![0f32; dim]);
        let mut scores = Vec::new();
        onebit_kernels::attend(onebit_kernels::Isa::detect(), &query, &keys, &values, len, 0.125, &mut scores, &mut a);
        onebit_kernels::attend_portable(&query, &keys, &values, len, 0.125, &mut scores, &mut b);
        prop_assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
