//! Helpers shared by the CLI tests.
#![allow(dead_code)]

use std::path::PathBuf;

pub mod server;

/// A file or folder of `../shared/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

/// The `onebit` binary under test.
pub fn onebit() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("onebit").unwrap()
}

/// The JSON object a successful `--json` run printed (panics with its stderr otherwise).
pub fn json_of(out: std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The DFlash reference pair as packages: the HF target converted, the z-lab draft imported.
pub fn reference_pair() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (target, draft) = (dir.path().join("target"), dir.path().join("draft"));
    onebit()
        .arg("convert")
        .arg("--quiet")
        .arg(fixture("dflash-ref/target"))
        .arg(&target)
        .assert()
        .success();
    onebit()
        .arg("convert-draft")
        .arg(fixture("dflash-ref/draft"))
        .arg(&draft)
        .arg("--target")
        .arg(&target)
        .assert()
        .success();
    (dir, target, draft)
}

/// tiny-llama converted from its GGUF (model, config and a tokenizer that encodes) into
/// a temporary folder: the folder (keep it alive) and the package's path.
pub fn tiny_llama_package() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("tiny-llama");
    onebit()
        .arg("convert")
        .arg("--quiet")
        .arg(fixture("tiny-llama/model.Q4_1.gguf"))
        .arg(&pkg)
        .assert()
        .success();
    (dir, pkg)
}
