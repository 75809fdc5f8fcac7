//! The BF16 head kernel: SIMD equals scalar bit for bit, any batch size.

use half::bf16;
use onebit_kernels::dense::{matmul_bf16, reference_dot};
use onebit_kernels::Isa;

#[test]
fn bf16_kernels_agree_and_are_batch_invariant() {
    // Batch sizes that take every tiling of the SIMD kernel (8, 4, 2, 1 inputs at a
    // time; 4 rows at a time for one input) and a row count with a partial block.
    for n in [1, 2, 3, 5, 8, 11] {
        check_bf16_kernels(131, 96, n);
    }
}

fn check_bf16_kernels(rows: usize, k: usize, n: usize) {
    let w: Vec<u8> = (0..rows * k)
        .flat_map(|i| bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 64.0).to_le_bytes())
        .collect();
    let x: Vec<f32> = (0..n * k)
        .map(|i| ((i * 13 % 17) as f32 - 8.0) / 7.0)
        .collect();
    for kernel in Isa::available() {
        // NaN where nothing was written would fail the comparisons below.
        let mut y = vec![f32::NAN; n * rows];
        matmul_bf16(&w, rows, k, &x, n, &mut y, kernel);
        for i in 0..n {
            let mut one = vec![0f32; rows];
            matmul_bf16(&w, rows, k, &x[i * k..(i + 1) * k], 1, &mut one, kernel);
            for r in 0..rows {
                let want = reference_dot(&w[r * k * 2..(r + 1) * k * 2], &x[i * k..(i + 1) * k]);
                assert_eq!(
                    y[i * rows + r].to_bits(),
                    want.to_bits(),
                    "{kernel:?} n={n} ({i},{r})"
                );
                assert_eq!(one[r].to_bits(), want.to_bits());
            }
        }
    }
}

#[test]
fn block_column_kernels_agree_and_are_batch_invariant() {
    // Batch sizes that take every input tiling of the SIMD kernel (8, 4, 2, 1).
    for n in [1, 2, 3, 5, 8, 11] {
        check_block_columns(64, 40, n);
    }
}

fn check_block_columns(rows: usize, k: usize, n: usize) {
    use onebit_kernels::dense::matmul_bf16_block_columns;
    let w: Vec<u8> = (0..rows * k)
        .flat_map(|i| bf16::from_f32(((i * 53 % 97) as f32 - 48.0) / 32.0).to_le_bytes())
        .collect();
    let x: Vec<f32> = (0..n * k)
        .map(|i| ((i * 11 % 23) as f32 - 11.0) / 9.0)
        .collect();
    let mut want = vec![0f32; n * rows];
    matmul_bf16_block_columns(&w, rows, k, &x, n, &mut want, Isa::scalar());
    // The stored order: element [b][c][r] is W[b*32 + r][c].
    for i in 0..n {
        for r in 0..rows {
            let (b, rr) = (r / 32, r % 32);
            let exact: f64 = (0..k)
                .map(|c| {
                    bf16::from_le_bytes([
                        w[2 * ((b * k + c) * 32 + rr)],
                        w[2 * ((b * k + c) * 32 + rr) + 1],
                    ])
                    .to_f32() as f64
                        * x[i * k + c] as f64
                })
                .sum();
            assert!((want[i * rows + r] as f64 - exact).abs() < 1e-4);
        }
    }
    for kernel in Isa::available() {
        let mut y = vec![f32::NAN; n * rows];
        matmul_bf16_block_columns(&w, rows, k, &x, n, &mut y, kernel);
        assert!(
            y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{kernel:?} n={n}"
        );
        let last = n - 1;
        let mut one = vec![0f32; rows];
        matmul_bf16_block_columns(&w, rows, k, &x[last * k..n * k], 1, &mut one, kernel);
        assert!(one
            .iter()
            .zip(&want[last * rows..n * rows])
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
