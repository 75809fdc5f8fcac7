//! Packing package data into device buffers. The NPU consumes the q4_1 tile layout
//! as stored, so a projection's buffer is its tiles byte for byte (padded with
//! zeros to a page); gains are widened to f32; the BF16 embedding is copied; the
//! rope table is computed once for the whole context.

use q4nx_format::{Q4Kind, Q4Matrix};

use super::plan::{BufferSpec, Norm, Projection, WeightSource};
use crate::error::{Result, TargetError};
use crate::kernels;
use crate::model::{TargetConfig, TargetWeights};

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn padded(mut bytes: Vec<u8>, spec: &BufferSpec) -> Result<Vec<u8>> {
    if bytes.len() > spec.bytes {
        return Err(TargetError::Unsupported(format!(
            "npu: {} bytes of {} do not fit its {}-byte buffer",
            bytes.len(),
            spec.name,
            spec.bytes
        )));
    }
    bytes.resize(spec.bytes, 0);
    Ok(bytes)
}

fn tiles(matrix: &Q4Matrix, spec: &BufferSpec) -> Result<Vec<u8>> {
    if matrix.kind() != Q4Kind::Q4_1 {
        return Err(TargetError::Unsupported(format!(
            "npu: tensor for {} holds {:?} tiles; the NPU kernels take q4_1 tiles",
            spec.name,
            matrix.kind()
        )));
    }
    padded(matrix.bytes().to_vec(), spec)
}

/// Rope cos table then sin table, `[position][head_dim / 2]` each, for `capacity`
/// positions: the same values the CPU backend computes per position.
pub fn rope_table(config: &TargetConfig, capacity: usize) -> Vec<f32> {
    let half = config.head_dim / 2;
    let mut cos = Vec::with_capacity(capacity * half);
    let mut sin = Vec::with_capacity(capacity * half);
    for p in 0..capacity {
        let (c, s) = kernels::rope_table(config.rope_theta, config.head_dim, p);
        cos.extend(c);
        sin.extend(s);
    }
    cos.extend(sin);
    cos
}

/// The bytes of weight buffer `spec` (which names its source).
pub fn pack(
    config: &TargetConfig,
    weights: &TargetWeights,
    spec: &BufferSpec,
    capacity: usize,
) -> Result<Vec<u8>> {
    let Some(source) = spec.source else {
        return Err(TargetError::Unsupported(format!(
            "npu: buffer {} is not a weight buffer",
            spec.name
        )));
    };
    let layer = |l: usize| {
        weights.layers.get(l).ok_or_else(|| {
            TargetError::Unsupported(format!("npu: buffer {} names missing layer {l}", spec.name))
        })
    };
    match source {
        WeightSource::Tiles {
            layer: l,
            projection,
        } => {
            let w = layer(l)?;
            let matrix = match projection {
                Projection::Q => &w.q,
                Projection::K => &w.k,
                Projection::V => &w.v,
                Projection::O => &w.o,
                Projection::Gate => &w.gate,
                Projection::Up => &w.up,
                Projection::Down => &w.down,
            };
            tiles(matrix, spec)
        }
        WeightSource::HeadTiles => tiles(&weights.lm_head, spec),
        WeightSource::Embedding => padded(weights.embed.bytes.to_vec(), spec),
        WeightSource::Gain { layer: l, norm } => {
            let w = layer(l)?;
            let gain = match norm {
                Norm::Input => Some(&w.input_norm),
                Norm::Post => Some(&w.post_norm),
                Norm::Query => w.q_norm.as_ref(),
                Norm::Key => w.k_norm.as_ref(),
            }
            .ok_or_else(|| {
                TargetError::Unsupported(format!(
                    "npu: buffer {} needs a {norm:?} norm that layer {l} does not have",
                    spec.name
                ))
            })?;
            padded(f32_bytes(gain), spec)
        }
        WeightSource::FinalNorm => padded(f32_bytes(&weights.final_norm), spec),
        WeightSource::RopeTable => padded(f32_bytes(&rope_table(config, capacity)), spec),
    }
}

/// The q4_1 matrix of `rows × cols` at the start of a packed tile buffer.
pub fn unpack_tiles<'a>(
    label: &str,
    bytes: &'a [u8],
    rows: usize,
    cols: usize,
) -> Result<Q4Matrix<'a>> {
    let len = q4nx_format::TileGrid { rows, cols }
        .byte_len()
        .unwrap_or(usize::MAX);
    let tiles = bytes.get(..len).ok_or_else(|| {
        TargetError::Unsupported(format!(
            "npu: buffer {label} holds {} bytes, fewer than the {len} of a {rows} x {cols} tile grid",
            bytes.len()
        ))
    })?;
    Ok(Q4Matrix::from_bytes(
        label,
        tiles,
        rows,
        cols,
        Q4Kind::Q4_1,
    )?)
}
