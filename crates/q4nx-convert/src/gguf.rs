//! A checked reader for GGUF v2/v3 files (llama.cpp's model format).
//!
//! Only what a converter needs: the metadata key/values (every value type),
//! the tensor infos and zero-copy access to each tensor's bytes. Every count,
//! length and offset read from the file goes through checked arithmetic and is
//! bounded by the file's size, so a malformed file is refused by name
//! ([`GgufError`]) and never causes a panic or an allocation larger than the file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use thiserror::Error;

/// Why a GGUF file was refused. Messages start `gguf: <path>: `.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GgufError {
    /// The file cannot be read.
    #[error("gguf: {path}: cannot read: {message}")]
    Io {
        /// The file (or a label for bytes in memory).
        path: String,
        /// What went wrong.
        message: String,
    },
    /// Bad magic `found`, expected "GGUF".
    #[error("gguf: {path}: bad magic {found:?}, expected \"GGUF\"")]
    BadMagic {
        /// The file (or a label for bytes in memory).
        path: String,
        /// What was found.
        found: [u8; 4],
    },
    /// Version `version` is not supported (only 2 and 3).
    #[error("gguf: {path}: version {version} is not supported (only 2 and 3)")]
    Version {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The version found.
        version: u32,
    },
    /// Truncated at byte `at`: `what` needs `need` bytes, `left` left.
    #[error("gguf: {path}: truncated at byte {at}: {what} needs {need} bytes, {left} left")]
    Truncated {
        /// The file (or a label for bytes in memory).
        path: String,
        /// File offset.
        at: u64,
        /// What was being read.
        what: String,
        /// Bytes needed.
        need: u64,
        /// Bytes left.
        left: u64,
    },
    /// `what` count `count` cannot fit in a `file_len`-byte file.
    #[error("gguf: {path}: {what} count {count} cannot fit in a {file_len}-byte file")]
    CountTooLarge {
        /// The file (or a label for bytes in memory).
        path: String,
        /// What was being read.
        what: String,
        /// The count from the file.
        count: u64,
        /// The file's length in bytes.
        file_len: u64,
    },
    /// Key '`key`': unknown value type `value_type`.
    #[error("gguf: {path}: key '{key}': unknown value type {value_type}")]
    UnknownValueType {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The key concerned.
        key: String,
        /// The type code from the file.
        value_type: u32,
    },
    /// Key '`key`': nested arrays are not supported.
    #[error("gguf: {path}: key '{key}': nested arrays are not supported")]
    NestedArray {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The key concerned.
        key: String,
    },
    /// `what` is not UTF-8.
    #[error("gguf: {path}: {what} is not UTF-8")]
    NotUtf8 {
        /// The file (or a label for bytes in memory).
        path: String,
        /// What was being read.
        what: String,
    },
    /// Key '`key`' appears twice.
    #[error("gguf: {path}: key '{key}' appears twice")]
    DuplicateKey {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The key concerned.
        key: String,
    },
    /// Tensor '`tensor`' appears twice.
    #[error("gguf: {path}: tensor '{tensor}' appears twice")]
    DuplicateTensor {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
    },
    /// A tensor's entry is malformed.
    #[error("gguf: {path}: tensor '{tensor}': {message}")]
    BadTensor {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// What went wrong.
        message: String,
    },
    /// Key '`key`': `message`.
    #[error("gguf: {path}: key '{key}': {message}")]
    BadKey {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The key concerned.
        key: String,
        /// What went wrong.
        message: String,
    },
}

/// ggml tensor types this reader knows by number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    /// ggml type `F32`.
    F32,
    /// ggml type `F16`.
    F16,
    /// ggml type `Q4_0` blocks.
    Q4_0,
    /// ggml type `Q4_1` blocks.
    Q4_1,
    /// ggml type `Q5_0` blocks.
    Q5_0,
    /// ggml type `Q5_1` blocks.
    Q5_1,
    /// ggml type `Q8_0` blocks.
    Q8_0,
    /// ggml type `Q8_1` blocks.
    Q8_1,
    /// ggml type `Q2_K` blocks.
    Q2_K,
    /// ggml type `Q3_K` blocks.
    Q3_K,
    /// ggml type `Q4_K` blocks.
    Q4_K,
    /// ggml type `Q5_K` blocks.
    Q5_K,
    /// ggml type `Q6_K` blocks.
    Q6_K,
    /// ggml type `Q8_K` blocks.
    Q8_K,
    /// ggml type `I8`.
    I8,
    /// ggml type `I16`.
    I16,
    /// ggml type `I32`.
    I32,
    /// ggml type `I64`.
    I64,
    /// ggml type `F64`.
    F64,
    /// ggml type `BF16`.
    BF16,
}

