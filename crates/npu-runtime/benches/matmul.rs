//! Matmul throughput at SmolLM2-135M's layer shapes, for n = 1, 2, 4, 8, 16 input rows.
//! Reported throughput is bytes of tile data actually read (padding excluded).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use npu_runtime::kernels::matmul::{matmul, Kernel};
use q4nx_format::{encode_q4_1, Q4Kind, Q4Matrix};

fn bench(c: &mut Criterion) {
    // One decoder layer of SmolLM2-135M: q, k, v, o, gate, up, down.
    let shapes = [
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    let tiles: Vec<(usize, usize, Vec<u8>)> = shapes
        .iter()
        .map(|&(n, k)| {
            let v: Vec<f32> = (0..n * k)
                .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
                .collect();
            (n, k, encode_q4_1(&v, n, k).unwrap())
        })
        .collect();
    let weights: Vec<Q4Matrix> = tiles
        .iter()
        .map(|(n, k, t)| Q4Matrix::from_bytes("w", t, *n, *k, Q4Kind::Q4_1).unwrap())
        .collect();
    let read_bytes: usize = shapes.iter().map(|&(n, k)| n * k * 5 / 8).sum();
    for kernel in Kernel::available()
        .into_iter()
        .filter(|&k| k != Kernel::Scalar)
    {
        for threads in [1usize, 2] {
            // Run inside a pool, as the CPU target does, so a call costs no thread wake-up.
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut g = c.benchmark_group(format!("smollm2_layer_{}_{threads}t", kernel.name()));
            for rows in [1usize, 2, 4, 8, 16] {
                g.throughput(Throughput::Bytes(read_bytes as u64));
                let xs: Vec<Vec<f32>> = shapes
                    .iter()
                    .map(|&(_, k)| (0..rows * k).map(|i| (i % 13) as f32 * 0.1).collect())
                    .collect();
                let mut ys: Vec<Vec<f32>> =
                    shapes.iter().map(|&(n, _)| vec![0f32; rows * n]).collect();
                g.bench_with_input(BenchmarkId::from_parameter(rows), &rows, |b, &rows| {
                    b.iter(|| {
                        pool.install(|| {
                            for ((w, x), y) in weights.iter().zip(&xs).zip(ys.iter_mut()) {
                                matmul(w, x, rows, y, kernel);
                            }
                        })
                    })
                });
            }
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
