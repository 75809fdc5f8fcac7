//! The routes, by the API they belong to.

pub(crate) mod ollama;
pub(crate) mod openai;
pub(crate) mod text;
