//! Writing draft packages: the importer, the synthetic fixtures and tests all build
//! packages through [`PackageBuilder`], so there is one writer of the layout.

use std::path::Path;

use half::bf16;
use q4nx_format::{encode_q4_1, ContainerWriter, Dtype, TILE_BYTES};
use serde_json::Value;

use crate::config::{DraftConfig, ScalarKind, DEFAULT_WEIGHTS, SCALARS};
use crate::error::{DraftError, Result};
use crate::package::{confined, sha256_file, Gain, Projection, FUSION, MANIFEST};
use crate::v2::V2Tensor;

/// Collects a draft's tensors, then writes `config.json`, the weight file and
/// `MANIFEST.sha256` (plus `configuration.json` when given).
pub struct PackageBuilder {
    config: DraftConfig,
    writer: ContainerWriter,
}

fn writer_err(e: q4nx_format::FormatError) -> DraftError {
    DraftError::Format(e)
}

impl PackageBuilder {
    /// A builder for a package of `config`, with no tensors yet.
    pub fn new(config: DraftConfig) -> PackageBuilder {
        PackageBuilder {
            config,
            writer: ContainerWriter::new(),
        }
    }

    /// The config being written.
    pub fn config(&self) -> &DraftConfig {
        &self.config
    }

    /// Adds a projection from row-major N x K values, q4_1-encoded.
    pub fn projection(&mut self, layer: usize, which: Projection, values: &[f32]) -> Result<()> {
        let (n, k) = which.shape(&self.config);
        if values.len() != n * k {
            return Err(DraftError::Tensor {
                path: "<builder>".into(),
                tensor: which.tensor_name(layer),
                problem: format!("got {} values for {n} x {k}", values.len()),
            });
        }
        self.projection_tiles(layer, which, encode_q4_1(values, n, k).map_err(writer_err)?)
    }

    /// Adds a projection from ready tile bytes.
    pub fn projection_tiles(
        &mut self,
        layer: usize,
        which: Projection,
        tiles: Vec<u8>,
    ) -> Result<()> {
        let shape = [tiles.len() / TILE_BYTES, TILE_BYTES];
        self.writer
            .add(which.tensor_name(layer), Dtype::I8, &shape, tiles)
            .map_err(writer_err)?;
        Ok(())
    }

    /// Adds a norm gain (rounded to bf16).
    pub fn gain(&mut self, gain: Gain, values: &[f32]) -> Result<()> {
        self.writer
            .add_bf16(gain.tensor_name(), &[values.len()], values)
            .map_err(writer_err)?;
        Ok(())
    }

    /// Adds the fusion matrix from row-major `hidden x taps*hidden` values, stored
    /// (bf16) as `[hidden/32][taps*hidden][32]`: element `[b][c][r]` = `W[b*32 + r][c]`.
    pub fn fusion(&mut self, row_major: &[f32]) -> Result<()> {
        let (h, w) = (self.config.hidden_size, self.config.context_width());
        if row_major.len() != h * w {
            return Err(DraftError::Tensor {
                path: "<builder>".into(),
                tensor: FUSION.into(),
                problem: format!("got {} values for {h} x {w}", row_major.len()),
            });
        }
        let mut bytes = Vec::with_capacity(h * w * 2);
        for b in 0..h / 32 {
            for c in 0..w {
                for r in 0..32 {
                    bytes.extend(bf16::from_f32(row_major[(b * 32 + r) * w + c]).to_le_bytes());
                }
            }
        }
        self.writer
            .add(FUSION, Dtype::BF16, &[h / 32, w, 32], bytes)
            .map_err(writer_err)?;
        Ok(())
    }

    /// Adds a DFlash 2 tensor from row-major values in its shape (rounded to bf16).
    pub fn v2_tensor(&mut self, which: V2Tensor, values: &[f32]) -> Result<()> {
        let bad = |problem: String| DraftError::Tensor {
            path: "<builder>".into(),
            tensor: which.tensor_name(),
            problem,
        };
        let shape = which
            .shape(&self.config)
            .ok_or_else(|| bad("belongs to DFlash 2, but the config is DFlash (1)".into()))?;
        if values.len() != shape.iter().product::<usize>() {
            return Err(bad(format!("got {} values for {shape:?}", values.len())));
        }
        self.writer
            .add_bf16(which.tensor_name(), &shape, values)
            .map_err(writer_err)?;
        Ok(())
    }

    fn add_scalars(&mut self) -> Result<()> {
        for (name, key, kind) in SCALARS {
            let values = self.config.scalar_value(key);
            match kind {
                ScalarKind::Ints => {
                    let data = values
                        .iter()
                        .flat_map(|&v| (v as i64).to_le_bytes())
                        .collect();
                    self.writer
                        .add(name, Dtype::I64, &[values.len()], data)
                        .map_err(writer_err)?;
                }
                ScalarKind::Float => {
                    let f: Vec<f32> = values.iter().map(|&v| v as f32).collect();
                    self.writer
                        .add_f32(name, &[f.len()], &f)
                        .map_err(writer_err)?;
                }
            }
        }
        Ok(())
    }

    /// Writes the package into `dir` (created if needed).
    pub fn write(mut self, dir: &Path, source_config: Option<&Value>) -> Result<()> {
        let io = |path: &Path, e: std::io::Error| DraftError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        self.add_scalars()?;
        let weights_name = if self.config.weights.is_empty() {
            DEFAULT_WEIGHTS.to_string()
        } else {
            self.config.weights.clone()
        };
        let weights = confined(dir, &weights_name, "weights")?;
        self.writer.write_file(&weights).map_err(writer_err)?;
        let mut files = vec![(weights_name, weights)];
        let mut write_json = |name: &str, v: &Value| -> Result<()> {
            let path = dir.join(name);
            std::fs::write(
                &path,
                serde_json::to_string_pretty(v).expect("JSON serializes") + "\n",
            )
            .map_err(|e| io(&path, e))?;
            files.push((name.to_string(), path));
            Ok(())
        };
        let mut config = self.config.to_json();
        if self.config.weights != DEFAULT_WEIGHTS {
            config["weights"] = Value::from(self.config.weights.clone());
        }
        write_json("config.json", &config)?;
        if let Some(src) = source_config {
            write_json("configuration.json", src)?;
        }
        let mut manifest = String::new();
        files.sort();
        for (name, path) in files {
            manifest.push_str(&format!("{}  {name}\n", sha256_file(&path)?));
        }
        let path = dir.join(MANIFEST);
        std::fs::write(&path, manifest).map_err(|e| io(&path, e))
    }
}
