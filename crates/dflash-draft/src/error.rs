//! The draft loader's refusals. Every message starts `dflash draft: ` and names the
//! path, key, tensor and value.

use thiserror::Error;

/// Every way a draft package (or a z-lab import) can be refused.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DraftError {
    /// A file of the package cannot be read.
    #[error("dflash draft: {path}: {message}")]
    Io {
        /// The file (or a label for bytes in memory).
        path: String,
        /// What went wrong.
        message: String,
    },
    /// Not a draft package: `message`.
    #[error("dflash draft: {path}: not a draft package: {message}")]
    NotAPackage {
        /// The file (or a label for bytes in memory).
        path: String,
        /// What went wrong.
        message: String,
    },
    /// Key '`key`' `problem`.
    #[error("dflash draft: {path}: key '{key}' {problem}")]
    Config {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The key concerned.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Tensor '`tensor`' `problem`.
    #[error("dflash draft: {path}: tensor '{tensor}' {problem}")]
    Tensor {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Scalar '`tensor`' is `found` in the container but `expected` in config.json ('`key`').
    #[error("dflash draft: {path}: scalar '{tensor}' is {found} in the container but {expected} in config.json ('{key}')")]
    ScalarMismatch {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The tensor's name.
        tensor: String,
        /// The key concerned.
        key: String,
        /// What was found.
        found: String,
        /// What was expected.
        expected: String,
    },
    /// MANIFEST.sha256 says '`file`' has sha256 `expected`, but it has `actual`.
    #[error("dflash draft: {path}: MANIFEST.sha256 says '{file}' has sha256 {expected}, but it has {actual}")]
    ManifestMismatch {
        /// The file (or a label for bytes in memory).
        path: String,
        /// The file concerned.
        file: String,
        /// What was expected.
        expected: String,
        /// The actual value.
        actual: String,
    },
    /// Paired with target `target`: `problem`.
    #[error("dflash draft: paired with target {target}: {problem}")]
    Pairing {
        /// The target concerned.
        target: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The container refused by the format crate.
    #[error("dflash draft: {0}")]
    Format(#[from] q4nx_format::FormatError),
}

/// Shorthand for results of this crate.
pub type Result<T, E = DraftError> = std::result::Result<T, E>;
