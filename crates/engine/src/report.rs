//! The events a section's model rounds and tool calls add to the stream: what an entry waits
//! on when it issues a round or a bound tool call, and the event its answer makes when the
//! walk delivers it (in the committed order, so the stream never depends on timing), plus the
//! VM's own reports (`log` checkpoints, local handlers and task built-ins).

use promptforge_lua::vm::VmReport;
use serde_json::Value as Json;

use crate::events::{EventKind, RoundEnd, ToolVia};
use crate::protocol::{Answer, Effect};
use crate::strand::Awaiting;

/// What an entry that issues `effect` waits on, when its answer makes an event.
pub(crate) fn awaiting(effect: &Effect) -> Option<Awaiting> {
    match effect {
        Effect::ModelRound(round) => Some(Awaiting::Round {
            model: round.model.name.clone(),
            model_id: round.model.model_id.clone(),
        }),
        Effect::Tool { alias, .. } => Some(Awaiting::Tool {
            alias: alias.clone(),
        }),
        Effect::Store(_) | Effect::Ask | Effect::Timer { .. } => None,
    }
}

/// The event an awaited answer makes.
pub(crate) fn answered(section: &str, awaiting: Awaiting, answer: &Answer) -> EventKind {
    match awaiting {
        Awaiting::Round { model, model_id } => EventKind::ModelRound {
            section: section.to_owned(),
            model,
            model_id,
            end: round_end(answer),
        },
        Awaiting::Tool { alias } => EventKind::ToolCall {
            section: section.to_owned(),
            tool: alias,
            via: ToolVia::Bound,
            ok: matches!(answer, Answer::Value(_)),
        },
    }
}

/// How a round ended, read from its answer (the reply JSON the section reads, an overflow,
/// or an error value).
fn round_end(answer: &Answer) -> RoundEnd {
    let reply = match answer {
        Answer::Error(error) => {
            return RoundEnd::Failed {
                kind: error.kind.clone(),
            };
        }
        Answer::Value(reply) => reply,
    };
    if reply.get("overflow").and_then(Json::as_bool) == Some(true) {
        return RoundEnd::Overflow;
    }
    let usage = reply.get("usage");
    let tokens = |field: &str| usage.and_then(|u| u.get(field)).and_then(Json::as_u64);
    RoundEnd::Reply {
        finish_reason: reply
            .get("finish_reason")
            .and_then(Json::as_str)
            .map(str::to_owned),
        prompt_tokens: tokens("prompt_tokens"),
        completion_tokens: tokens("completion_tokens"),
        tool_calls: reply
            .get("tool_calls")
            .and_then(Json::as_array)
            .map_or(0, Vec::len),
    }
}

/// The event a VM report makes.
pub(crate) fn of_vm(section: &str, report: VmReport) -> EventKind {
    match report {
        VmReport::Log(message) => EventKind::Log {
            section: section.to_owned(),
            message,
        },
        VmReport::Tool { name, via, ok } => EventKind::ToolCall {
            section: section.to_owned(),
            tool: name,
            via: ToolVia::from_name(&via).unwrap_or(ToolVia::Local),
            ok,
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::ErrorValue;

    #[test]
    fn a_round_answer_reads_as_its_end() {
        let reply = Answer::Value(json!({
            "text": "", "tool_calls": [{"id": "c1"}, {"id": "c2"}], "finish_reason": "tool_calls",
            "usage": {"prompt_tokens": 12, "completion_tokens": 3}
        }));
        assert_eq!(
            round_end(&reply),
            RoundEnd::Reply {
                finish_reason: Some("tool_calls".into()),
                prompt_tokens: Some(12),
                completion_tokens: Some(3),
                tool_calls: 2,
            }
        );
        let unmetered = Answer::Value(json!({"text": "x", "tool_calls": [], "usage": null}));
        assert_eq!(
            round_end(&unmetered),
            RoundEnd::Reply {
                finish_reason: None,
                prompt_tokens: None,
                completion_tokens: None,
                tool_calls: 0,
            }
        );
        assert_eq!(
            round_end(&Answer::Value(json!({"overflow": true}))),
            RoundEnd::Overflow
        );
        let failed = Answer::Error(ErrorValue::lua("x"));
        assert_eq!(round_end(&failed), RoundEnd::Failed { kind: "lua".into() });
    }

    #[test]
    fn a_bound_tool_answer_and_vm_reports_make_tool_events() {
        let awaiting = Awaiting::Tool {
            alias: "search".into(),
        };
        assert_eq!(
            answered("Main", awaiting, &Answer::Error(ErrorValue::lua("x"))),
            EventKind::ToolCall {
                section: "Main".into(),
                tool: "search".into(),
                via: ToolVia::Bound,
                ok: false,
            }
        );
        let report = VmReport::Tool {
            name: "task".into(),
            via: "task".into(),
            ok: true,
        };
        assert_eq!(
            of_vm("Main", report),
            EventKind::ToolCall {
                section: "Main".into(),
                tool: "task".into(),
                via: ToolVia::Task,
                ok: true,
            }
        );
    }
}
