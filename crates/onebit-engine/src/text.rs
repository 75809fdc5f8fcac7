//! Text in and out of a package: its `tokenizer.json`, its chat template, the
//! incremental detokenizer and the stop-string matcher.

use std::path::Path;

use tokenizers::{Encoding, Token, Tokenizer};

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
    /// The ids the tokenizer's post-processor puts before a text when it adds special
    /// tokens (a BOS, for most models that want one; empty when it adds none).
    prefix: Vec<u32>,
    /// The decoder is byte-level BPE's (GPT-2's byte-to-character table): a token's
    /// bytes are its vocabulary string mapped back through that table.
    byte_level: bool,
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
        // The post-processor is asked directly, with a placeholder id standing for the
        // text, so that no vocabulary entry has to exist for a probe text.
        let probe = u32::MAX;
        let placeholder = Encoding::from_tokens(vec![Token::new(probe, String::new(), (0, 0))], 0);
        let processed = tokenizer
            .post_process(placeholder, None, true)
            .map_err(|e| EngineError::Tokenizer {
                path: path.display().to_string(),
                message: format!("its post-processor fails on a one-token text: {e}"),
            })?;
        let ids = processed.get_ids();
        let prefix = ids[..ids.iter().position(|&id| id == probe).unwrap_or(0)].to_vec();
        let byte_level = tokenizer
            .get_decoder()
            .and_then(|d| serde_json::to_value(d).ok())
            .is_some_and(|v| v["type"] == "ByteLevel");
        Ok(Some(Text {
            tokenizer,
            prefix,
            byte_level,
        }))
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

    /// Token ids of a rendered chat prompt. The special tokens the template wrote are
    /// parsed as such and nothing is appended (as transformers tokenizes a chat); the
    /// tokenizer's BOS prefix is put in front only when the text does not already start
    /// with it (as llama.cpp does), so the prompt holds BOS once: never twice when the
    /// template writes `bos_token` itself, never dropped when it does not.
    pub fn encode_chat(&self, rendered: &str) -> Result<Vec<u32>, EngineError> {
        let ids = self.encode(rendered, false)?;
        if self.prefix.is_empty() || ids.starts_with(&self.prefix) {
            return Ok(ids);
        }
        Ok(self.prefix.iter().copied().chain(ids).collect())
    }

    /// The ids the tokenizer puts before a text when it adds special tokens (its BOS).
    pub fn special_prefix(&self) -> &[u32] {
        &self.prefix
    }

    /// The string of token `id`, if the vocabulary has it.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// The bytes token `id` stands for (what OpenAI's logprobs report as `bytes`: a
    /// token may hold part of a UTF-8 sequence). Byte-level BPE: the vocabulary string
    /// through GPT-2's byte table; SentencePiece: `<0xHH>` is byte HH and `▁` a space;
    /// added (special) tokens: their text. Empty for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(piece) = self.tokenizer.id_to_token(id) else {
            return Vec::new();
        };
        let special = self
            .tokenizer
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special);
        if special {
            return piece.into_bytes();
        }
        if self.byte_level {
            let bytes: Option<Vec<u8>> = piece.chars().map(gpt2_byte).collect();
            return bytes.unwrap_or_else(|| piece.into_bytes());
        }
        if let Some(hex) = piece
            .strip_prefix("<0x")
            .and_then(|h| h.strip_suffix('>'))
            .filter(|h| h.len() == 2)
        {
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                return vec![b];
            }
        }
        piece.replace('\u{2581}', " ").into_bytes()
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

/// The byte GPT-2's byte-level table maps to character `c` (printable Latin-1 bytes
/// stand for themselves; the other 68 bytes are the characters from U+0100 up, in
/// byte order), or `None` for a character outside the table.
fn gpt2_byte(c: char) -> Option<u8> {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let code = c as u32;
    if code < 0x100 {
        return printable(code).then_some(code as u8);
    }
    (0u32..=255)
        .filter(|&b| !printable(b))
        .nth((code - 0x100) as usize)
        .map(|b| b as u8)
}

/// The special-token strings a chat template sees: transformers passes its tokenizer's
/// `bos_token` and `eos_token` (Llama 3's template starts with `{{ bos_token }}`, so an
/// empty one loses `<|begin_of_text|>`). `None` leaves the name undefined, as
/// transformers does for a model without one (Qwen3 has no BOS).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatTokens {
    /// The BOS token's text.
    pub bos_token: Option<String>,
    /// The EOS token's text.
    pub eos_token: Option<String>,
}

