//! `config.json` rules at their boundaries, through `DraftConfig::from_json` directly
//! (the package tests cover the refusals as users see them).

use dflash_draft::synthetic::{small_config, write_synthetic};
use dflash_draft::DraftConfig;
use serde_json::{json, Value};

fn base() -> Value {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), &small_config(), 1).unwrap();
    serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap()
}

fn parse(edit: impl Fn(&mut Value)) -> Result<DraftConfig, String> {
    let mut v = base();
    edit(&mut v);
    DraftConfig::from_json("config.json", &v).map_err(|e| e.to_string())
}

#[test]
fn head_dim_defaults_to_hidden_over_heads() {
    let c = parse(|v| {
        v.as_object_mut().unwrap().remove("head_dim");
    })
    .unwrap();
    assert_eq!(c.head_dim, c.hidden_size / c.num_heads);
    assert_eq!(
        c,
        parse(|_| {}).unwrap(),
        "the default equals the explicit value here"
    );
}

#[test]
fn query_width_must_fill_q4_groups() {
    let err = parse(|v| v["head_dim"] = json!(12)).unwrap_err();
    assert!(
        err.contains("4 heads x 12 is not a multiple of 32"),
        "{err}"
    );
}

#[test]
fn taps_must_be_a_non_empty_array() {
    let err = parse(|v| v["target_layer_ids"] = json!([])).unwrap_err();
    assert!(
        err.contains("'target_layer_ids' is [], not a non-empty array"),
        "{err}"
    );
}

#[test]
fn block_size_boundaries() {
    // Two is the smallest block that drafts (the last token and one mask).
    assert_eq!(parse(|v| v["block_size"] = json!(2)).unwrap().block_size, 2);
    assert!(parse(|v| v["block_size"] = json!(1)).is_err());
    // A block may fill the whole position budget, not exceed it.
    let budget = base()["max_position_embeddings"].as_u64().unwrap();
    assert_eq!(
        parse(|v| v["block_size"] = json!(budget))
            .unwrap()
            .block_size as u64,
        budget
    );
    let err = parse(|v| v["block_size"] = json!(budget + 1)).unwrap_err();
    assert!(err.contains("exceeds the draft's position budget"), "{err}");
}
