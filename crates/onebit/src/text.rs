//! Text in and out of a package: its `tokenizer.json`, its chat template, and a
//! streaming decoder that prints only complete characters.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use tokenizers::Tokenizer;

/// A package's tokenizer.
pub struct Text {
    tokenizer: Tokenizer,
}

impl Text {
    /// Loads `DIR/tokenizer.json`.
    pub fn open(dir: &Path) -> Result<Text> {
        let path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path)
            .map_err(|e| anyhow!("run: {}: cannot load the tokenizer: {e}", path.display()))?;
        Ok(Text { tokenizer })
    }

    /// Token ids of `text`; `special` adds the tokenizer's own BOS/EOS template.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode(text, special)
            .map_err(|e| anyhow!("run: cannot tokenize the prompt: {e}"))?
            .get_ids()
            .to_vec())
    }

    /// Text of `ids` (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| anyhow!("run: cannot decode tokens: {e}"))
    }
}

/// Renders a Hugging Face chat template for one user turn (plus an optional system
/// turn), with the generation prompt opened for the assistant.
pub fn render_chat(
    template: &str,
    system: Option<&str>,
    user: &str,
    bos: &str,
    eos: &str,
) -> Result<String> {
    let mut env = minijinja::Environment::new();
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_template("chat", template)
        .context("run: the chat template does not parse")?;
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(minijinja::context! { role => "system", content => s });
    }
    messages.push(minijinja::context! { role => "user", content => user });
    env.get_template("chat")?
        .render(minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => bos,
            eos_token => eos,
        })
        .context("run: cannot render the chat template")
}

/// Turns a growing list of ids into text increments, holding back an incomplete
/// UTF-8 sequence (shown by the tokenizer as U+FFFD) until it completes.
#[derive(Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    printed: usize,
}

impl StreamDecoder {
    /// Adds one token; returns the new text that is safe to print.
    pub fn push(&mut self, text: &Text, id: u32) -> Result<String> {
        self.ids.push(id);
        let all = text.decode(&self.ids)?;
        if all.ends_with('\u{fffd}')
            || all.len() < self.printed
            || !all.is_char_boundary(self.printed)
        {
            return Ok(String::new());
        }
        let new = all[self.printed..].to_string();
        self.printed = all.len();
        Ok(new)
    }
}
