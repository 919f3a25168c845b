//! `promptforge runs`: the run history as a user reads it (recent runs, one run's timeline,
//! a run's record).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value as Json, json};

use crate::history::{History, open_existing};
use crate::record::Header;

#[derive(Debug, Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    command: Option<RunsCommand>,
    /// How many recent runs to list.
    #[arg(long, default_value_t = 20)]
    limit: u32,
    /// List as JSON lines.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// One run: its outcome, and a timeline of its sections, tasks, rounds and tool calls.
    Show {
        /// The run's id (from `promptforge runs`), or `last`.
        id: String,
        /// Print the conversation of one model round (1 for the first, in the order the run
        /// made them): the messages sent, the tools offered, and the reply.
        #[arg(long, value_name = "N")]
        round: Option<usize>,
        /// Print as one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also write the run's timeline as a self-contained HTML page.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Write a run's record (what `run --record` writes), for `promptforge replay`.
    Export {
        /// The run's id, or `last`.
        id: String,
        /// Write it here instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

pub fn runs(args: &RunsArgs) -> ExitCode {
    match runs_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            errln!("error: {message}");
            ExitCode::from(1)
        }
    }
}

fn runs_inner(args: &RunsArgs) -> Result<(), String> {
    let (history, path) = open_existing()?;
    match &args.command {
        None => {
            let rows = history.recent(args.limit)?;
            if rows.is_empty() && !args.json {
                outln!("no runs in {}", path.display());
            }
            for row in rows.iter().rev() {
                if args.json {
                    outln!(
                        "{}",
                        json!({"id": row.id, "started_at": row.started_at, "prompt": row.prompt,
                               "outcome": row.outcome, "error_kind": row.error_kind,
                               "wall_ms": row.wall_ms, "rounds": row.rounds,
                               "prompt_tokens": row.prompt_tokens,
                               "completion_tokens": row.completion_tokens, "model": row.model,
                               "seed": row.seed, "cost": row.cost,
                               "cached_rounds": row.cached_rounds})
                    );
                    continue;
                }
                let outcome = match &row.error_kind {
                    Some(kind) => format!("{} ({kind})", row.outcome),
                    None => row.outcome.clone(),
                };
                let cost = match row.cost {
                    Some(cost) => format!("${cost:.4}"),
                    None if row.rounds == 0 => "-".to_owned(),
                    None => "?".to_owned(),
                };
                let rounds = if row.cached_rounds > 0 {
                    format!("{} ({} cached)", row.rounds, row.cached_rounds)
                } else {
                    row.rounds.to_string()
                };
                outln!(
                    "{:>5}  {}  {outcome:<22} {:>9}  {rounds:>3} rounds  {:>7} in / {:>6} out  {cost:>9}  {}",
                    row.id,
                    row.started_at,
                    crate::ui::duration_text(std::time::Duration::from_millis(row.wall_ms as u64)),
                    crate::ui::thousands(row.prompt_tokens as u64),
                    crate::ui::thousands(row.completion_tokens as u64),
                    row.prompt,
                );
            }
            Ok(())
        }
        Some(RunsCommand::Export { id, out }) => {
            let id = history.resolve(id)?;
            match out {
                Some(file) => {
                    let mut tmp = std::io::BufWriter::new(
                        std::fs::File::create(file)
                            .map_err(|e| format!("{}: {e}", file.display()))?,
                    );
                    history.export(id, &mut tmp)?;
                    tmp.flush().map_err(|e| e.to_string())
                }
                None => history.export(id, &mut crate::ui::QuietStdout),
            }
        }
        Some(RunsCommand::Show {
            id,
            round,
            json,
            html,
        }) => {
            let id = history.resolve(id)?;
            let shown = Shown {
                round: *round,
                json: *json,
            };
            show(&history, id, shown, html.as_deref())
        }
    }
}

/// How `runs show` prints.
#[derive(Debug, Clone, Copy)]
struct Shown {
    /// One round's conversation instead of the timeline.
    round: Option<usize>,
    json: bool,
}

/// One model round of a record: its effect, the task that made it, its request, and its
/// answer (`{"value": reply}` or `{"error": ...}`) once taken.
struct Round {
    effect: u64,
    task: String,
    request: Json,
    answer: Option<Json>,
}

/// The round an effect is, numbered from 1 as `--round` takes it.
fn round_of(rounds: &[Round], effect: u64) -> Option<(usize, &Round)> {
    rounds
        .iter()
        .enumerate()
        .find(|(_, r)| r.effect == effect)
        .map(|(i, r)| (i + 1, r))
}

