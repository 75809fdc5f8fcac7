//! The draft loader: a formula-built package decoded element by element, and every
//! refusal matched on its message.

use std::path::Path;

use dflash_draft::synthetic::{
    fusion_value, gain_value, projection_value, small_config, small_v2_config, v2_value,
    write_synthetic,
};
use dflash_draft::{
    fusion_orientation, load_draft, load_draft_with, DraftConfig, Gain, LoadOptions, Projection,
    Sublayer, TargetShape, V2Tensor, FUSION,
};
use q4nx_format::{Container, ContainerWriter, Dtype};
use serde_json::Value;

const SEED: u64 = 42;

fn package() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), &small_config(), SEED).unwrap();
    dir
}

#[test]
fn synthetic_package_decodes_element_by_element() {
    let dir = package();
    let draft = load_draft(dir.path()).unwrap();
    let c = &draft.config;
    let mut checked = 0usize;
    for layer in 0..c.num_layers {
        for which in Projection::ALL {
            let (n, k) = which.shape(c);
            let values = draft.decode_projection(layer, which).unwrap();
            for r in 0..n {
                for col in 0..k {
                    assert_eq!(
                        values[r * k + col],
                        projection_value(SEED, layer, which, r, col),
                        "{which:?} {layer} ({r},{col})"
                    );
                    checked += 1;
                }
            }
        }
    }
    for gain in Gain::all(c.num_layers) {
        let values = draft.decode_gain(gain).unwrap();
        assert_eq!(
            values,
            (0..gain.len(c))
                .map(|i| gain_value(SEED, gain, i))
                .collect::<Vec<_>>()
        );
    }
    assert!(
        draft
            .decode_gain(Gain::PostAttention(0))
            .unwrap()
            .iter()
            .any(|&g| g < 0.0),
        "negative gains are accepted"
    );
    let fc = draft.decode_fusion().unwrap();
    let w = c.context_width();
    for r in 0..c.hidden_size {
        for col in 0..w {
            assert_eq!(fc[r * w + col], fusion_value(SEED, r, col));
        }
    }
    assert_eq!(checked, 2 * (64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 3));
    assert_eq!(
        draft.inventory_line(),
        format!("{} tensors, {} bytes; 2 layers, hidden 64, intermediate 128, 4 heads / 2 kv x 16, block 4, taps 1 3", 2 * 11 + 3 + 6, draft.file_bytes())
    );
    let o = fusion_orientation(&draft).unwrap();
    assert!(o.confirms_declared_order(), "{o:?}");
}

// ---- refusals ----

fn config_of(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn set_config(dir: &Path, edit: impl Fn(&mut Value)) {
    let mut c = config_of(dir);
    edit(&mut c);
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
}

/// Rewrites the container: drops tensors `keep` rejects, replaces/adds `extra`.
fn rewrite(
    dir: &Path,
    keep: impl Fn(&str) -> bool,
    extra: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)>,
) {
    let path = dir.join("dflash_weight.q4nx");
    let c = Container::read(&path).unwrap();
    let mut w = ContainerWriter::new();
    for t in c
        .tensors()
        .filter(|t| keep(t.name) && !extra.iter().any(|e| e.0 == t.name))
    {
        w.add(t.name, t.dtype, t.shape, t.bytes.to_vec()).unwrap();
    }
    for (name, dtype, shape, bytes) in extra {
        w.add(name, dtype, &shape, bytes).unwrap();
    }
    drop(c);
    w.write_file(&path).unwrap();
}

fn refused(dir: &Path, expect: &[&str]) {
    let msg = match load_draft_with(
        dir,
        LoadOptions {
            verify_manifest: false,
        },
    ) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    assert!(msg.starts_with("dflash draft: "), "{msg}");
    assert!(
        msg.contains(&dir.display().to_string()),
        "{msg:?} does not name the package's file"
    );
    for piece in expect {
        assert!(msg.contains(piece), "{msg:?} lacks {piece:?}");
    }
}

#[test]
fn missing_tensor() {
    let d = package();
    rewrite(
        d.path(),
        |n| n != "model.layers.1.mlp.down_proj.weight",
        vec![],
    );
    refused(
        d.path(),
        &["no tensor named 'model.layers.1.mlp.down_proj.weight'"],
    );
}

