//! The kernel manifest: which NPU kernel runs each op of the plan, so kernels built
//! with IRON/mlir-aie, or taken from an installed runtime, are used without
//! recompiling onebit. Format and examples: `docs/npu.md`.
//!
//! ```json
//! { "onebit_kernel_manifest": 1,
//!   "xclbin": "onebit.xclbin",
//!   "kernels": {
//!     "matmul_q4": { "kernel": "MLIR_AIE", "instructions": "mm_q4.bin",
//!                    "args": ["opcode", "instructions", "instruction_words",
//!                             "buffer:x", "buffer:weight", "buffer:out",
//!                             "scalar:rows", "scalar:n", "scalar:k"] } } }
//! ```

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use super::plan::{DispatchPlan, Geometry, Op, PassArgs, OP_KINDS};
use crate::error::{Result, TargetError};

/// The manifest version this onebit reads.
pub const MANIFEST_VERSION: u64 = 1;

/// Opcode of the common NPU argument layout (`opcode 3, instruction BO, words, data...`).
pub const DEFAULT_OPCODE: u64 = 3;

/// One kernel argument, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelArg {
    /// The opcode scalar.
    Opcode(u64),
    /// The instruction stream buffer.
    Instructions,
    /// The instruction stream's length in 32-bit words.
    InstructionWords,
    /// A plan buffer by the op's argument name (`x`, `weight`, `out`, ...).
    Buffer(String),
    /// A per-pass scalar by name (`rows`, `position`, `n`, `k`, ...).
    Scalar(String),
}

/// Where a kernel's code comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelCode {
    /// A kernel of the xclbin by name, with an instruction stream file.
    Instructions(PathBuf),
    /// A kernel from an ELF module (`xrt::elf` / `xrt::module` / `xrt::ext::kernel`).
    Elf(PathBuf),
    /// A kernel of the xclbin by name with no instruction stream.
    Xclbin,
}

/// The kernel for one op kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelEntry {
    /// The op kind it runs (its key under `kernels`).
    pub op: String,
    /// The xclbin holding the kernel: the entry's own, else the manifest's top-level one.
    pub xclbin: PathBuf,
    /// The kernel's name in the xclbin (e.g. `MLIR_AIE`).
    pub kernel: String,
    /// Where the kernel's code comes from.
    pub code: KernelCode,
    /// Its arguments, in call order.
    pub args: Vec<KernelArg>,
    /// How long one run may take, in milliseconds (5000 unless given).
    pub timeout_ms: u32,
}

/// A checked manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelManifest {
    /// The manifest file.
    pub path: PathBuf,
    /// Kernel entries by op kind.
    pub kernels: BTreeMap<String, KernelEntry>,
}

fn refuse(path: &Path, key: &str, problem: impl std::fmt::Display) -> TargetError {
    TargetError::Config {
        path: path.display().to_string(),
        key: key.into(),
        problem: problem.to_string(),
    }
}

/// The argument names each op kind binds (buffers) and offers (scalars).
fn op_names(kind: &str) -> (Vec<&'static str>, Vec<&'static str>) {
    // A representative op of each kind gives the names; geometry values do not matter.
    let g = Geometry {
        hidden: 1,
        head_dim: 2,
        num_heads: 1,
        num_kv_heads: 1,
        vocab: 1,
        rms_eps: 0.0,
        capacity: 1,
        max_rows: 1,
        taps: 1,
    };
    let op = match kind {
        "embed" => Op::Embed {
            table: 0,
            tokens: 0,
            out: 0,
        },
        "rms_norm" => Op::RmsNorm {
            x: 0,
            gain: 0,
            out: 0,
            width: 1,
        },
        "matmul_q4" => Op::MatMulQ4 {
            weight: 0,
            w_rows: 1,
            w_cols: 1,
            x: 0,
            out: 0,
        },
        "matmul_bf16" => Op::MatMulBf16 {
            table: 0,
            w_rows: 1,
            w_cols: 1,
            x: 0,
            out: 0,
        },
        "norm_rope" => Op::NormRope {
            x: 0,
            heads: 1,
            gain: Some(0),
            rope: 0,
        },
        "kv_append" => Op::KvAppend {
            k: 0,
            v: 0,
            keys: 0,
            values: 0,
        },
        "attention" => Op::Attention {
            q: 0,
            keys: 0,
            values: 0,
            out: 0,
        },
        "add" => Op::Add {
            x: 0,
            y: 0,
            width: 1,
        },
        "swiglu" => Op::SwiGlu {
            gate: 0,
            up: 0,
            width: 1,
        },
        "tap_copy" => Op::TapCopy {
            from: 0,
            to: 0,
            slot: 0,
        },
        _ => return (Vec::new(), Vec::new()),
    };
    let buffers = op.buffers().into_iter().map(|(n, _)| n).collect();
    let scalars = op
        .scalars(
            &g,
            PassArgs {
                rows: 1,
                position: 0,
            },
        )
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    (buffers, scalars)
}

