//! The `promptforge` command-line Host.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod check;
mod host;
mod models;
mod run;
mod source;

// Every section entry builds and frees a whole Lua state, thousands of small allocations;
// mimalloc frees and reuses them markedly faster than the system allocator (see
// docs/benchmarks.md, section entry).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// PromptForge: run Markdown prompt programs.
#[derive(Debug, Parser)]
#[command(name = "promptforge", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Parse prompt files and report every problem without running anything.
    Check(check::CheckArgs),
    /// Run a prompt.
    Run(Box<run::RunArgs>),
    /// List the model catalog (promptforge.toml, the user config file, and quick ids).
    Models(models::ModelsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => check::check(&args),
        Command::Run(args) => run::run(&args),
        Command::Models(args) => models::models(&args),
    }
}
