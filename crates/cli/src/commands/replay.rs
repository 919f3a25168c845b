//! `promptforge replay FILE`: run a recorded prompt (or an edited one) again from its record.
//!
//! The run gets the recorded seed, start instant, argument string, Host state and concurrency
//! limit; every effect is answered from the record by its id, at the step it was first
//! answered, after its request is checked against the recorded one. An unchanged prompt ends
//! with a byte-identical outcome and event stream and touches no network. At the first effect
//! whose request differs (or that the record lacks) the replay stops with a report naming the
//! effect, the section and prompt line that issued it, and a diff of the two requests; with
//! `--then-live` it goes on from there against the real providers instead.
//!
//! Exit status: the replayed outcome's (0, 1, 130) when it matches the record; 3 when the
//! replay diverged or its events differ; 2 for a usage error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clap::Args;
use promptforge_engine::{Outcome, Run, RunContext};
use promptforge_harness::store::Store;
use promptforge_syntax::Prompt;
use serde_json::Value as Json;

use crate::host::{Notes, Operator, channel};
use crate::record::{Record, Replay, compare, sha256_hex};
use crate::report::{Ui, exit_code, outcome_json};
use crate::session::{ModelFlags, Session};
use crate::source::read_prompt;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The record written by `run --record FILE`, or a run's id in the history (`last`: the
    /// newest run).
    #[arg(value_name = "RECORD|ID")]
    record: PathBuf,
    /// Replay this prompt file instead of the recorded one (an edited version).
    #[arg(long, value_name = "PATH")]
    prompt: Option<PathBuf>,
    /// Answer from the record up to the first divergence, then from the real providers.
    #[arg(long)]
    then_live: bool,
    /// With --then-live, what answers after the divergence (`--model` defaults to the
    /// recorded model's id, from the catalog).
    #[command(flatten)]
    models: ModelFlags,
    /// Print the replayed outcome as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Print the replayed events as JSON lines on stdout, the outcome last.
    #[arg(long)]
    events: bool,
}

pub fn replay(args: &ReplayArgs, _ui: Ui) -> ExitCode {
    match replay_inner(args) {
        Ok(code) => code,
        Err(message) => {
            errln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn replay_inner(args: &ReplayArgs) -> Result<ExitCode, String> {
    // A run id of the history (a number, or `last`), unless a file of that name exists.
    let exported = match args.record.to_str() {
        Some(id) if !args.record.exists() && (id == "last" || id.parse::<i64>().is_ok()) => {
            Some(crate::history::export_to_temp(id)?)
        }
        _ => None,
    };
    let record = match &exported {
        Some(file) => Record::load(file.path())?,
        None => Record::load(&args.record)?,
    };
    let header = &record.header;
    let prompt_path = args
        .prompt
        .clone()
        .unwrap_or_else(|| header.prompt.path.clone());
    let text = read_prompt(&prompt_path).map_err(|e| match &args.prompt {
        Some(_) => e,
        None => format!(
            "the recorded prompt {} cannot be read ({e}); pass --prompt PATH to replay it from where it is now",
            prompt_path.display()
        ),
    })?;
    if args.prompt.is_none() && sha256_hex(&text) != header.prompt.sha256 {
        errln!(
            "note: {} changed since it was recorded (its SHA-256 differs); replaying it as it is now",
            prompt_path.display()
        );
    }
    let prompt = match Prompt::parse(&text) {
        Ok(prompt) => prompt,
        Err(err) => {
            // The recorded run may have been this same parse failure.
            let outcome = Outcome::Failed(err.into());
            let value = serde_json::to_value(outcome_json(&outcome)).unwrap_or(Json::Null);
            return Ok(settle(args, &prompt_path, &record, &[], &outcome, &value));
        }
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let mut ctx = RunContext::new(header.seed, header.start_ms);
    ctx.args = header.args.clone();
    ctx.snapshot = header.snapshot.clone();
    ctx.concurrency = header.concurrency;
    ctx.host = header.host.clone();
    ctx.execution = prompt.frontmatter.name.clone();
    ctx.cancel = cancel.clone();
    ctx.effect_sites = true;

    // Only a live replay needs a model and a network; a plain one never reaches them.
    let session = if args.then_live {
        let recorded_id = header.host.model.as_ref().map(|m| m.id.clone());
        let id = args.models.model.clone().or(recorded_id);
        Session::open(&args.models, id.as_deref())?
    } else {
        Session::offline()
    };
    let mut host = session
        .host(Store::memory(), Operator::Nobody, cancel, channel())?
        .notes(if args.events {
            Notes::JsonStdout
        } else {
            Notes::Stderr
        })
        .replay(Replay::new(&record, args.then_live));
    // Live, the prompt's MCP servers start on their first call (the record holds the Host
    // state they were offered in).
    if args.then_live
        && let Some(mcp) = session.mcp_for(&prompt.frontmatter)?
    {
        host = host.mcp(mcp);
    }
    let mut run = Run::new(Arc::new(prompt), ctx);
    let mut events: Vec<Json> = Vec::new();
    let outcome = host.drive(&mut run, &mut |event| {
        let json = crate::report::event_json(event);
        if args.events {
            outln!("{json}");
        }
        events.push(json);
    });
    let outcome_value = serde_json::to_value(outcome_json(&outcome)).unwrap_or(Json::Null);

    if let Some(divergence) = host.divergence() {
        errln!("{}", divergence.report(&args.record, &prompt_path));
        if !args.then_live {
            return Ok(ExitCode::from(3));
        }
        errln!(
            "replay: answered from the record up to effect {}, live from there",
            divergence.effect
        );
        print_outcome(args, &prompt_path, &outcome);
        return Ok(exit_code(&outcome));
    }
    Ok(settle(
        args,
        &prompt_path,
        &record,
        &events,
        &outcome,
        &outcome_value,
    ))
}

/// Compare a replay that followed its record with the record, report, and give the status.
fn settle(
    args: &ReplayArgs,
    prompt_path: &std::path::Path,
    record: &Record,
    events: &[Json],
    outcome: &Outcome,
    value: &Json,
) -> ExitCode {
    print_outcome(args, prompt_path, outcome);
    match compare(record, events, value) {
        Some(difference) => {
            errln!("replay: not identical to the record: {difference}");
            ExitCode::from(3)
        }
        None => {
            errln!(
                "replay: identical to the record ({} effects, {} events)",
                record.requests.len(),
                events.len()
            );
            exit_code(outcome)
        }
    }
}

/// A recorded prompt's path as a person would type it here: relative to the current folder
/// when the file is under it (records keep the path absolute).
fn shown_path(path: &std::path::Path) -> std::path::PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            path.strip_prefix(cwd)
                .ok()
                .map(std::path::Path::to_path_buf)
        })
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| path.to_path_buf())
}

fn print_outcome(args: &ReplayArgs, prompt_path: &std::path::Path, outcome: &Outcome) {
    if args.json || args.events {
        // The same bytes `run --json` prints.
        match serde_json::to_string(&outcome_json(outcome)) {
            Ok(line) => outln!("{line}"),
            Err(e) => errln!("error: cannot encode the outcome: {e}"),
        }
        return;
    }
    match outcome {
        Outcome::Completed(result) => crate::report::print_result(result),
        Outcome::Cancelled => errln!("cancelled"),
        Outcome::Failed(err) => errln!(
            "{}",
            crate::source::run_failure_line(&shown_path(prompt_path), err, &err.message)
        ),
    }
}
