//! Decode attention of one layer at long context, SmolLM2-135M geometry (9 query heads,
//! 3 kv heads, head_dim 64): one query row at 2048 and 8192 positions, per KV type and
//! per variant this CPU has, on a team of 1 and 2 threads; plus an 8-row verify pass.
//! Throughput is bytes of KV read. `old_f32_attend` is the per-(row, head) `attend` loop
//! the CPU backend used before (f32 KV, keys read once per query head).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use onebit_kernels::attention::{self, attention};
use onebit_kernels::kv::{KvLayer, KvType};
use onebit_kernels::team::{for_each_chunk, Team};
use onebit_kernels::Isa;

const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HD: usize = 64;

fn filled(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 7919) % 1000) as f32 * 2e-3 - 1.0)
        .collect()
}

fn bench(c: &mut Criterion) {
    let scale = 1.0 / (HD as f32).sqrt();
    let mut seen = Vec::new();
    for isa in Isa::available() {
        let name = attention::variant_name(isa);
        if isa == Isa::scalar() || seen.contains(&name) {
            continue;
        }
        seen.push(name);
        for threads in [1usize, 2] {
            let team = Team::new(threads, "bench").unwrap();
            let mut g = c.benchmark_group(format!("attention_decode_{name}_{threads}t"));
            g.sample_size(20)
                .warm_up_time(std::time::Duration::from_millis(500))
                .measurement_time(std::time::Duration::from_secs(2));
            for len in [2048usize, 8192] {
                let k = filled(len * KV_HEADS * HD, 1);
                let v = filled(len * KV_HEADS * HD, 2);
                for kv_type in KvType::ALL {
                    let mut layer = KvLayer::new(kv_type, KV_HEADS, HD);
                    layer.append(&k, &v, len);
                    g.throughput(Throughput::Bytes(layer.byte_len() as u64));
                    for rows in [1usize, 8] {
                        let q = filled(rows * HEADS * HD, 3);
                        let mut out = vec![0f32; rows * HEADS * HD];
                        g.bench_with_input(
                            BenchmarkId::new(format!("{}_{rows}rows", kv_type.name()), len),
                            &len,
                            |b, &len| {
                                b.iter(|| {
                                    team.install(|| {
                                        attention(
                                            isa,
                                            &layer,
                                            &q,
                                            rows,
                                            len - rows,
                                            HEADS,
                                            scale,
                                            &mut out,
                                        )
                                    })
                                })
                            },
                        );
                    }
                }
                // The old path: one `attend` per query head over f32 rows.
                let keys: Vec<Vec<f32>> = (0..KV_HEADS)
                    .map(|h| {
                        (0..len)
                            .flat_map(|t| k[(t * KV_HEADS + h) * HD..][..HD].to_vec())
                            .collect()
                    })
                    .collect();
                let values = keys.clone();
                let q = filled(HEADS * HD, 3);
                let mut out = vec![0f32; HEADS * HD];
                g.throughput(Throughput::Bytes((len * KV_HEADS * HD * 8) as u64));
                g.bench_with_input(BenchmarkId::new("old_f32_attend", len), &len, |b, &len| {
                    b.iter(|| {
                        team.install(|| {
                            for_each_chunk(&mut out, HD, |head, o| {
                                let kh = head / (HEADS / KV_HEADS);
                                onebit_kernels::attend(
                                    onebit_kernels::Isa::detect(),
                                    &q[head * HD..(head + 1) * HD],
                                    &keys[kh],
                                    &values[kh],
                                    len,
                                    scale,
                                    &mut Vec::new(),
                                    o,
                                );
                            })
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
