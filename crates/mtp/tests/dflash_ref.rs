//! z-lab's reference trace through `mtp::run` + `DFlashHead`: `spec_tokens` and
//! `spec_accept` exactly.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use dflash_draft::{import_zlab, load_draft};
use mtp::{run, DFlashHead, RunOptions, SamplingConfig};
use npu_runtime::{CpuTarget, Forward, HeadKind, TapRows, TargetPackage};
use q4nx_format::Container;

mod common;
use common::CpuHooks;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

/// The `dflash-ref` target converted and the z-lab draft at `draft_source` imported, each
/// into a temporary directory (kept alive by the first value).
fn packages(
    draft_source: &std::path::Path,
) -> (
    (tempfile::TempDir, tempfile::TempDir),
    Arc<TargetPackage>,
    dflash_draft::DraftModel,
) {
    let target_dir = tempfile::tempdir().unwrap();
    let (writer, config, _) =
        q4nx_convert::hf::convert_hf_dir(&fixture("dflash-ref/target")).unwrap();
    writer
        .write_file(target_dir.path().join("model.q4nx"))
        .unwrap();
    std::fs::write(target_dir.path().join("config.json"), config.to_string()).unwrap();
    let draft_dir = tempfile::tempdir().unwrap();
    import_zlab(draft_source, draft_dir.path(), None).unwrap();
    let package = Arc::new(TargetPackage::open(target_dir.path()).unwrap());
    let draft = load_draft(draft_dir.path()).unwrap();
    ((target_dir, draft_dir), package, draft)
}

#[test]
fn reference_trace_through_the_mtp_loop() {
    let (_dirs, package, draft) = packages(&fixture("dflash-ref/draft"));
    // The trace is f32 arithmetic: the draft's reference precision.
    let weights = draft.reference_weights().unwrap();
    let reference = Container::open(fixture("dflash-ref/reference.safetensors")).unwrap();
    let ints = |n: &str| -> Vec<u32> {
        reference
            .tensor(n)
            .unwrap()
            .to_i64()
            .unwrap()
            .iter()
            .map(|&v| v as u32)
            .collect()
    };

    let mut target = CpuTarget::new(&package).unwrap();
    let sink = Arc::new(Mutex::new(TapRows::new(0)));
    target
        .set_layer_taps(&draft.config.target_layer_ids, sink.clone())
        .unwrap();
    let hooks = CpuHooks::new(&package, HeadKind::Tiles);
    let mut head = DFlashHead::new(&weights, Box::new(hooks), sink.clone());
    // z-lab's loop runs past the 48th token in its last round; give room for that.
    let options = RunOptions {
        max_tokens: 64,
        draft_max: 7,
        adaptive: None,
        stop_tokens: vec![],
        sampling: SamplingConfig {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            ..SamplingConfig::default()
        },
    };
    let out = run(
        &mut target,
        Some(&mut head),
        &ints("prompt"),
        &options,
        &mut |_| true,
    )
    .unwrap();
    assert_eq!(out.tokens[..48], ints("spec_tokens")[..]);
    let accept: Vec<u32> = out
        .stats
        .accepted_per_round
        .iter()
        .take(11)
        .map(|&a| a as u32 + 1)
        .collect();
    assert_eq!(accept, ints("spec_accept"));
    // The sink holds exactly the committed positions.
    assert_eq!(sink.lock().unwrap().rows(), target.position());
}

/// The DFlash 2 fixture (`crates/dflash-draft/tests/data/dflash2-ref`, z-lab's module on a
/// random DFlash 2 draft over the same target) through `mtp::run` + `DFlashHead`, at the
/// reference precision and at `q8`: the selector picks every round's drafts, and the
/// text is the module's (= plain greedy).
#[test]
fn dflash2_reference_through_the_mtp_loop() {
    let data =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dflash-draft/tests/data/dflash2-ref");
    let (_dirs, package, draft) = packages(&data.join("draft"));
    let reference = Container::open(data.join("reference.safetensors")).unwrap();
    let ints = |n: &str| -> Vec<u32> {
        let t = reference.tensor(n).unwrap();
        t.to_i64().unwrap().iter().map(|&v| v as u32).collect()
    };
    let (prompt, spec) = (ints("prompt"), ints("spec"));
    for weights in [draft.reference_weights().unwrap(), draft.weights().unwrap()] {
        let mut target = CpuTarget::new(&package).unwrap();
        let sink = Arc::new(Mutex::new(TapRows::new(0)));
        target
            .set_layer_taps(&draft.config.target_layer_ids, sink.clone())
            .unwrap();
        let hooks = CpuHooks::new(&package, HeadKind::Tiles);
        let mut head = DFlashHead::new(&weights, Box::new(hooks), sink.clone());
        let options = RunOptions {
            max_tokens: spec.len(),
            draft_max: 7,
            adaptive: None,
            stop_tokens: vec![],
            sampling: SamplingConfig {
                temperature: 0.0,
                top_p: 1.0,
                seed: 0,
                ..SamplingConfig::default()
            },
        };
        let out = run(&mut target, Some(&mut head), &prompt, &options, &mut |_| {
            true
        })
        .unwrap();
        assert_eq!(out.tokens, spec, "{:?}", weights.precision());
        assert!(out.stats.rounds > 0 && out.stats.drafted > 0);
        let last = head.last_output().unwrap();
        assert_eq!(last.selection.as_ref().unwrap().tokens, last.tokens);
        assert_eq!(sink.lock().unwrap().rows(), target.position());
    }
}
