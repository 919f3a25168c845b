//! What a command reports about a run: the outcome object of the CLI contract, events as JSON
//! lines, exit statuses, and how the terminal is used.

use std::process::ExitCode;

use promptforge_engine::events::RoundEnd;
use promptforge_engine::{Event, EventKind, Outcome, TaskEnding};
use serde::Serialize;
use serde_json::Value as Json;

/// The outcome object of the CLI contract.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub(crate) enum OutcomeJson {
    Completed { result: String },
    Cancelled,
    Failed { error: ErrorJson },
}

#[derive(Debug, Serialize)]
pub(crate) struct ErrorJson {
    kind: String,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    parse_kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    column: Option<u32>,
}

pub(crate) fn outcome_json(outcome: &Outcome) -> OutcomeJson {
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

pub(crate) fn event_json(event: &Event) -> serde_json::Value {
    use serde_json::json;
    let mut value = match &event.kind {
        EventKind::SectionStarted { section, id } => {
            json!({"event": "section_started", "section": section, "id": id})
        }
        EventKind::SharedLoadStarted { section } => {
            json!({"event": "shared_load_started", "section": section})
        }
        EventKind::SharedLoadSucceeded { section } => {
            json!({"event": "shared_load_succeeded", "section": section})
        }
        EventKind::SharedLoadFailed { section } => {
            json!({"event": "shared_load_failed", "section": section})
        }
        EventKind::BlockStarted { section, label } => {
            json!({"event": "block_started", "section": section, "block": label})
        }
        EventKind::BlockSucceeded { section, label } => {
            json!({"event": "block_succeeded", "section": section, "block": label})
        }
        EventKind::BlockFailed { section } => json!({"event": "block_failed", "section": section}),
        EventKind::Log { section, message } => {
            json!({"event": "log", "section": section, "message": message})
        }
        EventKind::TeardownStarted { section } => {
            json!({"event": "teardown_started", "section": section})
        }
        EventKind::TeardownSucceeded { section } => {
            json!({"event": "teardown_succeeded", "section": section})
        }
        EventKind::SectionFinished { section } => {
            json!({"event": "section_finished", "section": section})
        }
        EventKind::TaskSpawned {
            id, target, origin, ..
        } => json!({
            "event": "task_spawned", "id": id, "target": target, "origin": origin.as_str()
        }),
        EventKind::TaskStarted => json!({"event": "task_started"}),
        EventKind::ModelRound {
            section,
            model,
            model_id,
            end,
        } => {
            let mut value = json!({
                "event": "model_round", "section": section, "model": model, "model_id": model_id
            });
            let fields = match end {
                RoundEnd::Reply {
                    finish_reason,
                    prompt_tokens,
                    completion_tokens,
                    tool_calls,
                } => json!({
                    "finish_reason": finish_reason,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "tool_calls": tool_calls,
                }),
                RoundEnd::Overflow => json!({"finish_reason": "overflow"}),
                RoundEnd::Failed { kind } => json!({"error": kind}),
            };
            if let (Some(map), Json::Object(fields)) = (value.as_object_mut(), fields) {
                map.extend(fields);
            }
            value
        }
        EventKind::ToolCall {
            section,
            tool,
            via,
            ok,
        } => json!({
            "event": "tool_call", "section": section, "tool": tool, "via": via.as_str(), "ok": ok
        }),
        EventKind::TaskEnded { ending } => {
            let (state, reason) = match ending {
                TaskEnding::Succeeded => ("succeeded", None),
                TaskEnding::Failed => ("failed", None),
                TaskEnding::Cancelled => ("cancelled", None),
                TaskEnding::Abandoned(reason) => ("abandoned", Some(reason.as_str())),
            };
            let mut value = json!({"event": "task_ended", "ending": state});
            if let (Some(reason), Some(map)) = (reason, value.as_object_mut()) {
                map.insert("reason".into(), json!(reason));
            }
            value
        }
        EventKind::RunEnded { outcome } => json!({"event": "run_ended", "outcome": match outcome {
            Outcome::Completed(_) => "completed",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed(_) => "failed",
        }}),
    };
    if let Some(map) = value.as_object_mut() {
        map.insert("task".into(), json!(event.task));
    }
    value
}

/// A run's exit status: 0 completed, 1 failed, 130 cancelled.
pub(crate) fn exit_code(outcome: &Outcome) -> ExitCode {
    match outcome {
        Outcome::Completed(_) => ExitCode::SUCCESS,
        Outcome::Failed(_) => ExitCode::from(1),
        Outcome::Cancelled => ExitCode::from(130),
    }
}

/// How the terminal is used: from the global flags and whether stderr is a terminal.
#[derive(Debug, Clone, Copy)]
pub struct Ui {
    /// Draw live progress (stderr is a terminal and `--quiet` is not given).
    pub progress: bool,
    /// `-v` count.
    pub verbose: u8,
    /// `-q`: no progress display and no summary table.
    pub quiet: bool,
}

/// A completed run's result on stdout as a line of text: a final newline is added when it
/// has none (as a text file ends), so a shell prompt or the next piped line starts clean.
/// `--json` carries the exact bytes.
pub(crate) fn print_result(result: &str) {
    if result.ends_with('\n') || result.is_empty() {
        out!("{result}");
    } else {
        outln!("{result}");
    }
}
