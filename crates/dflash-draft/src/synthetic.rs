//! Synthetic draft packages made from formulas, so tests can compare every decoded
//! element with its known value: tiles are written group by group from a formula
//! (`d`, `m` bf16, codes 0..15), gains and the fusion matrix are bf16 formulas. The
//! fusion matrix has row structure (a magnitude per input column, shared by all rows),
//! so the orientation check has something to detect.

use std::path::Path;

use half::bf16;
use q4nx_format::{ContainerWriter, Q4Group, TileBuilder, GROUP_COLS};

use crate::builder::PackageBuilder;
use crate::config::{Dflash2, DraftConfig, DEFAULT_WEIGHTS};
use crate::error::{DraftError, Result};
use crate::package::{Gain, Projection};
use crate::v2::{Sublayer, V2Tensor};

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn unit(seed: u64, a: u64, b: u64) -> f32 {
    (mix(seed ^ mix(a ^ mix(b))) >> 40) as f32 / (1u64 << 24) as f32
}

fn projection_id(layer: usize, which: Projection) -> u64 {
    (layer * 16
        + Projection::ALL
            .iter()
            .position(|&p| p == which)
            .unwrap_or(0)) as u64
}

/// The group parameters of projection `which` of `layer`, row `row`, group `g`.
pub fn projection_group(
    seed: u64,
    layer: usize,
    which: Projection,
    row: usize,
    g: usize,
) -> Q4Group {
    let id = projection_id(layer, which);
    let key = (row as u64) << 24 | g as u64;
    let d = bf16::from_f32(0.002 + 0.01 * unit(seed, id, key));
    let m = bf16::from_f32(-7.5 * d.to_f32() + 0.01 * (unit(seed, id + 1000, key) - 0.5));
    let mut q = [0u8; GROUP_COLS];
    for (i, qi) in q.iter_mut().enumerate() {
        *qi = (mix(seed ^ mix(id ^ mix(key ^ mix(i as u64)))) % 16) as u8;
    }
    Q4Group { d, m, q }
}

/// The value a synthetic projection holds at (row, col).
pub fn projection_value(seed: u64, layer: usize, which: Projection, row: usize, col: usize) -> f32 {
    let g = projection_group(seed, layer, which, row, col / GROUP_COLS);
    g.d.to_f32() * g.q[col % GROUP_COLS] as f32 + g.m.to_f32()
}

/// A synthetic gain; post-attention gains hold one slightly negative value, as real
/// packages do.
pub fn gain_value(seed: u64, gain: Gain, i: usize) -> f32 {
    let id = match gain {
        Gain::Input(l) => 100 + l as u64 * 4,
        Gain::PostAttention(l) => 101 + l as u64 * 4,
        Gain::QNorm(l) => 102 + l as u64 * 4,
        Gain::KNorm(l) => 103 + l as u64 * 4,
        Gain::Hidden => 90,
        Gain::Final => 91,
    };
    if matches!(gain, Gain::PostAttention(_)) && i == 7 {
        return bf16::from_f32(-0.0016).to_f32();
    }
    bf16::from_f32(0.5 + unit(seed, id, i as u64)).to_f32()
}

/// The synthetic fusion matrix `W[row][col]` (bf16 values): a pseudo-normal value
/// scaled by a per-column magnitude.
pub fn fusion_value(seed: u64, row: usize, col: usize) -> f32 {
    let scale = (2.0 * unit(seed, 77, col as u64)).exp();
    let (u1, u2) = (
        unit(seed, 78, ((row as u64) << 32) | col as u64).max(1e-7),
        unit(seed, 79, ((row as u64) << 32) | col as u64),
    );
    let z = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
    bf16::from_f32(0.01 * scale * z).to_f32()
}

/// A small geometry for tests: 2 layers, hidden 64, intermediate 128, 4 heads / 2 kv x 16,
/// block 4, taps 1 3.
pub fn small_config() -> DraftConfig {
    DraftConfig {
        num_layers: 2,
        hidden_size: 64,
        intermediate_size: 128,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        block_size: 4,
        mask_token_id: 511,
        target_layer_ids: vec![1, 3],
        sliding_window: None,
        rope_theta: 10000.0,
        rms_norm_eps: 1e-6,
        embedding_scale: 1.0,
        vocab_size: Some(512),
        max_position_embeddings: 2048,
        weights: DEFAULT_WEIGHTS.into(),
        v2: None,
    }
}

