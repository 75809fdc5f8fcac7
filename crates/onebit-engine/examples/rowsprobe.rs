use npu_runtime::Forward;
use onebit_engine::{Engine, EngineConfig};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let rows: usize = a[2].parse().unwrap();
    let iters: usize = a[3].parse().unwrap();
    let engine = Engine::load(&EngineConfig::new(&a[1])).unwrap();
    let mut s = engine.session().unwrap();
    let t = s.target();
    let prompt: Vec<u32> = (0..128).map(|i| (i * 37 % 4000) as u32 + 10).collect();
    t.forward(&prompt).unwrap();
    let base = t.position();
    let batch: Vec<u32> = (0..rows).map(|i| (i * 91 % 4000) as u32 + 7).collect();
    let start = std::time::Instant::now();
    for _ in 0..iters {
        t.forward(&batch).unwrap();
        t.truncate(base).unwrap();
    }
    println!(
        "{rows} rows: {:.3} ms/pass",
        start.elapsed().as_secs_f64() * 1e3 / iters as f64
    );
}