#[test]
fn too_few_tiles() {
    let d = package();
    let c = Container::read(d.path().join("dflash_weight.q4nx")).unwrap();
    let t = c.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    let short = t.bytes[..t.bytes.len() - 5120].to_vec();
    let rows = t.shape[0] - 1;
    drop(c);
    rewrite(
        d.path(),
        |_| true,
        vec![(
            "model.layers.0.self_attn.q_proj.weight",
            Dtype::I8,
            vec![rows, 5120],
            short,
        )],
    );
    refused(
        d.path(),
        &[
            "model.layers.0.self_attn.q_proj.weight",
            "not the q4_1 tile grid of 64 x 64",
        ],
    );
}

#[test]
fn tensor_of_another_architecture() {
    let d = package();
    rewrite(
        d.path(),
        |_| true,
        vec![(
            "model.layers.0.mlp.experts.0.up_proj.weight",
            Dtype::I8,
            vec![1, 5120],
            vec![0; 5120],
        )],
    );
    refused(
        d.path(),
        &["tensor 'model.layers.0.mlp.experts.0.up_proj.weight' is not part of a DFlash draft"],
    );
}

#[test]
fn wrong_dtype_label() {
    let d = package();
    rewrite(
        d.path(),
        |_| true,
        vec![("model.norm.weight", Dtype::F16, vec![64], vec![0; 128])],
    );
    refused(
        d.path(),
        &["tensor 'model.norm.weight' has dtype F16, expected BF16"],
    );
}

#[test]
fn plain_row_major_fusion_matrix() {
    let d = package();
    rewrite(
        d.path(),
        |_| true,
        vec![(FUSION, Dtype::BF16, vec![64, 128], vec![0; 64 * 128 * 2])],
    );
    refused(
        d.path(),
        &[
            "tensor 'model.fc.weight' is plain row-major [64, 128]",
            "[2, 128, 32]",
        ],
    );
}

#[test]
fn scalar_block_size_disagrees() {
    let d = package();
    rewrite(
        d.path(),
        |_| true,
        vec![(
            "dflash.block_size",
            Dtype::I64,
            vec![1],
            8i64.to_le_bytes().to_vec(),
        )],
    );
    refused(
        d.path(),
        &[
            "scalar 'dflash.block_size' is [8.0]",
            "but [4.0] in config.json ('block_size')",
        ],
    );
}

#[test]
fn scalar_taps_disagree() {
    let d = package();
    let bytes: Vec<u8> = [1i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    rewrite(
        d.path(),
        |_| true,
        vec![("dflash.target_layer_ids", Dtype::I64, vec![2], bytes)],
    );
    refused(
        d.path(),
        &[
            "scalar 'dflash.target_layer_ids' is [1.0, 2.0]",
            "('target_layer_ids')",
        ],
    );
}

#[test]
fn scalar_rope_theta_disagrees() {
    let d = package();
    rewrite(
        d.path(),
        |_| true,
        vec![(
            "dflash.rope_theta",
            Dtype::F32,
            vec![1],
            1e6f32.to_le_bytes().to_vec(),
        )],
    );
    refused(
        d.path(),
        &[
            "scalar 'dflash.rope_theta' is [1000000.0]",
            "('rope_theta')",
        ],
    );
}

#[test]
fn missing_scalar() {
    let d = package();
    rewrite(d.path(), |n| n != "dflash.rms_eps", vec![]);
    refused(d.path(), &["no tensor named 'dflash.rms_eps'"]);
}

#[test]
fn dflash2_architecture_under_dflash_model_type() {
    let d = package();
    set_config(d.path(), |c| {
        c["architectures"] = serde_json::json!(["DFlash2DraftModel"])
    });
    refused(
        d.path(),
        &[
            "key 'architectures' [0] is 'DFlash2DraftModel', not 'DFlashDraftModel'",
            "(model_type 'dflash')",
        ],
    );
}

// ---- DFlash 2 ----

fn v2_package() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), &small_v2_config(), SEED).unwrap();
    dir
}