/// The Bolt geometry measured on `Nemotron-3.5-Bolt-E4B-DFlash-NPU2`.
pub fn bolt_config() -> DraftConfig {
    DraftConfig {
        num_layers: 5,
        hidden_size: 2560,
        intermediate_size: 5120,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
        block_size: 8,
        mask_token_id: 262_143,
        target_layer_ids: vec![5, 11, 17, 23, 35],
        sliding_window: Some(2048),
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
        embedding_scale: 1.0,
        vocab_size: Some(262_144),
        max_position_embeddings: 131_072,
        weights: DEFAULT_WEIGHTS.into(),
        v2: None,
    }
}

/// A draft of SmolLM2-135M's geometry (the target `cargo xtask fetch-model smollm2`
/// fetches: 30 layers, hidden 576, vocabulary 49152): 2 layers, 9 query / 3 key-value
/// heads of 64, intermediate 1536, block 8, 5 taps spread over the target's layers
/// (z-lab's rule: `round(1 + i * 26 / 4)`, i = 0..5), the mask token the vocabulary's
/// last id. With synthetic weights its drafts are noise: the "never right" draft whose
/// round cost the speculative loop must not pay for long.
pub fn smollm2_config() -> DraftConfig {
    DraftConfig {
        num_layers: 2,
        hidden_size: 576,
        intermediate_size: 1536,
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        block_size: 8,
        mask_token_id: 49_151,
        target_layer_ids: vec![1, 8, 14, 20, 27],
        sliding_window: None,
        rope_theta: 100_000.0,
        rms_norm_eps: 1e-5,
        embedding_scale: 1.0,
        vocab_size: Some(49_152),
        max_position_embeddings: 8192,
        weights: DEFAULT_WEIGHTS.into(),
        v2: None,
    }
}

/// The published DFlash 2 geometry (z-lab's `dflash2-config.json`): two taps in groups
/// of 16 channels, a rank-256 selector over the top 16 candidates, softcap 20 and the
/// published output multiplier.
pub fn published_v2() -> Dflash2 {
    Dflash2 {
        conv_kernel_size: 2,
        conv_group_size: 16,
        selector_rank: 256,
        selector_top_k: 16,
        final_logit_softcapping: Some(20.0),
        output_multiplier: 0.196_116_14,
    }
}

/// [`small_config`] as a DFlash 2 draft: two taps in groups of 16, rank 16 over top-8,
/// softcap 4, multiplier 0.5.
pub fn small_v2_config() -> DraftConfig {
    DraftConfig {
        v2: Some(Dflash2 {
            conv_kernel_size: 2,
            conv_group_size: 16,
            selector_rank: 16,
            selector_top_k: 8,
            final_logit_softcapping: Some(4.0),
            output_multiplier: 0.5,
        }),
        ..small_config()
    }
}

/// A DFlash 2 draft of SmolLM2-135M's geometry ([`smollm2_config`]) with the published
/// convolution and selector geometry ([`published_v2`]) and the published block of 16.
pub fn smollm2_v2_config() -> DraftConfig {
    DraftConfig {
        block_size: 16,
        v2: Some(published_v2()),
        ..smollm2_config()
    }
}

/// A synthetic DFlash 2 tensor's element `i` (bf16 values): base kernels near the
/// identity at tap 0 and small elsewhere, small dynamic projections, the selector's
/// projection and codebooks pseudo-normal.
pub fn v2_value(seed: u64, which: V2Tensor, shape: &[usize], i: usize) -> f32 {
    let (id, scale) = match which {
        V2Tensor::ConvBase(l, s) => (200 + 2 * l as u64 + (s == Sublayer::Mlp) as u64, 0.3),
        V2Tensor::ConvProjection(l, s) => (
            300 + 2 * l as u64 + (s == Sublayer::Mlp) as u64,
            0.3 / (shape[1] as f32).sqrt(),
        ),
        V2Tensor::SelectorProjection => (400, 1.0 / (shape[1] as f32).sqrt()),
        V2Tensor::PredecessorCodebook => (401, 0.3),
        V2Tensor::SuccessorCodebook => (402, 0.3),
    };
    let centred = 2.0 * unit(seed, id, i as u64) - 1.0;
    let mut v = centred * scale * 1.7;
    if let V2Tensor::ConvBase(..) = which {
        // [2][K][H]: tap 0 of either set near 1.
        let (k, h) = (shape[1], shape[2]);
        if (i / h).is_multiple_of(k) {
            v += 1.0;
        }
    }
    bf16::from_f32(v).to_f32()
}

