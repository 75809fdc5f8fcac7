//! The `onebit` command line: a thin layer over the library crates.
//!
//! Every subcommand lives in its own module and returns `anyhow::Result`; `main`
//! prints the error chain and exits with status 2, so scripts can tell a refused
//! input (2) from success (0).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod backend;
mod bench;
mod convert;
mod convert_draft;
mod doctor;
mod inspect;
mod perplexity;
mod run;
mod serve;
mod store;
mod validate;

/// Run Q4NX language models with DFlash speculative decoding.
#[derive(Parser)]
#[command(name = "onebit", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the inventory of a Q4NX container or a model package directory.
    Inspect(inspect::InspectArgs),
    /// Convert a GGUF model (Llama, Qwen3) to a Q4NX target package.
    Convert(convert::ConvertArgs),
    /// Convert a z-lab (Hugging Face) DFlash draft into an NPU draft package.
    ConvertDraft(convert_draft::ConvertDraftArgs),
    /// Generate text with a target package (greedy or sampled), streaming it.
    Run(run::RunArgs),
    /// Measure prefill and decode speed, n-row pass costs and memory bandwidth.
    Bench(bench::BenchArgs),
    /// Perplexity of a text; with --compare-precision, KL divergence and top-1
    /// agreement between two precisions.
    Perplexity(perplexity::PerplexityArgs),
    /// Serve the model over HTTP: OpenAI (/v1/chat/completions, /v1/completions,
    /// /v1/models) and Ollama (/api/chat, /api/generate, /api/tags, ...) routes.
    Serve(serve::ServeArgs),
    /// Report what this machine offers: CPU kernels, XRT, the NPU and why it is or is
    /// not usable; optionally check a model's NPU plan and a kernel manifest.
    Doctor(doctor::DoctorArgs),
    /// Fetch a model by name (`smollm2`, `gemma3:270m`) into the store and convert it,
    /// or add a local GGUF / Hugging Face directory under --name.
    Pull(store::PullArgs),
    /// The models in the store: name, size, family, quantization, when pulled.
    List(store::ListArgs),
    /// Remove a model from the store.
    Rm(store::NameArgs),
    /// What a stored model is: its source, digests and configuration.
    Show(store::NameArgs),
    /// Whether onebit can run on this machine (exit 0) and with what: CPU features
    /// (AMX included), memory, the NPU driver and device, XRT.
    Validate(validate::ValidateArgs),
}

/// A model argument that names a stored model (not a directory) becomes its package's
/// directory; the name, when it was one.
fn by_name(model: &mut std::path::PathBuf) -> anyhow::Result<Option<store::Name>> {
    let (dir, name) = store::resolve(model)?;
    *model = dir;
    Ok(name)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::ConvertDraft(args) => convert_draft::run(&args),
        Command::Run(mut args) => by_name(&mut args.target.model).and_then(|_| run::run(&args)),
        Command::Bench(mut args) => by_name(&mut args.target.model).and_then(|_| bench::run(&args)),
        Command::Perplexity(mut args) => {
            by_name(&mut args.target.model).and_then(|_| perplexity::run(&args))
        }
        Command::Doctor(args) => doctor::run(&args),
        Command::Serve(mut args) => match args.model_dir.as_mut().map(by_name) {
            Some(Err(e)) => Err(e),
            Some(Ok(name)) => {
                // A stored model is served under its name (`smollm2:135m`), as Ollama does.
                if args.alias.is_none() {
                    args.alias = name.map(|n| n.to_string());
                }
                serve::run(&args)
            }
            // No model: the whole store, by name.
            None => serve::run(&args),
        },
        Command::Pull(args) => store::pull(&args),
        Command::List(args) => store::list(&args),
        Command::Rm(args) => store::rm(&args),
        Command::Show(args) => store::show(&args),
        Command::Validate(args) => validate::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("onebit: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