#[test]
fn dflash2_package_decodes_element_by_element() {
    let d = v2_package();
    let draft = load_draft(d.path()).unwrap();
    assert_eq!(draft.generation(), "DFlash 2");
    let c = &draft.config;
    for which in V2Tensor::all(c.num_layers) {
        let shape = which.shape(c).unwrap();
        let values = draft.decode_v2(which).unwrap();
        assert_eq!(values.len(), shape.iter().product::<usize>());
        for (i, v) in values.iter().enumerate() {
            assert_eq!(*v, v2_value(SEED, which, &shape, i), "{which:?} [{i}]");
        }
    }
    assert_eq!(
        V2Tensor::ConvProjection(0, Sublayer::Mlp).shape(c),
        Some(vec![2 * 2 * (64 / 16), 64])
    );
    assert_eq!(
        V2Tensor::PredecessorCodebook.tensor_name(),
        "model.candidate_selector.predecessor_codebook"
    );
    assert!(
        draft
            .inventory_line()
            .ends_with("; DFlash 2: conv 2 taps, groups of 16; selector rank 16, top-8; softcap 4, output multiplier 0.5"),
        "{}",
        draft.inventory_line()
    );
    // The config reads back as written.
    let again = DraftConfig::from_json("x", &config_of(d.path())).unwrap();
    assert_eq!(again, small_v2_config());
}

#[test]
fn dflash2_missing_tensor() {
    let d = v2_package();
    rewrite(
        d.path(),
        |n| n != "model.layers.1.mlp_conv.kernel_projection.weight",
        vec![],
    );
    refused(
        d.path(),
        &["no tensor named 'model.layers.1.mlp_conv.kernel_projection.weight'"],
    );
}

#[test]
fn dflash2_wrong_shape_and_dtype() {
    let d = v2_package();
    rewrite(
        d.path(),
        |_| true,
        vec![(
            "model.layers.0.attention_conv.base_kernel",
            Dtype::BF16,
            vec![2, 3, 64],
            vec![0; 2 * 3 * 64 * 2],
        )],
    );
    refused(
        d.path(),
        &[
            "tensor 'model.layers.0.attention_conv.base_kernel' has shape [2, 3, 64], expected [2, 2, 64]",
        ],
    );
    let d = v2_package();
    rewrite(
        d.path(),
        |_| true,
        vec![(
            "model.candidate_selector.successor_codebook",
            Dtype::F32,
            vec![512, 16],
            vec![0; 512 * 16 * 4],
        )],
    );
    refused(
        d.path(),
        &["tensor 'model.candidate_selector.successor_codebook' has dtype F32, expected BF16"],
    );
}

#[test]
fn dflash2_non_finite_value() {
    let d = v2_package();
    let mut bytes = vec![0u8; 16 * 64 * 2];
    bytes[2 * 37..2 * 38].copy_from_slice(&half::bf16::NAN.to_le_bytes());
    rewrite(
        d.path(),
        |_| true,
        vec![(
            "model.candidate_selector.hidden_projection.weight",
            Dtype::BF16,
            vec![16, 64],
            bytes,
        )],
    );
    refused(
        d.path(),
        &["tensor 'model.candidate_selector.hidden_projection.weight' holds a non-finite value at element 37"],
    );
}

#[test]
fn dflash1_package_with_a_dflash2_tensor() {
    let d = package();
    rewrite(
        d.path(),
        |_| true,
        vec![(
            "model.layers.0.mlp_conv.base_kernel",
            Dtype::BF16,
            vec![2, 2, 64],
            vec![0; 2 * 2 * 64 * 2],
        )],
    );
    refused(
        d.path(),
        &["tensor 'model.layers.0.mlp_conv.base_kernel' is not part of a DFlash draft"],
    );
}

#[test]
fn dflash2_inconsistent_keys_are_refused_by_name() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "conv_group_size",
            24.into(),
            "key 'conv_group_size' 24 does not divide hidden_size 64",
        ),
        (
            "conv_kernel_size",
            5.into(),
            "key 'conv_kernel_size' 5 exceeds block_size 4",
        ),
        (
            "conv_kernel_size",
            0.into(),
            "key 'conv_kernel_size' is 0, not an integer in 1..=2^24",
        ),
        (
            "selector_rank",
            Value::Null,
            "key 'selector_rank' is missing",
        ),
        (
            "selector_top_k",
            513.into(),
            "key 'selector_top_k' 513 exceeds vocab_size 512",
        ),
        (
            "vocab_size",
            Value::Null,
            "key 'vocab_size' is missing; a DFlash 2 draft's selector codebooks",
        ),
        (
            "final_logit_softcapping",
            (-1.0).into(),
            "key 'final_logit_softcapping' is -1; a cap is positive",
        ),
        (
            "output_multiplier",
            0.into(),
            "key 'output_multiplier' is 0",
        ),
        (
            "output_multiplier",
            "x".into(),
            "key 'output_multiplier' is \"x\", not a finite number",
        ),
        (
            "sliding_window",
            3.into(),
            "key 'sliding_window' 3 is smaller than block_size 4",
        ),
    ];
    for (key, value, expect) in cases {
        let d = v2_package();
        set_config(d.path(), |c| c[key] = value.clone());
        refused(d.path(), &[expect]);
    }
}