/// Writes a synthetic package for `config` into `dir`.
pub fn write_synthetic(dir: &Path, config: &DraftConfig, seed: u64) -> Result<()> {
    let mut b = PackageBuilder::new(config.clone());
    for layer in 0..config.num_layers {
        for which in Projection::ALL {
            let (n, k) = which.shape(config);
            let mut tiles = TileBuilder::new(n, k)?;
            for row in 0..n {
                for g in 0..k / GROUP_COLS {
                    tiles.set_group(row, g, &projection_group(seed, layer, which, row, g));
                }
            }
            b.projection_tiles(layer, which, tiles.finish())?;
        }
    }
    for gain in Gain::all(config.num_layers) {
        let values: Vec<f32> = (0..gain.len(config))
            .map(|i| gain_value(seed, gain, i))
            .collect();
        b.gain(gain, &values)?;
    }
    let (h, w) = (config.hidden_size, config.context_width());
    let mut fc = Vec::with_capacity(h * w);
    for r in 0..h {
        for c in 0..w {
            fc.push(fusion_value(seed, r, c));
        }
    }
    b.fusion(&fc)?;
    for which in V2Tensor::all(config.num_layers) {
        let Some(shape) = which.shape(config) else {
            break;
        };
        let values: Vec<f32> = (0..shape.iter().product())
            .map(|i| v2_value(seed, which, &shape, i))
            .collect();
        b.v2_tensor(which, &values)?;
    }
    b.write(dir, None)
}

/// Writes the same synthetic draft in z-lab's Hugging Face layout (what
/// `onebit convert-draft` imports): `config.json` with the draft keys in `dflash_config`
/// (the published spelling; `is_causal: false`, full-attention layers) and
/// `model.safetensors` with the source names — projections F32 (q4_1-exact values),
/// norms, fusion matrix and DFlash 2's tensors BF16.
pub fn write_zlab_source(dir: &Path, config: &DraftConfig, seed: u64) -> Result<()> {
    let io = |path: &Path, e: std::io::Error| DraftError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let c = config;
    let mut w = ContainerWriter::new();
    for layer in 0..c.num_layers {
        for which in Projection::ALL {
            let (n, k) = which.shape(c);
            let values: Vec<f32> = (0..n * k)
                .map(|i| projection_value(seed, layer, which, i / k, i % k))
                .collect();
            let name = which.tensor_name(layer);
            w.add_f32(name.trim_start_matches("model."), &[n, k], &values)?;
        }
    }
    for gain in Gain::all(c.num_layers) {
        let values: Vec<f32> = (0..gain.len(c))
            .map(|i| gain_value(seed, gain, i))
            .collect();
        let name = gain.tensor_name();
        w.add_bf16(name.trim_start_matches("model."), &[values.len()], &values)?;
    }
    let (h, width) = (c.hidden_size, c.context_width());
    let fc: Vec<f32> = (0..h * width)
        .map(|i| fusion_value(seed, i / width, i % width))
        .collect();
    w.add_bf16("fc.weight", &[h, width], &fc)?;
    for which in V2Tensor::all(c.num_layers) {
        let Some(shape) = which.shape(c) else {
            break;
        };
        let values: Vec<f32> = (0..shape.iter().product())
            .map(|i| v2_value(seed, which, &shape, i))
            .collect();
        w.add_bf16(which.source_name(), &shape, &values)?;
    }
    let weights = dir.join("model.safetensors");
    w.write_file(&weights)?;
    let mut draft = serde_json::json!({
        "mask_token_id": c.mask_token_id,
        "target_layer_ids": c.target_layer_ids,
        "block_size": c.block_size,
    });
    let arch = match &c.v2 {
        None => crate::config::ARCHITECTURE,
        Some(d) => {
            draft["conv_kernel_size"] = d.conv_kernel_size.into();
            draft["conv_group_size"] = d.conv_group_size.into();
            draft["selector_rank"] = d.selector_rank.into();
            draft["selector_top_k"] = d.selector_top_k.into();
            draft["final_logit_softcapping"] = d.final_logit_softcapping.into();
            draft["output_multiplier"] = d.output_multiplier.into();
            crate::config::ARCHITECTURE_V2
        }
    };
    let json = serde_json::json!({
        "architectures": [arch],
        "model_type": "qwen3",
        "attention_bias": false,
        "is_causal": false,
        "block_size": c.block_size,
        "dflash_config": draft,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "layer_types": vec!["full_attention"; c.num_layers],
        "max_position_embeddings": c.max_position_embeddings,
        "num_attention_heads": c.num_heads,
        "num_hidden_layers": c.num_layers,
        "num_key_value_heads": c.num_kv_heads,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "sliding_window": c.sliding_window,
        "vocab_size": c.vocab_size,
    });
    let path = dir.join("config.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&json).expect("JSON serializes") + "\n",
    )
    .map_err(|e| io(&path, e))
}
