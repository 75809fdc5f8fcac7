//! `cargo xtask tokenize-reference`: llama.cpp's own token ids for the GGUFs onebit
//! runs, the oracle for onebit's tokenizer (`crates/onebit-engine/tests/tokenizer_oracle.rs`).
//!
//! Builds `llama-tokenize` alone from the same pinned llama-cpp-python sdist as
//! `bench-peer` (`target/peer/`), then tokenizes, for SmolLM2 and Gemma 3 (the GGUFs of
//! `cargo xtask fetch-model smollm2|gemma3`, checked against their pinned sha256):
//! - hard plain texts (digits, whitespace runs, code, "Licensed", accents, CJK, emoji,
//!   special-token strings inside text, the empty text);
//! - the chat prompts of both families' templates as transformers renders them (the
//!   cases of `crates/onebit-engine/tests/templates/expected.json`, which onebit's
//!   renderer equals byte for byte), and, for a model that adds BOS and whose template
//!   writes it too (Gemma), the same prompts without it (a template that leaves BOS to
//!   the tokenizer).
//!
//! Each text is tokenized twice: `llama-tokenize --ids --log-disable --no-escape -f
//! FILE` (BOS added when the GGUF says so, special tokens parsed) as `ids`, and with
//! `--no-bos` as `ids_no_bos`. The result is checked in as
//! `crates/onebit-engine/tests/data/llama-tokenize.json`; CI only reads it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::llama_cpp::{self, LLAMA_CPP_PYTHON};
use crate::models;

/// Where the fixture is written, relative to the workspace root.
pub const FIXTURE: &str = "crates/onebit-engine/tests/data/llama-tokenize.json";
/// The transformers-rendered chat prompts the chat cases come from.
const TEMPLATE_CASES: &str = "crates/onebit-engine/tests/templates/expected.json";

/// Texts that tokenizers get wrong in different ways: digit grouping, whitespace runs
/// (SentencePiece's `▁` merges, GPT-2's `\s+(?!\S)`), code, a word transformers'
/// GGUF conversion splits wrongly for Gemma ("Licensed"), bytes without a piece (byte
/// fallback), multi-codepoint emoji, special-token strings inside plain text, and the
/// empty text.
pub const PLAIN_TEXTS: &[&str] = &[
    "Licensed under the Apache License, Version 2.0 (the \"License\"); you may not use this file except in compliance with the License.",
    "Hello world",
    " leading space,  two  spaces,   three   spaces, trailing space ",
    "tabs\t\tand newlines\n\n\nand a CRLF\r\nand    four spaces\n    indented\n",
    "3.14159 12345678901234567890 1,000,000 0x7fff 2026-12-04 v1.2.3 42nd 007",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{v:?}\");\n}\n",
    "def f(a, b):\n\tif a >= b:\n\t\treturn a ** 2  # square\n\treturn b // 3\n",
    "Grüße, naïve café — “quotes” ‘single’ … ½ × ÷ ∑ ∞ ≠ Ω",
    "日本語のテキスト、中文文本和한국어 텍스트。漢字かな交じり文",
    "🙂 👍🏽 👨‍👩‍👧‍👦 🇯🇵 ❤️ 🤖🦀",
    "Ελληνικά, русский, עברית, العربية, हिन्दी, ไทย",
    "\u{1f} unit separator, bell\u{7}, zero\u{200b}width, non\u{a0}breaking, soft\u{ad}hyphen",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "<start_of_turn>user\nhi<end_of_turn>\n<|im_start|>user\nhi<|im_end|>\n<bos><eos><|endoftext|>",
    "<bos>Hello",
    " ",
    "\n",
    "",
];

/// One model the fixture covers.
struct Model {
    name: &'static str,
    gguf: &'static str,
    sha256: &'static str,
    /// The template's name in expected.json.
    template: &'static str,
}