#[test]
fn dflash2_pairing_needs_the_targets_vocabulary() {
    let d = v2_package();
    let draft = load_draft(d.path()).unwrap();
    let target = |vocab| TargetShape {
        name: "t".into(),
        num_layers: 4,
        hidden_size: 64,
        vocab_size: vocab,
    };
    draft.check_target(&target(512)).unwrap();
    let msg = draft.check_target(&target(600)).unwrap_err().to_string();
    assert!(
        msg.contains("the DFlash 2 selector's codebooks have 512 rows, but the target's vocabulary has 600 tokens"),
        "{msg}"
    );
}

#[test]
fn model_type_not_dflash() {
    let d = package();
    set_config(d.path(), |c| c["model_type"] = "qwen3".into());
    refused(d.path(), &["key 'model_type' is 'qwen3', not 'dflash'"]);
}

#[test]
fn architecture_not_dflash() {
    let d = package();
    set_config(d.path(), |c| {
        c["architectures"] = serde_json::json!(["Qwen3ForCausalLM"])
    });
    refused(
        d.path(),
        &["key 'architectures' [0] is 'Qwen3ForCausalLM', not 'DFlashDraftModel'"],
    );
}

#[test]
fn missing_mask_token_id() {
    let d = package();
    set_config(d.path(), |c| {
        drop(c.as_object_mut().unwrap().remove("mask_token_id"))
    });
    refused(
        d.path(),
        &["key 'mask_token_id' is missing; no usable 'mask_token_id'"],
    );
}

#[test]
fn mask_token_id_beyond_vocabulary() {
    let d = package();
    set_config(d.path(), |c| c["mask_token_id"] = 512.into());
    refused(
        d.path(),
        &["key 'mask_token_id' 512 is not below vocab_size 512"],
    );
}

#[test]
fn target_layers_out_of_order() {
    let d = package();
    set_config(d.path(), |c| {
        c["target_layer_ids"] = serde_json::json!([1, 3, 3])
    });
    refused(
        d.path(),
        &["key 'target_layer_ids' is not strictly increasing at 2"],
    );
}

#[test]
fn block_size_one_drafts_nothing() {
    let d = package();
    set_config(d.path(), |c| c["block_size"] = 1.into());
    refused(d.path(), &["key 'block_size' 1 drafts nothing"]);
}

#[test]
fn block_size_beyond_position_budget() {
    let d = package();
    set_config(d.path(), |c| c["max_position_embeddings"] = 3.into());
    refused(
        d.path(),
        &["key 'block_size' 4 exceeds the draft's position budget (max_position_embeddings 3)"],
    );
}

#[test]
fn weight_path_leaving_the_package() {
    let d = package();
    set_config(d.path(), |c| {
        c["weights"] = "../elsewhere/dflash_weight.q4nx".into()
    });
    refused(
        d.path(),
        &["key 'weights' '../elsewhere/dflash_weight.q4nx' leaves the package directory"],
    );
    set_config(d.path(), |c| c["weights"] = "/etc/passwd".into());
    refused(d.path(), &["'/etc/passwd' leaves the package directory"]);
}

#[test]
fn non_tile_geometry() {
    let d = package();
    set_config(d.path(), |c| c["hidden_size"] = 72.into());
    refused(d.path(), &["key 'hidden_size' 72 is not a multiple of 32"]);
}

#[test]
fn geometry_disagreeing_with_tiles() {
    let d = package();
    set_config(d.path(), |c| c["intermediate_size"] = 256.into());
    refused(
        d.path(),
        &[
            "model.layers.0.mlp.gate_proj.weight",
            "not the q4_1 tile grid of 256 x 64",
        ],
    );
}

#[test]
fn truncated_file() {
    let d = package();
    let path = d.path().join("dflash_weight.q4nx");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    refused(d.path(), &["q4nx: ", "past the"]);
}

#[test]
fn empty_directory() {
    let d = tempfile::tempdir().unwrap();
    refused(d.path(), &["not a draft package: no config.json"]);
}

