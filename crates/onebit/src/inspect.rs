//! `onebit inspect PATH`: what a container or package holds.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use q4nx_format::Container;
use serde_json::Value;

#[derive(Args)]
pub struct InspectArgs {
    /// A `.q4nx`/`.safetensors` file, or a package directory holding `config.json`.
    pub path: PathBuf,
    /// Also print one line per tensor: name, dtype, shape, bytes.
    #[arg(long)]
    pub tensors: bool,
}

pub fn run(args: &InspectArgs) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.path.is_dir() {
        inspect_dir(&args.path, args.tensors, &mut out)
    } else if args.path.exists() {
        inspect_file(&args.path, args.tensors, &mut out)
    } else {
        bail!(
            "inspect: {}: no such file or directory",
            args.path.display()
        )
    }
}

/// The inventory of one container: `N tensors, B bytes`, the dtype histogram,
/// and optionally every tensor.
pub fn inspect_file(path: &Path, tensors: bool, out: &mut impl Write) -> Result<()> {
    let c = Container::open(path)?;
    writeln!(
        out,
        "{}: {} tensors, {} bytes",
        path.display(),
        c.len(),
        c.file_len()
    )?;
    let mut histogram: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for t in c.tensors() {
        let e = histogram.entry(t.dtype.label()).or_default();
        e.0 += 1;
        e.1 += t.bytes.len();
    }
    for (dtype, (count, bytes)) in histogram {
        writeln!(out, "  {dtype:<5} {count:>5} tensors {bytes:>14} bytes")?;
    }
    if let Some(meta) = c.metadata() {
        for (k, v) in meta {
            writeln!(out, "  metadata {k} = {v}")?;
        }
    }
    if tensors {
        for t in c.tensors() {
            writeln!(
                out,
                "  {}\t{}\t{:?}\t{}",
                t.name,
                t.dtype,
                t.shape,
                t.bytes.len()
            )?;
        }
    }
    Ok(())
}

fn inspect_dir(dir: &Path, tensors: bool, out: &mut impl Write) -> Result<()> {
    let config_path = dir.join("config.json");
    let mut containers: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("inspect: {}: cannot list directory", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "q4nx" || e == "safetensors")
        })
        .collect();
    containers.sort();
    if !config_path.exists() && containers.is_empty() {
        bail!(
            "inspect: {}: not a model package (no config.json and no .q4nx or .safetensors file)",
            dir.display()
        );
    }
    if is_draft_package(&config_path) {
        let draft = dflash_draft::load_draft(dir)?;
        writeln!(out, "draft package: {}", draft.inventory_line())?;
    }
    if config_path.exists() {
        let text = std::fs::read_to_string(&config_path)
            .with_context(|| format!("inspect: {}: cannot read", config_path.display()))?;
        let config: Value = serde_json::from_str(&text)
            .with_context(|| format!("inspect: {}: not valid JSON", config_path.display()))?;
        writeln!(out, "{}", describe_config(&config))?;
    }
    for c in containers {
        inspect_file(&c, tensors, out)?;
    }
    Ok(())
}

/// Whether `config.json` declares a DFlash draft, by `model_type` or by
/// `architectures` (the loader then checks everything, so a draft with a wrong
/// `model_type` is refused by name instead of being listed as a target).
fn is_draft_package(config_path: &Path) -> bool {
    std::fs::read_to_string(config_path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .is_some_and(|v| {
            let draft_type = matches!(
                v.get("model_type").and_then(Value::as_str),
                Some("dflash" | "dflash2")
            );
            let draft_arch = v
                .get("architectures")
                .and_then(Value::as_array)
                .is_some_and(|a| {
                    a.iter().filter_map(Value::as_str).any(|name| {
                        name == dflash_draft::ARCHITECTURE || name == dflash_draft::ARCHITECTURE_V2
                    })
                });
            draft_type || draft_arch
        })
}

/// One line from a Hugging Face style `config.json`.
pub fn describe_config(config: &Value) -> String {
    let get = |key: &str| -> String {
        match config.get(key) {
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::String(s)) => s.clone(),
            _ => "?".into(),
        }
    };
    let arch = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| get("model_type"));
    let head_dim = match config.get("head_dim") {
        Some(Value::Number(n)) => n.to_string(),
        _ => match (
            config.get("hidden_size").and_then(Value::as_u64),
            config.get("num_attention_heads").and_then(Value::as_u64),
        ) {
            (Some(h), Some(n)) if n > 0 => (h / n).to_string(),
            _ => "?".into(),
        },
    };
    format!(
        "config: {arch} ({}), {} layers, hidden {}, intermediate {}, {} heads / {} kv x {head_dim}, vocab {}",
        get("model_type"),
        get("num_hidden_layers"),
        get("hidden_size"),
        get("intermediate_size"),
        get("num_attention_heads"),
        get("num_key_value_heads"),
        get("vocab_size"),
    )
}
