//! The draft loader's refusals. Every message starts `dflash draft: ` and names the
//! path, key, tensor and value.

use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DraftError {
    #[error("dflash draft: {path}: {message}")]
    Io { path: String, message: String },
    #[error("dflash draft: {path}: not a draft package: {message}")]
    NotAPackage { path: String, message: String },
    #[error("dflash draft: {path}: key '{key}' {problem}")]
    Config {
        path: String,
        key: String,
        problem: String,
    },
    #[error("dflash draft: {path}: tensor '{tensor}' {problem}")]
    Tensor {
        path: String,
        tensor: String,
        problem: String,
    },
    #[error("dflash draft: {path}: scalar '{tensor}' is {found} in the container but {expected} in config.json ('{key}')")]
    ScalarMismatch {
        path: String,
        tensor: String,
        key: String,
        found: String,
        expected: String,
    },
    #[error("dflash draft: {path}: MANIFEST.sha256 says '{file}' has sha256 {expected}, but it has {actual}")]
    ManifestMismatch {
        path: String,
        file: String,
        expected: String,
        actual: String,
    },
    #[error("dflash draft: paired with target {target}: {problem}")]
    Pairing { target: String, problem: String },
    #[error("dflash draft: {0}")]
    Format(#[from] q4nx_format::FormatError),
}

pub type Result<T, E = DraftError> = std::result::Result<T, E>;
