"""Outside oracle for onebit's Gemma 3 forward: transformers' own Gemma3ForCausalLM.

Usage (a virtual environment with torch, transformers, safetensors and numpy from PyPI):

    python3 -m venv /tmp/tvenv
    /tmp/tvenv/bin/pip install torch transformers safetensors numpy
    /tmp/tvenv/bin/python xtask/scripts/gemma3_reference.py \
        crates/npu-runtime/tests/data/tiny-gemma3

Writes OUT/hf/config.json + OUT/hf/model.safetensors (a tiny random Gemma 3 text model,
saved by transformers' save_pretrained: what `onebit convert` imports) and
OUT/reference.safetensors:

  tokens       I64  the prompt (longer than the sliding window)
  greedy       I64  transformers' greedy continuation, one full forward per step
  logits       F32  the logits of every prompt row, then of the first greedy steps
  margins      F32  each greedy step's top-1 minus top-2 logit

The weights are chosen so the Q4NX package onebit makes of them holds them exactly:
every projection row group is f32(d) * q + f32(m) with bf16 d and m and both codes 0
and 15 present (the tile quantizer's exact round trip), the embedding and the norm
gains are bf16 values. So transformers runs on exactly the Q4NX-dequantized weights
(the Rust test checks that the converted package decodes back to them bit for bit).

Geometry: 3 layers (sliding, sliding, full: both layer types), hidden 64, 2 query
heads over 1 kv head of 32, MLP 96, vocabulary 256, sliding window 4, global rope base
10000 and local 100 (so the two bases differ visibly), query_pre_attn_scalar 24 (not
head_dim, so the scale is tested), eager attention in float32, no KV cache (the mask
alone decides what a position sees).
"""
import sys
from pathlib import Path

import numpy as np
import safetensors.numpy
import torch
import transformers
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

out = Path(sys.argv[1])
rng = np.random.default_rng(20261203)
torch.manual_seed(0)

LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention"]
cfg = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    sliding_window=4,
    layer_types=LAYER_TYPES,
    query_pre_attn_scalar=24,
    hidden_activation="gelu_pytorch_tanh",
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
    tie_word_embeddings=True,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
    attn_implementation="eager",
)
# transformers 5 takes one rope base per layer type; 4.x a global base and a local one.
try:
    config = Gemma3TextConfig(
        **cfg,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        },
    )
except TypeError:
    config = Gemma3TextConfig(**cfg, rope_theta=10000.0, rope_local_base_freq=100.0)
config._attn_implementation = "eager"


def bf16(x):
    """Rounds float32 values to bfloat16 (nearest even), kept as float32."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def q4_exact(rows, cols, spread):
    """A rows x cols matrix whose every 32-column group is f32(d) * q + f32(m), bf16 d
    and m, codes 0..15 with 0 and 15 both present."""
    groups = rows * cols // 32
    d = bf16(rng.uniform(0.2, 1.0, groups) * spread / 15)
    m = bf16(-d * 7.5 + rng.normal(0, spread / 20, groups))
    q = rng.integers(0, 16, (groups, 32))
    for g in range(groups):
        a, b = rng.choice(32, 2, replace=False)
        q[g, a], q[g, b] = 0, 15
    w = (d[:, None].astype(np.float32) * q.astype(np.float32)) + m[:, None].astype(np.float32)
    return w.astype(np.float32).reshape(rows, cols)


model = Gemma3ForCausalLM(config).eval()
h, hd, inter = 64, 32, 96
state = {}
for name, p in model.named_parameters():
    shape = tuple(p.shape)
    if name == "model.embed_tokens.weight":
        v = bf16(rng.normal(0, 0.15, shape))
    elif "post_" in name and name.endswith("layernorm.weight"):
        # Gemma's gains are w in (1 + w). Large post-norm gains let the layers outweigh
        # the scaled input embedding, which a random tied model otherwise just repeats.
        v = bf16(rng.normal(3.0, 1.0, shape))
    elif name.endswith("norm.weight"):
        v = bf16(rng.normal(0.0, 0.3, shape))
    elif len(shape) == 2:
        spread = 1.0 / np.sqrt(shape[1]) * 3
        v = q4_exact(shape[0], shape[1], spread)
    else:
        raise SystemExit(f"unexpected parameter {name} {shape}")
    state[name] = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
missing, unexpected = model.load_state_dict(state, strict=False)
assert not unexpected, unexpected
assert all("lm_head" in k for k in missing), missing
assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "tied"

(out / "hf").mkdir(parents=True, exist_ok=True)
model.save_pretrained(out / "hf", safe_serialization=True)
gen = out / "hf" / "generation_config.json"
if gen.exists():
    gen.unlink()

prompt = [2] + rng.integers(3, 256, 11).tolist()
steps = 80
seq = list(prompt)
greedy, margins, logits_rows = [], [], []
with torch.no_grad():
    for step in range(steps):
        ids = torch.tensor([seq])
        logits = model(input_ids=ids, use_cache=False).logits[0].float().numpy()
        if step == 0:
            logits_rows.extend(logits)
        elif step < 8:
            logits_rows.append(logits[-1])
        last = logits[-1]
        top = np.argsort(-last, kind="stable")
        greedy.append(int(top[0]))
        margins.append(float(last[top[0]] - last[top[1]]))
        seq.append(int(top[0]))

meta = {
    "generator": "xtask/scripts/gemma3_reference.py",
    "transformers": transformers.__version__,
    "torch": torch.__version__,
}
safetensors.numpy.save_file(
    {
        "tokens": np.array(prompt, dtype=np.int64),
        "greedy": np.array(greedy, dtype=np.int64),
        "logits": np.stack(logits_rows).astype(np.float32),
        "margins": np.array(margins, dtype=np.float32),
    },
    str(out / "reference.safetensors"),
    metadata=meta,
)
print(f"wrote {out}: prompt {len(prompt)}, {steps} greedy steps, min margin {min(margins):.4f}, "
      f"distinct tokens {len(set(greedy))}; {meta}")