/// A relative path inside the manifest's folder, or a refusal naming the key.
fn confined(dir: &Path, manifest: &Path, key: &str, value: &str) -> Result<PathBuf> {
    let rel = Path::new(value);
    if value.is_empty()
        || rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(refuse(
            manifest,
            key,
            format!("'{value}' must be a relative path inside the manifest's folder"),
        ));
    }
    let full = dir.join(rel);
    if !full.is_file() {
        return Err(refuse(
            manifest,
            key,
            format!("names {}, which is not a file", full.display()),
        ));
    }
    Ok(full)
}

impl KernelManifest {
    /// Reads and checks a manifest file.
    pub fn open(path: impl AsRef<Path>) -> Result<KernelManifest> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| TargetError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| refuse(path, "(file)", format!("is not valid JSON: {e}")))?;
        Self::from_json(path, &json)
    }

    /// Checks a parsed manifest; `path` locates relative file names and names errors.
    pub fn from_json(path: &Path, json: &Value) -> Result<KernelManifest> {
        let dir = path.parent().unwrap_or(Path::new("."));
        match json.get("onebit_kernel_manifest").and_then(Value::as_u64) {
            Some(MANIFEST_VERSION) => {}
            Some(v) => {
                return Err(refuse(
                    path,
                    "onebit_kernel_manifest",
                    format!("is {v}; this onebit reads version {MANIFEST_VERSION}"),
                ))
            }
            None => {
                return Err(refuse(
                    path,
                    "onebit_kernel_manifest",
                    "is missing (expected 1)",
                ))
            }
        }
        let default_xclbin = match json.get("xclbin") {
            Some(Value::String(s)) => Some(confined(dir, path, "xclbin", s)?),
            Some(other) => {
                return Err(refuse(
                    path,
                    "xclbin",
                    format!("must be a string, not {other}"),
                ))
            }
            None => None,
        };
        let Some(kernels) = json.get("kernels").and_then(Value::as_object) else {
            return Err(refuse(path, "kernels", "is missing or not an object"));
        };
        let mut entries = BTreeMap::new();
        for (op, entry) in kernels {
            let key = |k: &str| format!("kernels.{op}.{k}");
            if !OP_KINDS.contains(&op.as_str()) {
                return Err(refuse(
                    path,
                    &format!("kernels.{op}"),
                    format!("is not an op of the plan (ops: {})", OP_KINDS.join(", ")),
                ));
            }
            let string = |k: &str| -> Result<Option<String>> {
                match entry.get(k) {
                    None => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    Some(other) => Err(refuse(
                        path,
                        &key(k),
                        format!("must be a string, not {other}"),
                    )),
                }
            };
            let xclbin = match string("xclbin")? {
                Some(s) => confined(dir, path, &key("xclbin"), &s)?,
                None => default_xclbin.clone().ok_or_else(|| {
                    refuse(
                        path,
                        &key("xclbin"),
                        "is missing and the manifest has no top-level xclbin",
                    )
                })?,
            };
            let kernel = string("kernel")?.ok_or_else(|| {
                refuse(
                    path,
                    &key("kernel"),
                    "is missing (the kernel's name, e.g. MLIR_AIE)",
                )
            })?;
            let code = match (string("instructions")?, string("elf")?) {
                (Some(_), Some(_)) => {
                    return Err(refuse(
                        path,
                        &key("elf"),
                        "and instructions are both given; a kernel takes one",
                    ))
                }
                (Some(i), None) => {
                    let file = confined(dir, path, &key("instructions"), &i)?;
                    load_instructions(&file)
                        .map_err(|problem| refuse(path, &key("instructions"), problem))?;
                    KernelCode::Instructions(file)
                }
                (None, Some(e)) => KernelCode::Elf(confined(dir, path, &key("elf"), &e)?),
                (None, None) => KernelCode::Xclbin,
            };
            let timeout_ms = match entry.get("timeout_ms") {
                None => 5000,
                Some(v) => v
                    .as_u64()
                    .filter(|&t| (1..=600_000).contains(&t))
                    .ok_or_else(|| {
                        refuse(
                            path,
                            &key("timeout_ms"),
                            format!("must be 1..=600000 milliseconds, not {v}"),
                        )
                    })? as u32,
            };
            let Some(args) = entry.get("args").and_then(Value::as_array) else {
                return Err(refuse(path, &key("args"), "is missing or not a list"));
            };
            let (buffer_names, scalar_names) = op_names(op);
            let mut parsed = Vec::with_capacity(args.len());
            for (i, arg) in args.iter().enumerate() {
                let arg_key = format!("kernels.{op}.args[{i}]");
                let Some(text) = arg.as_str() else {
                    return Err(refuse(
                        path,
                        &arg_key,
                        format!("must be a string, not {arg}"),
                    ));
                };
                let parsed_arg = match text.split_once(':') {
                    None if text == "opcode" => KernelArg::Opcode(DEFAULT_OPCODE),
                    None if text == "instructions" => KernelArg::Instructions,
                    None if text == "instruction_words" => KernelArg::InstructionWords,
                    Some(("opcode", value)) => KernelArg::Opcode(value.parse().map_err(|_| refuse(path, &arg_key, format!("'{text}': the opcode must be a number")))?),
                    Some(("buffer", name)) if buffer_names.contains(&name) => KernelArg::Buffer(name.into()),
                    Some(("buffer", name)) => return Err(refuse(path, &arg_key, format!("'{name}' is not a buffer of {op} (it binds {})", buffer_names.join(", ")))),
                    Some(("scalar", name)) if scalar_names.contains(&name) => KernelArg::Scalar(name.into()),
                    Some(("scalar", name)) => return Err(refuse(path, &arg_key, format!("'{name}' is not a scalar of {op} (it offers {})", scalar_names.join(", ")))),
                    _ => return Err(refuse(path, &arg_key, format!("'{text}' is not opcode, instructions, instruction_words, buffer:NAME or scalar:NAME"))),
                };
                if matches!(
                    parsed_arg,
                    KernelArg::Instructions | KernelArg::InstructionWords
                ) && !matches!(code, KernelCode::Instructions(_))
                {
                    return Err(refuse(
                        path,
                        &arg_key,
                        format!("'{text}' needs an instructions file for {op}"),
                    ));
                }
                parsed.push(parsed_arg);
            }
            entries.insert(
                op.clone(),
                KernelEntry {
                    op: op.clone(),
                    xclbin,
                    kernel,
                    code,
                    args: parsed,
                    timeout_ms,
                },
            );
        }
        Ok(KernelManifest {
            path: path.to_path_buf(),
            kernels: entries,
        })
    }

    /// The op kinds a plan uses that this manifest has no kernel for.
    pub fn missing_for(&self, plan: &DispatchPlan) -> Vec<&'static str> {
        plan.op_counts()
            .into_iter()
            .map(|(kind, _)| kind)
            .filter(|kind| !self.kernels.contains_key(*kind))
            .collect()
    }
}