impl ChatTokens {
    /// The package's tokens in `dir`. `tokenizer_config.json`, when the package has
    /// one (a Hugging Face directory's), is what transformers reads, so it decides
    /// alone (a key that is absent or null there means no such token); otherwise the
    /// ids of config.json (`bos_token_id`, the first `eos_token_id`; what the GGUF
    /// converter writes) are looked up in the tokenizer's vocabulary.
    pub fn resolve(
        dir: &Path,
        text: Option<&Text>,
        bos_id: Option<u32>,
        eos_ids: &[u32],
    ) -> Result<ChatTokens, EngineError> {
        let path = dir.join("tokenizer_config.json");
        if path.exists() {
            let bad = |message: String| EngineError::Tokenizer {
                path: path.display().to_string(),
                message,
            };
            let source =
                std::fs::read_to_string(&path).map_err(|e| bad(format!("cannot read it: {e}")))?;
            let json: serde_json::Value = serde_json::from_str(&source)
                .map_err(|e| bad(format!("is not valid JSON: {e}")))?;
            let token = |key: &str| -> Result<Option<String>, EngineError> {
                // A token is a string or an AddedToken object {"content": ...}.
                match json.get(key) {
                    None | Some(serde_json::Value::Null) => Ok(None),
                    Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                    Some(v) => match v.get("content").and_then(serde_json::Value::as_str) {
                        Some(s) => Ok(Some(s.to_string())),
                        None => Err(bad(format!(
                            "'{key}' is {v}, not a string or an object with a string 'content'"
                        ))),
                    },
                }
            };
            return Ok(ChatTokens {
                bos_token: token("bos_token")?,
                eos_token: token("eos_token")?,
            });
        }
        let Some(text) = text else {
            return Ok(ChatTokens::default());
        };
        let lookup = |key: &str, id: Option<u32>| -> Result<Option<String>, EngineError> {
            match id {
                None => Ok(None),
                Some(id) => text
                    .id_to_token(id)
                    .map(Some)
                    .ok_or_else(|| EngineError::Tokenizer {
                        path: dir.join("config.json").display().to_string(),
                        message: format!("'{key}' is {id}, which is not a token of tokenizer.json"),
                    }),
            }
        };
        Ok(ChatTokens {
            bos_token: lookup("bos_token_id", bos_id)?,
            eos_token: lookup("eos_token_id", eos_ids.first().copied())?,
        })
    }
}

/// Renders a Hugging Face chat template over `messages` the way transformers'
/// `apply_chat_template` does: Jinja with `trim_blocks` and `lstrip_blocks`, Python's
/// string methods (`.startswith`, `.split`, `.strip`...), `raise_exception`, a
/// `tojson` that writes what Python's `json.dumps` writes, the model's `bos_token` and
/// `eos_token`, and `add_generation_prompt` (the assistant's turn opened).
///
/// A template's `raise_exception(message)` is [`EngineError::TemplateException`] with
/// the template's own message; a template that does not parse or render otherwise is
/// [`EngineError::Template`].
pub fn render_chat(
    template: &str,
    messages: &[Message],
    tokens: &ChatTokens,
    add_generation_prompt: bool,
) -> Result<String, EngineError> {
    let mut env = minijinja::Environment::new();
    // transformers compiles templates with these two on; without them a template
    // written with plain `{% ... %}` tags renders extra newlines and indentation.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(python_methods);
    // Python prints its booleans and None capitalized.
    env.set_formatter(|out, state, value| match value.kind() {
        minijinja::value::ValueKind::Bool | minijinja::value::ValueKind::None => {
            let word = match (value.is_none(), value.is_true()) {
                (true, _) => "None",
                (false, true) => "True",
                (false, false) => "False",
            };
            out.write_str(word).map_err(minijinja::Error::from)
        }
        _ => minijinja::escape_formatter(out, state, value),
    });
    env.add_filter("trim", |s: &str| python_strip(s, None, true, true));
    env.add_filter("tojson", tojson);
    // Llama 3.2's template dates its system turn with this (transformers: local time;
    // here UTC, the servers' usual zone, without a time-zone database).
    env.add_function("strftime_now", |format: &str| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        strftime(format, now)
    });
    // What the template raised, kept apart from the render error (which minijinja
    // decorates with positions), so the error carries the template's text unchanged.
    let raised = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let sink = raised.clone();
    env.add_function(
        "raise_exception",
        move |message: String| -> Result<String, minijinja::Error> {
            if let Ok(mut slot) = sink.lock() {
                slot.get_or_insert_with(|| message.clone());
            }
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        },
    );
    env.add_template("chat", template)
        .map_err(|e| EngineError::Template(format!("the chat template does not parse: {e}")))?;
    let messages: Vec<_> = messages
        .iter()
        .map(|m| minijinja::context! { role => m.role, content => m.content })
        .collect();
    let result = env.get_template("chat").and_then(|t| {
        t.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => tokens.bos_token,
            eos_token => tokens.eos_token,
        })
    });
    result.map_err(
        |e| match raised.lock().ok().and_then(|mut slot| slot.take()) {
            Some(message) => EngineError::TemplateException { message },
            None => EngineError::Template(format!("cannot render the chat template: {e}")),
        },
    )
}

