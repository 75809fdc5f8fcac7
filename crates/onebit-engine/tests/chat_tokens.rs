//! A chat prompt's tokens: the template sees the package's own BOS/EOS strings, the
//! special tokens it writes are single ids, and the prompt holds BOS exactly once —
//! never twice when the template writes `bos_token` and the tokenizer adds one too,
//! never dropped when the template leaves it to the tokenizer. Over the tiny fixture's
//! tokenizer (always) and SmolLM2's real one (when fetched; skipped by name otherwise).

use std::path::{Path, PathBuf};

use onebit_engine::{render_chat, ChatTokens, Engine, EngineConfig, Message, Prompt, Text};
use serde_json::{json, Value};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

fn templates_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/templates")
}

/// A Llama-3-style template: it writes `bos_token` itself.
const WRITES_BOS: &str = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}";
/// A template that leaves BOS to the tokenizer.
const NO_BOS: &str =
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}";

/// tiny-qwen3 (its `<s>` is id 1, `</s>` id 2) copied with `template` as its chat
/// template; `add_bos` gives its tokenizer a post-processor that puts `<s>` first, as
/// the converter writes for a GGUF with `tokenizer.ggml.add_bos_token`.
fn package(dir: &Path, template: &str, add_bos: bool) -> EngineConfig {
    std::fs::copy(
        fixture("tiny-qwen3").join("model.q4nx"),
        dir.join("model.q4nx"),
    )
    .unwrap();
    let mut config: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("tiny-qwen3").join("config.json")).unwrap(),
    )
    .unwrap();
    config["chat_template"] = json!(template);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tokenizer: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("tiny-qwen3").join("tokenizer.json")).unwrap(),
    )
    .unwrap();
    if add_bos {
        tokenizer["post_processor"] = json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        });
    }
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let mut c = EngineConfig::new(dir);
    c.threads = Some(1);
    c
}

fn count(ids: &[u32], id: u32) -> usize {
    ids.iter().filter(|&&t| t == id).count()
}

#[test]
fn a_chat_prompt_holds_bos_once_whoever_writes_it() {
    let chat = Prompt::Chat(vec![
        Message::new("user", "hi"),
        Message::new("assistant", "yo"),
        Message::new("user", "ok"),
    ]);
    for (template, add_bos, bos_first) in [
        // Written by the template and added by the tokenizer: once.
        (WRITES_BOS, true, true),
        // Written by the template only: once.
        (WRITES_BOS, false, true),
        // Added by the tokenizer only: once.
        (NO_BOS, true, true),
        // Neither (ChatML models like SmolLM2 and Qwen3): none, as transformers has it.
        (NO_BOS, false, false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::load(&package(dir.path(), template, add_bos)).unwrap();
        // The template saw the package's own tokens (config.json's ids 1 and 2).
        assert_eq!(
            engine.chat_tokens(),
            &ChatTokens {
                bos_token: Some("<s>".into()),
                eos_token: Some("</s>".into()),
            }
        );
        let ids = engine.tokenize(&chat).unwrap();
        let label = format!(
            "template writes BOS: {}, tokenizer adds BOS: {add_bos}: {ids:?}",
            template == WRITES_BOS
        );
        assert_eq!(count(&ids, 1), usize::from(bos_first), "{label}");
        assert_eq!(ids[0] == 1, bos_first, "{label}");
        // Each turn's `</s>` is one special id, never its characters.
        assert_eq!(count(&ids, 2), 3, "{label}");
        let expected_prefix: &[u32] = if add_bos { &[1] } else { &[] };
        assert_eq!(
            engine.text().unwrap().special_prefix(),
            expected_prefix,
            "{label}"
        );
    }
}

#[test]
fn tokenizer_config_json_decides_the_template_tokens_when_present() {
    let dir = tempfile::tempdir().unwrap();
    let config = package(dir.path(), WRITES_BOS, false);
    // As in Qwen3's: an AddedToken object for one, null for the other.
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": {"content": "<s>", "special": true}, "eos_token": null}"#,
    )
    .unwrap();
    let engine = Engine::load(&config).unwrap();
    assert_eq!(
        engine.chat_tokens(),
        &ChatTokens {
            bos_token: Some("<s>".into()),
            eos_token: None,
        }
    );
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": 7}"#,
    )
    .unwrap();
    let err = Engine::load(&config).err().unwrap().to_string();
    assert!(
        err.contains("tokenizer_config.json: cannot load the tokenizer: 'bos_token' is 7, not a string or an object with a string 'content'"),
        "{err}"
    );
    std::fs::write(dir.path().join("tokenizer_config.json"), "{").unwrap();
    let err = Engine::load(&config).err().unwrap().to_string();
    assert!(
        err.contains("tokenizer_config.json: cannot load the tokenizer: is not valid JSON"),
        "{err}"
    );
}

#[test]
fn a_bos_id_outside_the_vocabulary_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = package(dir.path(), WRITES_BOS, false);
    let path = dir.path().join("config.json");
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["bos_token_id"] = json!(600);
    std::fs::write(&path, json.to_string()).unwrap();
    let err = Engine::load(&config).err().unwrap().to_string();
    assert!(
        err.contains("config.json: cannot load the tokenizer: 'bos_token_id' is 600, which is not a token of tokenizer.json"),
        "{err}"
    );
}

