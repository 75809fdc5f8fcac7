//! The `onebit` command line: a thin layer over the library crates.
//!
//! Every subcommand lives in its own module and returns `anyhow::Result`; `main`
//! prints the error chain and exits with status 2, so scripts can tell a refused
//! input (2) from success (0).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod convert;
mod inspect;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Convert(args) => convert::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("onebit: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
