//! `onebit convert` as a user runs it: byte-identical containers, a config that
//! matches the model, and a tokenizer.json that really encodes.

mod common;
use common::{fixture, onebit};

use std::collections::HashMap;
use std::path::Path;

use predicates::prelude::*;
use serde_json::Value;

fn convert(gguf: &Path, out: &Path) -> String {
    let output = onebit()
        .args(["convert", "--quiet"])
        .arg(gguf)
        .arg(out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The fixture's transformers config and ours agree on every key a forward needs.
fn check_config(ours: &Value, reference: &Value) {
    for key in [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "model_type",
        "architectures",
    ] {
        assert_eq!(ours[key], reference[key], "config key {key}");
    }
    let theta = reference["rope_theta"]
        .as_f64()
        .or(reference["rope_parameters"]["rope_theta"].as_f64());
    assert_eq!(ours["rope_theta"].as_f64(), theta);
}

/// SentencePiece-style BPE as llama.cpp runs it, written independently of the
/// converter: start from characters, repeatedly merge the adjacent pair whose
/// concatenation is the best-scoring vocabulary piece (leftmost on ties), then
/// spell pieces missing from the vocabulary as byte tokens.
fn spm_reference_encode(text: &str, tokens: &[String], scores: &[f64]) -> Vec<u32> {
    let index: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let normalized = format!("\u{2581}{}", text.replace(' ', "\u{2581}"));
    let mut symbols: Vec<String> = normalized.chars().map(|c| c.to_string()).collect();
    loop {
        let mut best: Option<(f64, usize)> = None;
        for i in 0..symbols.len().saturating_sub(1) {
            let joined = format!("{}{}", symbols[i], symbols[i + 1]);
            if let Some(&id) = index.get(joined.as_str()) {
                if best.is_none_or(|(s, _)| scores[id] > s) {
                    best = Some((scores[id], i));
                }
            }
        }
        let Some((_, i)) = best else { break };
        let right = symbols.remove(i + 1);
        symbols[i].push_str(&right);
    }
    let mut ids = Vec::new();
    for s in symbols {
        match index.get(s.as_str()) {
            Some(&id) => ids.push(id as u32),
            None => {
                for b in s.as_bytes() {
                    ids.push(index[format!("<0x{b:02X}>").as_str()] as u32);
                }
            }
        }
    }
    ids
}

/// The vocabulary, as the reference tokenizer.json the fixture ships lists it.
fn reference_vocab(dir: &str) -> Vec<String> {
    let t = json(&fixture(dir).join("tokenizer.json"));
    let vocab = t["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (piece, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = piece.clone();
    }
    tokens
}

#[test]
fn tiny_llama_package_is_byte_identical_and_its_tokenizer_encodes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pkg");
    let stdout = convert(&fixture("tiny-llama/model.Q4_1.gguf"), &out);
    assert!(
        stdout.contains("converted 21 tensors, 544080 bytes"),
        "{stdout}"
    );
    assert!(
        stdout.contains("tokenizer.json: SentencePiece vocabulary"),
        "{stdout}"
    );
    assert!(
        std::fs::read(out.join("model.q4nx")).unwrap()
            == std::fs::read(fixture("tiny-llama/model.q4nx")).unwrap(),
        "model.q4nx differs from FastFlowLM's"
    );
    check_config(
        &json(&out.join("config.json")),
        &json(&fixture("tiny-llama/config.json")),
    );

    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let tokens = reference_vocab("tiny-llama");
    let ours = json(&out.join("tokenizer.json"));
    let our_vocab = ours["model"]["vocab"].as_object().unwrap();
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(our_vocab[t].as_u64(), Some(i as u64), "vocab entry {t}");
    }
    // Scores as the GGUF stores them (the converter's input), for the reference encoder.
    let scores = gguf_scores(&fixture("tiny-llama/model.Q4_1.gguf"));
    for text in [
        "The model is converted with llama.cpp and runs on the server.",
        "Use `--help` to see all options; build with cmake -B build.",
        "naïve café ✓ 42",
    ] {
        let got = tok.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(
            got,
            spm_reference_encode(text, &tokens, &scores),
            "encoding {text:?}"
        );
        assert_eq!(
            tok.decode(&got, false).unwrap(),
            text,
            "round trip of {text:?}"
        );
        let with_bos = tok.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(
            with_bos[0], 1,
            "BOS is added (tokenizer.ggml.add_bos_token)"
        );
    }
}

fn gguf_scores(path: &Path) -> Vec<f64> {
    let file = q4nx_convert::gguf::GgufFile::open(path).unwrap();
    file.gguf
        .metadata_value("tokenizer.ggml.scores")
        .and_then(|v| v.as_array())
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

#[test]
fn tiny_qwen3_package_is_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pkg");
    convert(&fixture("tiny-qwen3/model.Q4_1.gguf"), &out);
    assert!(
        std::fs::read(out.join("model.q4nx")).unwrap()
            == std::fs::read(fixture("tiny-qwen3/model.q4nx")).unwrap(),
        "model.q4nx differs from FastFlowLM's"
    );
    check_config(
        &json(&out.join("config.json")),
        &json(&fixture("tiny-qwen3/config.json")),
    );
    onebit()
        .arg("inspect")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "config: Qwen3ForCausalLM (qwen3), 2 layers, hidden 128",
        ));
}

#[test]
fn existing_package_is_not_overwritten_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pkg");
    convert(&fixture("tiny-qwen3/model.Q4_1.gguf"), &out);
    onebit()
        .args(["convert", "--quiet"])
        .arg(fixture("tiny-qwen3/model.Q4_1.gguf"))
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "a package is already there (pass --force to replace it)",
        ));
}

#[test]
fn a_q4nx_file_is_refused_as_gguf_by_name() {
    let dir = tempfile::tempdir().unwrap();
    onebit()
        .args(["convert", "--quiet"])
        .arg(fixture("tiny-qwen3/model.q4nx"))
        .arg(dir.path().join("pkg"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("gguf: "))
        .stderr(predicate::str::contains("bad magic"));
}
