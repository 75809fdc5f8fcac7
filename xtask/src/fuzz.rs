//! A mutation fuzzer that runs on stable Rust.
//!
//! It has no coverage feedback (libFuzzer needs nightly); instead it mutates real
//! files the parsers will meet, with mutations aimed at what parsers get wrong:
//! digits inside the JSON header (sizes and offsets), structural characters,
//! truncation, byte flips, splices of one part of a file into another, and length
//! prefixes. Every input runs under `catch_unwind`; a panic is saved under
//! `target/fuzz-crashes/` and fails the run.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A small, seedable PRNG (xorshift64*): the fuzzer needs speed, not quality.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Applies 1..=4 random mutations, biased towards the first `hot` bytes (the header).
pub fn mutate(seed: &[u8], hot: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            b.push(rng.next() as u8);
            continue;
        }
        let span = if rng.below(4) == 0 {
            b.len()
        } else {
            hot.min(b.len())
        };
        let at = rng.below(span);
        match rng.below(9) {
            0 => b[at] = rng.next() as u8,
            1 => b[at] ^= 1 << rng.below(8),
            2 => {
                // Rewrite a digit run (sizes, offsets, shapes).
                if let Some(start) = (at..span).find(|&i| b[i].is_ascii_digit()) {
                    let end = (start..b.len())
                        .find(|&i| !b[i].is_ascii_digit())
                        .unwrap_or(b.len());
                    let replacement = match rng.below(5) {
                        0 => "0".to_string(),
                        1 => u64::MAX.to_string(),
                        2 => "18446744073709551616".to_string(),
                        3 => (rng.next() % 1_000_000).to_string(),
                        _ => "-1".to_string(),
                    };
                    b.splice(start..end, replacement.into_bytes());
                }
            }
            3 => {
                let tokens: [&[u8]; 10] = [
                    b"{", b"}", b"[", b"]", b",", b":", b"\"", b"null", b"1e999", b"\\u0000",
                ];
                let t = tokens[rng.below(tokens.len())];
                b.splice(at..at, t.iter().copied());
            }
            4 => b.truncate(at),
            5 => {
                let len = rng.below(64).min(b.len() - at);
                b.drain(at..at + len);
            }
            6 => {
                let from = rng.below(b.len());
                let len = rng.below(128).min(b.len() - from);
                let chunk = b[from..from + len].to_vec();
                b.splice(at..at, chunk);
            }
            7 if b.len() >= 8 => {
                // The 8-byte length prefix (q4nx) or a u64 count/size field.
                let v: u64 = match rng.below(4) {
                    0 => rng.next(),
                    1 => u64::from_le_bytes(b[..8].try_into().unwrap())
                        .wrapping_add(rng.below(17) as u64)
                        .wrapping_sub(8),
                    2 => b.len() as u64,
                    _ => u64::MAX,
                };
                let pos = if rng.below(2) == 0 {
                    0
                } else {
                    at.min(b.len() - 8)
                };
                b[pos..pos + 8].copy_from_slice(&v.to_le_bytes());
            }
            _ => {
                let extra = rng.below(32);
                for _ in 0..extra {
                    b.push(rng.next() as u8);
                }
            }
        }
    }
    b
}

struct Target {
    name: &'static str,
    seeds: Vec<(String, Vec<u8>)>,
    hot: fn(&[u8]) -> usize,
    run: fn(Vec<u8>) -> bool,
}

fn q4nx_hot(b: &[u8]) -> usize {
    8 + b
        .get(..8)
        .map(|h| u64::from_le_bytes(h.try_into().unwrap()) as usize)
        .unwrap_or(0)
}

fn targets() -> Result<Vec<Target>> {
    let fx = crate::shared_fixtures();
    let read = |rel: &str| -> Result<(String, Vec<u8>)> {
        let p = fx.join(rel);
        Ok((
            rel.to_string(),
            std::fs::read(&p).with_context(|| format!("fuzz: cannot read seed {}", p.display()))?,
        ))
    };
    Ok(vec![
        Target {
            name: "q4nx",
            seeds: vec![
                read("tiny-llama/model.q4nx")?,
                read("tiny-qwen3/model.q4nx")?,
                read("dflash-ref/draft/model.safetensors")?,
                read("tiny-llama/reference.safetensors")?,
            ],
            hot: q4nx_hot,
            run: q4nx_format::fuzzing::exercise_container,
        },
        Target {
            name: "manifest",
            seeds: vec![("kernels.json".into(), manifest_seed()?)],
            hot: |b| b.len(),
            run: |bytes| npu_runtime::fuzzing::exercise_manifest(manifest_dir(), &bytes),
        },
        Target {
            name: "instructions",
            seeds: vec![
                (
                    "insts.bin".into(),
                    [1u32, 0x0603_0100, 7, 0xdead_beef]
                        .iter()
                        .flat_map(|w| w.to_le_bytes())
                        .collect(),
                ),
                (
                    "insts.txt".into(),
                    b"06030100\n0x00000105\n\nffffffff\n".to_vec(),
                ),
            ],
            hot: |b| b.len(),
            run: |bytes| npu_runtime::fuzzing::exercise_instructions(&bytes),
        },
        Target {
            name: "gguf",
            seeds: vec![
                read("tiny-llama/model.Q4_1.gguf")?,
                read("tiny-qwen3/model.Q4_1.gguf")?,
            ],
            hot: gguf_hot,
            run: |bytes| q4nx_convert::fuzzing::exercise_gguf(&bytes),
        },
    ])
}

