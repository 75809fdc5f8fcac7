//! `onebit convert MODEL.gguf OUT_DIR`: a GGUF model to a Q4NX target package.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use q4nx_convert::gguf::GgufFile;
use q4nx_convert::{tokenizer::tokenizer_json, GgufConverter};

#[derive(Args)]
pub struct ConvertArgs {
    /// The GGUF model to convert (Llama or Qwen3 family), or a Hugging Face model
    /// directory (`config.json` + `model.safetensors`).
    pub gguf: PathBuf,
    /// The package directory to write: model.q4nx, tokenizer.json, config.json.
    pub out_dir: PathBuf,
    /// Replace an existing package in OUT_DIR.
    #[arg(long)]
    pub force: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// What a conversion wrote, for the summary line and for callers.
pub struct Summary {
    pub tensors: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub input_bytes: u64,
    pub differences: Vec<String>,
}

pub fn run(args: &ConvertArgs) -> Result<()> {
    let s = convert(&args.gguf, &args.out_dir, args.force, args.quiet)?;
    for d in &s.differences {
        println!("differs from FastFlowLM's converter: {d}");
    }
    println!(
        "converted {} tensors, {} bytes in {:.2} s ({:.0} MB/s of input) -> {}",
        s.tensors,
        s.bytes,
        s.seconds,
        s.input_bytes as f64 / 1e6 / s.seconds.max(1e-9),
        args.out_dir.display()
    );
    Ok(())
}

pub fn convert(gguf_path: &Path, out_dir: &Path, force: bool, quiet: bool) -> Result<Summary> {
    let start = Instant::now();
    let target = out_dir.join("model.q4nx");
    if target.exists() && !force {
        bail!(
            "convert: {}: a package is already there (pass --force to replace it)",
            out_dir.display()
        );
    }
    if gguf_path.is_dir() {
        return convert_hf(gguf_path, out_dir, start);
    }
    let file = GgufFile::open(gguf_path)?;
    let converter = GgufConverter::new(&file)?;
    let config = converter.hf_config()?;
    let (tokenizer, tokenizer_note) = tokenizer_json(&file.gguf)
        .map_err(|e| anyhow::anyhow!("convert: {}: {e}", gguf_path.display()))?;

    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} converting [{bar:40}] {pos}/{len} tensors {elapsed}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    let (writer, report) = converter.convert(&|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();

    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("convert: {}: cannot create directory", out_dir.display()))?;
    writer.write_file(&target)?;
    let write_json = |name: &str, value: &serde_json::Value| -> Result<()> {
        let path = out_dir.join(name);
        let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("convert: {}: cannot write", path.display()))
    };
    write_json("config.json", &config)?;
    write_json("tokenizer.json", &tokenizer)?;
    if let Some(source) = config
        .get("q4nx_chat_template_source")
        .and_then(|v| v.as_str())
    {
        // The user should know the chat prompt format is not the file's own.
        eprintln!(
            "convert: note: {}: the GGUF has no tokenizer.chat_template; the package gets the {source}",
            gguf_path.display()
        );
    }

    let mut differences = report.differences;
    if file
        .gguf
        .metadata_value("tokenizer.ggml.model")
        .and_then(|v| v.as_str())
        == Some("llama")
    {
        differences.push(
            "tokenizer.json: SentencePiece vocabulary written as a byte-fallback BPE with merges ranked by score \
             (the reference writes a ByteLevel BPE with no merges, which cannot encode text)"
                .into(),
        );
    }
    differences.extend(tokenizer_note);
    differences.push(
        "config.json: written by onebit from the GGUF metadata (the reference writes none)".into(),
    );
    Ok(Summary {
        tensors: report.tensors,
        bytes: std::fs::metadata(&target).map(|m| m.len()).unwrap_or(0),
        seconds: start.elapsed().as_secs_f64(),
        input_bytes: std::fs::metadata(gguf_path).map(|m| m.len()).unwrap_or(0),
        differences,
    })
}

/// A Hugging Face model directory: tiles for projections, BF16 for the rest; the config
/// (and tokenizer files, when present) are copied.
fn convert_hf(src: &Path, out_dir: &Path, start: Instant) -> Result<Summary> {
    let (writer, config, tensors) = q4nx_convert::hf::convert_hf_dir(src)?;
    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("convert: {}: cannot create directory", out_dir.display()))?;
    let target = out_dir.join("model.q4nx");
    writer.write_file(&target)?;
    let text = serde_json::to_string_pretty(&config).expect("JSON values serialize");
    std::fs::write(out_dir.join("config.json"), text + "\n")
        .with_context(|| format!("convert: {}: cannot write config.json", out_dir.display()))?;
    for name in ["tokenizer.json", "tokenizer_config.json"] {
        if src.join(name).exists() {
            std::fs::copy(src.join(name), out_dir.join(name))
                .with_context(|| format!("convert: cannot copy {name}"))?;
        }
    }
    let input_bytes = std::fs::metadata(src.join("model.safetensors"))
        .map(|m| m.len())
        .unwrap_or(0);
    Ok(Summary {
        tensors,
        bytes: std::fs::metadata(&target).map(|m| m.len()).unwrap_or(0),
        seconds: start.elapsed().as_secs_f64(),
        input_bytes,
        differences: vec!["source is a Hugging Face safetensors model: projections quantized to q4_1 tiles (lossless only for q4_1-representable weights)".into()],
    })
}
