//! One SmolLM2-135M decoder layer's projections (q, k, v, o, gate, up, down) for
//! n = 1, 2, 4, 8, 16 input rows, per family and per variant this CPU has, on 1 and 2
//! threads. Throughput is bytes of weights read (tile payload, padding excluded).
//! The `q8` and `q8x2` rows include quantizing the inputs (at one and two int8 levels),
//! as a pass does.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use onebit_kernels::q8::{self, Levels, PackedQ4, QuantizedRows};
use onebit_kernels::{matmul, Isa};
use q4nx_format::{encode_q4_1, Q4Kind, Q4Matrix};

fn bench(c: &mut Criterion) {
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
    let packed: Vec<PackedQ4> = weights.iter().map(PackedQ4::new).collect();
    let read_bytes: usize = shapes.iter().map(|&(n, k)| n * k * 5 / 8).sum();
    let mut seen = Vec::new();
    for isa in Isa::available() {
        let names = (matmul::variant_name(isa), q8::variant_name(isa));
        if isa == Isa::scalar() || seen.contains(&names) {
            continue;
        }
        seen.push(names);
        for threads in [1usize, 2] {
            // Run inside a pool, as the CPU target does, so a call costs no thread wake-up.
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut g = c.benchmark_group(format!("smollm2_layer_{}_{threads}t", isa.name()));
            for rows in [1usize, 2, 4, 8, 16] {
                g.throughput(Throughput::Bytes(read_bytes as u64));
                let xs: Vec<Vec<f32>> = shapes
                    .iter()
                    .map(|&(_, k)| (0..rows * k).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect())
                    .collect();
                let mut ys: Vec<Vec<f32>> =
                    shapes.iter().map(|&(n, _)| vec![0f32; rows * n]).collect();
                g.bench_with_input(
                    BenchmarkId::new(format!("f32_{}", names.0), rows),
                    &rows,
                    |b, &rows| {
                        b.iter(|| {
                            pool.install(|| {
                                for ((w, x), y) in weights.iter().zip(&xs).zip(ys.iter_mut()) {
                                    matmul(w, x, rows, y, isa);
                                }
                            })
                        })
                    },
                );
                let mut quantized = QuantizedRows::default();
                for (label, levels) in [("q8", Levels::One), ("q8x2", Levels::Two)] {
                    g.bench_with_input(
                        BenchmarkId::new(format!("{label}_{}", names.1), rows),
                        &rows,
                        |b, &rows| {
                            b.iter(|| {
                                pool.install(|| {
                                    for (((w, (_, k)), x), y) in
                                        packed.iter().zip(&shapes).zip(&xs).zip(ys.iter_mut())
                                    {
                                        quantized.quantize_levels(x, rows, *k, levels);
                                        q8::matmul_q4(w, &quantized, y, isa);
                                    }
                                })
                            })
                        },
                    );
                }
            }
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
