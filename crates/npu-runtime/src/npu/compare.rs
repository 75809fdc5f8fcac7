//! The op-by-op comparison (llama.cpp's `test-backend-ops` idea): every op kind runs
//! on the device under test with the same inputs the CPU reference gets, and the
//! outputs are compared against a stated limit per op.
//!
//! The reference is the CPU backend's scalar kernels called directly on host arrays;
//! the device gets the inputs as bytes in its own buffers, through the same bindings
//! the dispatch plan uses. Limits are normalized mean squared errors (NMSE =
//! Σ(out − ref)² / Σ ref²), chosen for a real NPU: data movement is exact, f32
//! element-wise math 1e-7, matmuls 5e-4 (the NPU multiplies bf16 activations). The
//! simulated device must do better: bit-exact on every op, which is what makes whole
//! sim forwards bit-identical to the CPU backend.

use half::bf16;

use super::device::Device;
use super::plan::{BufferRole, BufferSpec, Elem, Geometry, Op, PassArgs};
use crate::error::Result;
use crate::kernels::{self, Isa};

/// One row of the comparison table.
#[derive(Clone, Debug, PartialEq)]
pub struct OpCheck {
    /// The op kind (a key of the plan's `OP_KINDS`).
    pub op: &'static str,
    /// The case's shapes, for people.
    pub shape: String,
    /// Largest absolute difference from the reference.
    pub max_abs_error: f64,
    /// Normalized mean squared error against the reference: Σ(out − ref)² / Σ ref².
    pub nmse: f64,
    /// The largest NMSE that passes.
    pub limit: f64,
    /// Whether every output value has the reference's exact bits.
    pub bit_exact: bool,
}

impl OpCheck {
    /// Whether the device met the op's limit.
    pub fn passed(&self) -> bool {
        self.nmse <= self.limit && self.nmse.is_finite()
    }
}

/// Deterministic inputs (a 64-bit LCG), so every device sees the same values.
struct Inputs(u64);

impl Inputs {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
    fn bf16_bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|_| bf16::from_f32(self.next()).to_le_bytes())
            .collect()
    }
}

fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn floats_of(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn bf16_floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// The small geometry every case runs at: several heads and kv groups, a pass of 5
/// rows at position 7, a matmul whose K is not a multiple of 256 (the tiles are padded).
pub const GEOMETRY: Geometry = Geometry {
    hidden: 64,
    head_dim: 16,
    num_heads: 4,
    num_kv_heads: 2,
    vocab: 96,
    rms_eps: 1e-5,
    capacity: 24,
    max_rows: 5,
    taps: 2,
};
const PASS: PassArgs = PassArgs {
    rows: 5,
    position: 7,
};
const MM_ROWS: usize = 40;
const MM_COLS: usize = 288;

/// A case: buffers with their contents, the op, the output's reference values.
struct Case {
    op: &'static str,
    shape: String,
    buffers: Vec<(BufferSpec, Vec<u8>)>,
    run: Op,
    reference: Vec<f32>,
    limit: f64,
}

fn spec(name: &str, bytes: usize, elem: Elem) -> BufferSpec {
    BufferSpec {
        name: name.into(),
        bytes,
        role: BufferRole::Activations,
        elem,
        source: None,
    }
}

fn f32_buffer(name: &str, values: &[f32]) -> (BufferSpec, Vec<u8>) {
    (spec(name, values.len() * 4, Elem::F32), bytes_of(values))
}

fn cases() -> Result<Vec<Case>> {
    let g = GEOMETRY;
    let (n, h, hd) = (PASS.rows, g.hidden, g.head_dim);
    let q_dim = g.num_heads * hd;
    let kv_dim = g.num_kv_heads * hd;
    let mut input = Inputs(0x0b17_0b17);
    let mut cases = Vec::new();
    const EXACT: f64 = 0.0;
    const ELEMENTWISE: f64 = 1e-7;
    const MATMUL: f64 = 5e-4;

    let table = input.bf16_bytes(g.vocab * h);
    let tokens: Vec<u32> = vec![3, 0, 95, 17, 42];
    let mut reference = Vec::new();
    let table_values = bf16_floats(&table);
    for &t in &tokens {
        reference.extend_from_slice(&table_values[t as usize * h..(t as usize + 1) * h]);
    }
    cases.push(Case {
        op: "embed",
        shape: format!("{n} tokens of vocab {} × {h} bf16", g.vocab),
        buffers: vec![
            (spec("table", table.len(), Elem::Bytes), table.clone()),
            (
                spec("tokens", n * 4, Elem::Bytes),
                tokens.iter().flat_map(|t| t.to_le_bytes()).collect(),
            ),
            f32_buffer("out", &vec![0.0; n * h]),
        ],
        run: Op::Embed {
            table: 0,
            tokens: 1,
            out: 2,
        },
        reference,
        limit: EXACT,
    });

    let x = input.floats(n * h);
    let gain = input.floats(h);
    let mut reference = vec![0f32; n * h];
    kernels::rms_norm(&x, &gain, g.rms_eps, &mut reference);
    cases.push(Case {
        op: "rms_norm",
        shape: format!("{n} × {h}"),
        buffers: vec![
            f32_buffer("x", &x),
            f32_buffer("gain", &gain),
            f32_buffer("out", &vec![0.0; n * h]),
        ],
        run: Op::RmsNorm {
            x: 0,
            gain: 1,
            out: 2,
            width: h,
        },
        reference,
        limit: ELEMENTWISE,
    });

    let weights = input.floats(MM_ROWS * MM_COLS);
    let tiles = q4nx_format::encode_q4_1(&weights, MM_ROWS, MM_COLS)?;
    let matrix = q4nx_format::Q4Matrix::from_bytes(
        "case",
        &tiles,
        MM_ROWS,
        MM_COLS,
        q4nx_format::Q4Kind::Q4_1,
    )?;
    let x = input.floats(n * MM_COLS);
    let mut reference = vec![0f32; n * MM_ROWS];
    kernels::matmul(&matrix, &x, n, &mut reference, Isa::scalar());
    let mut packed = tiles.clone();
    packed.resize(super::plan::packed_tile_bytes(MM_ROWS, MM_COLS), 0);
    cases.push(Case {
        op: "matmul_q4",
        shape: format!("{n} × {MM_COLS} · ({MM_ROWS} × {MM_COLS} q4_1 tiles)ᵀ"),
        buffers: vec![
            (spec("weight", packed.len(), Elem::Bytes), packed),
            f32_buffer("x", &x),
            f32_buffer("out", &vec![0.0; n * MM_ROWS]),
        ],
        run: Op::MatMulQ4 {
            weight: 0,
            w_rows: MM_ROWS,
            w_cols: MM_COLS,
            x: 1,
            out: 2,
        },
        reference,
        limit: MATMUL,
    });

    let x = input.floats(n * h);
    let mut reference = vec![0f32; n * g.vocab];
    kernels::dense::matmul_bf16(&table, g.vocab, h, &x, n, &mut reference, Isa::scalar());
    cases.push(Case {
        op: "matmul_bf16",
        shape: format!("{n} × {h} · ({} × {h} bf16)ᵀ", g.vocab),
        buffers: vec![
            (spec("table", table.len(), Elem::Bytes), table.clone()),
            f32_buffer("x", &x),
            f32_buffer("out", &vec![0.0; n * g.vocab]),
        ],
        run: Op::MatMulBf16 {
            table: 0,
            w_rows: g.vocab,
            w_cols: h,
            x: 1,
            out: 2,
        },
        reference,
        limit: MATMUL,
    });

    let q = input.floats(n * q_dim);
    let head_gain = input.floats(hd);
    let rope = {
        let mut cos = Vec::new();
        let mut sin = Vec::new();
        for p in 0..g.capacity {
            let (c, s) = kernels::rope_table(10000.0, hd, p);
            cos.extend(c);
            sin.extend(s);
        }
        (cos, sin)
    };
    let mut reference = q.clone();
    kernels::norm_and_rope(
        &mut reference,
        g.num_heads,
        hd,
        Some(&head_gain),
        g.rms_eps,
        PASS.position,
        &rope.0,
        &rope.1,
    );
    let rope_table: Vec<f32> = rope.0.iter().chain(&rope.1).copied().collect();
    cases.push(Case {
        op: "norm_rope",
        shape: format!(
            "{n} × {} heads × {hd} at position {}",
            g.num_heads, PASS.position
        ),
        buffers: vec![
            f32_buffer("x", &q),
            f32_buffer("rope", &rope_table),
            f32_buffer("gain", &head_gain),
        ],
        run: Op::NormRope {
            x: 0,
            heads: g.num_heads,
            gain: Some(2),
            rope: 1,
        },
        reference,
        limit: ELEMENTWISE,
    });

    let k = input.floats(n * kv_dim);
    let v = input.floats(n * kv_dim);
    let cache_len = g.num_kv_heads * g.capacity * hd;
    let old_keys = input.floats(cache_len);
    let mut reference = old_keys.clone();
    for i in 0..n {
        for kh in 0..g.num_kv_heads {
            let to = (kh * g.capacity + PASS.position + i) * hd;
            reference[to..to + hd]
                .copy_from_slice(&k[i * kv_dim + kh * hd..i * kv_dim + (kh + 1) * hd]);
        }
    }
    cases.push(Case {
        op: "kv_append",
        shape: format!(
            "{n} rows × {} kv heads into {} positions",
            g.num_kv_heads, g.capacity
        ),
        buffers: vec![
            f32_buffer("k", &k),
            f32_buffer("v", &v),
            f32_buffer("keys", &old_keys),
            f32_buffer("values", &vec![0.0; cache_len]),
        ],
        run: Op::KvAppend {
            k: 0,
            v: 1,
            keys: 2,
            values: 3,
        },
        reference,
        limit: EXACT,
    });

    let q = input.floats(n * q_dim);
    let keys = input.floats(cache_len);
    let values = input.floats(cache_len);
    let mut reference = vec![0f32; n * q_dim];
    super::device::attention_over_rows(
        Isa::scalar(),
        &g,
        PASS.position,
        n,
        &q,
        &keys,
        &values,
        &mut reference,
    );
    cases.push(Case {
        op: "attention",
        shape: format!(
            "{n} rows × {} heads over {}..{} positions",
            g.num_heads,
            PASS.position + 1,
            PASS.position + n
        ),
        buffers: vec![
            f32_buffer("q", &q),
            f32_buffer("keys", &keys),
            f32_buffer("values", &values),
            f32_buffer("out", &vec![0.0; n * q_dim]),
        ],
        run: Op::Attention {
            q: 0,
            keys: 1,
            values: 2,
            out: 3,
        },
        reference,
        limit: ELEMENTWISE,
    });

    let x = input.floats(n * h);
    let y = input.floats(n * h);
    let reference: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    cases.push(Case {
        op: "add",
        shape: format!("{n} × {h}"),
        buffers: vec![f32_buffer("x", &x), f32_buffer("y", &y)],
        run: Op::Add {
            x: 0,
            y: 1,
            width: h,
        },
        reference,
        limit: EXACT,
    });

    let gate = input.floats(n * 3 * h);
    let up = input.floats(n * 3 * h);
    let mut reference = gate.clone();
    kernels::swiglu(Isa::scalar(), &mut reference, &up);
    cases.push(Case {
        op: "swiglu",
        shape: format!("{n} × {}", 3 * h),
        buffers: vec![f32_buffer("gate", &gate), f32_buffer("up", &up)],
        run: Op::SwiGlu {
            gate: 0,
            up: 1,
            width: 3 * h,
        },
        reference,
        limit: ELEMENTWISE,
    });

    let from = input.floats(n * h);
    let before = input.floats(n * h * g.taps);
    let mut reference = before.clone();
    for i in 0..n {
        let w = h * g.taps;
        reference[i * w + h..i * w + 2 * h].copy_from_slice(&from[i * h..(i + 1) * h]);
    }
    cases.push(Case {
        op: "tap_copy",
        shape: format!("{n} rows of {h} into slot 1 of {}", g.taps),
        buffers: vec![f32_buffer("from", &from), f32_buffer("to", &before)],
        run: Op::TapCopy {
            from: 0,
            to: 1,
            slot: 1,
        },
        reference,
        limit: EXACT,
    });
    Ok(cases)
}

/// Runs every op kind on `device` and compares it with the CPU reference.
pub fn compare_ops<D: Device>(device: &mut D) -> Result<Vec<OpCheck>> {
    let mut checks = Vec::new();
    for case in cases()? {
        let specs: Vec<BufferSpec> = case.buffers.iter().map(|(s, _)| s.clone()).collect();
        device.allocate(&specs, std::slice::from_ref(&case.run))?;
        for (id, (_, bytes)) in case.buffers.iter().enumerate() {
            device.write(id, 0, bytes)?;
        }
        device.run(&case.run, &GEOMETRY, PASS)?;
        let out = case.run.output();
        let mut bytes = vec![0u8; case.reference.len() * 4];
        device.read(out, 0, &mut bytes)?;
        let got = floats_of(&bytes);
        let (mut err, mut norm, mut max_abs) = (0f64, 0f64, 0f64);
        for (&a, &b) in got.iter().zip(&case.reference) {
            let d = a as f64 - b as f64;
            err += d * d;
            norm += (b as f64) * (b as f64);
            max_abs = max_abs.max(d.abs());
        }
        checks.push(OpCheck {
            op: case.op,
            shape: case.shape,
            max_abs_error: max_abs,
            nmse: if norm > 0.0 { err / norm } else { err },
            limit: case.limit,
            bit_exact: got
                .iter()
                .zip(&case.reference)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
        });
    }
    Ok(checks)
}

/// The comparison as a Markdown table.
pub fn format_table(device: &str, checks: &[OpCheck]) -> String {
    let mut out =
        format!("op-by-op comparison: {device} vs the CPU reference (scalar kernels)\n\n");
    out.push_str("| op | shape | max abs error | NMSE | limit | bit-exact | result |\n|---|---|---|---|---|---|---|\n");
    for c in checks {
        out.push_str(&format!(
            "| {} | {} | {:.3e} | {:.3e} | {:.0e} | {} | {} |\n",
            c.op,
            c.shape,
            c.max_abs_error,
            c.nmse,
            c.limit,
            if c.bit_exact { "yes" } else { "no" },
            if c.passed() { "pass" } else { "FAIL" }
        ));
    }
    out
}
