//! `promptforge describe PROMPT`: what a prompt needs, for a person (the description itself
//! is [`crate::declared`]'s, which `run PROMPT --help` and `check --json` print too).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::declared::load;

#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// The prompt file to describe.
    #[arg(value_name = "PROMPT")]
    prompt: PathBuf,
    /// Print the description as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn describe(args: &DescribeArgs) -> ExitCode {
    let description = match load(&args.prompt) {
        Ok(d) => d,
        Err(message) => {
            errln!("error: {message}");
            return ExitCode::from(1);
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&description) {
            Ok(text) => outln!("{text}"),
            Err(e) => {
                errln!("error: cannot encode the description: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        outln!("{}", description.text(""));
    }
    ExitCode::SUCCESS
}
