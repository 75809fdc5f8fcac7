//! Errors of the target runtime. Messages start `target: ` and name the file, key,
//! tensor or value.

use thiserror::Error;

/// Why the target runtime refused a package, a manifest or a call.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TargetError {
    /// A file (`config.json`, a kernel manifest) could not be read.
    #[error("target: {path}: cannot read: {message}")]
    Io {
        /// The file that could not be read.
        path: String,
        /// The operating system's reason.
        message: String,
    },
    /// A JSON file (`config.json`, a kernel manifest) has a missing, malformed or
    /// unsupported value at `key`.
    #[error("target: {path}: config key '{key}' {problem}")]
    Config {
        /// The JSON file.
        path: String,
        /// The offending key (dotted for nested keys; `(file)` when the whole file is bad).
        key: String,
        /// What is wrong with it, phrased to follow the key.
        problem: String,
    },
    /// A tensor of `model.q4nx` does not fit the architecture (bad width, or a tensor
    /// the model does not use).
    #[error("target: {path}: tensor '{tensor}' {problem}")]
    Tensor {
        /// The container file.
        path: String,
        /// The tensor's name.
        tensor: String,
        /// What is wrong with it, phrased to follow the tensor name.
        problem: String,
    },
    /// A token id passed to a forward is not below the vocabulary size.
    #[error("target: token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The offending token id.
        token: u32,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// A pass would run past the context the model (or the allocated KV cache) holds.
    #[error("target: a pass of {n} tokens at position {position} would exceed max_position_embeddings {max}")]
    TooLong {
        /// Positions already cached (where the pass would start).
        position: usize,
        /// Tokens in the refused pass.
        n: usize,
        /// Positions the cache can hold.
        max: usize,
    },
    /// A chunked prefill was cancelled between chunks.
    #[error("target: prefill cancelled at position {position}")]
    Cancelled {
        /// Positions in the cache when it stopped (the chunks already run).
        position: usize,
    },
    /// `truncate` asked to keep more positions than are cached.
    #[error("target: cannot truncate to {len} positions: only {position} are cached")]
    TruncateBeyond {
        /// The requested cache length.
        len: usize,
        /// Positions actually cached.
        position: usize,
    },
    /// A layer tap names a layer the model does not have.
    #[error("target: tap layer {layer} does not exist (the model has {layers} layers)")]
    TapLayer {
        /// The requested layer index.
        layer: usize,
        /// The model's number of layers.
        layers: usize,
    },
    /// A request this build, backend or device cannot serve (no XRT, bad plan
    /// options, a device failure); the message says which.
    #[error("target: {0}")]
    Unsupported(String),
    /// The Q4NX container itself is malformed or a tensor has the wrong dtype or shape.
    #[error(transparent)]
    Format(#[from] q4nx_format::FormatError),
}

/// `Result` with [`TargetError`] as the default error.
pub type Result<T, E = TargetError> = std::result::Result<T, E>;