/// `runs show ID`: the outcome and a timeline, or one round's conversation.
fn show(history: &History, id: i64, shown: Shown, html: Option<&Path>) -> Result<(), String> {
    let mut record = Vec::new();
    // A run that has not ended has no record in the history yet, but its journal holds what
    // it did so far (the same lines, the last perhaps cut off): shown from there.
    let mut from_journal = false;
    if let Err(not_kept) = history.export(id, &mut record) {
        match history.unfinished(id) {
            Ok(crate::history::Unfinished::Journal(journal)) => {
                record = std::fs::read(&journal).map_err(|_| not_kept)?;
                from_journal = true;
            }
            _ => return Err(not_kept),
        }
    }
    // (time, the record line it stands for, text): at the same time, the record's own order
    // (an effect at the line that issued it), so a round never shows after the run's end.
    let mut lines: Vec<(u64, usize, String)> = Vec::new();
    let mut files: std::collections::BTreeSet<String> = Default::default();
    let mut header: Option<Header> = None;
    let mut requests: std::collections::BTreeMap<u64, (String, Json, u64, usize)> =
        Default::default();
    let mut timeline = crate::html::Timeline::default();
    let mut open_bands: std::collections::BTreeMap<String, usize> = Default::default();
    let mut bar_at: std::collections::BTreeMap<u64, usize> = Default::default();
    let mut outcome = Json::Null;
    let mut rounds: Vec<Round> = Vec::new();
    for (position, line) in record
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        let Ok(value) = serde_json::from_slice::<Json>(line) else {
            continue;
        };
        if header.is_none() {
            header = serde_json::from_value(value).ok();
            continue;
        }
        let t = value["t"].as_u64().unwrap_or(0);
        timeline.total_ms = timeline.total_ms.max(t);
        if let Some(effect) = value["effect"].as_u64() {
            let kind = value["request"]["effect"].as_str().unwrap_or("").to_owned();
            bar_at.insert(effect, timeline.bars.len());
            timeline.bars.push(crate::html::Bar {
                effect,
                task: value["task"].as_str().unwrap_or("0").to_owned(),
                kind: kind.clone(),
                start_ms: t,
                end_ms: None,
                label: kind.replace('_', " "),
                request: value["request"]["request"].clone(),
                answer: None,
            });
            if kind == "model_round" {
                rounds.push(Round {
                    effect,
                    task: value["task"].as_str().unwrap_or("0").to_owned(),
                    request: value["request"]["request"].clone(),
                    answer: None,
                });
            }
            requests.insert(
                effect,
                (kind, value["request"]["request"].clone(), t, position),
            );
        } else if let Some(effect) = value["answer"].as_u64() {
            if let Some(&at) = bar_at.get(&effect) {
                timeline.bars[at].end_ms = Some(t);
                timeline.bars[at].answer = Some(value["value"].clone());
            }
            if let Some(round) = rounds.iter_mut().find(|r| r.effect == effect) {
                round.answer = Some(value["value"].clone());
            }
            let Some((kind, request, issued, issued_at)) = requests.get(&effect) else {
                continue;
            };
            let took = t.saturating_sub(*issued);
            let text = match kind.as_str() {
                "model_round" => {
                    let tokens = tokens_text(&value["value"]["value"]);
                    let failed = value["value"].get("error").is_some();
                    let (n, task) =
                        round_of(&rounds, effect).map_or((0, "0"), |(n, r)| (n, r.task.as_str()));
                    format!(
                        "[task {task}] model round {n} (effect {effect}, {}){}: {}{tokens}",
                        crate::ui::plural(
                            request["messages"].as_array().map_or(0, Vec::len) as u64,
                            "message"
                        ),
                        if failed { " failed" } else { "" },
                        crate::ui::duration_text(std::time::Duration::from_millis(took))
                    )
                }
                "store" => {
                    let (op, path) = (
                        request["op"].as_str().unwrap_or(""),
                        request["path"].as_str().unwrap_or(""),
                    );
                    let ok = value["value"].get("error").is_none();
                    match op {
                        "write" | "append" | "str_replace" if ok => {
                            files.insert(path.to_owned());
                        }
                        "delete" if ok => {
                            files.remove(path);
                        }
                        _ => {}
                    }
                    format!("store {op} {path}")
                }
                other => format!(
                    "{} {effect}: {}",
                    other.replace('_', " "),
                    crate::ui::duration_text(std::time::Duration::from_millis(took))
                ),
            };
            lines.push((*issued, *issued_at, text));
        } else if let Some(event) = value.get("event") {
            let task = event["task"].as_str().unwrap_or("0");
            let name = event["event"].as_str().unwrap_or("");
            match name {
                "section_started" => {
                    if let Some(at) = open_bands.remove(task) {
                        timeline.bands[at].end_ms = Some(t);
                    }
                    open_bands.insert(task.to_owned(), timeline.bands.len());
                    timeline.bands.push(crate::html::Band {
                        task: task.to_owned(),
                        section: event["section"].as_str().unwrap_or("").to_owned(),
                        start_ms: t,
                        end_ms: None,
                    });
                }
                "section_finished" => {
                    if let Some(at) = open_bands.remove(task) {
                        timeline.bands[at].end_ms = Some(t);
                    }
                }
                _ => {}
            }
            let what = match name {
                "section_started" | "section_finished" => {
                    format!("{name} `{}`", event["section"].as_str().unwrap_or(""))
                }
                "log" => format!(
                    "log [{}] {}",
                    event["section"].as_str().unwrap_or(""),
                    event["message"].as_str().unwrap_or("")
                ),
                "task_spawned" => format!(
                    "task_spawned {} → `{}`",
                    event["id"].as_str().unwrap_or(""),
                    event["target"].as_str().unwrap_or("")
                ),
                "task_ended" => format!("task_ended {}", event["ending"].as_str().unwrap_or("")),
                "tool_call" => format!(
                    "tool call {} ({}) in `{}`{}",
                    event["tool"].as_str().unwrap_or(""),
                    event["via"].as_str().unwrap_or(""),
                    event["section"].as_str().unwrap_or(""),
                    if event["ok"] == Json::Bool(false) {
                        ": failed"
                    } else {
                        ""
                    }
                ),
                // The round's own line (from its effect) says more, with its timing.
                "model_round" => continue,
                "block_started"
                | "block_succeeded"
                | "block_failed"
                | "teardown_started"
                | "teardown_succeeded"
                | "shared_load_started"
                | "shared_load_succeeded"
                | "task_started" => continue,
                other => other.to_owned(),
            };
            lines.push((t, position, format!("[task {task}] {what}")));
        } else if let Some(o) = value.get("outcome") {
            outcome = o.clone();
        }
    }
    let Some(header) = header else {
        return Err(format!("run {id} has no header"));
    };
    if let Some(n) = shown.round {
        let Some(round) = n.checked_sub(1).and_then(|i| rounds.get(i)) else {
            if rounds.is_empty() {
                return Err(format!("run {id} made no model round"));
            }
            return Err(format!(
                "run {id} has {}; --round takes 1 to {}",
                crate::ui::plural(rounds.len() as u64, "model round"),
                rounds.len()
            ));
        };
        if shown.json {
            outln!("{}", round_json(n, round));
        } else {
            print_round(id, n, rounds.len(), round, !from_journal);
        }
        return Ok(());
    }
    // Effects still out (a run not ended): shown where they were issued, as waiting.
    if from_journal {
        let answered: std::collections::BTreeSet<u64> = timeline
            .bars
            .iter()
            .filter(|b| b.end_ms.is_some())
            .map(|b| b.effect)
            .collect();
        for (effect, (kind, _, issued, issued_at)) in &requests {
            if answered.contains(effect) {
                continue;
            }
            let text = match round_of(&rounds, *effect) {
                Some((n, round)) => format!(
                    "[task {}] model round {n} (effect {effect}): waiting for the model",
                    round.task
                ),
                None => format!("{} {effect}: waiting", kind.replace('_', " ")),
            };
            lines.push((*issued, *issued_at, text));
        }
    }
    lines.sort_by_key(|(t, position, _)| (*t, *position));
    if shown.json {
        let value = json!({
            "id": id,
            "prompt": header.prompt.path,
            "started_at": header.when,
            "seed": header.seed,
            "model": header.host.model.as_ref().map(|m| m.id.clone()),
            "args": header.args,
            "outcome": outcome,
            "ended": !from_journal,
            "timeline": lines.iter().map(|(t, _, text)| json!({"t_ms": t, "text": text})).collect::<Vec<_>>(),
            "rounds": rounds.iter().enumerate().map(|(i, r)| round_json(i + 1, r)).collect::<Vec<_>>(),
            "files": files,
        });
        outln!("{value}");
        return Ok(());
    }
    outln!("run {id}: {}", header.prompt.path.display());
    if from_journal {
        outln!("  (not ended: what its journal holds so far)");
    }
    outln!(
        "  started {}  seed {}  model {}",
        header.when,
        header.seed,
        header.host.model.as_ref().map_or("none", |m| m.id.as_str())
    );
    if let Some(args) = &header.args {
        outln!("  args {}", json!(args));
    }
    match outcome["outcome"].as_str() {
        Some("completed") => outln!("  completed: {}", json!(outcome["result"])),
        Some("failed") => outln!(
            "  failed ({}): {}",
            outcome["error"]["kind"].as_str().unwrap_or(""),
            outcome["error"]["message"].as_str().unwrap_or("")
        ),
        Some(other) => outln!("  {other}"),
        None if from_journal => outln!("  not ended"),
        None => outln!("  (no outcome recorded)"),
    }
    outln!("timeline:");
    for (t, _, text) in lines {
        outln!(
            "  +{:>7}  {text}",
            crate::ui::duration_text(std::time::Duration::from_millis(t))
        );
    }
    if !files.is_empty() {
        outln!("store files it left:");
        for file in &files {
            outln!("  {file}");
        }
    }
    if let Some(path) = html {
        timeline.title = format!("run {id}: {}", header.prompt.path.display());
        timeline.outcome = outcome["outcome"].as_str().unwrap_or("unknown").to_owned();
        let rounds = timeline
            .bars
            .iter()
            .filter(|b| b.kind == "model_round")
            .count();
        timeline.summary = format!(
            "started {} · seed {} · model {} · {} · {} · {} effects",
            header.when,
            header.seed,
            header.host.model.as_ref().map_or("none", |m| m.id.as_str()),
            crate::ui::duration_text(std::time::Duration::from_millis(timeline.total_ms)),
            crate::ui::plural(rounds as u64, "model round"),
            timeline.bars.len()
        );
        std::fs::write(path, timeline.html())
            .map_err(|e| format!("--html {}: {e}", path.display()))?;
        outln!("timeline written to {}", path.display());
    }
    Ok(())
}

