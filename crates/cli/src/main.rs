//! The `promptforge` command-line Host.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// `print!` to stdout that never panics: see [`ui::out`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::ui::out(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics: stderr may be a closed pipe or a terminal that hung up (a
/// SIGHUP's run must still reach the history after it says `cancelled`).
macro_rules! errln {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `println!` to stdout that never panics: see [`ui::out`].
macro_rules! outln {
    () => { $crate::ui::out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::ui::out(format_args!("{}\n", format_args!($($arg)*))) };
}

mod commands;
mod declared;
mod history;
mod host;
mod html;
mod otel;
mod record;
mod report;
mod response_cache;
mod session;
mod source;
mod ui;
mod witness;

use commands::{batch, cache, check, describe, lsp, mcp, models, replay, run, runs};

// Every section entry builds and frees a whole Lua state, thousands of small allocations;
// mimalloc frees and reuses them markedly faster than the system allocator (see
// docs/benchmarks.md, section entry).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// PromptForge: run Markdown prompt programs.
#[derive(Debug, Parser)]
#[command(name = "promptforge", version, about, propagate_version = true)]
pub(crate) struct Cli {
    /// Log what the Host does on stderr: -v requests, statuses, retries and timings; -vv more.
    /// Keys and prompt text are never logged.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// No progress display and no summary line.
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Parse prompt files and report every problem without running anything.
    Check(check::CheckArgs),
    /// Run a prompt (`run PROMPT --help` shows what that prompt takes).
    Run(Box<run::RunArgs>),
    /// Run a prompt once per line of a JSON-lines file of inputs, checking expectations.
    Batch(Box<batch::BatchArgs>),
    /// Join the result files of sharded batches (`batch --shard I/N`) into one, in input order.
    Merge(batch::MergeArgs),
    /// Run a recorded prompt again from its record (`run --record FILE`), answering every
    /// effect from it, and report where an edited prompt diverges.
    Replay(Box<replay::ReplayArgs>),
    /// Continue a run that was killed before it ended, from its journal in the history: the
    /// answers it got again (no network call), then live.
    Resume(run::resume::ResumeArgs),
    /// The run history: recent runs (`runs`), one run (`runs show ID`), its record
    /// (`runs export ID`).
    Runs(runs::RunsArgs),
    /// Show what a prompt takes: its args, model roles, tool slots, Plugins and files.
    Describe(describe::DescribeArgs),
    /// List the model catalog (promptforge.toml, the user config file, and quick ids).
    Models(models::ModelsArgs),
    /// MCP: serve prompt files as tools to agents (`mcp serve DIR`), or list a configured
    /// MCP server's tools (`mcp tools NAME`).
    Mcp(mcp::McpArgs),
    /// The response cache of `--cache`: `cache stats`, `cache clear [--older-than DAYS]`.
    Cache(cache::CacheArgs),
    /// A language server for prompt files over stdio, for editors (see docs/editors.md).
    Lsp(lsp::LspArgs),
    /// Print a shell completion script: `promptforge completions bash > ...`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `-v` logs through tracing: promptforge's own targets at info (`-v`) or debug (`-vv`), every
/// dependency's too at trace (`-vvv`). `RUST_LOG` overrides the level when set.
fn start_logs(verbose: u8) {
    if verbose == 0 {
        return;
    }
    let level = match verbose {
        1 => "promptforge=info",
        2 => "promptforge=debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(console::colors_enabled_stderr())
        .with_writer(ui::LogWriter::default)
        .try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    start_logs(cli.verbose);
    let ui = report::Ui {
        progress: !cli.quiet && std::io::stderr().is_terminal(),
        verbose: cli.verbose,
        quiet: cli.quiet,
    };
    let code = match cli.command {
        Command::Check(args) => check::check(&args),
        Command::Run(args) => run::run(&args, ui),
        Command::Batch(args) => batch::batch(&args, ui),
        Command::Merge(args) => batch::merge(&args),
        Command::Replay(args) => replay::replay(&args, ui),
        Command::Resume(args) => run::resume::resume(&args, ui),
        Command::Runs(args) => runs::runs(&args),
        Command::Describe(args) => describe::describe(&args),
        Command::Models(args) => models::models(&args),
        Command::Mcp(args) => mcp::mcp(&args),
        Command::Lsp(args) => lsp::lsp(&args),
        Command::Cache(args) => cache::cache(&args),
        Command::Completions { shell } => {
            let mut command = Cli::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "promptforge", &mut script);
            out!("{}", String::from_utf8_lossy(&script));
            ExitCode::SUCCESS
        }
    };
    // A closed pipe ends the output quietly; stdout that failed otherwise fails the command.
    if ui::stdout_flush_failed() && code == ExitCode::SUCCESS {
        return ExitCode::FAILURE;
    }
    code
}