/// Python's `strftime` of the UTC time `unix` seconds, for the directives templates
/// use (`%d %m %Y %y %b %B %a %A %H %I %M %S %p %j %e %%`); any other is an error
/// naming it, not a silently different date.
fn strftime(format: &str, unix: i64) -> Result<String, minijinja::Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    // Civil date from days since 1970-01-01 (proleptic Gregorian, 400-year eras).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_march = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_march + 2) / 153;
    let day = doy_march - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const BEFORE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[(month - 1) as usize] + day + i64::from(leap && month > 2);
    // 1970-01-01 was a Thursday.
    let weekday = (days + 3).rem_euclid(7) as usize;
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let directive = chars.next();
        let piece = match directive {
            Some('d') => format!("{day:02}"),
            Some('e') => format!("{day:>2}"),
            Some('m') => format!("{month:02}"),
            Some('Y') => format!("{year}"),
            Some('y') => format!("{:02}", year.rem_euclid(100)),
            Some('b') => month_name[..3].to_string(),
            Some('B') => month_name.to_string(),
            Some('a') => DAYS[weekday][..3].to_string(),
            Some('A') => DAYS[weekday].to_string(),
            Some('H') => format!("{hour:02}"),
            Some('I') => format!("{:02}", (hour + 11) % 12 + 1),
            Some('p') => if hour < 12 { "AM" } else { "PM" }.to_string(),
            Some('M') => format!("{minute:02}"),
            Some('S') => format!("{second:02}"),
            Some('j') => format!("{yday:03}"),
            Some('%') => "%".to_string(),
            other => {
                return Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: directive '%{}' in '{format}' is not supported",
                        other.map(String::from).unwrap_or_default()
                    ),
                ))
            }
        };
        out.push_str(&piece);
    }
    Ok(out)
}

/// Python's `str.isspace` characters: Rust's whitespace and the four separators
/// U+001C..U+001F, which Python's `strip` also removes.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip`/`lstrip`/`rstrip`: `chars` given, those characters; else
/// Python's whitespace.
fn python_strip(s: &str, chars: Option<&str>, left: bool, right: bool) -> String {
    let strip = |c: char| match chars {
        Some(set) => set.contains(c),
        None => python_space(c),
    };
    let s = if left { s.trim_start_matches(strip) } else { s };
    let s = if right { s.trim_end_matches(strip) } else { s };
    s.to_string()
}

/// Python methods on template values: minijinja-contrib's pycompat, with the strip
/// family on Python's own whitespace (pycompat strips Rust's, which lacks U+001C..F).
fn python_methods(
    state: &minijinja::State,
    value: &minijinja::Value,
    method: &str,
    args: &[minijinja::Value],
) -> Result<minijinja::Value, minijinja::Error> {
    let sides = match method {
        "strip" => Some((true, true)),
        "lstrip" => Some((true, false)),
        "rstrip" => Some((false, true)),
        _ => None,
    };
    if let (Some((left, right)), Some(s)) = (sides, value.as_str()) {
        let (chars,): (Option<&str>,) = minijinja::value::from_args(args)?;
        return Ok(minijinja::Value::from(python_strip(s, chars, left, right)));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// transformers' `tojson` filter: Python's `json.dumps(value, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)` with those four as keyword options.
/// (minijinja's own escapes `<`, `>`, `&` and `'` for HTML and writes no spaces.)
fn tojson(
    value: &minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> Result<String, minijinja::Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<minijinja::Value> = kwargs.get("indent")?;
    let separators: Option<minijinja::Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let invalid = |m: String| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, m);
    // Python: an integer indent is that many spaces, a string is used as it is.
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_str(), v.as_i64()) {
            (Some(s), _) => Some(s.to_string()),
            (None, Some(n)) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            _ => {
                return Err(invalid(format!(
                    "tojson: indent is {v}, not an integer or a string"
                )))
            }
        },
    };
    let (item, key) = match separators {
        Some(v) if !v.is_none() => {
            let pair: Vec<minijinja::Value> = v.try_iter()?.collect();
            match pair.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(invalid(format!(
                        "tojson: separators is {v}, not two strings"
                    )))
                }
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let options = JsonOptions {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &options, 0)?;
    Ok(out)
}

/// How [`write_json`] writes, as `json.dumps`'s options say.
struct JsonOptions {
    ensure_ascii: bool,
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
}

