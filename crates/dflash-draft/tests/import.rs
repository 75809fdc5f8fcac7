//! Importing z-lab's DFlash draft (`../shared/fixtures/dflash-ref/draft`): lossless for
//! every projection and norm; the fusion matrix is BF16 in NPU packages, so it comes
//! back as exactly the bf16 rounding of each source value.

use std::path::PathBuf;

use dflash_draft::{fusion_orientation, import_zlab, load_draft, Gain, Projection, TargetShape};
use q4nx_format::Container;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

fn ref_target() -> TargetShape {
    TargetShape {
        name: "dflash-ref/target".into(),
        num_layers: 4,
        hidden_size: 128,
        vocab_size: 512,
    }
}

#[test]
fn dflash_ref_draft_imports_losslessly() {
    let out = tempfile::tempdir().unwrap();
    let report = import_zlab(
        &fixture("dflash-ref/draft"),
        out.path(),
        Some(&ref_target()),
    )
    .unwrap();
    assert_eq!(
        report.max_projection_error, 0.0,
        "projections are q4_1-representable"
    );
    assert_eq!(report.max_gain_error, 0.0, "gains are bf16-representable");
    assert_eq!(report.tensors, 31);
    eprintln!("{report:?}");
    assert_eq!(report.inventory, format!("31 tensors, {} bytes; 2 layers, hidden 128, intermediate 256, 4 heads / 2 kv x 32, block 8, taps 0 2 3", std::fs::metadata(out.path().join("dflash_weight.q4nx")).unwrap().len()));

    // Element by element against the source floats.
    let src = Container::open(fixture("dflash-ref/draft/model.safetensors")).unwrap();
    let draft = load_draft(out.path()).unwrap();
    assert_eq!(draft.config.mask_token_id, 511);
    assert_eq!(draft.config.target_layer_ids, [0, 2, 3]);
    for layer in 0..2 {
        for which in Projection::ALL {
            let name = which.tensor_name(layer);
            let want = src
                .tensor(name.trim_start_matches("model."))
                .unwrap()
                .to_f32()
                .unwrap();
            let got = draft.decode_projection(layer, which).unwrap();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}"
            );
        }
    }
    for gain in Gain::all(2) {
        let name = gain.tensor_name();
        let want = src
            .tensor(name.trim_start_matches("model."))
            .unwrap()
            .to_f32()
            .unwrap();
        assert_eq!(draft.decode_gain(gain).unwrap(), want, "{name}");
    }
    let fc = src.tensor("fc.weight").unwrap().to_f32().unwrap();
    // The report's fusion error is exactly the bf16 rounding of the source matrix.
    let rounding = fc
        .iter()
        .map(|&v| (half::bf16::from_f32(v).to_f32() - v).abs())
        .fold(0f32, f32::max);
    assert!(rounding > 0.0);
    assert_eq!(report.max_fusion_error, rounding);
    let got = draft.decode_fusion().unwrap();
    assert!(got
        .iter()
        .zip(&fc)
        .all(|(a, b)| *a == half::bf16::from_f32(*b).to_f32()));
    // The one trained draft we have: its fusion matrix (128 x 384, briefly trained) has
    // no neighbour structure the check can see — every figure of both readings is
    // below 0.05 in magnitude, as for independent noise — so both readings read
    // consistently and the check abstains rather than confirm or refute the order.
    // (The order itself is proved by the reference test: `fused` matches z-lab's to
    // 5e-6 with the float32 matrix read in the declared order.)
    let o = fusion_orientation(&draft).unwrap();
    eprintln!("orientation {o:?}");
    assert!(o.declared_consistent(), "{o:?}");
    assert!(o.plain_consistent(), "{o:?}");
    assert!(!o.confirms_declared_order(), "{o:?}");
    assert!(
        o.declared.iter().chain(&o.plain).all(|f| f.abs() < 0.05),
        "{o:?}"
    );
}

