//! `EngineError`: every way loading or generating can fail, with the values involved.

/// Why the engine refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The package's `tokenizer.json` exists but does not load.
    #[error("{path}: cannot load the tokenizer: {message}")]
    Tokenizer {
        /// The file.
        path: String,
        /// The tokenizer library's message.
        message: String,
    },
    /// A text prompt for a package without `tokenizer.json`.
    #[error("the package has no tokenizer.json: give the prompt as token ids")]
    NoTokenizer,
    /// The tokenizer refused the prompt.
    #[error("cannot tokenize the prompt: {0}")]
    Encode(String),
    /// The tokenizer refused to decode output ids.
    #[error("cannot decode tokens: {0}")]
    Decode(String),
    /// The chat template does not parse or render.
    #[error("{0}")]
    Template(String),
    /// The chat template refused the messages with its own `raise_exception(message)`
    /// (roles not alternating, a role it does not know...): the caller's messages are
    /// at fault, not the model (a server answers 400 with this text).
    #[error("the chat template refused the messages: {message}")]
    TemplateException {
        /// The template's own message.
        message: String,
    },
    /// A chat prompt for a package without a chat template (the caller may supply the
    /// fallback, [`crate::FALLBACK_CHAT_TEMPLATE`]).
    #[error("the package has no chat_template in config.json")]
    NoChatTemplate,
    /// A token id (of a prompt, or given to detokenize) is not below the vocabulary size:
    /// the caller's ids are at fault (a server answers 400).
    #[error("target: token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The offending token id.
        token: u32,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt and the tokens asked for do not fit the context.
    #[error("the prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context size ({ctx} tokens)")]
    ContextOverflow {
        /// Prompt tokens.
        prompt: usize,
        /// Tokens asked for at most.
        max_tokens: usize,
        /// The context size.
        ctx: usize,
    },
    /// A prompt that fills the context, with no token to generate asked for.
    #[error("the prompt ({prompt} tokens) leaves no room to generate in the context size ({ctx} tokens)")]
    NoRoom {
        /// Prompt tokens.
        prompt: usize,
        /// The context size.
        ctx: usize,
    },
    /// An option out of range (the message names it).
    #[error("{0}")]
    Invalid(String),
    /// A sampling parameter out of range.
    #[error(transparent)]
    Sampling(#[from] mtp::SamplingError),
    /// The target failed to open or run.
    #[error(transparent)]
    Target(#[from] npu_runtime::TargetError),
    /// The draft package was refused.
    #[error(transparent)]
    Draft(#[from] dflash_draft::DraftError),
    /// A failure of the code around the engine (a front end's worker), reported through it.
    #[error("internal error: {0}")]
    Internal(String),
    /// The speculative loop failed (including a failing drafter).
    #[error(transparent)]
    Run(#[from] mtp::RunError),
}

/// Results of the engine.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
