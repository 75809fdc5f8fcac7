//! The one error type of the format crate.

use thiserror::Error;

/// Every way a container or a tile matrix can be refused.
///
/// Each message starts with `q4nx: ` and names the file (`path`), the tensor and
/// the offending values, so a user can find the problem without a debugger.
/// `path` is the file's path, or a label such as `<memory>` for byte slices.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FormatError {
    #[error("q4nx: {path}: cannot read: {message}")]
    Io { path: String, message: String },

    #[error("q4nx: {path}: file is {len} bytes, too short for the 8-byte header length")]
    TooShort { path: String, len: u64 },

    #[error("q4nx: {path}: header length {header_len} exceeds the limit of {limit} bytes")]
    HeaderTooLong {
        path: String,
        header_len: u64,
        limit: u64,
    },

    #[error(
        "q4nx: {path}: header length {header_len} runs past the end of the {file_len}-byte file"
    )]
    HeaderPastEnd {
        path: String,
        header_len: u64,
        file_len: u64,
    },

    #[error("q4nx: {path}: header is not UTF-8 (invalid byte at header offset {offset})")]
    HeaderNotUtf8 { path: String, offset: usize },

    #[error("q4nx: {path}: header is not valid JSON: {message}")]
    HeaderNotJson { path: String, message: String },

    #[error("q4nx: {path}: header JSON is not an object: found {found}")]
    HeaderNotObject { path: String, found: String },

    #[error("q4nx: {path}: tensor '{tensor}': entry is malformed: {message}")]
    BadEntry {
        path: String,
        tensor: String,
        message: String,
    },

    #[error("q4nx: {path}: __metadata__ is malformed: {message}")]
    BadMetadata { path: String, message: String },

    #[error("q4nx: {path}: tensor '{tensor}': unknown dtype label '{label}'")]
    UnknownDtype {
        path: String,
        tensor: String,
        label: String,
    },

    #[error("q4nx: {path}: tensor '{tensor}' appears more than once in the header")]
    DuplicateName { path: String, tensor: String },

    #[error(
        "q4nx: {path}: tensor '{tensor}': size of shape {shape:?} x {dtype_size} bytes overflows"
    )]
    SizeOverflow {
        path: String,
        tensor: String,
        shape: Vec<u64>,
        dtype_size: usize,
    },

    #[error(
        "q4nx: {path}: tensor '{tensor}': data_offsets [{begin}, {end}] end before they begin"
    )]
    InvertedOffsets {
        path: String,
        tensor: String,
        begin: u64,
        end: u64,
    },

    #[error(
        "q4nx: {path}: tensor '{tensor}': data_offsets [{begin}, {end}] hold {actual} bytes, but {dtype} {shape:?} needs {expected}"
    )]
    SizeMismatch {
        path: String,
        tensor: String,
        dtype: crate::Dtype,
        shape: Vec<u64>,
        begin: u64,
        end: u64,
        expected: u64,
        actual: u64,
    },

    #[error("q4nx: {path}: tensor '{tensor}': data starts at {begin}, but the previous tensor ends at {expected} (gap)")]
    Gap {
        path: String,
        tensor: String,
        begin: u64,
        expected: u64,
    },

    #[error("q4nx: {path}: tensor '{tensor}': data starts at {begin}, inside the previous tensor which ends at {expected} (overlap)")]
    Overlap {
        path: String,
        tensor: String,
        begin: u64,
        expected: u64,
    },

    #[error("q4nx: {path}: tensor '{tensor}': data_offsets end {end} is past the {data_len} bytes of data")]
    OutOfBounds {
        path: String,
        tensor: String,
        end: u64,
        data_len: u64,
    },

    #[error("q4nx: {path}: tensors end at data offset {data_end}, but the file has {data_len} data bytes ({trailing} trailing)")]
    TrailingBytes {
        path: String,
        data_end: u64,
        data_len: u64,
        trailing: u64,
    },

    #[error("q4nx: {path}: no tensor named '{tensor}'")]
    MissingTensor { path: String, tensor: String },

    #[error("q4nx: {path}: tensor '{tensor}': expected dtype {expected}, found {found}")]
    WrongDtype {
        path: String,
        tensor: String,
        expected: String,
        found: String,
    },

    #[error("q4nx: {path}: tensor '{tensor}': {message}")]
    BadTileGrid {
        path: String,
        tensor: String,
        message: String,
    },

    #[error("q4nx: {path}: tensor '{tensor}': {message}")]
    BadValue {
        path: String,
        tensor: String,
        message: String,
    },

    #[error("q4nx: writer: {message}")]
    Writer { message: String },
}

/// Shorthand for results of this crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;