/// Appends `value` as Python's `json.dumps` writes it.
fn write_json(
    out: &mut String,
    value: &minijinja::Value,
    options: &JsonOptions,
    depth: usize,
) -> Result<(), minijinja::Error> {
    use minijinja::value::ValueKind;
    // Templates can build values only as deep as their own nesting; this bounds the
    // recursion for any input all the same.
    if depth > 256 {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "tojson: the value is nested more than 256 levels deep",
        ));
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &options.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&python_float(f64::try_from(value.clone())?)),
        ValueKind::String => write_json_string(out, value.as_str().unwrap_or_default(), options),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<minijinja::Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item);
                }
                newline(out, depth + 1);
                write_json(out, item, options, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<minijinja::Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if options.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item);
                }
                newline(out, depth + 1);
                // Python writes non-string keys (numbers, booleans, None) as strings.
                let name = match key.as_str() {
                    Some(s) => s.to_string(),
                    None => {
                        let mut k = String::new();
                        write_json(&mut k, key, options, depth + 1)?;
                        k
                    }
                };
                write_json_string(out, &name, options);
                out.push_str(&options.key);
                write_json(out, &value.get_item(key)?, options, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        kind => {
            return Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                format!("tojson: a value of type {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// A JSON string as Python escapes it: the two-character escapes, other control
/// characters as `\u00XX`, and (with `ensure_ascii`) everything past ASCII as UTF-16
/// `\uXXXX` units.
fn write_json_string(out: &mut String, s: &str, options: &JsonOptions) {
    use std::fmt::Write;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (options.ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr` of a float (what `json.dumps` writes): the shortest digits that
/// read back, positional for exponents -4..16 (with `.0` when integral), otherwise
/// `d.ddde+XX`; `NaN`, `Infinity`, `-Infinity` for the rest.
fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let (head, tail) = digits.split_at(1);
        let tail = if tail.is_empty() {
            String::new()
        } else {
            format!(".{tail}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{head}{tail}e{esign}{:02}", exp.abs())
    }
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
    fn gpt2_byte_table_inverts_the_byte_level_alphabet() {
        assert_eq!(super::gpt2_byte('\u{120}'), Some(b' '), "Ġ");
        assert_eq!(super::gpt2_byte('\u{10a}'), Some(b'\n'), "Ċ");
        assert_eq!(super::gpt2_byte('a'), Some(b'a'));
        assert_eq!(
            super::gpt2_byte('\u{ad}'),
            None,
            "soft hyphen is not in the table"
        );
        // All 256 bytes, each once.
        let mut seen = [false; 256];
        for c in (0x21u32..0x7f)
            .chain(0xa1..0xad)
            .chain(0xae..0x100)
            .chain(0x100..0x144)
        {
            let b = super::gpt2_byte(char::from_u32(c).unwrap()).unwrap();
            assert!(!seen[b as usize], "{c:x}");
            seen[b as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(super::gpt2_byte('\u{144}'), None);
    }

    #[test]
    fn multibyte_text_is_split_only_at_char_boundaries() {
        let mut m = StopMatcher::new(&["é!".into()]);
        assert_eq!(m.push("caféé"), StopScan::Release("café".into()));
        assert_eq!(m.push("!"), StopScan::Stop(String::new(), "é!".into()));
    }

    #[test]
    fn strftime_writes_what_python_writes() {
        // Python: datetime.fromtimestamp(t, timezone.utc).strftime(...)
        let f = "%d %b %Y|%e %B %y|%a %A|%H:%M:%S %I%p|%j|%m|%%";
        assert_eq!(
            strftime(f, 0).unwrap(),
            "01 Jan 1970| 1 January 70|Thu Thursday|00:00:00 12AM|001|01|%"
        );
        // 2024-07-26 (Llama 3's default date) 13:05:09, a Friday in a leap year.
        assert_eq!(
            strftime(f, 1_721_999_109).unwrap(),
            "26 Jul 2024|26 July 24|Fri Friday|13:05:09 01PM|208|07|%"
        );
        // 2000-02-29 23:59:59 and a day before the epoch.
        assert_eq!(
            strftime("%Y-%m-%d %j %a", 951_868_799).unwrap(),
            "2000-02-29 060 Tue"
        );
        assert_eq!(strftime("%Y-%m-%d %a", -86_400).unwrap(), "1969-12-31 Wed");
        assert!(strftime("%Q", 0)
            .unwrap_err()
            .to_string()
            .contains("directive '%Q' in '%Q' is not supported"));
        // Templates test for it before they call it.
        let s = render_chat(
            "{% if strftime_now is defined %}{{ strftime_now('%Y') | length }}{% endif %}",
            &[],
            &ChatTokens::default(),
            false,
        )
        .unwrap();
        assert_eq!(s, "4");
    }

    #[test]
    fn the_fallback_template_renders_chatml() {
        let s = render_chat(
            FALLBACK_CHAT_TEMPLATE,
            &[Message::new("system", "S"), Message::new("user", "U")],
            &ChatTokens::default(),
            true,
        )
        .unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
