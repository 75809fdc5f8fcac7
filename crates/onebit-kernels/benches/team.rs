//! The cost of one parallel region on a two-thread [`Team`] with empty tasks: what every
//! matmul, attention and element-wise region of a pass pays on top of its work (a 1-row
//! SmolLM2 pass runs about 210 of them).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use onebit_kernels::team::{parallel_for, Team};

fn bench(c: &mut Criterion) {
    let team = Team::new(2, "bench").expect("spawn the team");
    let mut g = c.benchmark_group("team_region_2t");
    // 2 tasks: the smallest region; 30: a q|k|v matmul's 32-row blocks; 96: gate|up's.
    for tasks in [2usize, 8, 30, 96] {
        g.bench_with_input(BenchmarkId::from_parameter(tasks), &tasks, |b, &tasks| {
            team.install(|| {
                b.iter(|| {
                    parallel_for(tasks, &|i| {
                        std::hint::black_box(i);
                    })
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
