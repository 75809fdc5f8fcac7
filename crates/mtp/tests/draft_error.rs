//! A drafter that fails is an error of the run, never a silent fall back to plain
//! decoding; `run_from` continues a target that already holds part of the prompt.

use std::path::PathBuf;

use mtp::{DraftHead, RunError, RunOptions, SamplingConfig};
use npu_runtime::{CpuTarget, Forward, TargetPackage};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

/// Fails on its second draft.
struct Failing {
    calls: usize,
}

impl DraftHead for Failing {
    fn needs_last_hidden(&self) -> bool {
        false
    }
    fn draft(&mut self, _pos: usize, last: u32, k: usize) -> Option<Vec<u32>> {
        self.calls += 1;
        (self.calls < 2).then(|| vec![last; k])
    }
    fn commit_rows(&mut self, _m: usize) {}
    fn reset(&mut self) {
        self.calls = 0;
    }
    fn error(&self) -> Option<String> {
        (self.calls >= 2).then(|| "the draft weights went away".to_string())
    }
}

fn options(k: usize) -> RunOptions {
    RunOptions {
        max_tokens: 12,
        draft_max: k,
        stop_tokens: Vec::new(),
        sampling: SamplingConfig {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            ..SamplingConfig::default()
        },
        adaptive: None,
    }
}

#[test]
fn a_failing_draft_is_an_error_naming_why() {
    let package = std::sync::Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    let mut target = CpuTarget::new(&package).unwrap();
    let mut head = Failing { calls: 0 };
    let err = mtp::run(
        &mut target,
        Some(&mut head),
        &[1, 2, 3],
        &options(3),
        &mut |_| true,
    )
    .unwrap_err();
    assert!(matches!(err, RunError::Draft(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "mtp::run: the drafter failed: the draft weights went away"
    );
}

#[test]
fn run_from_a_cached_prefix_equals_a_whole_run() {
    let package = std::sync::Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    let prompt = [1u32, 7, 99, 300, 42];
    let mut whole = CpuTarget::new(&package).unwrap();
    let a = mtp::run(&mut whole, None, &prompt, &options(0), &mut |_| true).unwrap();
    let mut part = CpuTarget::new(&package).unwrap();
    part.forward(&prompt[..3]).unwrap();
    let b = mtp::run_from(&mut part, None, &prompt, 3, &options(0), &mut |_| true).unwrap();
    assert_eq!(a.tokens, b.tokens);
    // The target must hold exactly the cached positions, and one prompt token must be left.
    let err = mtp::run_from(&mut part, None, &prompt, 3, &options(0), &mut |_| true).unwrap_err();
    assert!(matches!(err, RunError::Cached { cached: 3, .. }), "{err:?}");
    let mut full = CpuTarget::new(&package).unwrap();
    full.forward(&prompt).unwrap();
    let err = mtp::run_from(&mut full, None, &prompt, 5, &options(0), &mut |_| true).unwrap_err();
    assert!(
        err.to_string().contains("at least one must be left to run"),
        "{err}"
    );
}