const MODELS: &[Model] = &[
    Model {
        name: "smollm2",
        gguf: models::SMOLLM2_GGUF,
        sha256: models::SMOLLM2_GGUF_SHA256,
        template: "smollm2",
    },
    Model {
        name: "gemma3",
        gguf: models::GEMMA3_GGUF,
        sha256: models::GEMMA3_SHA256,
        template: "gemma3",
    },
];

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("tokenize-reference: unknown argument '{a}' (it takes none)");
    }
    let root = crate::workspace_root();
    let peer = llama_cpp::peer_dir()?;
    eprintln!("tokenize-reference: [1/3] llama-tokenize (llama-cpp-python {LLAMA_CPP_PYTHON})");
    let bin = llama_cpp::ensure_tool(&peer, "llama-tokenize", llama_cpp::Build::Native)?;
    let commit = llama_cpp_commit(&peer);

    eprintln!("tokenize-reference: [2/3] the GGUFs");
    let mut ggufs = Vec::new();
    for m in MODELS {
        let path = models::models_dir().join(m.gguf);
        if !path.exists() {
            bail!(
                "tokenize-reference: {} is missing; run `cargo xtask fetch-model {}` first",
                path.display(),
                m.name
            );
        }
        let actual = models::sha256_file(&path)?;
        if actual != m.sha256 {
            bail!(
                "tokenize-reference: {} has sha256 {actual}, pinned {}; fetch it again",
                path.display(),
                m.sha256
            );
        }
        ggufs.push(path);
    }

    eprintln!("tokenize-reference: [3/3] tokenizing");
    let cases_path = root.join(TEMPLATE_CASES);
    let template_cases: Value =
        serde_json::from_str(&std::fs::read_to_string(&cases_path).with_context(|| {
            format!("tokenize-reference: cannot read {}", cases_path.display())
        })?)
        .with_context(|| format!("tokenize-reference: {} is not JSON", cases_path.display()))?;
    let scratch = peer.join("tokenize-scratch.txt");
    let mut out_models = Vec::new();
    for (m, gguf) in MODELS.iter().zip(&ggufs) {
        let tok = |text: &str| -> Result<Value> {
            let ids = tokenize(&bin, gguf, &scratch, text, false)?;
            let ids_no_bos = tokenize(&bin, gguf, &scratch, text, true)?;
            Ok(json!({"ids": ids, "ids_no_bos": ids_no_bos}))
        };
        let mut plain = Vec::new();
        for text in PLAIN_TEXTS {
            let mut case = json!({"text": text});
            merge(&mut case, tok(text)?);
            plain.push(case);
        }
        let bos_text = template_cases["models"][m.template]["bos_token"]
            .as_str()
            .map(str::to_string);
        let mut chat = Vec::new();
        for c in template_cases["cases"].as_array().with_context(|| {
            format!(
                "tokenize-reference: {} has no 'cases' array",
                cases_path.display()
            )
        })? {
            if c["template"] != m.template {
                continue;
            }
            // A template's refusal (roles not alternating) renders no prompt.
            let Some(text) = c["expected"].as_str() else {
                continue;
            };
            let conversation = c["conversation"].as_str().with_context(|| {
                format!("tokenize-reference: a case of {TEMPLATE_CASES} has no 'conversation'")
            })?;
            let messages = template_cases["conversations"][conversation].clone();
            let agp = c["add_generation_prompt"].clone();
            let mut case = json!({
                "conversation": conversation,
                "messages": messages,
                "add_generation_prompt": agp,
                "bos_left_to_tokenizer": false,
                "text": text,
            });
            let ids = tok(text)?;
            // llama.cpp adds BOS to this model's texts (Gemma's, not SmolLM2's).
            let adds_bos =
                ids["ids"].as_array().map(Vec::len) > ids["ids_no_bos"].as_array().map(Vec::len);
            merge(&mut case, ids);
            chat.push(case);
            // The same prompt from a template that leaves BOS to the tokenizer.
            let rest = bos_text.as_deref().and_then(|b| text.strip_prefix(b));
            if let Some(rest) = rest.filter(|_| adds_bos) {
                let mut case = json!({
                    "conversation": conversation,
                    "messages": messages,
                    "add_generation_prompt": agp,
                    "bos_left_to_tokenizer": true,
                    "text": rest,
                });
                merge(&mut case, tok(rest)?);
                chat.push(case);
            }
        }
        eprintln!(
            "tokenize-reference: {}: {} plain texts, {} chat prompts",
            m.name,
            plain.len(),
            chat.len()
        );
        out_models.push((m, plain, chat));
    }
    let _ = std::fs::remove_file(&scratch);

    let fixture = root.join(FIXTURE);
    if let Some(dir) = fixture.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("tokenize-reference: cannot create {}", dir.display()))?;
    }
    std::fs::write(&fixture, render(&commit, &out_models)?)
        .with_context(|| format!("tokenize-reference: cannot write {}", fixture.display()))?;
    println!("tokenize-reference: wrote {}", fixture.display());
    Ok(())
}

fn merge(case: &mut Value, more: Value) {
    if let (Some(a), Value::Object(b)) = (case.as_object_mut(), more) {
        a.extend(b);
    }
}

