//! Target packages refused by name: bad config values, missing or extra tensors,
//! wrong geometry.

use std::path::{Path, PathBuf};

use npu_runtime::TargetPackage;
use q4nx_format::{Container, ContainerWriter};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

/// A copy of tiny-qwen3 with its config edited and its tensors filtered/added.
fn package(
    edit_config: impl Fn(&mut Value),
    keep: impl Fn(&str) -> bool,
    extra: Option<(&str, Vec<u8>)>,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tiny-qwen3/config.json")).unwrap())
            .unwrap();
    edit_config(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let c = Container::open(fixture("tiny-qwen3/model.q4nx")).unwrap();
    let mut w = ContainerWriter::new();
    for t in c.tensors().filter(|t| keep(t.name)) {
        w.add(t.name, t.dtype, t.shape, t.bytes.to_vec()).unwrap();
    }
    if let Some((name, bytes)) = extra {
        w.add(name, q4nx_format::Dtype::U8, &[bytes.len()], bytes)
            .unwrap();
    }
    w.write_file(dir.path().join("model.q4nx")).unwrap();
    dir
}

fn refused(dir: &Path) -> String {
    match TargetPackage::open(dir) {
        Ok(_) => panic!("package accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn untouched_copy_loads() {
    let dir = package(|_| {}, |_| true, None);
    let p = TargetPackage::open(dir.path()).unwrap();
    assert_eq!(p.config.num_layers, 2);
}

#[test]
fn unsupported_model_type() {
    let dir = package(|c| c["model_type"] = "gemma3".into(), |_| true, None);
    let msg = refused(dir.path());
    assert!(
        msg.starts_with("target: ") && msg.contains("config key 'model_type' is 'gemma3'"),
        "{msg}"
    );
}

#[test]
fn missing_hidden_size() {
    let dir = package(
        |c| drop(c.as_object_mut().unwrap().remove("hidden_size")),
        |_| true,
        None,
    );
    assert!(refused(dir.path()).contains("config key 'hidden_size' is missing"));
}

#[test]
fn kv_heads_not_dividing_heads() {
    let dir = package(|c| c["num_key_value_heads"] = 3.into(), |_| true, None);
    assert!(refused(dir.path())
        .contains("config key 'num_key_value_heads' 3 does not divide num_attention_heads 4"));
}

#[test]
fn rope_scaling_refused() {
    let dir = package(
        |c| c["rope_scaling"] = serde_json::json!({"rope_type": "llama3"}),
        |_| true,
        None,
    );
    assert!(refused(dir.path())
        .contains("config key 'rope_scaling' type 'llama3' is not supported yet"));
}

#[test]
fn missing_tensor() {
    let dir = package(|_| {}, |n| n != "model.layers.1.mlp.up_proj.weight", None);
    assert!(refused(dir.path()).contains("no tensor named 'model.layers.1.mlp.up_proj.weight'"));
}

#[test]
fn extra_tensor() {
    let dir = package(
        |_| {},
        |_| true,
        Some(("model.layers.0.self_attn.sinks", vec![0; 4])),
    );
    assert!(refused(dir.path())
        .contains("tensor 'model.layers.0.self_attn.sinks' is not part of a 2-layer Qwen3 model"));
}

#[test]
fn wrong_geometry_in_config() {
    // An intermediate size the tiles do not have.
    let dir = package(|c| c["intermediate_size"] = 512.into(), |_| true, None);
    let msg = refused(dir.path());
    assert!(
        msg.contains("model.layers.0.mlp.gate_proj.weight")
            && msg.contains("not the q4_1 tile grid of 512 x 128"),
        "{msg}"
    );
}

#[test]
fn llama_package_with_qwen3_norms_is_refused() {
    let dir = package(|c| c["model_type"] = "llama".into(), |_| true, None);
    assert!(refused(dir.path())
        .contains("self_attn.k_norm.weight' is not part of a 2-layer Llama model"));
}

#[test]
fn missing_config_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let msg = refused(dir.path());
    assert!(
        msg.starts_with("target: ") && msg.contains("config.json: cannot read"),
        "{msg}"
    );
}