impl GgmlType {
    /// The type for a ggml type number, if known.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            30 => BF16,
            _ => return None,
        })
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 | I32 => (1, 4),
            F16 | BF16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Q2_K => (256, 84),
            Q3_K => (256, 110),
            Q4_K => (256, 144),
            Q5_K => (256, 176),
            Q6_K => (256, 210),
            Q8_K => (256, 292),
        }
    }

    /// The name ggml uses.
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            BF16 => "BF16",
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// A `u8`.
    U8(u8),
    /// A `i8`.
    I8(i8),
    /// A `u16`.
    U16(u16),
    /// A `i16`.
    I16(i16),
    /// A `u32`.
    U32(u32),
    /// A `i32`.
    I32(i32),
    /// A `f32`.
    F32(f32),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// A `u64`.
    U64(u64),
    /// A `i64`.
    I64(i64),
    /// A `f64`.
    F64(f64),
    /// An array of values of one type.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// An integer value of any width, as u64 (negative values refused).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// A float or integer value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }
    /// An array value.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's info, validated against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// The tensor's name.
    pub name: String,
    /// ggml order: `dims[0]` is the fastest-varying (columns).
    pub dims: Vec<u64>,
    /// How its data is encoded.
    pub ggml_type: GgmlType,
    /// Absolute byte range in the file.
    pub range: std::ops::Range<usize>,
}

impl GgufTensorInfo {
    /// Elements per row (`dims[0]`).
    pub fn cols(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }
    /// Number of rows (product of the other dims).
    pub fn rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }
    /// Shape in row-major (numpy/torch) order.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF file over bytes the caller holds (a map or a buffer).
#[derive(Clone, Debug)]
pub struct Gguf {
    /// GGUF format version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, GgufValue)>,
    /// Tensors in file (info) order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Data alignment in bytes (`general.alignment`, default 32).
    pub alignment: u64,
    /// File offset of the tensor data section.
    pub data_start: usize,
    index: BTreeMap<String, usize>,
}

struct Cursor<'a> {
    path: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let left = (self.bytes.len() - self.pos) as u64;
        if n > left {
            return Err(GgufError::Truncated {
                path: self.path.into(),
                at: self.pos as u64,
                what: what.into(),
                need: n,
                left,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| GgufError::NotUtf8 {
            path: self.path.into(),
            what: what.into(),
        })
    }
    /// Refuses a count whose elements (each at least `min_size` bytes) cannot fit in
    /// what is left of the file, so a huge count never drives an allocation.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<(), GgufError> {
        let left = (self.bytes.len() - self.pos) as u64;
        if count.checked_mul(min_size).is_none_or(|need| need > left) {
            return Err(GgufError::CountTooLarge {
                path: self.path.into(),
                what: what.into(),
                count,
                file_len: self.bytes.len() as u64,
            });
        }
        Ok(())
    }
    fn value(&mut self, key: &str, value_type: u32, depth: u32) -> Result<GgufValue, GgufError> {
        let w = |s: &[u8]| -> [u8; 8] {
            let mut b = [0u8; 8];
            b[..s.len()].copy_from_slice(s);
            b
        };
        Ok(match value_type {
            0 => GgufValue::U8(self.take(1, key)?[0]),
            1 => GgufValue::I8(self.take(1, key)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.take(2, key)?.try_into().unwrap())),
            3 => GgufValue::I16(i16::from_le_bytes(self.take(2, key)?.try_into().unwrap())),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(self.u32(key)? as i32),
            6 => GgufValue::F32(f32::from_bits(self.u32(key)?)),
            7 => GgufValue::Bool(self.take(1, key)?[0] != 0),
            8 => GgufValue::String(self.string(key)?),
            9 => {
                if depth > 0 {
                    return Err(GgufError::NestedArray {
                        path: self.path.into(),
                        key: key.into(),
                    });
                }
                let elem_type = self.u32(key)?;
                let count = self.u64(key)?;
                let min_size = match elem_type {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => {
                        return Err(GgufError::NestedArray {
                            path: self.path.into(),
                            key: key.into(),
                        })
                    }
                    other => {
                        return Err(GgufError::UnknownValueType {
                            path: self.path.into(),
                            key: key.into(),
                            value_type: other,
                        })
                    }
                };
                self.check_count(count, min_size, &format!("array '{key}'"))?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(key, elem_type, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(self.u64(key)? as i64),
            12 => GgufValue::F64(f64::from_bits(u64::from_le_bytes(w(self.take(8, key)?)))),
            other => {
                return Err(GgufError::UnknownValueType {
                    path: self.path.into(),
                    key: key.into(),
                    value_type: other,
                })
            }
        })
    }
}