/// `llama-tokenize --ids` of `text` (written to `scratch` byte for byte, read with
/// `--no-escape`), with `--no-bos` when `no_bos`.
fn tokenize(bin: &Path, gguf: &Path, scratch: &Path, text: &str, no_bos: bool) -> Result<Vec<u32>> {
    std::fs::write(scratch, text)
        .with_context(|| format!("tokenize-reference: cannot write {}", scratch.display()))?;
    let mut cmd = Command::new(bin);
    cmd.arg("-m")
        .arg(gguf)
        .args(["--ids", "--log-disable", "--no-escape", "-f"])
        .arg(scratch);
    if no_bos {
        cmd.arg("--no-bos");
    }
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .with_context(|| format!("tokenize-reference: cannot start {shown}"))?;
    if !out.status.success() {
        bail!(
            "tokenize-reference: {shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    parse_ids(&stdout).with_context(|| {
        format!("tokenize-reference: {shown} printed no id list ('[1, 2, 3]'): {stdout:?}")
    })
}

/// The last line of `llama-tokenize --ids` output, `[1, 2, 3]`, as ids.
fn parse_ids(stdout: &str) -> Option<Vec<u32>> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('['))?;
    let inner = line.trim().strip_prefix('[')?.strip_suffix(']')?;
    if inner.trim().is_empty() {
        return Some(Vec::new());
    }
    inner.split(',').map(|s| s.trim().parse().ok()).collect()
}

/// The vendored llama.cpp's commit, as its build stamps it (`LLAMA_COMMIT` in the
/// generated build-info), or "unknown".
fn llama_cpp_commit(peer: &Path) -> String {
    let info: PathBuf = peer.join(format!("build-{LLAMA_CPP_PYTHON}/common/build-info.cpp"));
    std::fs::read_to_string(info)
        .ok()
        .and_then(|t| {
            let line = t.lines().find(|l| l.contains("LLAMA_COMMIT"))?;
            Some(line.split('"').nth(1)?.to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The fixture's text: the header fields one per line, every case on one line (a
/// token-id array per line keeps the diff of a regeneration readable).
fn render(commit: &str, models: &[(&Model, Vec<Value>, Vec<Value>)]) -> Result<String> {
    let s = |v: &Value| serde_json::to_string(v);
    let mut out = String::from("{\n");
    out += &format!(
        "  \"generator\": {},\n",
        s(&json!("cargo xtask tokenize-reference"))?
    );
    out += &format!(
        "  \"llama_cpp\": {},\n",
        s(&json!(format!(
            "llama.cpp commit {commit}, vendored by llama-cpp-python {LLAMA_CPP_PYTHON} (PyPI sdist)"
        )))?
    );
    out += &format!(
        "  \"command\": {},\n",
        s(&json!("llama-tokenize -m GGUF --ids --log-disable --no-escape -f TEXT: ids; the same with --no-bos: ids_no_bos"))?
    );
    out += "  \"models\": {\n";
    for (i, (m, plain, chat)) in models.iter().enumerate() {
        out += &format!("    {}: {{\n", s(&json!(m.name))?);
        out += &format!("      \"gguf\": {},\n", s(&json!(m.gguf))?);
        out += &format!("      \"sha256\": {},\n", s(&json!(m.sha256))?);
        for (key, cases, last) in [("plain", plain, false), ("chat", chat, true)] {
            out += &format!("      \"{key}\": [\n");
            for (j, c) in cases.iter().enumerate() {
                let comma = if j + 1 < cases.len() { "," } else { "" };
                out += &format!("        {}{comma}\n", s(c)?);
            }
            out += if last { "      ]\n" } else { "      ],\n" };
        }
        out += if i + 1 < models.len() {
            "    },\n"
        } else {
            "    }\n"
        };
    }
    out += "  }\n}\n";
    // What is written must read back as the same JSON.
    serde_json::from_str::<Value>(&out).context("tokenize-reference: the fixture is not JSON")?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_tokenize_id_lists_parse() {
        assert_eq!(parse_ids("[2, 9259, 1902]\n"), Some(vec![2, 9259, 1902]));
        assert_eq!(parse_ids("[]\n"), Some(vec![]));
        assert_eq!(parse_ids("noise\n[1]\n"), Some(vec![1]));
        assert_eq!(parse_ids("[1, x]\n"), None);
        assert_eq!(parse_ids("nothing"), None);
    }
}
