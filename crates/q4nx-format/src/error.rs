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
    /// The file cannot be read.
    #[error("q4nx: {path}: cannot read: {message}")]
    Io {
        /// The file (or a label for bytes in memory).
        path: String,
        /// What went wrong.
        message: String,
    },

    /// File is `len` bytes, too short for the 8-byte header length.
    #[error("q4nx: {path}: file is {len} bytes, too short for the 8-byte header length")]
    TooShort {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The length in bytes.
        len: u64,
    },

    /// Header length `header_len` exceeds the limit of `limit` bytes.
    #[error("q4nx: {path}: header length {header_len} exceeds the limit of {limit} bytes")]
    HeaderTooLong {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The header length from the file.
        header_len: u64,
        /// The limit.
        limit: u64,
    },

    #[error(
        "q4nx: {path}: header length {header_len} runs past the end of the {file_len}-byte file"
    )]
    /// Header length `header_len` runs past the end of the `file_len`-byte file.
    HeaderPastEnd {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The header length from the file.
        header_len: u64,
        /// The file's length in bytes.
        file_len: u64,
    },

    /// Header is not UTF-8 (invalid byte at header offset `offset`).
    #[error("q4nx: {path}: header is not UTF-8 (invalid byte at header offset {offset})")]
    HeaderNotUtf8 {
        /// The file (or a label for bytes in memory).
        path: String,
        /// Offset concerned.
        offset: usize,
    },

    /// Header is not valid JSON: `message`.
    #[error("q4nx: {path}: header is not valid JSON: {message}")]
    HeaderNotJson {
        /// The file (or a label for bytes in memory).
        path: String,
        /// What went wrong.
        message: String,
    },

    /// Header JSON is not an object: found `found`.
    #[error("q4nx: {path}: header JSON is not an object: found {found}")]
    HeaderNotObject {
        /// The file (or a label for bytes in memory).
        path: String,
        /// What was found.
        found: String,
    },

    /// Tensor '`tensor`': entry is malformed: `message`.
    #[error("q4nx: {path}: tensor '{tensor}': entry is malformed: {message}")]
    BadEntry {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// What went wrong.
        message: String,
    },

    /// __metadata__ is malformed: `message`.
    #[error("q4nx: {path}: __metadata__ is malformed: {message}")]
    BadMetadata {
        /// The file (or a label for bytes in memory).
        path: String,
        /// What went wrong.
        message: String,
    },

    /// Tensor '`tensor`': unknown dtype label '`label`'.
    #[error("q4nx: {path}: tensor '{tensor}': unknown dtype label '{label}'")]
    UnknownDtype {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// The unknown label.
        label: String,
    },

    /// Tensor '`tensor`' appears more than once in the header.
    #[error("q4nx: {path}: tensor '{tensor}' appears more than once in the header")]
    DuplicateName {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
    },

    #[error(
        "q4nx: {path}: tensor '{tensor}': size of shape {shape:?} x {dtype_size} bytes overflows"
    )]
    /// Tensor '`tensor`': size of shape `shape` x `dtype_size` bytes overflows.
    SizeOverflow {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// The shape concerned.
        shape: Vec<u64>,
        /// Bytes per element.
        dtype_size: usize,
    },

    #[error(
        "q4nx: {path}: tensor '{tensor}': data_offsets [{begin}, {end}] end before they begin"
    )]
    /// Tensor '`tensor`': data_offsets [`begin`, `end`] end before they begin.
    InvertedOffsets {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// Start offset.
        begin: u64,
        /// End offset.
        end: u64,
    },

    #[error(
        "q4nx: {path}: tensor '{tensor}': data_offsets [{begin}, {end}] hold {actual} bytes, but {dtype} {shape:?} needs {expected}"
    )]
    /// Tensor '`tensor`': data_offsets [`begin`, `end`] hold `actual` bytes, but `dtype` `shape` needs `expected`.
    SizeMismatch {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// The element type concerned.
        dtype: crate::Dtype,
        /// The shape concerned.
        shape: Vec<u64>,
        /// Start offset.
        begin: u64,
        /// End offset.
        end: u64,
        /// What was expected.
        expected: u64,
        /// The actual value.
        actual: u64,
    },

    /// Tensor '`tensor`': data starts at `begin`, but the previous tensor ends at `expected` (gap).
    #[error("q4nx: {path}: tensor '{tensor}': data starts at {begin}, but the previous tensor ends at {expected} (gap)")]
    Gap {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// Start offset.
        begin: u64,
        /// What was expected.
        expected: u64,
    },

    /// Tensor '`tensor`': data starts at `begin`, inside the previous tensor which ends at `expected` (overlap).
    #[error("q4nx: {path}: tensor '{tensor}': data starts at {begin}, inside the previous tensor which ends at {expected} (overlap)")]
    Overlap {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// Start offset.
        begin: u64,
        /// What was expected.
        expected: u64,
    },

    /// Tensor '`tensor`': data_offsets end `end` is past the `data_len` bytes of data.
    #[error("q4nx: {path}: tensor '{tensor}': data_offsets end {end} is past the {data_len} bytes of data")]
    OutOfBounds {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// End offset.
        end: u64,
        /// Bytes in the data section.
        data_len: u64,
    },

    /// Tensors end at data offset `data_end`, but the file has `data_len` data bytes (`trailing` trailing).
    #[error("q4nx: {path}: tensors end at data offset {data_end}, but the file has {data_len} data bytes ({trailing} trailing)")]
    TrailingBytes {
        /// The file (or a label for bytes in memory).
        path: String,
        /// Where the last tensor ends.
        data_end: u64,
        /// Bytes in the data section.
        data_len: u64,
        /// Bytes past the last tensor.
        trailing: u64,
    },

    /// No tensor named '`tensor`'.
    #[error("q4nx: {path}: no tensor named '{tensor}'")]
    MissingTensor {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
    },

    /// Tensor '`tensor`': expected dtype `expected`, found `found`.
    #[error("q4nx: {path}: tensor '{tensor}': expected dtype {expected}, found {found}")]
    WrongDtype {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// What was expected.
        expected: String,
        /// What was found.
        found: String,
    },

    /// A tile tensor does not fit the matrix it should hold.
    #[error("q4nx: {path}: tensor '{tensor}': {message}")]
    BadTileGrid {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// What went wrong.
        message: String,
    },

    /// A tensor's values are unusable (e.g. not finite).
    #[error("q4nx: {path}: tensor '{tensor}': {message}")]
    BadValue {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// What went wrong.
        message: String,
    },

    /// The writer refused its input (names, shapes, sizes).
    #[error("q4nx: writer: {message}")]
    Writer {
        /// What went wrong.
        message: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;
