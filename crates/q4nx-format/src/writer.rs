//! Writing containers exactly as the safetensors library does.
//!
//! FastFlowLM writes `model.q4nx` with safetensors' `save_file`. Its serializer
//! orders tensors by dtype (the [`Dtype`] declaration order, largest first), then by
//! name; writes the header as compact JSON with `__metadata__` first when present;
//! pads the header with spaces to a multiple of 8 bytes; then writes the data in
//! the same order with no gaps. This writer follows the same rules, so a file
//! it writes from the same tensors is byte-identical to FastFlowLM's.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

use serde_json::Value;

use crate::dtype::Dtype;
use crate::error::{FormatError, Result};

struct PendingTensor {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Collects tensors, then writes one container.
#[derive(Default)]
pub struct ContainerWriter {
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
    metadata: Option<BTreeMap<String, String>>,
}

impl ContainerWriter {
    /// An empty writer.
    pub fn new() -> ContainerWriter {
        ContainerWriter::default()
    }

    /// Sets `__metadata__`.
    pub fn metadata(&mut self, metadata: BTreeMap<String, String>) -> &mut Self {
        self.metadata = Some(metadata);
        self
    }

    /// Adds a tensor; refuses duplicate names and data whose length does not match
    /// `shape` x dtype size.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        dtype: Dtype,
        shape: &[usize],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        if name == "__metadata__" {
            return Err(FormatError::Writer {
                message: "'__metadata__' is reserved and cannot name a tensor".into(),
            });
        }
        let expected = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| FormatError::Writer {
                message: format!("tensor '{name}': shape {shape:?} overflows"),
            })?;
        if expected != data.len() {
            return Err(FormatError::Writer {
                message: format!(
                    "tensor '{name}': {dtype} {shape:?} needs {expected} bytes, got {}",
                    data.len()
                ),
            });
        }
        if !self.names.insert(name.clone()) {
            return Err(FormatError::Writer {
                message: format!("tensor '{name}' added twice"),
            });
        }
        self.tensors.push(PendingTensor {
            name,
            dtype,
            shape: shape.to_vec(),
            data,
        });
        Ok(self)
    }

    /// Adds `f32` values converted to bf16 (round to nearest even).
    pub fn add_bf16(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        values: &[f32],
    ) -> Result<&mut Self> {
        let data = values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        self.add(name, Dtype::BF16, shape, data)
    }

    /// Adds `f32` values as F32.
    pub fn add_f32(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        values: &[f32],
    ) -> Result<&mut Self> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add(name, Dtype::F32, shape, data)
    }

    fn ordered(&self) -> Vec<&PendingTensor> {
        let mut order: Vec<&PendingTensor> = self.tensors.iter().collect();
        order.sort_by(|a, b| b.dtype.cmp(&a.dtype).then_with(|| a.name.cmp(&b.name)));
        order
    }

    /// The padded header (without the 8-byte length prefix).
    fn header(&self, order: &[&PendingTensor]) -> Vec<u8> {
        let mut map = serde_json::Map::new();
        if let Some(meta) = &self.metadata {
            let m = meta
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            map.insert("__metadata__".into(), Value::Object(m));
        }
        let mut offset = 0usize;
        for t in order {
            let end = offset + t.data.len();
            let mut entry = serde_json::Map::new();
            entry.insert("dtype".into(), Value::String(t.dtype.label().into()));
            entry.insert("shape".into(), Value::from(t.shape.clone()));
            entry.insert("data_offsets".into(), Value::from(vec![offset, end]));
            map.insert(t.name.clone(), Value::Object(entry));
            offset = end;
        }
        let mut header = serde_json::to_vec(&Value::Object(map))
            .expect("JSON of strings and integers serializes");
        let pad = (8 - header.len() % 8) % 8;
        header.extend(std::iter::repeat_n(b' ', pad));
        header
    }

    /// Writes the container to `out`.
    pub fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let order = self.ordered();
        let header = self.header(&order);
        out.write_all(&(header.len() as u64).to_le_bytes())?;
        out.write_all(&header)?;
        for t in order {
            out.write_all(&t.data)?;
        }
        Ok(())
    }

    /// The container as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out)
            .expect("writing to a Vec cannot fail");
        out
    }

    /// Writes the container to a file (through a temporary name, then renamed, so a
    /// reader never maps a half-written file).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |e: std::io::Error| FormatError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(".partial");
        let tmp = path.with_file_name(tmp_name);
        {
            let file = std::fs::File::create(&tmp).map_err(io)?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
            self.write_to(&mut w).map_err(io)?;
            w.flush().map_err(io)?;
        }
        std::fs::rename(&tmp, path).map_err(io)
    }
}
