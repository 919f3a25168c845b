//! `promptforge run PROMPT`: run a prompt and report its one outcome.
//!
//! With `--json`, stdout holds exactly one JSON object (the outcome, in the shape of the
//! conformance contract); without it, the result goes to stdout and a failure to stderr as
//! `error[KIND]: message` with the prompt location. Exit status: 0 completed, 1 failed,
//! 130 cancelled, 2 usage error before any run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use promptforge_engine::{Outcome, RunError, RunErrorKind, first_step};
use promptforge_syntax::Prompt;
use serde::Serialize;

use crate::source::read_prompt;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The prompt file to run.
    #[arg(value_name = "PROMPT")]
    prompt: PathBuf,
    /// The run's raw argument string (`args`).
    #[arg(long = "args", value_name = "STRING")]
    run_args: Option<String>,
    /// Print exactly one JSON object, the run's outcome, on stdout.
    #[arg(long)]
    json: bool,
    /// The run's seed (unsigned 64-bit); default: from the OS.
    #[arg(long)]
    seed: Option<u64>,
    /// The run's start instant, RFC 3339 (`sys.when`); default: now.
    #[arg(long, value_name = "RFC3339")]
    when: Option<String>,
    /// Answer every model round from a scripted model file.
    #[arg(long, value_name = "FILE")]
    script: Option<PathBuf>,
    /// A JSON object file: the Host-state snapshot that `ui()` returns.
    #[arg(long, value_name = "FILE")]
    snapshot: Option<PathBuf>,
    /// An operator answer for the input broker (repeatable, in order).
    #[arg(long = "input", value_name = "TEXT")]
    inputs: Vec<String>,
    /// The run's store is this directory on disk.
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
}

/// The outcome object of the CLI contract.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
enum OutcomeJson {
    Completed { result: String },
    Cancelled,
    Failed { error: ErrorJson },
}

#[derive(Debug, Serialize)]
struct ErrorJson {
    kind: String,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    parse_kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    column: Option<u32>,
}

fn outcome_json(outcome: &Outcome) -> OutcomeJson {
    match outcome {
        Outcome::Completed(result) => OutcomeJson::Completed {
            result: result.clone(),
        },
        Outcome::Cancelled => OutcomeJson::Cancelled,
        Outcome::Failed(err) => OutcomeJson::Failed {
            error: ErrorJson {
                kind: err.kind.to_string(),
                message: err.message.clone(),
                parse_kind: err.parse_kind.map(|k| k.to_string()),
                line: err.line,
                column: err.column,
            },
        },
    }
}

fn execute(args: &RunArgs, text: &str) -> Outcome {
    let parsed = Prompt::parse(text);
    if let Err(err) = first_step(parsed.as_ref()) {
        return Outcome::Failed(err);
    }
    Outcome::Failed(RunError::new(
        RunErrorKind::Internal,
        format!(
            "{}: this build parses and checks prompts but cannot execute them yet",
            args.prompt.display()
        ),
    ))
}

fn report(args: &RunArgs, outcome: &Outcome) -> ExitCode {
    if args.json {
        match serde_json::to_string(&outcome_json(outcome)) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("error: cannot encode the outcome: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        match outcome {
            Outcome::Completed(result) => print!("{result}"),
            Outcome::Cancelled => eprintln!("cancelled"),
            Outcome::Failed(err) => {
                let kind = match err.parse_kind {
                    Some(parse_kind) => format!("{}/{parse_kind}", err.kind),
                    None => err.kind.to_string(),
                };
                eprintln!("error[{kind}]: {}", err.message);
                if let Some(line) = err.line {
                    eprintln!(
                        "  --> {}:{line}:{}",
                        args.prompt.display(),
                        err.column.unwrap_or(1)
                    );
                }
            }
        }
    }
    match outcome {
        Outcome::Completed(_) => ExitCode::SUCCESS,
        Outcome::Failed(_) => ExitCode::from(1),
        Outcome::Cancelled => ExitCode::from(130),
    }
}

pub fn run(args: &RunArgs) -> ExitCode {
    let text = match read_prompt(&args.prompt) {
        Ok(text) => text,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let outcome = execute(args, &text);
    report(args, &outcome)
}
