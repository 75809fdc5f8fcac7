//! `onebit convert-draft` and `onebit inspect` on draft packages.

mod common;
use common::{fixture, onebit};

use predicates::prelude::*;

#[test]
fn convert_draft_then_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("draft");
    onebit()
        .arg("convert-draft")
        .arg(fixture("dflash-ref/draft"))
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("draft package: 31 tensors"))
        .stdout(predicate::str::contains(
            "largest change: projections 0e0, norms 0e0",
        ));
    onebit()
        .arg("inspect")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "2 layers, hidden 128, intermediate 256, 4 heads / 2 kv x 32, block 8, taps 0 2 3",
        ));
    // Again without --force: refused, nothing overwritten.
    onebit()
        .arg("convert-draft")
        .arg(fixture("dflash-ref/draft"))
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("a package is already there"));
}

#[test]
fn convert_draft_pairs_with_a_target_package() {
    // tiny-qwen3 has 2 layers: the draft's tap layer 2 and 3 do not exist there.
    let dir = tempfile::tempdir().unwrap();
    onebit()
        .arg("convert-draft")
        .arg(fixture("dflash-ref/draft"))
        .arg(dir.path().join("draft"))
        .arg("--target")
        .arg(fixture("tiny-qwen3"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("dflash draft: paired with target"))
        .stderr(predicate::str::contains(
            "names layer 2, but the target has 2 layers",
        ));
}

#[test]
fn inspect_refuses_a_broken_draft_package_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("draft");
    onebit()
        .arg("convert-draft")
        .arg(fixture("dflash-ref/draft"))
        .arg(&out)
        .assert()
        .success();
    let config = out.join("config.json");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\"block_size\": 8", "\"block_size\": 1");
    std::fs::write(&config, text).unwrap();
    onebit()
        .arg("inspect")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "key 'block_size' 1 drafts nothing",
        ));
}

/// A draft whose `config.json` declares `architectures: ["DFlashDraftModel"]` but a
/// wrong `model_type` is routed to the draft loader by its architecture and refused
/// by name (exit 2), as `run --draft` refuses it, instead of being listed as a target.
#[test]
fn inspect_routes_a_draft_by_architectures_too() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("draft");
    onebit()
        .arg("convert-draft")
        .arg(fixture("dflash-ref/draft"))
        .arg(&out)
        .assert()
        .success();
    let config = out.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("\"model_type\": \"dflash\""), "{text}");
    assert!(text.contains("DFlashDraftModel"), "{text}");
    std::fs::write(
        &config,
        text.replace("\"model_type\": \"dflash\"", "\"model_type\": \"qwen3\""),
    )
    .unwrap();
    let message = "key 'model_type' is 'qwen3', not 'dflash'";
    onebit()
        .arg("inspect")
        .arg(&out)
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains(message));
    onebit()
        .args([
            "run",
            "--prompt-tokens",
            "1",
            "--max-tokens",
            "1",
            "--model",
        ])
        .arg(fixture("tiny-qwen3"))
        .arg("--draft")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(message));
}
