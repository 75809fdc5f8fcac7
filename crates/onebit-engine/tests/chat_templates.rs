//! Chat templates rendered byte for byte as transformers' `apply_chat_template` renders
//! them: the templates of SmolLM2, Gemma 3, Qwen3 and Llama 3.1 (tests/templates, with
//! their sources in its README) over the conversations of the checked-in fixture
//! `tests/templates/expected.json`, written by `xtask/scripts/chat_template_reference.py`.
//! A template's `raise_exception` is the named error carrying the template's text.

use std::path::PathBuf;

use onebit_engine::{render_chat, ChatTokens, EngineError, Message};
use serde_json::Value;

fn templates_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/templates")
}

fn fixture() -> Value {
    let path = templates_dir().join("expected.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn messages(v: &Value) -> Vec<Message> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect()
}

fn tokens(v: &Value) -> ChatTokens {
    ChatTokens {
        bos_token: v["bos_token"].as_str().map(str::to_string),
        eos_token: v["eos_token"].as_str().map(str::to_string),
    }
}

#[test]
fn the_four_families_render_exactly_as_transformers_does() {
    let fixture = fixture();
    let cases = fixture["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    let mut families = std::collections::BTreeSet::new();
    let mut raised = 0;
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let conversation = case["conversation"].as_str().unwrap();
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let template = std::fs::read_to_string(templates_dir().join(format!("{name}.jinja")))
            .unwrap_or_else(|e| panic!("{name}.jinja: {e}"));
        let got = render_chat(
            &template,
            &messages(&fixture["conversations"][conversation]),
            &tokens(&fixture["models"][name]),
            add,
        );
        let label = format!("{name} / {conversation} / add_generation_prompt={add}");
        families.insert(name.to_string());
        match (&got, case.get("expected"), case.get("error")) {
            (Ok(text), Some(want), None) if want.as_str() == Some(text.as_str()) => {}
            (Err(EngineError::TemplateException { message }), None, Some(want))
                if want.as_str() == Some(message.as_str()) =>
            {
                raised += 1;
            }
            _ => failures.push(format!(
                "{label}:\n  got      {got:?}\n  expected {:?}",
                case.get("expected").or(case.get("error"))
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        families.into_iter().collect::<Vec<_>>(),
        ["gemma3", "llama3.1", "qwen3", "smollm2"]
    );
    assert!(cases.len() >= 60, "{} cases", cases.len());
    // Gemma 3 refuses turns that do not alternate: both its refusals are covered.
    assert!(raised >= 2, "{raised} raised");
}

#[test]
fn a_template_exception_names_the_template_and_keeps_its_text() {
    let template = std::fs::read_to_string(templates_dir().join("gemma3.jinja")).unwrap();
    let err = render_chat(
        &template,
        &[Message::new("user", "a"), Message::new("user", "b")],
        &ChatTokens::default(),
        true,
    )
    .unwrap_err();
    assert!(
        matches!(&err, EngineError::TemplateException { message }
            if message == "Conversation roles must alternate user/assistant/user/assistant/..."),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the chat template refused the messages: Conversation roles must alternate user/assistant/user/assistant/..."
    );
    // A template that fails otherwise is a different error.
    let err = render_chat(
        "{{ messages[0].content.nonexistent_method() }}",
        &[Message::new("user", "a")],
        &ChatTokens::default(),
        true,
    )
    .unwrap_err();
    assert!(matches!(err, EngineError::Template(_)), "{err:?}");
    let err = render_chat("{% for %}", &[], &ChatTokens::default(), true).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the chat template does not parse"),
        "{err}"
    );
}

#[test]
fn the_real_bos_token_reaches_the_template() {
    let template = std::fs::read_to_string(templates_dir().join("llama3.1.jinja")).unwrap();
    let tokens = ChatTokens {
        bos_token: Some("<|begin_of_text|>".into()),
        eos_token: Some("<|eot_id|>".into()),
    };
    let text = render_chat(&template, &[Message::new("user", "Hi")], &tokens, true).unwrap();
    assert!(
        text.starts_with("<|begin_of_text|><|start_header_id|>system"),
        "{text}"
    );
    // No generation prompt: the text ends after the last turn.
    let text = render_chat(&template, &[Message::new("user", "Hi")], &tokens, false).unwrap();
    assert!(text.ends_with("Hi<|eot_id|>"), "{text}");
    let eos = render_chat("{{ eos_token }}|{{ bos_token }}", &[], &tokens, true).unwrap();
    assert_eq!(eos, "<|eot_id|>|<|begin_of_text|>");
}

#[test]
fn tojson_writes_what_python_json_dumps_writes() {
    let render = |source: &str| {
        render_chat(source, &[], &ChatTokens::default(), false)
            .unwrap_or_else(|e| panic!("{source}: {e}"))
    };
    // Values whose json.dumps text was checked in Python.
    assert_eq!(
        render(r#"{{ {"b": [1, 2.5, none, true], "a": "x<'&>é"} | tojson }}"#),
        r#"{"b": [1, 2.5, null, true], "a": "x<'&>é"}"#
    );
    assert_eq!(
        render(r#"{{ {"b": 1, "a": [ ]} | tojson(sort_keys=true) }}"#),
        r#"{"a": [], "b": 1}"#
    );
    assert_eq!(
        render(r#"{{ {"k": [1, {"z": "é"}]} | tojson(indent=2, ensure_ascii=true) }}"#),
        "{\n  \"k\": [\n    1,\n    {\n      \"z\": \"\\u00e9\"\n    }\n  ]\n}"
    );
    assert_eq!(
        render(r#"{{ [1, 2] | tojson(separators=[",", ":"]) }}"#),
        "[1,2]"
    );
    assert_eq!(
        render(r#"{{ [1e20, 0.0001, 1e-05, 3.0, -0.5, 123456789012345678] | tojson }}"#),
        "[1e+20, 0.0001, 1e-05, 3.0, -0.5, 123456789012345678]"
    );
    assert_eq!(
        render(r#"{{ "tab\t nl\n \u0001 \\ 🙂" | tojson(ensure_ascii=true) }}"#),
        r#""tab\t nl\n \u0001 \\ \ud83d\ude42""#
    );
}

#[test]
fn python_string_methods_are_available() {
    let render = |source: &str| {
        render_chat(
            source,
            &[Message::new("user", "\u{1f} <think>a</think>\n\nb \n")],
            &ChatTokens::default(),
            false,
        )
        .unwrap_or_else(|e| panic!("{source}: {e}"))
    };
    let c = "messages[0].content";
    assert_eq!(
        render(&format!(
            "{{{{ {c}.split('</think>')[-1].lstrip('\\n') }}}}"
        )),
        "b \n"
    );
    // Python's strip removes U+001F; Rust's trim alone would keep it.
    assert_eq!(
        render(&format!("{{{{ {c}.strip() }}}}")),
        "<think>a</think>\n\nb"
    );
    assert_eq!(
        render(&format!("{{{{ {c} | trim }}}}")),
        "<think>a</think>\n\nb"
    );
    assert_eq!(
        render(&format!("{{{{ {c}.strip().startswith('<think>') }}}}")),
        "True"
    );
    assert_eq!(
        render(&format!("{{{{ {c}.rstrip().endswith(('x', 'b')) }}}}")),
        "True"
    );
    // Python prints None and the booleans capitalized.
    assert_eq!(render("{{ none }} {{ false }}"), "None False");
}
