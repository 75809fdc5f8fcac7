"""Reference outputs of gguf-py's ggml block code, for onebit's bit-exactness tests.

Run by `cargo xtask ggml-reference` (which installs gguf==0.19.0 and numpy in a
virtual environment under target/). Writes one safetensors file:

  <TYPE>.blocks  U8   random blocks of that ggml type (scale fields finite)
  <TYPE>.values  F32  gguf.quants.dequantize() of those blocks
  q4_1.input     F32  inputs to gguf.quants.quantize(..., Q4_1), rounded through bf16
  q4_1.output    U8   its output blocks

Deterministic (seeded); the file is committed, so tests need no Python.
"""
import json
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from gguf.constants import GGML_QUANT_SIZES

rng = np.random.default_rng(20261130)
N_BLOCKS = 24

# Byte ranges holding f16 scales, which must be finite for a bitwise comparison.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def random_blocks(qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(N_BLOCKS, size), dtype=np.uint8)
    for at in F16_FIELDS.get(qtype, []):
        scale = (rng.uniform(1e-3, 1.0, N_BLOCKS) * rng.choice([-1, 1], N_BLOCKS)).astype(np.float16)
        raw[:, at:at + 2] = scale.view(np.uint8).reshape(N_BLOCKS, 2)
    return raw


tensors = {}
for qtype in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]:
    blocks = random_blocks(qtype)
    values = dequantize(blocks.reshape(-1), qtype).astype(np.float32).reshape(-1)
    tensors[f"{qtype.name}.blocks"] = ("U8", blocks.reshape(-1))
    tensors[f"{qtype.name}.values"] = ("F32", values)

f16 = rng.normal(0, 1, 256).astype(np.float16)
tensors["F16.blocks"] = ("U8", f16.view(np.uint8))
tensors["F16.values"] = ("F32", dequantize(f16.view(np.uint8), T.F16).astype(np.float32))

# Q4_1 quantizer inputs: normal weights, wide and tiny ranges, constant and
# two-valued groups, values exactly on rounding boundaries.
groups = [
    rng.normal(0, 0.05, (64, 32)),
    rng.normal(3, 10, (16, 32)),
    rng.uniform(-1e-4, 1e-4, (16, 32)),
    np.full((4, 32), 0.3),
    np.tile(np.array([0.0, 1.0]), (4, 16)),
    np.tile(np.arange(32) / 31 * 15 / 15, (4, 1)),
]
x = np.concatenate(groups).astype(np.float32)
# The converter rounds through bf16 before quantizing; so do the inputs here.
x = (((x.view(np.uint32).astype(np.uint64) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
out = quantize(x, T.Q4_1)
tensors["q4_1.input"] = ("F32", x.reshape(-1))
tensors["q4_1.output"] = ("U8", out.reshape(-1).view(np.uint8))

header, data, offset = {}, [], 0
for name in sorted(tensors):
    dtype, arr = tensors[name]
    raw = np.ascontiguousarray(arr).tobytes()
    header[name] = {"dtype": dtype, "shape": [len(arr)], "data_offsets": [offset, offset + len(raw)]}
    data.append(raw)
    offset += len(raw)
header["__metadata__"] = {"generator": "xtask/scripts/ggml_reference.py", "gguf": "0.19.0"}
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for raw in data:
        f.write(raw)
print(f"wrote {sys.argv[1]}: {len(tensors)} tensors, {offset} data bytes")
