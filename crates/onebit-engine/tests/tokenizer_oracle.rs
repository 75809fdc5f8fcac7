//! The tokenizer oracle: onebit's token ids for the real SmolLM2 and Gemma 3 packages
//! (converted from their GGUFs by `cargo xtask fetch-model smollm2|gemma3`) equal
//! llama.cpp's own tokenizer's on the same GGUFs, over hard plain texts and the chat
//! prompts of both families' templates, and a chat prompt holds BOS once, never twice.
//!
//! The reference ids are `tests/data/llama-tokenize.json`, written by `cargo xtask
//! tokenize-reference` (`llama-tokenize` built from the same pinned llama-cpp-python
//! sdist as `bench-peer`); this test only reads it. For each text the fixture holds
//! llama.cpp's ids with its default flags (`ids`: BOS added when the GGUF asks for it,
//! special tokens parsed) and with `--no-bos` (`ids_no_bos`).
//!
//! - A plain text: `Text::encode(text, true)` (what `run` and `bench` prompt with)
//!   equals `ids`, and `Text::encode(text, false)` equals `ids_no_bos`.
//! - A chat prompt: onebit renders the fixture's messages with the package's own
//!   template to exactly the fixture's text (transformers' rendering), and
//!   `Text::encode_chat` equals llama.cpp's ids with BOS once: `ids` when the text does
//!   not start with BOS (the tokenizer adds it), `ids_no_bos` when the template wrote it
//!   (llama-tokenize's defaults then give BOS twice, which the fixture shows for Gemma).

use std::path::{Path, PathBuf};

use onebit_engine::{render_chat, ChatTokens, Message, Text};
use serde_json::Value;

fn fixture() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/llama-tokenize.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn package(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/models")
        .join(name)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}

/// The number of `bos` ids the prompt starts with.
fn leading(ids: &[u32], bos: u32) -> usize {
    ids.iter().take_while(|&&t| t == bos).count()
}

/// The package's tokenizer, its BOS id, its template and the strings the template sees,
/// as the engine loads them.
fn load(pkg: &Path) -> (Text, Option<u32>, String, ChatTokens) {
    let text = Text::open(pkg).unwrap().unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(pkg.join("config.json")).unwrap()).unwrap();
    let bos = config["bos_token_id"].as_u64().map(|x| x as u32);
    let eos: Vec<u32> = match &config["eos_token_id"] {
        Value::Array(a) => a.iter().map(|x| x.as_u64().unwrap() as u32).collect(),
        v => v.as_u64().map(|x| x as u32).into_iter().collect(),
    };
    let tokens = ChatTokens::resolve(pkg, Some(&text), bos, &eos).unwrap();
    let template = config["chat_template"].as_str().unwrap().to_string();
    (text, bos, template, tokens)
}

/// Compares one model's package with the fixture; returns the number of texts checked,
/// or `None` when the package is not fetched (skipped by name).
fn check(name: &str, test: &str) -> Option<usize> {
    let pkg = package(name);
    if !pkg.join("tokenizer.json").exists() {
        test_support::skip!(
            test,
            "{name} not fetched (run `cargo xtask fetch-model {name}`; looked in {})",
            pkg.display()
        );
        return None;
    }
    let fixture = fixture();
    let model = &fixture["models"][name];
    let (text, bos, template, tokens) = load(&pkg);
    let prefix = text.special_prefix().to_vec();
    let mut checked = 0;

    for case in model["plain"].as_array().unwrap() {
        let s = case["text"].as_str().unwrap();
        let (want, want_no_bos) = (ids(&case["ids"]), ids(&case["ids_no_bos"]));
        assert_eq!(
            text.encode(s, true).unwrap(),
            want,
            "{name}: {s:?} with special tokens added (llama-tokenize)"
        );
        assert_eq!(
            text.encode(s, false).unwrap(),
            want_no_bos,
            "{name}: {s:?} without BOS (llama-tokenize --no-bos)"
        );
        checked += 1;
    }

    let mut bos_once = 0;
    for case in model["chat"].as_array().unwrap() {
        let s = case["text"].as_str().unwrap();
        let label = format!(
            "{name}: chat '{}' (add_generation_prompt {}, BOS left to the tokenizer {})",
            case["conversation"].as_str().unwrap(),
            case["add_generation_prompt"],
            case["bos_left_to_tokenizer"]
        );
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let rendered = render_chat(&template, &messages, &tokens, agp).unwrap();
        if case["bos_left_to_tokenizer"] == true {
            let bos_text = tokens.bos_token.as_deref().unwrap();
            assert_eq!(rendered.strip_prefix(bos_text), Some(s), "{label}");
        } else {
            assert_eq!(rendered, s, "{label}: onebit renders otherwise");
        }
        let (want, want_no_bos) = (ids(&case["ids"]), ids(&case["ids_no_bos"]));
        let ours = text.encode_chat(s).unwrap();
        // llama.cpp adds BOS to this model's prompts (and onebit's tokenizer does too).
        let adds_bos = want.len() == want_no_bos.len() + 1;
        assert_eq!(adds_bos, !prefix.is_empty(), "{label}: {prefix:?}");
        let written = bos.is_some_and(|b| want_no_bos.first() == Some(&b));
        let expected = if adds_bos && !written {
            &want
        } else {
            &want_no_bos
        };
        assert_eq!(&ours, expected, "{label}: onebit's ids against llama.cpp's");
        if let Some(b) = bos.filter(|_| adds_bos) {
            assert_eq!(leading(&ours, b), 1, "{label}: BOS not once: {ours:?}");
            if written {
                // What BOS twice looks like: llama-tokenize's defaults on this text.
                assert_eq!(leading(&want, b), 2, "{label}: {want:?}");
            }
            bos_once += 1;
        }
        checked += 1;
    }
    if !prefix.is_empty() {
        assert!(bos_once > 0, "{name}: no chat prompt checked BOS");
    }
    Some(checked)
}

#[test]
fn smollm2_ids_equal_llama_cpps() {
    if let Some(n) = check("smollm2", "smollm2_ids_equal_llama_cpps") {
        assert!(n >= 30, "{n} texts");
    }
}

/// Gemma 3 adds BOS and its template writes `<bos>` itself: the rendered prompts are
/// where BOS is doubled or dropped, and the prompts without their `<bos>` are where a
/// tokenizer that does not add it loses it.
#[test]
fn gemma3_ids_equal_llama_cpps_with_bos_once() {
    if let Some(n) = check("gemma3", "gemma3_ids_equal_llama_cpps_with_bos_once") {
        assert!(n >= 30, "{n} texts");
    }
}
