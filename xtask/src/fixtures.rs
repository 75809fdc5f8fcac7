//! `cargo xtask fixtures`: the synthetic packages the project makes and owns.
//!
//! `fixtures/tiny-demo/` is committed (small, and the README's quick start reads it);
//! a test regenerates it and compares bytes, so the committed copy cannot drift from
//! this generator.

use std::path::Path;

use anyhow::{Context, Result};
use q4nx_format::{encode_q4_1, ContainerWriter, Dtype, TILE_BYTES};

/// Geometry of the tiny demo package (Llama family).
const HIDDEN: usize = 32;
const INTERMEDIATE: usize = 64;
const VOCAB: usize = 64;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = 16;
const LAYERS: usize = 1;

/// A deterministic, q4_1-representable weight: every 32-column group is
/// `d * q + m` with codes 0..15 all present.
fn weight(seed: usize, rows: usize, cols: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let g = c / 32;
            let d = half::bf16::from_f32(0.01 + 0.001 * ((seed + r + g) % 7) as f32).to_f32();
            let m = half::bf16::from_f32(-7.5 * d).to_f32();
            let q = ((c * 7 + r * 3 + seed) % 16) as f32;
            v.push(d * q + m);
        }
    }
    v
}

fn add_projection(
    w: &mut ContainerWriter,
    name: &str,
    seed: usize,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let tiles = encode_q4_1(&weight(seed, rows, cols), rows, cols)?;
    w.add(
        name,
        Dtype::I8,
        &[tiles.len() / TILE_BYTES, TILE_BYTES],
        tiles,
    )?;
    Ok(())
}

/// The demo package's container bytes and config text.
pub fn tiny_demo() -> Result<(Vec<u8>, String)> {
    let mut w = ContainerWriter::new();
    let embed: Vec<f32> = (0..VOCAB * HIDDEN)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 200.0)
        .collect();
    w.add_bf16("model.embed_tokens.weight", &[VOCAB, HIDDEN], &embed)?;
    let gain = vec![1.0f32; HIDDEN];
    w.add_bf16("model.norm.weight", &[HIDDEN], &gain)?;
    add_projection(&mut w, "lm_head.weight", 99, VOCAB, HIDDEN)?;
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}.");
        w.add_bf16(format!("{p}input_layernorm.weight"), &[HIDDEN], &gain)?;
        w.add_bf16(
            format!("{p}post_attention_layernorm.weight"),
            &[HIDDEN],
            &gain,
        )?;
        let kv = KV_HEADS * HEAD_DIM;
        for (i, (name, rows, cols)) in [
            ("self_attn.q_proj", HEADS * HEAD_DIM, HIDDEN),
            ("self_attn.k_proj", kv, HIDDEN),
            ("self_attn.v_proj", kv, HIDDEN),
            ("self_attn.o_proj", HIDDEN, HEADS * HEAD_DIM),
            ("mlp.gate_proj", INTERMEDIATE, HIDDEN),
            ("mlp.up_proj", INTERMEDIATE, HIDDEN),
            ("mlp.down_proj", HIDDEN, INTERMEDIATE),
        ]
        .into_iter()
        .enumerate()
        {
            add_projection(&mut w, &format!("{p}{name}.weight"), l * 10 + i, rows, cols)?;
        }
    }
    let config = format!(
        r#"{{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "vocab_size": {VOCAB},
  "hidden_size": {HIDDEN},
  "intermediate_size": {INTERMEDIATE},
  "num_hidden_layers": {LAYERS},
  "num_attention_heads": {HEADS},
  "num_key_value_heads": {KV_HEADS},
  "head_dim": {HEAD_DIM},
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "max_position_embeddings": 256,
  "tie_word_embeddings": false,
  "bos_token_id": 1,
  "eos_token_id": 2
}}
"#
    );
    Ok((w.to_bytes(), config))
}

/// Where the generated (uncommitted) fixtures go.
pub fn generated_dir() -> std::path::PathBuf {
    crate::workspace_root().join("target/fixtures")
}

pub fn run(args: &[String]) -> Result<()> {
    let dir = crate::workspace_root().join("fixtures/tiny-demo");
    write_tiny_demo(&dir)?;
    println!("fixtures: wrote {}", dir.display());
    let out = generated_dir();
    let small = out.join("draft-small");
    dflash_draft::synthetic::write_synthetic(&small, &dflash_draft::synthetic::small_config(), 42)?;
    println!(
        "fixtures: wrote {} (small synthetic DFlash draft)",
        small.display()
    );
    let smollm2 = out.join("smollm2-draft");
    dflash_draft::synthetic::write_synthetic(
        &smollm2,
        &dflash_draft::synthetic::smollm2_config(),
        135,
    )?;
    println!(
        "fixtures: wrote {} (synthetic DFlash draft of SmolLM2 geometry: random weights, never right)",
        smollm2.display()
    );
    // DFlash 2 at the published convolution and selector geometry (two taps, groups of
    // 16, rank 256, top-16, block 16) over SmolLM2's sizes: the z-lab layout, then the
    // package `onebit convert-draft` makes of it.
    let source = out.join("smollm2-dflash2-hf");
    let config = dflash_draft::synthetic::smollm2_v2_config();
    dflash_draft::synthetic::write_zlab_source(&source, &config, 235)?;
    let package = out.join("smollm2-dflash2");
    let report = dflash_draft::import_zlab(&source, &package, None)?;
    println!(
        "fixtures: wrote {} (z-lab layout) and {} (random DFlash 2 draft of SmolLM2 geometry: {})",
        source.display(),
        package.display(),
        report.inventory
    );
    if !args.iter().any(|a| a == "--no-bolt") {
        let start = std::time::Instant::now();
        let bolt = out.join("bolt-draft");
        dflash_draft::synthetic::write_synthetic(
            &bolt,
            &dflash_draft::synthetic::bolt_config(),
            2026,
        )?;
        let bytes = std::fs::metadata(bolt.join(dflash_draft::DEFAULT_WEIGHTS))?.len();
        println!(
            "fixtures: wrote {} (Bolt geometry: {bytes} bytes of weights, {:+} vs the real package's 270406816; {:.1} s)",
            bolt.display(),
            bytes as i64 - 270_406_816,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

pub fn write_tiny_demo(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("fixtures: cannot create {}", dir.display()))?;
    let (container, config) = tiny_demo()?;
    std::fs::write(dir.join("model.q4nx"), container)?;
    std::fs::write(dir.join("config.json"), config)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_tiny_demo_matches_the_generator() {
        let dir = crate::workspace_root().join("fixtures/tiny-demo");
        let (container, config) = super::tiny_demo().unwrap();
        let on_disk = std::fs::read(dir.join("model.q4nx")).expect("run `cargo xtask fixtures`");
        assert!(
            on_disk == container,
            "fixtures/tiny-demo/model.q4nx is stale: run `cargo xtask fixtures`"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("config.json")).unwrap(),
            config
        );
    }
}