/// SmolLM2's real tokenizer (the converted package of `cargo xtask fetch-model
/// smollm2`): its own template over a chat with a system turn, and a Llama-3-style one
/// that writes its `bos_token`, encode to its real special ids — `<|im_start|>` 1 and
/// `<|im_end|>` 2, one id each — with BOS once, even when the tokenizer adds one too.
#[test]
fn smollm2_chat_prompts_encode_to_its_special_ids_with_bos_once() {
    let Some(pkg) = test_support::fetched_model!(
        "smollm2",
        "smollm2_chat_prompts_encode_to_its_special_ids_with_bos_once"
    ) else {
        return;
    };
    let text = Text::open(&pkg).unwrap().unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(pkg.join("config.json")).unwrap()).unwrap();
    let bos = config["bos_token_id"].as_u64().map(|x| x as u32);
    let eos = config["eos_token_id"].as_u64().map(|x| x as u32);
    let tokens = ChatTokens::resolve(&pkg, Some(&text), bos, &[eos.unwrap()]).unwrap();
    // What SmolLM2's tokenizer_config.json names them.
    assert_eq!(
        tokens,
        ChatTokens {
            bos_token: Some("<|im_start|>".into()),
            eos_token: Some("<|im_end|>".into()),
        }
    );
    let messages = [
        Message::new("system", "You are terse."),
        Message::new("user", "Hi"),
        Message::new("assistant", "Hello."),
        Message::new("user", "Bye"),
    ];
    let own = std::fs::read_to_string(templates_dir().join("smollm2.jinja")).unwrap();
    let ids = text
        .encode_chat(&render_chat(&own, &messages, &tokens, true).unwrap())
        .unwrap();
    // Four turns and the opened assistant turn; SmolLM2 adds no BOS of its own.
    assert!(text.special_prefix().is_empty());
    assert_eq!(
        (ids[0], count(&ids, 1), count(&ids, 2)),
        (1, 5, 4),
        "{ids:?}"
    );
    // The special tokens split the text: each plain piece encodes alone to the same ids.
    let rendered = render_chat(&own, &messages, &tokens, true).unwrap();
    let mut spliced = Vec::new();
    for (i, turn) in rendered.split("<|im_start|>").enumerate() {
        if i > 0 {
            spliced.push(1);
        }
        for (j, piece) in turn.split("<|im_end|>").enumerate() {
            if j > 0 {
                spliced.push(2);
            }
            spliced.extend(text.encode(piece, false).unwrap());
        }
    }
    assert_eq!(ids, spliced);
    // A template that writes bos_token, through a tokenizer that adds BOS as well (the
    // same vocabulary with a BOS post-processor): BOS once.
    let dir = tempfile::tempdir().unwrap();
    let mut json: Value =
        serde_json::from_str(&std::fs::read_to_string(pkg.join("tokenizer.json")).unwrap())
            .unwrap();
    json["post_processor"] = json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
    });
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
    let adds_bos = Text::open(dir.path()).unwrap().unwrap();
    assert_eq!(adds_bos.special_prefix(), [1]);
    let llama = std::fs::read_to_string(templates_dir().join("llama3.1.jinja")).unwrap();
    let rendered = render_chat(&llama, &messages[1..], &tokens, true).unwrap();
    assert!(
        rendered.starts_with("<|im_start|><|start_header_id|>"),
        "{rendered}"
    );
    let ids = adds_bos.encode_chat(&rendered).unwrap();
    assert_eq!(ids[0], 1);
    assert_ne!(ids[1], 1, "BOS twice: {ids:?}");
    assert_eq!(ids, text.encode_chat(&rendered).unwrap());
}

/// `--chat-template FILE` (`EngineConfig::chat_template`) replaces the package's
/// template; a file that cannot be read, or a template that does not parse, is refused
/// at load with the flag and the path.
#[test]
fn a_chat_template_file_replaces_the_packages_and_bad_ones_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = package(dir.path(), NO_BOS, false);
    let file = dir.path().join("override.jinja");
    std::fs::write(
        &file,
        "{% for m in messages %}<<{{ m.role }}:{{ m.content }}>>{% endfor %}{% if add_generation_prompt %}<<assistant:{% endif %}",
    )
    .unwrap();
    config.chat_template = Some(file.clone());
    let engine = Engine::load(&config).unwrap();
    let chat = [Message {
        role: "user".into(),
        content: "hi".into(),
    }];
    assert_eq!(
        engine.render_chat(&chat).unwrap(),
        "<<user:hi>><<assistant:"
    );
    assert!(engine
        .chat_template()
        .unwrap()
        .starts_with("{% for m in messages %}<<"));

    let missing = dir.path().join("absent.jinja");
    config.chat_template = Some(missing.clone());
    let err = Engine::load(&config).err().unwrap().to_string();
    assert!(
        err.contains(&format!(
            "--chat-template {}: cannot read it",
            missing.display()
        )),
        "{err}"
    );

    std::fs::write(&file, "{% for m in messages %}unclosed").unwrap();
    config.chat_template = Some(file.clone());
    let err = Engine::load(&config).err().unwrap().to_string();
    assert!(
        err.contains(&format!("--chat-template {}: ", file.display()))
            && err.contains("does not parse"),
        "{err}"
    );
}
