//! Errors of the target runtime. Messages start `target: ` and name the file, key,
//! tensor or value.

use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TargetError {
    #[error("target: {path}: cannot read: {message}")]
    Io { path: String, message: String },
    #[error("target: {path}: config key '{key}' {problem}")]
    Config {
        path: String,
        key: String,
        problem: String,
    },
    #[error("target: {path}: tensor '{tensor}' {problem}")]
    Tensor {
        path: String,
        tensor: String,
        problem: String,
    },
    #[error("target: token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("target: a pass of {n} tokens at position {position} would exceed max_position_embeddings {max}")]
    TooLong {
        position: usize,
        n: usize,
        max: usize,
    },
    #[error("target: cannot truncate to {len} positions: only {position} are cached")]
    TruncateBeyond { len: usize, position: usize },
    #[error("target: tap layer {layer} does not exist (the model has {layers} layers)")]
    TapLayer { layer: usize, layers: usize },
    #[error("target: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Format(#[from] q4nx_format::FormatError),
}

pub type Result<T, E = TargetError> = std::result::Result<T, E>;
