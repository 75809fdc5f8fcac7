//! Text in and out of a package: its `tokenizer.json`, its chat template, the
//! incremental detokenizer and the stop-string matcher.

use std::path::Path;

use tokenizers::Tokenizer;

use crate::error::EngineError;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant` (passed to the template as given).
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message of `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The template used when a package carries none (ChatML, as llama-server falls back
/// to): the server can then still answer chat requests for any package.
pub const FALLBACK_CHAT_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A package's tokenizer.
pub struct Text {
    tokenizer: Tokenizer,
}

impl Text {
    /// Loads `DIR/tokenizer.json`: `Ok(None)` when the package has none; a file that
    /// exists but does not load is an error (never a silent "no tokenizer").
    pub fn open(dir: &Path) -> Result<Option<Text>, EngineError> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| EngineError::Tokenizer {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Some(Text { tokenizer }))
    }

    /// Token ids of `text`; `special` adds the tokenizer's own BOS/EOS template.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, EngineError> {
        Ok(self
            .tokenizer
            .encode(text, special)
            .map_err(|e| EngineError::Encode(e.to_string()))?
            .get_ids()
            .to_vec())
    }

    /// Text of `ids` (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| EngineError::Decode(e.to_string()))
    }

    /// Text of `ids` with special tokens written out (what a prompt's ids stand for).
    pub fn decode_with_special(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| EngineError::Decode(e.to_string()))
    }
}

/// Renders a Hugging Face chat template over `messages`, with the generation prompt
/// opened for the assistant.
pub fn render_chat(template: &str, messages: &[Message]) -> Result<String, EngineError> {
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
        .map_err(|e| EngineError::Template(format!("the chat template does not parse: {e}")))?;
    let messages: Vec<_> = messages
        .iter()
        .map(|m| minijinja::context! { role => m.role, content => m.content })
        .collect();
    env.get_template("chat")
        .and_then(|t| {
            t.render(minijinja::context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => "",
                eos_token => "",
            })
        })
        .map_err(|e| EngineError::Template(format!("cannot render the chat template: {e}")))
}

/// Turns ids into text increments without re-decoding the whole output each token:
/// it decodes a window from the last emitted boundary (`prefix`) and subtracts the
/// text that window's head already gave, holding back an incomplete UTF-8 sequence
/// (shown by the tokenizer as U+FFFD) until it completes. Work per token is bounded
/// by the window, which closes at every emitted piece.
#[derive(Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    /// Start of the decode window.
    prefix: usize,
    /// End of what has been emitted (ids `prefix..read` decode to the window's head).
    read: usize,
}

impl Detokenizer {
    /// Adds one token; returns the new text that is complete (possibly empty).
    pub fn push(&mut self, text: &Text, id: u32) -> Result<String, EngineError> {
        self.ids.push(id);
        let head = text.decode(&self.ids[self.prefix..self.read])?;
        let mut all = text.decode(&self.ids[self.prefix..])?;
        if !all.starts_with(&head) {
            // The emitted text reads otherwise in context (byte-fallback tokens that no
            // longer form valid UTF-8 with what follows them). It cannot be taken back,
            // so it stands, and the new tokens are decoded on their own from here:
            // waiting for the window to agree again would drop the rest of the output.
            self.prefix = self.read;
            all = text.decode(&self.ids[self.prefix..])?;
            if all.ends_with('\u{fffd}') || all.is_empty() {
                return Ok(String::new());
            }
            self.read = self.ids.len();
            return Ok(all);
        }
        if all.ends_with('\u{fffd}') || all.len() <= head.len() {
            return Ok(String::new());
        }
        let piece = all[head.len()..].to_string();
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(piece)
    }

    /// Whatever is still held back (an incomplete sequence at the end of output),
    /// decoded as it stands.
    pub fn flush(&mut self, text: &Text) -> Result<String, EngineError> {
        if self.read == self.ids.len() {
            return Ok(String::new());
        }
        let head = text.decode(&self.ids[self.prefix..self.read])?;
        let all = text.decode(&self.ids[self.prefix..])?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(match all.strip_prefix(&head) {
            Some(rest) => rest.to_string(),
            None => String::new(),
        })
    }
}

/// Holds text back while it could still be the start of a stop string, and finds the
/// first stop string in the output.
#[derive(Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text not yet released.
    pending: String,
}

/// What [`StopMatcher::push`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum StopScan {
    /// Text safe to release (possibly empty).
    Release(String),
    /// A stop string completed: the text before it, and the stop string.
    Stop(String, String),
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Adds `piece` of output.
    pub fn push(&mut self, piece: &str) -> StopScan {
        if self.stops.is_empty() {
            return StopScan::Release(piece.to_string());
        }
        self.pending.push_str(piece);
        // The earliest stop string wins (the longest at the same place).
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())));
        if let Some((at, stop)) = found {
            let before = self.pending[..at].to_string();
            let stop = stop.clone();
            self.pending.clear();
            return StopScan::Stop(before, stop);
        }
        // Keep the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        let release = self.pending[..keep].to_string();
        self.pending.drain(..keep);
        StopScan::Release(release)
    }

    /// The held-back text, at the end of output.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_held_back_until_they_cannot_match() {
        let mut m = StopMatcher::new(&["</s>".into(), "STOP".into()]);
        assert_eq!(m.push("Hello <"), StopScan::Release("Hello ".into()));
        assert_eq!(m.push("/"), StopScan::Release(String::new()));
        assert_eq!(m.push("x"), StopScan::Release("</x".into()));
        assert_eq!(m.push("ST"), StopScan::Release(String::new()));
        assert_eq!(
            m.push("OP and more"),
            StopScan::Stop(String::new(), "STOP".into())
        );
        let mut m = StopMatcher::new(&["ab".into()]);
        assert_eq!(m.push("xa"), StopScan::Release("x".into()));
        assert_eq!(m.flush(), "a");
    }

    #[test]
    fn the_earliest_stop_string_wins() {
        let mut m = StopMatcher::new(&["cd".into(), "bcde".into(), "b".into()]);
        assert_eq!(m.push("abcdef"), StopScan::Stop("a".into(), "bcde".into()));
    }

    #[test]
    fn no_stop_strings_release_everything() {
        let mut m = StopMatcher::new(&[String::new()]);
        assert_eq!(m.push("abc"), StopScan::Release("abc".into()));
    }

    #[test]
    fn multibyte_text_is_split_only_at_char_boundaries() {
        let mut m = StopMatcher::new(&["é!".into()]);
        assert_eq!(m.push("caféé"), StopScan::Release("café".into()));
        assert_eq!(m.push("!"), StopScan::Stop(String::new(), "é!".into()));
    }

    #[test]
    fn the_fallback_template_renders_chatml() {
        let s = render_chat(
            FALLBACK_CHAT_TEMPLATE,
            &[Message::new("system", "S"), Message::new("user", "U")],
        )
        .unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
