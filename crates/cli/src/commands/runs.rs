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
    /// One run: its outcome, and a timeline of its sections, tasks and rounds.
    Show {
        /// The run's id (from `promptforge runs`).
        id: i64,
        /// Also write the run's timeline as a self-contained HTML page.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Write a run's record (what `run --record` writes), for `promptforge replay`.
    Export {
        /// The run's id.
        id: i64,
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
            for (id, when, prompt, outcome, kind, ms, rounds, pin, pout, model, seed) in
                rows.iter().rev()
            {
                if args.json {
                    outln!(
                        "{}",
                        json!({"id": id, "started_at": when, "prompt": prompt, "outcome": outcome,
                               "error_kind": kind, "wall_ms": ms, "rounds": rounds,
                               "prompt_tokens": pin, "completion_tokens": pout, "model": model,
                               "seed": seed})
                    );
                    continue;
                }
                let outcome = match kind {
                    Some(kind) => format!("{outcome} ({kind})"),
                    None => outcome.clone(),
                };
                outln!(
                    "{id:>5}  {when}  {outcome:<22} {:>9}  {:>3} rounds  {:>7} in / {:>6} out  {prompt}",
                    crate::ui::duration_text(std::time::Duration::from_millis(*ms as u64)),
                    rounds,
                    crate::ui::thousands(*pin as u64),
                    crate::ui::thousands(*pout as u64),
                );
            }
            Ok(())
        }
        Some(RunsCommand::Export { id, out }) => match out {
            Some(file) => {
                let mut tmp = std::io::BufWriter::new(
                    std::fs::File::create(file).map_err(|e| format!("{}: {e}", file.display()))?,
                );
                history.export(*id, &mut tmp)?;
                tmp.flush().map_err(|e| e.to_string())
            }
            None => history.export(*id, &mut crate::ui::QuietStdout),
        },
        Some(RunsCommand::Show { id, html }) => show(&history, *id, html.as_deref()),
    }
}

/// `runs show ID`: the outcome and a timeline.
fn show(history: &History, id: i64, html: Option<&Path>) -> Result<(), String> {
    let mut record = Vec::new();
    history.export(id, &mut record)?;
    // (time, 0 for an event and 1 for an effect, so a section shows before its calls, text).
    let mut lines: Vec<(u64, u8, String)> = Vec::new();
    let mut files: std::collections::BTreeSet<String> = Default::default();
    let mut header: Option<Header> = None;
    let mut requests: std::collections::BTreeMap<u64, (String, Json, u64)> = Default::default();
    let mut timeline = crate::html::Timeline::default();
    let mut open_bands: std::collections::BTreeMap<String, usize> = Default::default();
    let mut bar_at: std::collections::BTreeMap<u64, usize> = Default::default();
    let mut outcome = Json::Null;
    for line in record.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
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
            requests.insert(effect, (kind, value["request"]["request"].clone(), t));
        } else if let Some(effect) = value["answer"].as_u64() {
            if let Some(&at) = bar_at.get(&effect) {
                timeline.bars[at].end_ms = Some(t);
                timeline.bars[at].answer = Some(value["value"].clone());
            }
            let Some((kind, request, issued)) = requests.get(&effect) else {
                continue;
            };
            let took = t.saturating_sub(*issued);
            let text = match kind.as_str() {
                "model_round" => {
                    let reply = &value["value"]["value"];
                    let usage = &reply["usage"];
                    let tokens = if usage.is_object() {
                        format!(
                            ", {} in / {} out tokens",
                            usage["prompt_tokens"], usage["completion_tokens"]
                        )
                    } else {
                        String::new()
                    };
                    let failed = value["value"].get("error").is_some();
                    format!(
                        "model round {effect} ({} messages){}: {}{tokens}",
                        request["messages"].as_array().map_or(0, Vec::len),
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
            lines.push((*issued, 1, text));
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
            lines.push((t, 0, format!("[task {task}] {what}")));
        } else if let Some(o) = value.get("outcome") {
            outcome = o.clone();
        }
    }
    let Some(header) = header else {
        return Err(format!("run {id} has no header"));
    };
    outln!("run {id}: {}", header.prompt.path.display());
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
        None => outln!("  (no outcome recorded)"),
    }
    outln!("timeline:");
    lines.sort_by_key(|(t, rank, _)| (*t, *rank));
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