/// The folder a fuzzed kernel manifest lives in, with the files a good one names.
fn manifest_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = crate::workspace_root().join("target/fuzz/manifest");
        std::fs::create_dir_all(&dir).expect("fuzz: cannot create target/fuzz/manifest");
        for (name, bytes) in [
            ("onebit.xclbin", &b"xclbin"[..]),
            ("mm.bin", &[1u8, 0, 0, 6, 2, 0, 0, 0][..]),
            ("norm.txt", &b"06030100\n"[..]),
            ("attn.elf", &b"\x7fELF"[..]),
        ] {
            std::fs::write(dir.join(name), bytes).expect("fuzz: cannot write a manifest file");
        }
        dir
    })
}

/// A manifest using every kind of entry, as the fuzzer's seed.
fn manifest_seed() -> Result<Vec<u8>> {
    manifest_dir();
    Ok(br#"{"onebit_kernel_manifest": 1, "xclbin": "onebit.xclbin", "kernels": {
  "matmul_q4": {"kernel": "MLIR_AIE", "instructions": "mm.bin", "timeout_ms": 100,
    "args": ["opcode", "instructions", "instruction_words", "buffer:x", "buffer:weight", "buffer:out", "scalar:rows", "scalar:n", "scalar:k"]},
  "rms_norm": {"kernel": "MLIR_AIE", "instructions": "norm.txt", "xclbin": "onebit.xclbin",
    "args": ["opcode:3", "instructions", "instruction_words", "buffer:x", "buffer:gain", "buffer:out", "scalar:width"]},
  "attention": {"kernel": "attn", "elf": "attn.elf", "args": ["buffer:q", "buffer:keys", "buffer:values", "buffer:out", "scalar:position"]},
  "add": {"kernel": "MLIR_AIE", "args": ["buffer:x", "buffer:y", "scalar:width"]}
}}"#
    .to_vec())
}

/// The GGUF header (metadata and tensor infos) is where parsing happens.
fn gguf_hot(b: &[u8]) -> usize {
    q4nx_convert::gguf::Gguf::parse("seed", b)
        .map(|g| g.data_start)
        .unwrap_or(b.len())
}

pub fn run(args: &[String]) -> Result<()> {
    let mut seconds = 60u64;
    let mut seed = 0x0b17_u64;
    let mut only: Option<String> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => seconds = it.next().context("--seconds needs a value")?.parse()?,
            "--seed" => seed = it.next().context("--seed needs a value")?.parse()?,
            t if !t.starts_with('-') => only = Some(t.to_string()),
            other => bail!("fuzz: unknown option '{other}'"),
        }
    }
    let all = targets()?;
    if let Some(name) = &only {
        if !all.iter().any(|t| t.name == name) {
            let names: Vec<_> = all.iter().map(|t| t.name).collect();
            bail!(
                "fuzz: unknown target '{name}' (known: {})",
                names.join(", ")
            );
        }
    }
    std::panic::set_hook(Box::new(|_| {}));
    let crash_dir = crate::workspace_root().join("target/fuzz-crashes");
    let mut failed = 0;
    for target in all
        .iter()
        .filter(|t| only.as_deref().is_none_or(|o| o == t.name))
    {
        let mut rng = Rng::new(seed);
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let (mut runs, mut accepted, mut panics) = (0u64, 0u64, 0u64);
        let start = Instant::now();
        while Instant::now() < deadline {
            for _ in 0..64 {
                let (_, seed_bytes) = &target.seeds[rng.below(target.seeds.len())];
                let input = mutate(seed_bytes, (target.hot)(seed_bytes), &mut rng);
                let copy = input.clone();
                match catch_unwind(AssertUnwindSafe(|| (target.run)(input))) {
                    Ok(true) => accepted += 1,
                    Ok(false) => {}
                    Err(_) => {
                        panics += 1;
                        std::fs::create_dir_all(&crash_dir)?;
                        let path = crash_dir.join(format!("{}-{runs}.bin", target.name));
                        std::fs::write(&path, copy)?;
                        eprintln!(
                            "fuzz: {}: panic, input saved to {}",
                            target.name,
                            path.display()
                        );
                    }
                }
                runs += 1;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "fuzz {}: {runs} inputs in {secs:.0} s ({:.0}/s), {accepted} accepted, {} refused, {panics} panics (seed {seed})",
            target.name,
            runs as f64 / secs,
            runs - accepted - panics
        );
        failed += panics;
    }
    let _ = std::panic::take_hook();
    if failed > 0 {
        bail!("fuzz: {failed} inputs panicked");
    }
    Ok(())
}