/// `, N in / M out tokens` for a reply that reported its usage, else nothing.
fn tokens_text(reply: &Json) -> String {
    let usage = &reply["usage"];
    if usage.is_object() {
        format!(
            ", {} in / {} out tokens",
            usage["prompt_tokens"], usage["completion_tokens"]
        )
    } else {
        String::new()
    }
}

/// A round as `runs show --json` prints it: the request as sent (model, messages, tools) and
/// the answer as taken.
fn round_json(n: usize, round: &Round) -> Json {
    json!({
        "round": n,
        "effect": round.effect,
        "task": round.task,
        "model": round.request["model"],
        "messages": round.request["messages"],
        "tools": round.request["tools"],
        "reply": round.answer.as_ref().and_then(|a| a.get("value")),
        "error": round.answer.as_ref().and_then(|a| a.get("error")),
    })
}

/// One round's conversation for people: each message sent, the tools offered, the reply.
fn print_round(id: i64, n: usize, of: usize, round: &Round, ended: bool) {
    let model = &round.request["model"];
    outln!(
        "run {id}, model round {n} of {of} (effect {}, task {}): {} on {}",
        round.effect,
        round.task,
        model["name"].as_str().unwrap_or(""),
        model["model_id"].as_str().unwrap_or("")
    );
    let tools: Vec<&str> = round.request["tools"]
        .as_array()
        .map(|tools| tools.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    if !tools.is_empty() {
        outln!("tools offered: {}", tools.join(", "));
    }
    outln!("sent:");
    for message in round.request["messages"].as_array().into_iter().flatten() {
        let role = message["role"].as_str().unwrap_or("?");
        let role = match message["tool_call_id"].as_str() {
            Some(call) => format!("{role} {call}"),
            None => role.to_owned(),
        };
        print_message(&role, message);
    }
    match &round.answer {
        None if ended => outln!("no answer recorded (the run ended first)"),
        None => outln!("no answer yet (the run has not ended)"),
        Some(answer) => match (answer.get("value"), answer.get("error")) {
            (Some(reply), _) if reply.get("overflow").is_some() => {
                outln!("reply: the provider refused the request as too long for the context")
            }
            (Some(reply), _) => {
                let tokens = tokens_text(reply);
                outln!(
                    "reply (finish {}{tokens}):",
                    reply["finish_reason"].as_str().unwrap_or("unknown")
                );
                print_message("assistant", reply);
            }
            (None, Some(error)) => outln!(
                "failed ({}): {}",
                error["kind"].as_str().unwrap_or(""),
                error["message"].as_str().unwrap_or("")
            ),
            (None, None) => outln!("reply: {answer}"),
        },
    }
}

/// A message's text (content parts joined, images named) and its tool calls, indented.
fn print_message(role: &str, message: &Json) {
    let text = match &message.get("content").or(message.get("text")) {
        Some(Json::String(text)) => text.clone(),
        Some(Json::Array(parts)) => parts
            .iter()
            .map(|part| match part["type"].as_str() {
                Some("text") => part["text"].as_str().unwrap_or("").to_owned(),
                Some(other) => format!("[{other}]"),
                None => String::new(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    outln!("  [{role}]");
    for line in text.lines() {
        outln!("    {line}");
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        outln!(
            "    → call {} {} (id {})",
            call["name"].as_str().unwrap_or(""),
            call["arguments"],
            call["id"].as_str().unwrap_or("")
        );
    }
}