#[test]
fn manifest_mismatch() {
    let d = package();
    // A fresh package verifies every file its manifest lists.
    let listed = std::fs::read_to_string(d.path().join(dflash_draft::MANIFEST))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count();
    assert!(listed >= 2);
    assert_eq!(dflash_draft::verify_manifest(d.path()).unwrap(), listed);
    set_config(d.path(), |c| c["rope_theta"] = 10000.0.into()); // same value, different bytes
    let msg = load_draft(d.path()).err().unwrap().to_string();
    assert!(
        msg.contains("MANIFEST.sha256 says 'config.json' has sha256"),
        "{msg}"
    );
    // The opt-out skips the manifest and loads.
    assert!(load_draft_with(
        d.path(),
        LoadOptions {
            verify_manifest: false
        }
    )
    .is_ok());
}

#[test]
fn pairing_with_a_target() {
    let d = package();
    let draft = load_draft(d.path()).unwrap();
    let target = |layers, vocab| TargetShape {
        name: "t".into(),
        num_layers: layers,
        hidden_size: 64,
        vocab_size: vocab,
    };
    assert!(draft.check_target(&target(4, 512)).is_ok());
    let msg = draft.check_target(&target(3, 512)).unwrap_err().to_string();
    assert_eq!(msg, "dflash draft: paired with target t: target_layer_ids names layer 3, but the target has 3 layers");
    let msg = draft.check_target(&target(4, 500)).unwrap_err().to_string();
    assert_eq!(msg, "dflash draft: paired with target t: mask_token_id 511 is not below the target's vocabulary of 500");
}

/// Every scalar of the one table, rewritten to a value the config does not have, is
/// refused naming the scalar and the config key (the three above show whole messages).
#[test]
fn every_scalar_disagreement_is_refused() {
    use dflash_draft::{ScalarKind, SCALARS};
    for (scalar, key, kind) in SCALARS {
        let d = package();
        let (dtype, bytes) = match kind {
            ScalarKind::Ints => (Dtype::I64, 9999i64.to_le_bytes().to_vec()),
            ScalarKind::Float => (Dtype::F32, 12345.0f32.to_le_bytes().to_vec()),
        };
        rewrite(d.path(), |_| true, vec![(scalar, dtype, vec![1], bytes)]);
        let shown = match kind {
            ScalarKind::Ints => "[9999.0]",
            ScalarKind::Float => "[12345.0]",
        };
        // What config.json says, stated here independently of the loader's table.
        let c = small_config();
        let configured: Vec<f64> = match key {
            "block_size" => vec![c.block_size as f64],
            "sliding_window" => vec![c.sliding_window.unwrap_or(0) as f64],
            "target_layer_ids" => c.target_layer_ids.iter().map(|&l| l as f64).collect(),
            "embedding_scale" => vec![c.embedding_scale as f64],
            "rope_theta" => vec![c.rope_theta as f64],
            "rms_norm_eps" => vec![c.rms_norm_eps as f64],
            other => panic!("a scalar key this test does not know: {other}"),
        };
        refused(
            d.path(),
            &[
                &format!("scalar '{scalar}' is {shown}"),
                &format!("but {configured:?} in config.json ('{key}')"),
            ],
        );
    }
}

/// Norm gains must be finite and bounded (a corrupt gain poisons every draft).
#[test]
fn unbounded_or_non_finite_gain() {
    for (bad, shown) in [(f32::NAN, "NaN"), (20480.0, "20480"), (-32768.0, "-32768")] {
        let d = package();
        let c = Container::read(d.path().join("dflash_weight.q4nx")).unwrap();
        let gain = c
            .tensors()
            .find(|t| t.name.ends_with("input_layernorm.weight"))
            .map(|t| (t.name.to_string(), t.shape.to_vec(), t.bytes.to_vec()))
            .unwrap();
        drop(c);
        let mut bytes = gain.2.clone();
        bytes[2..4].copy_from_slice(&half::bf16::from_f32(bad).to_le_bytes());
        rewrite(
            d.path(),
            |_| true,
            vec![(&gain.0, Dtype::BF16, gain.1.clone(), bytes)],
        );
        refused(
            d.path(),
            &[
                &gain.0,
                &format!("holds {shown}"),
                "not a finite, bounded gain",
            ],
        );
    }
}

/// The builder names a non-default weights file in config.json (and only then), and
/// the loader follows it.
#[test]
fn custom_weights_file_name() {
    let d = package();
    assert!(
        config_of(d.path()).get("weights").is_none(),
        "default name left implicit"
    );
    let custom = tempfile::tempdir().unwrap();
    let mut config = small_config();
    config.weights = "custom_weights.q4nx".into();
    write_synthetic(custom.path(), &config, SEED).unwrap();
    assert_eq!(config_of(custom.path())["weights"], "custom_weights.q4nx");
    assert!(custom.path().join("custom_weights.q4nx").is_file());
    let draft = load_draft(custom.path()).unwrap();
    assert_eq!(draft.config.weights, "custom_weights.q4nx");
}

