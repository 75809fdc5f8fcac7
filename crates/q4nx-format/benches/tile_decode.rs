//! Tile decoding throughput, reported as GB/s of tile bytes.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use q4nx_format::{decode_tile, encode_q4_1, Q4Kind, Q4Matrix, TILE_BYTES};

fn bench(c: &mut Criterion) {
    let (n, k) = (1024, 2048);
    let values: Vec<f32> = (0..n * k)
        .map(|i| ((i * 2654435761usize) % 1000) as f32 * 1e-3 - 0.5)
        .collect();
    let tiles = encode_q4_1(&values, n, k).unwrap();
    let m = Q4Matrix::from_bytes("bench", &tiles, n, k, Q4Kind::Q4_1).unwrap();

    let mut g = c.benchmark_group("tile_decode");
    g.throughput(Throughput::Bytes(TILE_BYTES as u64));
    let mut out = [0f32; 32 * 256];
    g.bench_function("one_tile", |b| {
        b.iter(|| decode_tile(std::hint::black_box(m.tile(3, 5)), Q4Kind::Q4_1, &mut out))
    });
    g.throughput(Throughput::Bytes(tiles.len() as u64));
    g.bench_function("matrix_1024x2048", |b| {
        b.iter(|| std::hint::black_box(m.decode()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