/// Reads an instruction stream: raw little-endian 32-bit words (`.bin`), or text
/// with one hexadecimal word per line (mlir-aie's `insts.txt`).
pub fn load_instructions(path: &Path) -> std::result::Result<Vec<u32>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let binary = path.extension().is_some_and(|e| e == "bin");
    parse_instructions(&bytes, binary, &path.display().to_string())
}

/// The words of an instruction stream's bytes (`binary`: little-endian words, else
/// hexadecimal text lines); `label` names the source in errors. Never panics.
pub fn parse_instructions(
    bytes: &[u8],
    binary: bool,
    label: &str,
) -> std::result::Result<Vec<u32>, String> {
    if binary {
        if !bytes.len().is_multiple_of(4) || bytes.is_empty() {
            return Err(format!(
                "{label} holds {} bytes, not a whole number of 32-bit words",
                bytes.len()
            ));
        }
        return Ok(bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect());
    }
    let text =
        std::str::from_utf8(bytes).map_err(|_| format!("{label} is neither .bin nor text"))?;
    let mut words = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let digits = line.trim_start_matches("0x").trim_start_matches("0X");
        words.push(
            u32::from_str_radix(digits, 16).map_err(|_| {
                format!("{label} line {}: '{line}' is not a hexadecimal word", n + 1)
            })?,
        );
    }
    if words.is_empty() {
        return Err(format!("{label} holds no instruction words"));
    }
    Ok(words)
}
