//! `onebit inspect` run as a user runs it.

mod common;
use common::{fixture, onebit};

use predicates::prelude::*;

#[test]
fn file_inventory_line_and_histogram() {
    let path = fixture("tiny-llama/model.q4nx");
    onebit()
        .arg("inspect")
        .arg(&path)
        .assert()
        .success()
        .stdout(predicate::str::contains("21 tensors, 544080 bytes"))
        .stdout(predicate::str::contains(
            "BF16      6 tensors         132352 bytes",
        ))
        .stdout(predicate::str::contains(
            "I8       15 tensors         409600 bytes",
        ));
}

#[test]
fn tensors_flag_lists_every_tensor() {
    let out = onebit()
        .args(["inspect", "--tensors"])
        .arg(fixture("tiny-qwen3/model.q4nx"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("model.layers.1.self_attn.q_norm.weight\tBF16\t[32]\t64"),
        "{text}"
    );
    assert!(
        text.contains("lm_head.weight\tI8\t[16, 5120]\t81920"),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("  model.") || l.starts_with("  lm_head"))
            .count(),
        25
    );
}

#[test]
fn package_directory_describes_config() {
    onebit()
        .arg("inspect")
        .arg(fixture("tiny-qwen3"))
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "config: Qwen3ForCausalLM (qwen3), 2 layers, hidden 128, intermediate 256, 4 heads / 2 kv x 32, vocab 512",
        ))
        .stdout(predicate::str::contains("model.q4nx: 25 tensors, 544744 bytes"));
}

#[test]
fn missing_path_exits_2() {
    onebit()
        .args(["inspect", "/nonexistent/thing.q4nx"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no such file or directory"));
}

#[test]
fn refused_file_exits_2_with_the_format_message() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.q4nx");
    let mut bytes = std::fs::read(fixture("tiny-llama/model.q4nx")).unwrap();
    bytes.truncate(bytes.len() - 100);
    std::fs::write(&bad, bytes).unwrap();
    onebit()
        .arg("inspect")
        .arg(&bad)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("q4nx: "))
        .stderr(predicate::str::contains(
            "model.layers.1.self_attn.v_proj.weight",
        ));
}

#[test]
fn empty_directory_is_not_a_package() {
    let dir = tempfile::tempdir().unwrap();
    onebit()
        .arg("inspect")
        .arg(dir.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not a model package"));
}
