//! The safetensors-layout container: header parsing, validation and zero-copy views.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::Path;

use serde::de::{Deserializer as _, MapAccess, Visitor};
use serde_json::Value;

use crate::dtype::Dtype;
use crate::error::{FormatError, Result};

/// The largest header this crate will parse (the safetensors crate's limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One tensor's entry in the header, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Byte range relative to the start of the data section.
    pub data: Range<usize>,
}

impl TensorInfo {
    /// Number of elements (product of the shape; 1 for a scalar).
    pub fn num_elements(&self) -> usize {
        // Validation proved the product fits; saturate rather than panic regardless.
        self.shape
            .iter()
            .fold(1usize, |acc, &d| acc.saturating_mul(d))
    }

    /// Byte length of the tensor's data.
    pub fn byte_len(&self) -> usize {
        self.data.end - self.data.start
    }
}

/// A parsed and validated header: tensors in file order plus `__metadata__`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Tensors sorted by data offset (file order).
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` string map, if present.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Length of the JSON header in bytes (as stored in the first 8 bytes).
    pub header_len: usize,
}

impl Header {
    /// Offset of the data section from the start of the file.
    pub fn data_start(&self) -> usize {
        8 + self.header_len
    }

    /// Parses and validates a whole container held in `file` (header and data).
    ///
    /// `path` only labels error messages. Every check is done here: nothing that
    /// passes can make a later view index out of bounds.
    pub fn parse(path: &str, file: &[u8]) -> Result<Header> {
        let p = || path.to_string();
        let file_len = file.len() as u64;
        if file.len() < 8 {
            return Err(FormatError::TooShort {
                path: p(),
                len: file_len,
            });
        }
        let mut len_bytes = [0u8; 8];
        len_bytes.copy_from_slice(&file[..8]);
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > MAX_HEADER_LEN {
            return Err(FormatError::HeaderTooLong {
                path: p(),
                header_len,
                limit: MAX_HEADER_LEN,
            });
        }
        // header_len <= 1e8 so the sum cannot overflow.
        if 8 + header_len > file_len {
            return Err(FormatError::HeaderPastEnd {
                path: p(),
                header_len,
                file_len,
            });
        }
        let header_len = header_len as usize;
        let header_bytes = &file[8..8 + header_len];
        let text = std::str::from_utf8(header_bytes).map_err(|e| FormatError::HeaderNotUtf8 {
            path: p(),
            offset: e.valid_up_to(),
        })?;
        let entries = parse_entries(path, text)?;
        let data_len = file_len - 8 - header_len as u64;

        let mut metadata = None;
        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(entries.len());
        let mut seen: HashMap<String, ()> = HashMap::with_capacity(entries.len());
        for (name, value) in entries {
            if name == "__metadata__" {
                if metadata.is_some() {
                    return Err(FormatError::DuplicateName {
                        path: p(),
                        tensor: name,
                    });
                }
                metadata = Some(parse_metadata(path, value)?);
                continue;
            }
            if seen.insert(name.clone(), ()).is_some() {
                return Err(FormatError::DuplicateName {
                    path: p(),
                    tensor: name,
                });
            }
            tensors.push(parse_entry(path, name, value, data_len)?);
        }

        // File order: by data offset. Zero-length tensors sort before the tensor
        // that starts where they do, which keeps the contiguity check simple.
        tensors.sort_by(|a, b| {
            (a.data.start, a.data.end, &a.name).cmp(&(b.data.start, b.data.end, &b.name))
        });
        let mut expected = 0usize;
        for t in &tensors {
            if t.data.start > expected {
                return Err(FormatError::Gap {
                    path: p(),
                    tensor: t.name.clone(),
                    begin: t.data.start as u64,
                    expected: expected as u64,
                });
            }
            if t.data.start < expected {
                return Err(FormatError::Overlap {
                    path: p(),
                    tensor: t.name.clone(),
                    begin: t.data.start as u64,
                    expected: expected as u64,
                });
            }
            expected = t.data.end;
        }
        if expected as u64 != data_len {
            return Err(FormatError::TrailingBytes {
                path: p(),
                data_end: expected as u64,
                data_len,
                trailing: data_len - expected as u64,
            });
        }
        Ok(Header {
            tensors,
            metadata,
            header_len,
        })
    }
}

/// Reads the top-level JSON object as an ordered list of entries, keeping
/// duplicates (a `Map` would silently keep only the last one).
fn parse_entries(path: &str, text: &str) -> Result<Vec<(String, Value)>> {
    struct EntriesVisitor;
    impl<'de> Visitor<'de> for EntriesVisitor {
        type Value = Vec<(String, Value)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = map.next_entry::<String, Value>()? {
                out.push((k, v));
            }
            Ok(out)
        }
    }
    let trimmed = text.trim_start();
    if !trimmed.starts_with('{') {
        // Name the top-level value's kind when it is valid JSON of another kind.
        return match serde_json::from_str::<Value>(text) {
            Ok(v) => Err(FormatError::HeaderNotObject {
                path: path.to_string(),
                found: json_kind(&v).to_string(),
            }),
            Err(e) => Err(FormatError::HeaderNotJson {
                path: path.to_string(),
                message: e.to_string(),
            }),
        };
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let entries = de
        .deserialize_map(EntriesVisitor)
        .and_then(|v| de.end().map(|_| v))
        .map_err(|e| FormatError::HeaderNotJson {
            path: path.to_string(),
            message: e.to_string(),
        })?;
    Ok(entries)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parse_metadata(path: &str, value: Value) -> Result<BTreeMap<String, String>> {
    let Value::Object(map) = value else {
        return Err(FormatError::BadMetadata {
            path: path.to_string(),
            message: format!("expected an object of strings, found {}", json_kind(&value)),
        });
    };
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            other => Err(FormatError::BadMetadata {
                path: path.to_string(),
                message: format!("key '{k}' holds {}, not a string", json_kind(&other)),
            }),
        })
        .collect()
}

fn parse_entry(path: &str, name: String, value: Value, data_len: u64) -> Result<TensorInfo> {
    let bad = |message: String| FormatError::BadEntry {
        path: path.to_string(),
        tensor: name.clone(),
        message,
    };
    let Value::Object(map) = value else {
        return Err(bad(format!(
            "expected an object, found {}",
            json_kind(&value)
        )));
    };
    for key in map.keys() {
        if !matches!(key.as_str(), "dtype" | "shape" | "data_offsets") {
            return Err(bad(format!("unexpected key '{key}'")));
        }
    }
    let label = match map.get("dtype") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(bad(format!(
                "'dtype' is {}, not a string",
                json_kind(other)
            )))
        }
        None => return Err(bad("missing key 'dtype'".into())),
    };
    let dtype = Dtype::from_label(&label).ok_or_else(|| FormatError::UnknownDtype {
        path: path.to_string(),
        tensor: name.clone(),
        label: label.clone(),
    })?;
    let shape = uint_array(map.get("shape"), "shape").map_err(bad)?;
    let offsets = uint_array(map.get("data_offsets"), "data_offsets").map_err(bad)?;
    let [begin, end] = offsets[..] else {
        return Err(bad(format!(
            "'data_offsets' has {} values, not 2",
            offsets.len()
        )));
    };
    if end < begin {
        return Err(FormatError::InvertedOffsets {
            path: path.to_string(),
            tensor: name,
            begin,
            end,
        });
    }
    let expected = shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| FormatError::SizeOverflow {
            path: path.to_string(),
            tensor: name.clone(),
            shape: shape.clone(),
            dtype_size: dtype.size(),
        })?;
    let actual = end - begin;
    if actual != expected {
        return Err(FormatError::SizeMismatch {
            path: path.to_string(),
            tensor: name,
            dtype,
            shape,
            begin,
            end,
            expected,
            actual,
        });
    }
    if end > data_len {
        return Err(FormatError::OutOfBounds {
            path: path.to_string(),
            tensor: name,
            end,
            data_len,
        });
    }
    // end <= data_len <= file length, so every value fits in usize.
    Ok(TensorInfo {
        name,
        dtype,
        shape: shape.into_iter().map(|d| d as usize).collect(),
        data: begin as usize..end as usize,
    })
}

fn uint_array(value: Option<&Value>, key: &str) -> std::result::Result<Vec<u64>, String> {
    let Some(value) = value else {
        return Err(format!("missing key '{key}'"));
    };
    let Value::Array(items) = value else {
        return Err(format!("'{key}' is {}, not an array", json_kind(value)));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .ok_or_else(|| format!("'{key}'[{i}] is {v}, not a non-negative integer"))
        })
        .collect()
}

/// A zero-copy view of one tensor.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first.
    pub shape: &'a [usize],
    /// The tensor's data, borrowed from the container.
    pub bytes: &'a [u8],
    /// The container's path, for error messages.
    pub path: &'a str,
}

impl<'a> TensorView<'a> {
    /// Number of elements.
    pub fn num_elements(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    fn wrong_dtype(&self, expected: &str) -> FormatError {
        FormatError::WrongDtype {
            path: self.path.to_string(),
            tensor: self.name.to_string(),
            expected: expected.to_string(),
            found: self.dtype.label().to_string(),
        }
    }

    /// Refuses the tensor unless it has the given dtype.
    pub fn expect_dtype(&self, dtype: Dtype) -> Result<()> {
        if self.dtype == dtype {
            Ok(())
        } else {
            Err(self.wrong_dtype(dtype.label()))
        }
    }

    /// Refuses the tensor unless it has exactly the given shape.
    pub fn expect_shape(&self, shape: &[usize]) -> Result<()> {
        if self.shape == shape {
            Ok(())
        } else {
            Err(FormatError::BadValue {
                path: self.path.to_string(),
                tensor: self.name.to_string(),
                message: format!("expected shape {shape:?}, found {:?}", self.shape),
            })
        }
    }

    /// Widens a BF16, F16 or F32 tensor to `f32` values.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let b = self.bytes;
        Ok(match self.dtype {
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            _ => return Err(self.wrong_dtype("BF16, F16 or F32")),
        })
    }

    /// Widens an integer tensor (I8, U8, I16, U16, I32, U32, I64) to `i64`.
    pub fn to_i64(&self) -> Result<Vec<i64>> {
        let b = self.bytes;
        Ok(match self.dtype {
            Dtype::I8 => b.iter().map(|&x| x as i8 as i64).collect(),
            Dtype::U8 => b.iter().map(|&x| x as i64).collect(),
            Dtype::I16 => b
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
            Dtype::U16 => b
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
            Dtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::U32 => b
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            _ => return Err(self.wrong_dtype("an integer type up to I64")),
        })
    }
}

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An opened, validated container.
///
/// # Memory maps
///
/// [`Container::open`] maps the file. As ripgrep documents for its own use of
/// memory maps, this is only safe while no other process truncates or rewrites
/// the file: if the file shrinks underneath the map, touching the lost pages
/// raises `SIGBUS` and the process dies. Model packages are written once and then
/// only read, so onebit accepts that trade for zero-copy loading; use
/// [`Container::read`] when the file may change while it is open.
pub struct Container {
    path: String,
    storage: Storage,
    header: Header,
    index: HashMap<String, usize>,
}

impl fmt::Debug for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Container")
            .field("path", &self.path)
            .field("tensors", &self.header.tensors.len())
            .field("bytes", &self.storage.bytes().len())
            .finish()
    }
}

impl Container {
    /// Maps and validates the file at `path` (see the type's docs on maps).
    pub fn open(path: impl AsRef<Path>) -> Result<Container> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let io = |e: std::io::Error| FormatError::Io {
            path: label.clone(),
            message: e.to_string(),
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        // Mapping an empty file fails on some platforms; it is refused as too short anyway.
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: see the type-level docs: the map is valid as long as the file
            // is not truncated by another process while it is open.
            Storage::Mapped(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Self::from_storage(label, storage)
    }

    /// Reads the whole file into memory and validates it (no map).
    pub fn read(path: impl AsRef<Path>) -> Result<Container> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| FormatError::Io {
            path: label.clone(),
            message: e.to_string(),
        })?;
        Self::from_storage(label, Storage::Owned(bytes))
    }

    /// Validates a container held in memory; `label` names it in errors.
    pub fn from_bytes(label: impl Into<String>, bytes: Vec<u8>) -> Result<Container> {
        Self::from_storage(label.into(), Storage::Owned(bytes))
    }

    fn from_storage(path: String, storage: Storage) -> Result<Container> {
        let header = Header::parse(&path, storage.bytes())?;
        let index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Container {
            path,
            storage,
            header,
            index,
        })
    }

    /// The path (or label) the container was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// `__metadata__`, if the file has one.
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.header.metadata.as_ref()
    }

    /// Total file size in bytes.
    pub fn file_len(&self) -> usize {
        self.storage.bytes().len()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.header.tensors.len()
    }

    /// True when the container holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.header.tensors.is_empty()
    }

    /// The whole file's bytes.
    pub fn file_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    fn view_of<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        let start = self.header.data_start();
        let bytes = &self.storage.bytes()[start + info.data.start..start + info.data.end];
        TensorView {
            name: &info.name,
            dtype: info.dtype,
            shape: &info.shape,
            bytes,
            path: &self.path,
        }
    }

    /// All tensors, in file order.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = TensorView<'_>> + '_ {
        self.header.tensors.iter().map(|t| self.view_of(t))
    }

    /// The tensor called `name`, if present.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        self.index
            .get(name)
            .map(|&i| self.view_of(&self.header.tensors[i]))
    }

    /// The tensor called `name`, or a [`FormatError::MissingTensor`].
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        self.get(name).ok_or_else(|| FormatError::MissingTensor {
            path: self.path.clone(),
            tensor: name.to_string(),
        })
    }
}