#[test]
fn import_refuses_a_bad_pairing_and_a_non_draft() {
    let out = tempfile::tempdir().unwrap();
    let small = TargetShape {
        num_layers: 3,
        ..ref_target()
    };
    let msg = import_zlab(&fixture("dflash-ref/draft"), out.path(), Some(&small))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("target_layer_ids names layer 3, but the target has 3 layers"),
        "{msg}"
    );
    let msg = import_zlab(&fixture("dflash-ref/target"), out.path(), None)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(
            "[0] is 'Qwen3ForCausalLM', not 'DFlashDraftModel' or 'DFlash2DraftModel' (not a z-lab DFlash draft)"
        ),
        "{msg}"
    );
}

/// A source tensor the package has no place for is refused by name, not dropped.
#[test]
fn import_refuses_an_unexplained_source_tensor() {
    use q4nx_format::{Container, ContainerWriter, Dtype};
    let src = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("dflash-ref/draft/config.json"),
        src.path().join("config.json"),
    )
    .unwrap();
    let original = Container::read(fixture("dflash-ref/draft/model.safetensors")).unwrap();
    let mut w = ContainerWriter::new();
    for t in original.tensors() {
        w.add(t.name, t.dtype, t.shape, t.bytes.to_vec()).unwrap();
    }
    w.add("layers.0.mlp.extra_bias", Dtype::F32, &[4], vec![0u8; 16])
        .unwrap();
    w.write_file(src.path().join("model.safetensors")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let msg = import_zlab(src.path(), out.path(), Some(&ref_target()))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("tensor 'layers.0.mlp.extra_bias' has no place in a DFlash draft package"),
        "{msg}"
    );
}

type ConfigEdit = Box<dyn Fn(&mut serde_json::Value)>;

/// A copy of the DFlash 2 source draft of `tests/data/dflash2-ref` with its config edited.
fn dflash2_source(edit: impl Fn(&mut serde_json::Value)) -> tempfile::TempDir {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/dflash2-ref/draft");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

/// A DFlash 2 draft imports with its `dflash_config` keys lifted (so `inspect` says
/// DFlash 2), and an attention pattern this forward does not run is refused by name.
#[test]
fn dflash2_import_and_its_refusals() {
    let out = tempfile::tempdir().unwrap();
    let report = import_zlab(dflash2_source(|_| {}).path(), out.path(), None).unwrap();
    assert!(
        report
            .inventory
            .contains("DFlash 2: conv 2 taps, groups of 16; selector rank 32, top-8; softcap 4, output multiplier 0.5"),
        "{}",
        report.inventory
    );
    let draft = dflash_draft::load_draft(out.path()).unwrap();
    assert_eq!(draft.config.block_size, 8);
    assert_eq!(draft.config.sliding_window, Some(24));
    let cases: Vec<(ConfigEdit, &str)> = vec![
        (
            Box::new(|c| c["is_causal"] = true.into()),
            "key 'is_causal' makes the block causal",
        ),
        (
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("is_causal");
            }),
            "key 'is_causal' makes the block causal (set, or implied by sliding_attention layers)",
        ),
        (
            Box::new(|c| {
                c["layer_types"] = serde_json::json!(["sliding_attention", "full_attention"])
            }),
            "key 'layer_types' mixes sliding and full attention",
        ),
        (
            Box::new(|c| c["dflash_config"]["conv_group_size"] = 48.into()),
            "key 'conv_group_size' 48 does not divide hidden_size 128",
        ),
    ];
    for (edit, expect) in cases {
        let out = tempfile::tempdir().unwrap();
        let msg = import_zlab(dflash2_source(edit).path(), out.path(), None)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("dflash draft: ") && msg.contains(expect),
            "{msg}"
        );
    }
    // Full-attention layers take no window.
    let out = tempfile::tempdir().unwrap();
    let source = dflash2_source(|c| {
        c["layer_types"] = serde_json::json!(["full_attention", "full_attention"])
    });
    import_zlab(source.path(), out.path(), None).unwrap();
    let draft = dflash_draft::load_draft(out.path()).unwrap();
    assert_eq!(draft.config.sliding_window, None);
}