impl Gguf {
    /// Parses and validates a GGUF file held in `bytes`; `path` labels errors.
    pub fn parse(path: &str, bytes: &[u8]) -> Result<Gguf, GgufError> {
        let mut c = Cursor {
            path,
            bytes,
            pos: 0,
        };
        let magic: [u8; 4] = c.take(4, "magic")?.try_into().unwrap();
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic {
                path: path.into(),
                found: magic,
            });
        }
        let version = c.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::Version {
                path: path.into(),
                version,
            });
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        // A key/value takes at least 8 (key length) + 4 (type) + 1 bytes.
        c.check_count(n_kv, 13, "metadata")?;
        // A tensor info takes at least 8 + 4 + 4 + 8 bytes.
        c.check_count(n_tensors, 24, "tensor")?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut seen = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let value_type = c.u32(&key)?;
            let value = c.value(&key, value_type, 0)?;
            if seen.insert(key.clone(), ()).is_some() {
                return Err(GgufError::DuplicateKey {
                    path: path.into(),
                    key,
                });
            }
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => 32,
            Some((k, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(GgufError::BadKey {
                        path: path.into(),
                        key: k.clone(),
                        message: format!("{v:?} is not a power of two up to 1 MiB"),
                    })
                }
            },
        };

        struct RawInfo {
            name: String,
            dims: Vec<u64>,
            type_id: u32,
            offset: u64,
        }
        let mut raw = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            let n_dims = c.u32(&name)?;
            if n_dims == 0 || n_dims > 4 {
                return Err(GgufError::BadTensor {
                    path: path.into(),
                    tensor: name,
                    message: format!("{n_dims} dimensions (1 to 4 allowed)"),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&name)?);
            }
            let type_id = c.u32(&name)?;
            let offset = c.u64(&name)?;
            raw.push(RawInfo {
                name,
                dims,
                type_id,
                offset,
            });
        }
        let data_start = (c.pos as u64).next_multiple_of(alignment);
        let file_len = bytes.len() as u64;
        if data_start > file_len && n_tensors > 0 {
            return Err(GgufError::Truncated {
                path: path.into(),
                at: c.pos as u64,
                what: "alignment padding before the tensor data".into(),
                need: data_start - c.pos as u64,
                left: file_len - c.pos as u64,
            });
        }

        let mut tensors = Vec::with_capacity(raw.len());
        let mut index = BTreeMap::new();
        for r in raw {
            let bad = |message: String| GgufError::BadTensor {
                path: path.into(),
                tensor: r.name.clone(),
                message,
            };
            let ggml_type = GgmlType::from_id(r.type_id)
                .ok_or_else(|| bad(format!("unknown ggml type {}", r.type_id)))?;
            let (block_elems, block_bytes) = ggml_type.block();
            let elems = r
                .dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| bad(format!("dims {:?} overflow", r.dims)))?;
            if r.dims[0] % block_elems as u64 != 0 {
                return Err(bad(format!(
                    "{} rows of {} elements are not whole {} blocks of {block_elems}",
                    r.dims.iter().skip(1).product::<u64>(),
                    r.dims[0],
                    ggml_type
                )));
            }
            let size = (elems / block_elems as u64)
                .checked_mul(block_bytes as u64)
                .ok_or_else(|| bad("byte size overflows".into()))?;
            if r.offset % alignment != 0 {
                return Err(bad(format!(
                    "offset {} is not a multiple of the alignment {alignment}",
                    r.offset
                )));
            }
            let start = data_start
                .checked_add(r.offset)
                .ok_or_else(|| bad("offset overflows".into()))?;
            let end = start
                .checked_add(size)
                .ok_or_else(|| bad("offset overflows".into()))?;
            if end > file_len {
                return Err(bad(format!(
                    "data [{start}, {end}) runs past the end of the {file_len}-byte file"
                )));
            }
            if index.insert(r.name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor {
                    path: path.into(),
                    tensor: r.name,
                });
            }
            tensors.push(GgufTensorInfo {
                name: r.name,
                dims: r.dims,
                ggml_type,
                range: start as usize..end as usize,
            });
        }
        // Overlapping tensor data means a corrupt index.
        let mut by_start: Vec<&GgufTensorInfo> = tensors.iter().collect();
        by_start.sort_by_key(|t| (t.range.start, t.range.end));
        for pair in by_start.windows(2) {
            if pair[1].range.start < pair[0].range.end {
                return Err(GgufError::BadTensor {
                    path: path.into(),
                    tensor: pair[1].name.clone(),
                    message: format!("data overlaps tensor '{}'", pair[0].name),
                });
            }
        }
        Ok(Gguf {
            version,
            metadata,
            tensors,
            alignment,
            data_start: data_start as usize,
            index,
        })
    }

    /// The metadata value under `key`.
    pub fn metadata_value(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The tensor info called `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }
}

/// A memory-mapped GGUF file with its parsed index (see [`q4nx_format::Container`] on maps).
pub struct GgufFile {
    path: String,
    map: Option<memmap2::Mmap>,
    /// The parsed index.
    pub gguf: Gguf,
}

impl GgufFile {
    /// Maps and parses the file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let io = |e: std::io::Error| GgufError::Io {
            path: label.clone(),
            message: e.to_string(),
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        // SAFETY: as for `Container::open`: valid while no one truncates the file.
        let map = if len == 0 {
            None
        } else {
            Some(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        let gguf = Gguf::parse(&label, map.as_deref().unwrap_or(&[]))?;
        Ok(GgufFile {
            path: label,
            map,
            gguf,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The bytes of one tensor.
    pub fn data(&self, info: &GgufTensorInfo) -> &[u8] {
        &self.map.as_deref().unwrap_or(&[])[info.range.clone()]
    }
}
