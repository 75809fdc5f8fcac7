//! `tokenizer.json` (Hugging Face `tokenizers` format) rebuilt from GGUF metadata.
//!
//! Two vocabulary kinds, as llama.cpp names them in `tokenizer.ggml.model`:
//! - `gpt2`: byte-level BPE. Vocabulary and merges are copied; the pre-tokenizer is
//!   chosen by `tokenizer.ggml.pre` (the regexes llama.cpp uses for each).
//! - `llama`: SentencePiece BPE with byte fallback. SentencePiece merges by the score
//!   of the merged piece; a BPE model whose merges are every (left, right) split of a
//!   vocabulary piece, ranked by that piece's score, does the same. Spaces become `▁`
//!   and a `▁` is prepended unless `tokenizer.ggml.add_space_prefix` is false.
//!
//! FastFlowLM's converter writes a byte-level BPE with zero merges for `llama`
//! vocabularies, which cannot encode text; this one encodes (see the CLI tests, which
//! compare against an independent SentencePiece-style and BPE tokenizer).

use serde_json::{json, Value};

use crate::gguf::{Gguf, GgufValue};

/// Why no tokenizer could be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerError(pub String);

impl std::fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

const TOKEN_UNKNOWN: u64 = 2;
const TOKEN_CONTROL: u64 = 3;
const TOKEN_USER_DEFINED: u64 = 4;

const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn strings(g: &Gguf, key: &str) -> Result<Vec<String>, TokenizerError> {
    let arr = g
        .metadata_value(key)
        .and_then(GgufValue::as_array)
        .ok_or_else(|| {
            TokenizerError(format!("metadata key '{key}' is missing or not an array"))
        })?;
    arr.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| TokenizerError(format!("metadata key '{key}'[{i}] is not a string")))
        })
        .collect()
}

fn numbers(g: &Gguf, key: &str, len: usize) -> Result<Option<Vec<f64>>, TokenizerError> {
    let Some(v) = g.metadata_value(key) else {
        return Ok(None);
    };
    let arr = v
        .as_array()
        .ok_or_else(|| TokenizerError(format!("metadata key '{key}' is not an array")))?;
    if arr.len() != len {
        return Err(TokenizerError(format!(
            "metadata key '{key}' has {} entries for {len} tokens",
            arr.len()
        )));
    }
    arr.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_f64()
                .ok_or_else(|| TokenizerError(format!("metadata key '{key}'[{i}] is not a number")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn special_id(g: &Gguf, key: &str, len: usize) -> Option<usize> {
    g.metadata_value(key)
        .and_then(GgufValue::as_u64)
        .map(|v| v as usize)
        .filter(|&v| v < len)
}

/// The `added_tokens` list: unknown and control tokens are special; user-defined
/// tokens are matched whole but are not special.
fn added_tokens(
    tokens: &[String],
    types: &Option<Vec<f64>>,
    extra_special: &[Option<usize>],
) -> Value {
    let mut out = Vec::new();
    for (id, content) in tokens.iter().enumerate() {
        let ty = types.as_ref().map(|t| t[id] as u64).unwrap_or(1);
        let special =
            ty == TOKEN_UNKNOWN || ty == TOKEN_CONTROL || extra_special.contains(&Some(id));
        if special || ty == TOKEN_USER_DEFINED {
            out.push(json!({
                "id": id,
                "content": content,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": special,
            }));
        }
    }
    Value::Array(out)
}

fn bos_processor(tokens: &[String], bos: Option<usize>, add_bos: bool) -> Value {
    match (add_bos, bos) {
        (true, Some(id)) => {
            let content = &tokens[id];
            json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": content, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [
                    {"SpecialToken": {"id": content, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": content, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}
                ],
                "special_tokens": {content.clone(): {"id": content, "ids": [id], "tokens": [content]}}
            })
        }
        _ => Value::Null,
    }
}

fn byte_level_pre(pre: &str) -> (Value, Option<String>) {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |regex: &str| json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false});
    match pre {
        "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" => (byte_level(true), None),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" => (
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            None,
        ),
        "qwen2" | "stablelm2" => (
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]}),
            None,
        ),
        "llama3" | "llama-bpe" | "llama-v3" => (
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]}),
            None,
        ),
        other => (
            byte_level(true),
            Some(format!(
                "tokenizer: pre-tokenizer '{other}' is not known; the GPT-2 split is used ({GPT2_REGEX}), which may split some text differently"
            )),
        ),
    }
}

