"""Reference renders of chat templates by transformers' own `apply_chat_template`, for
onebit's byte-for-byte template tests (crates/onebit-engine/tests/chat_templates.rs).

Usage (in a virtual environment with `transformers` and `jinja2`; PyTorch is not needed):

    python3 -m venv /tmp/tplvenv
    /tmp/tplvenv/bin/pip install transformers jinja2
    /tmp/tplvenv/bin/python xtask/scripts/chat_template_reference.py \
        crates/onebit-engine/tests/templates

Reads TEMPLATES/<name>.jinja for each model below and writes TEMPLATES/expected.json:
every conversation rendered with and without `add_generation_prompt`, and either the
text transformers renders or the message of the exception the template raised.
"""

import json
import sys
from pathlib import Path

import jinja2
import tokenizers
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

# The special tokens each model's tokenizer gives its template (its tokenizer_config.json's
# bos_token / eos_token; None: the model has none, and transformers passes no such name).
MODELS = {
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "qwen3": {"bos_token": None, "eos_token": "<|im_end|>"},
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
}

# Conversations: plain turns, a system turn, whitespace the templates trim (including
# U+001F, which Python's strip removes and Rust's trim does not), text that looks like
# template syntax or JSON, a reasoning turn Qwen3 splits, a tool turn Llama 3.1 writes
# with tojson, and roles that do not alternate (Gemma 3 raises).
CONVERSATIONS = {
    "one-user-turn": [
        {"role": "user", "content": "Hello!"},
    ],
    "multi-turn": [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "2 + 2 = 4."},
        {"role": "user", "content": "And 3 + 3?"},
    ],
    "system-multi-turn": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another?"},
    ],
    "ends-with-assistant": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour"},
    ],
    "whitespace-and-unicode": [
        {"role": "system", "content": "  \n Be kind.\t\n"},
        {"role": "user", "content": "\x1f  Grüße, 日本語 🙂 \"quoted\" \\ {{ not a tag }} {% raw %}\n\n"},
        {"role": "assistant", "content": "\n  Sure: <b>&amp;</b>  \x1e"},
        {"role": "user", "content": "{\"json\": [1, 2]}"},
    ],
    "reasoning": [
        {"role": "user", "content": "Think first: 6 * 7?"},
        {"role": "assistant", "content": "<think>\n6 * 7 = 42\n</think>\n\n42"},
        {"role": "user", "content": "And 6 * 8?"},
    ],
    "tool-turn": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check."},
        {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear <é>\"}\n"},
    ],
    "roles-not-alternating": [
        {"role": "user", "content": "First."},
        {"role": "user", "content": "Second."},
    ],
}


def tokenizer_for(bos_token, eos_token):
    """A tokenizer whose special tokens are the model's: apply_chat_template passes
    them to the template; its vocabulary is never used (tokenize=False)."""
    base = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    kwargs = {}
    if bos_token is not None:
        kwargs["bos_token"] = bos_token
    if eos_token is not None:
        kwargs["eos_token"] = eos_token
    return PreTrainedTokenizerFast(tokenizer_object=base, **kwargs)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: chat_template_reference.py TEMPLATES_DIR")
    root = Path(sys.argv[1])
    cases = []
    for name, tokens in MODELS.items():
        template = (root / f"{name}.jinja").read_text(encoding="utf-8")
        tokenizer = tokenizer_for(tokens["bos_token"], tokens["eos_token"])
        for conversation, messages in CONVERSATIONS.items():
            for add_generation_prompt in (False, True):
                case = {
                    "template": name,
                    "conversation": conversation,
                    "add_generation_prompt": add_generation_prompt,
                }
                try:
                    case["expected"] = tokenizer.apply_chat_template(
                        messages,
                        chat_template=template,
                        add_generation_prompt=add_generation_prompt,
                        tokenize=False,
                    )
                except jinja2.exceptions.TemplateError as e:
                    # raise_exception raises TemplateError(message).
                    case["error"] = str(e)
                cases.append(case)
    out = {
        "generator": "xtask/scripts/chat_template_reference.py",
        "versions": {
            "transformers": transformers.__version__,
            "jinja2": jinja2.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "models": MODELS,
        "conversations": CONVERSATIONS,
        "cases": cases,
    }
    path = root / "expected.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    raised = sum("error" in c for c in cases)
    print(f"{path}: {len(cases)} cases ({raised} raise)")


if __name__ == "__main__":
    main()