/// The orientation check tells a fusion matrix stored in the declared block-column
/// order from the same values written plainly row after row (same shape, so the
/// loader cannot see it): the declared reading contradicts itself, the plain one agrees.
#[test]
fn orientation_check_flags_a_plain_row_major_fusion_matrix() {
    let d = package();
    let draft = load_draft(d.path()).unwrap();
    let right = fusion_orientation(&draft).unwrap();
    assert!(
        right.declared_consistent() && !right.plain_consistent(),
        "{right:?}"
    );
    let logical = draft.decode_fusion().unwrap();
    // The figures are Pearson correlations of log|W| between neighbours, computed
    // here the textbook way (two passes) for the declared reading.
    let (rows, cols) = (64usize, logical.len() / 64);
    let logs: Vec<f64> = logical
        .iter()
        .map(|&v| (v.abs() as f64 + 1e-12).ln())
        .collect();
    let pearson = |dr: usize, dc: usize| -> f64 {
        let pairs: Vec<(f64, f64)> = (0..rows - dr)
            .flat_map(|r| (0..cols - dc).map(move |c| (r, c)))
            .map(|(r, c)| (logs[r * cols + c], logs[(r + dr) * cols + c + dc]))
            .collect();
        let n = pairs.len() as f64;
        let (mx, my) = (
            pairs.iter().map(|p| p.0).sum::<f64>() / n,
            pairs.iter().map(|p| p.1).sum::<f64>() / n,
        );
        let cov: f64 = pairs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / n;
        let vx: f64 = pairs.iter().map(|p| (p.0 - mx).powi(2)).sum::<f64>() / n;
        let vy: f64 = pairs.iter().map(|p| (p.1 - my).powi(2)).sum::<f64>() / n;
        cov / (vx * vy).sqrt()
    };
    for (i, (dr, dc)) in [(1, 0), (32, 0), (0, 1), (0, 32)].into_iter().enumerate() {
        assert!(
            (right.declared[i] - pearson(dr, dc)).abs() < 1e-9,
            "figure {i}: {} vs {}",
            right.declared[i],
            pearson(dr, dc)
        );
    }
    let c = Container::read(d.path().join("dflash_weight.q4nx")).unwrap();
    let shape = c.tensor(FUSION).unwrap().shape.to_vec();
    drop(c);
    drop(draft);
    let plain: Vec<u8> = logical
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    rewrite(
        d.path(),
        |_| true,
        vec![(FUSION, Dtype::BF16, shape, plain)],
    );
    let wrong = load_draft_with(
        d.path(),
        LoadOptions {
            verify_manifest: false,
        },
    )
    .unwrap();
    let o = fusion_orientation(&wrong).unwrap();
    assert!(!o.declared_consistent() && o.plain_consistent(), "{o:?}");
    assert!(!o.confirms_declared_order());
    // The two readings swap roles: what was the plain reading is now the declared one.
    assert_eq!(o.plain, right.declared);
}

/// A fusion matrix without structure (independent noise) reads consistently both ways,
/// so the check does not confirm an order it cannot see.
#[test]
fn orientation_check_abstains_on_structureless_weights() {
    let d = package();
    let c = Container::read(d.path().join("dflash_weight.q4nx")).unwrap();
    let (shape, len) = {
        let t = c.tensor(FUSION).unwrap();
        (t.shape.to_vec(), t.bytes.len() / 2)
    };
    drop(c);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let noise: Vec<u8> = (0..len)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            half::bf16::from_f32(v).to_le_bytes()
        })
        .collect();
    rewrite(
        d.path(),
        |_| true,
        vec![(FUSION, Dtype::BF16, shape, noise)],
    );
    let draft = load_draft_with(
        d.path(),
        LoadOptions {
            verify_manifest: false,
        },
    )
    .unwrap();
    let o = fusion_orientation(&draft).unwrap();
    assert!(o.declared_consistent() && o.plain_consistent(), "{o:?}");
    assert!(!o.confirms_declared_order(), "{o:?}");
    assert!(
        o.declared.iter().chain(&o.plain).all(|f| f.abs() < 0.05),
        "{o:?}"
    );
}