/// Builds `tokenizer.json` from the GGUF's `tokenizer.ggml.*` metadata. Returns the
/// JSON and a note when the result is an approximation.
pub fn tokenizer_json(g: &Gguf) -> Result<(Value, Option<String>), TokenizerError> {
    let model = g
        .metadata_value("tokenizer.ggml.model")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| TokenizerError("metadata key 'tokenizer.ggml.model' is missing".into()))?;
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let n = tokens.len();
    let types = numbers(g, "tokenizer.ggml.token_type", n)?;
    let bos = special_id(g, "tokenizer.ggml.bos_token_id", n);
    let eos = special_id(g, "tokenizer.ggml.eos_token_id", n);
    let unk = special_id(g, "tokenizer.ggml.unknown_token_id", n);
    let flag = |key: &str, default: bool| {
        g.metadata_value(key)
            .and_then(GgufValue::as_bool)
            .unwrap_or(default)
    };
    let mut vocab = serde_json::Map::with_capacity(n);
    for (id, t) in tokens.iter().enumerate() {
        // A duplicated piece keeps its first id, as llama.cpp's text-to-id map does.
        vocab.entry(t.clone()).or_insert(Value::from(id));
    }
    let added = added_tokens(&tokens, &types, &[bos, eos, unk]);
    match model {
        "gpt2" => {
            let merges: Vec<Value> = strings(g, "tokenizer.ggml.merges")?
                .iter()
                .enumerate()
                .map(|(i, m)| match m.split_once(' ') {
                    Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                        Ok(json!([a, b]))
                    }
                    _ => Err(TokenizerError(format!(
                        "tokenizer.ggml.merges[{i}] '{m}' is not two pieces"
                    ))),
                })
                .collect::<Result<_, _>>()?;
            let pre = g
                .metadata_value("tokenizer.ggml.pre")
                .and_then(GgufValue::as_str)
                .unwrap_or("default");
            let (pre_tokenizer, note) = byte_level_pre(pre);
            let post = match bos_processor(
                &tokens,
                bos,
                flag("tokenizer.ggml.add_bos_token", false),
            ) {
                Value::Null => {
                    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false})
                }
                p => p,
            };
            Ok((
                json!({
                    "version": "1.0",
                    "truncation": null,
                    "padding": null,
                    "added_tokens": added,
                    "normalizer": null,
                    "pre_tokenizer": pre_tokenizer,
                    "post_processor": post,
                    "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
                    "model": {
                        "type": "BPE", "dropout": null, "unk_token": null,
                        "continuing_subword_prefix": null, "end_of_word_suffix": null,
                        "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                        "vocab": vocab, "merges": merges
                    }
                }),
                note,
            ))
        }
        "llama" => {
            let scores = numbers(g, "tokenizer.ggml.scores", n)?.ok_or_else(|| {
                TokenizerError("metadata key 'tokenizer.ggml.scores' is missing".into())
            })?;
            let merges = spm_merges(&tokens, &scores, &types);
            let mut normalizers = Vec::new();
            if flag("tokenizer.ggml.add_space_prefix", true) {
                normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
            }
            normalizers.push(
                json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}),
            );
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if flag("tokenizer.ggml.add_space_prefix", true) {
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            Ok((
                json!({
                    "version": "1.0",
                    "truncation": null,
                    "padding": null,
                    "added_tokens": added,
                    "normalizer": {"type": "Sequence", "normalizers": normalizers},
                    "pre_tokenizer": null,
                    "post_processor": bos_processor(&tokens, bos, flag("tokenizer.ggml.add_bos_token", true)),
                    "decoder": {"type": "Sequence", "decoders": decoders},
                    "model": {
                        "type": "BPE", "dropout": null,
                        "unk_token": unk.map(|u| tokens[u].clone()),
                        "continuing_subword_prefix": null, "end_of_word_suffix": null,
                        "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                        "vocab": vocab, "merges": merges
                    }
                }),
                None,
            ))
        }
        other => Err(TokenizerError(format!(
            "tokenizer model '{other}' is not supported (supported: gpt2, llama)"
        ))),
    }
}

/// Every split of every normal vocabulary piece into two pieces that are both in the
/// vocabulary, ranked by the merged piece's score (highest first), then by the
/// pieces' ids; this is the merge order SentencePiece's BPE applies.
fn spm_merges(tokens: &[String], scores: &[f64], types: &Option<Vec<f64>>) -> Vec<Value> {
    let index: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .rev()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f64, usize, usize, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        let normal = types.as_ref().map(|t| t[id] as u64 == 1).unwrap_or(true);
        if !normal {
            continue;
        }
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                merges.push((scores[id], id, li, ri));
            }
        }
    }
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    merges
        .into_iter()
        .map(|(_, _, l, r)| json!([tokens[l], tokens[r]]))
        .collect()
}
