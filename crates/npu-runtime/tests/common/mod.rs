//! Helpers shared by the target's integration tests.
#![allow(dead_code)]

use std::sync::{mpsc, Arc};
use std::time::Duration;

use npu_runtime::{CpuModel, CpuTarget, PassBatcher};

/// Runs `script(session, s)` for `s` in `0..n` on `n` threads at once, every session a
/// member of one `PassBatcher` (whose linger far exceeds the test, so each pass holds
/// every session still running) and leaving it when its script ends. The outputs in
/// session order, and the batcher. A session that left but is still waited for wedges
/// the others: the watchdog fails the test then.
pub fn in_shared_passes<T: Send + 'static>(
    model: &Arc<CpuModel>,
    n: usize,
    script: impl Fn(&mut CpuTarget, usize) -> T + Send + Copy + 'static,
) -> (Vec<T>, Arc<PassBatcher>) {
    let batcher = PassBatcher::new(model.clone(), Duration::from_secs(3600));
    let (done, finished) = mpsc::channel();
    let members: Vec<_> = (0..n).map(|_| batcher.member()).collect();
    for (s, member) in members.into_iter().enumerate() {
        let (model, batcher, done) = (model.clone(), batcher.clone(), done.clone());
        std::thread::spawn(move || {
            let mut target = model.session();
            target.join(batcher).unwrap();
            let out = script(&mut target, s);
            drop(member);
            done.send((s, out)).unwrap();
        });
    }
    let mut outputs: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let (s, out) = finished
            .recv_timeout(Duration::from_secs(120))
            .expect("shared passes wedged: a session that left is still waited for");
        outputs[s] = Some(out);
    }
    (outputs.into_iter().map(Option::unwrap).collect(), batcher)
}

/// The largest elementwise |a - b| (the slices have the same length).
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
