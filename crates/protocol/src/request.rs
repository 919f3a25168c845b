//! What a section asks its engine for when it suspends: one typed request per suspending call.
//!
//! The section VM decodes what its shim yielded (an operation name and a payload of JSON data)
//! into a [`SectionRequest`] once, at the yield; the engine matches on the variant and never
//! reads a field by name. A model round arrives already typed ([`ModelRound`]: the VM builds
//! its messages from the loop's checked list without a JSON form in between). Arguments the
//! shim checked in Lua arrive checked; what only the engine can check (a section target
//! against the visible set, a task id against ownership, a store path) is checked there.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value as Json;

use crate::effect::{ASK_TOOL_PATH, ModelRound};

/// A suspending call's request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SectionRequest {
    /// A `store.*` call (chapter 09), its arguments as the section passed them.
    Store(StoreCall),
    /// `call(target, input?)`.
    Call {
        /// The section reference, as written.
        target: String,
        /// The callee's input, when given.
        input: Option<String>,
    },
    /// `fanout(worker, collection)`: the collection's members, in order.
    Fanout {
        /// The worker section reference.
        worker: String,
        /// The members (JSON data).
        items: Vec<Json>,
    },
    /// The shim's pause before it reads or changes run-wide model state while the strand ran
    /// ahead of the committed order.
    Sync,
    /// `input.ask()`.
    Ask,
    /// A call to a bound tool, by the section or by the model.
    ToolCall {
        /// The alias it was called by.
        alias: String,
        /// The tool path.
        path: String,
        /// The arguments (a JSON object).
        args: Json,
    },
    /// A model round (`models.loop` or `models.infer`).
    Round(ModelRound),
    /// A `tasks.*` call or one of the model's task built-ins (chapter 15).
    Tasks(TasksCall),
}

/// A `tasks.*` call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TasksCall {
    /// `tasks.spawn(target, opts)`.
    Spawn {
        /// The section reference.
        target: String,
        /// `opts.input`.
        input: Option<String>,
        /// `opts.item`, when given (JSON data; `null` is a given item).
        item: Option<Json>,
        /// `opts.index`.
        index: Option<i64>,
    },
    /// `tasks.join_any(set, opts)` (`all` false) or `tasks.join(set, opts)` (`all` true).
    Wait {
        /// Every member of the set must end (`tasks.join`).
        all: bool,
        /// The task ids of the set, in order.
        members: Vec<String>,
        /// `opts.timeout` in seconds.
        timeout: Option<f64>,
    },
    /// `tasks.concurrency(n?)`.
    Concurrency {
        /// The new limit, when given.
        limit: Option<u64>,
    },
    /// `tasks.ready(t)`.
    Ready {
        /// The task id.
        task: String,
    },
    /// `tasks.status(t)`.
    Status {
        /// The task id.
        task: String,
    },
    /// `tasks.pending(filter?)`.
    Pending {
        /// `filter.origin`.
        origin: Option<String>,
    },
    /// `tasks.note(text)`.
    Note {
        /// The note.
        text: String,
    },
    /// `tasks.cancel(t)`.
    Cancel {
        /// The task id.
        task: String,
    },
    /// One of the model's task built-ins (`task`, `task_status`, `task_cancel`,
    /// `await_tasks`), called from `models.loop`.
    Tool {
        /// The built-in's name.
        name: String,
        /// The model's arguments.
        args: Json,
        /// The targets `tools.allow_tasks` allows, when it named some.
        allow: Option<Vec<String>>,
    },
    /// The task notices waiting for the section's next round.
    Notices,
}

/// A store call as the section made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreCall {
    /// The operation: `read`, `read_numbered`, `write`, `append`, `str_replace`, `delete`,
    /// `exists` or `glob`.
    pub op: String,
    /// The path (every operation but `glob`).
    #[serde(default)]
    pub path: String,
    /// `write`/`append` contents.
    #[serde(default)]
    pub contents: String,
    /// `str_replace`'s anchor.
    #[serde(default)]
    pub old: String,
    /// `str_replace`'s replacement.
    #[serde(default)]
    pub new: String,
    /// `glob`'s pattern.
    #[serde(default)]
    pub pattern: String,
    /// `read`/`read_numbered`'s first line bound.
    #[serde(default)]
    pub first: Option<Bound>,
    /// `read`/`read_numbered`'s last line bound.
    #[serde(default)]
    pub last: Option<Bound>,
}

/// A line bound as the section passed it: its Lua type (`nil`, `integer`, `number`,
/// `string`, ...) and, for a number, its value. The engine checks it (chapter 09, "Bound
/// values").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bound {
    /// The Lua type name, `integer` and `number` told apart.
    #[serde(rename = "type")]
    pub type_name: String,
    /// The value of a number.
    #[serde(default)]
    pub value: Option<Json>,
}

impl SectionRequest {
    /// The request a section's shim yielded as `(op, payload)`; `Err` names what was malformed
    /// (the shim is trusted, so this is an internal error). Model rounds are not decoded here:
    /// the VM builds them itself.
    pub fn decode(op: &str, payload: Json) -> Result<SectionRequest, String> {
        let malformed = |e: serde_json::Error| format!("malformed {op} request: {e}");
        let fields = |payload: Json| -> Result<Fields, String> {
            serde_json::from_value(normalize(payload)).map_err(malformed)
        };
        Ok(match op {
            "store" => SectionRequest::Store(
                serde_json::from_value(normalize(payload)).map_err(malformed)?,
            ),
            "call" => {
                let f = fields(payload)?;
                SectionRequest::Call {
                    target: f.target,
                    input: f.input,
                }
            }
            "fanout" => {
                let f = fields(payload)?;
                SectionRequest::Fanout {
                    worker: f.worker,
                    items: f.items,
                }
            }
            "sync" => SectionRequest::Sync,
            "input.ask" => SectionRequest::Ask,
            "tool.call" => {
                let f = fields(payload)?;
                SectionRequest::ToolCall {
                    alias: f.alias,
                    path: f.path,
                    args: match f.args {
                        Some(Json::Object(map)) => Json::Object(map),
                        _ => Json::Object(serde_json::Map::new()),
                    },
                }
            }
            tasks if tasks.starts_with("tasks.") => {
                let f = fields(payload)?;
                SectionRequest::Tasks(match tasks {
                    "tasks.spawn" => TasksCall::Spawn {
                        target: f.target,
                        input: f.input,
                        item: f.has_item.then(|| f.item.unwrap_or(Json::Null)),
                        index: f.index,
                    },
                    "tasks.join_any" | "tasks.join" => TasksCall::Wait {
                        all: tasks == "tasks.join",
                        members: f.members,
                        timeout: f.timeout,
                    },
                    "tasks.concurrency" => TasksCall::Concurrency {
                        limit: f.limit.as_ref().and_then(Json::as_u64),
                    },
                    "tasks.ready" => TasksCall::Ready { task: f.task },
                    "tasks.status" => TasksCall::Status { task: f.task },
                    "tasks.pending" => TasksCall::Pending { origin: f.origin },
                    "tasks.note" => TasksCall::Note { text: f.text },
                    "tasks.cancel" => TasksCall::Cancel { task: f.task },
                    "tasks.tool" => TasksCall::Tool {
                        name: f.name,
                        args: f.args.unwrap_or(Json::Null),
                        allow: f.allow,
                    },
                    "tasks.notices" => TasksCall::Notices,
                    other => return Err(format!("unknown tasks operation `{other}`")),
                })
            }
            other => return Err(format!("unsupported suspending request `{other}`")),
        })
    }

    /// The call's operation name, as the shim yields it (`store`, `call`, `tasks.spawn`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            SectionRequest::Store(_) => "store",
            SectionRequest::Call { .. } => "call",
            SectionRequest::Fanout { .. } => "fanout",
            SectionRequest::Sync => "sync",
            SectionRequest::Ask => "input.ask",
            SectionRequest::ToolCall { .. } => "tool.call",
            SectionRequest::Round(round) if round.infer => "model.infer",
            SectionRequest::Round(_) => "model.loop",
            SectionRequest::Tasks(call) => match call {
                TasksCall::Spawn { .. } => "tasks.spawn",
                TasksCall::Wait { all: false, .. } => "tasks.join_any",
                TasksCall::Wait { all: true, .. } => "tasks.join",
                TasksCall::Concurrency { .. } => "tasks.concurrency",
                TasksCall::Ready { .. } => "tasks.ready",
                TasksCall::Status { .. } => "tasks.status",
                TasksCall::Pending { .. } => "tasks.pending",
                TasksCall::Note { .. } => "tasks.note",
                TasksCall::Cancel { .. } => "tasks.cancel",
                TasksCall::Tool { .. } => "tasks.tool",
                TasksCall::Notices => "tasks.notices",
            },
        }
    }

    /// Whether a strand running ahead of the committed order may make this call: model
    /// rounds, tool calls (but the operator's ask tool) and `call` depend only on the strand's
    /// own state. Everything else (store calls, fanouts, tasks, questions, the shim's `sync`)
    /// observes or changes what other strands see, so it waits for the committed order.
    pub fn is_local(&self) -> bool {
        match self {
            SectionRequest::Round(_) | SectionRequest::Call { .. } => true,
            SectionRequest::ToolCall { path, .. } => path != ASK_TOOL_PATH,
            _ => false,
        }
    }
}

/// The fields the shim's payloads use, each absent when not given. A Lua table reaches JSON as
/// an object when it is empty, so an empty list arrives as `{}`: [`normalize`] and
/// [`seq_or_empty`] read it as an empty list.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Fields {
    target: String,
    input: Option<String>,
    worker: String,
    #[serde(deserialize_with = "seq_or_empty")]
    items: Vec<Json>,
    alias: String,
    path: String,
    args: Option<Json>,
    item: Option<Json>,
    has_item: bool,
    index: Option<i64>,
    #[serde(deserialize_with = "seq_or_empty")]
    members: Vec<String>,
    timeout: Option<f64>,
    limit: Option<Json>,
    task: String,
    origin: Option<String>,
    text: String,
    name: String,
    #[serde(deserialize_with = "opt_seq_or_empty")]
    allow: Option<Vec<String>>,
}

/// A payload that is not an object (an empty Lua table, or none) as an empty object.
fn normalize(payload: Json) -> Json {
    match payload {
        Json::Object(map) => Json::Object(map),
        _ => Json::Object(serde_json::Map::new()),
    }
}

/// A list, where an empty Lua table arrives as `{}`.
fn seq_or_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    match Json::deserialize(deserializer)? {
        Json::Array(items) => items
            .into_iter()
            .map(|item| serde_json::from_value(item).map_err(serde::de::Error::custom))
            .collect(),
        _ => Ok(Vec::new()),
    }
}

/// [`seq_or_empty`] for an optional list.
fn opt_seq_or_empty<'de, D, T>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    match Json::deserialize(deserializer)? {
        Json::Null => Ok(None),
        Json::Array(items) => items
            .into_iter()
            .map(|item| serde_json::from_value(item).map_err(serde::de::Error::custom))
            .collect::<Result<Vec<T>, D::Error>>()
            .map(Some),
        // An empty Lua table names no list: no restriction, as for an absent one.
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code

    use serde_json::json;

    use super::*;

    #[test]
    fn every_suspending_call_decodes() {
        let cases = [
            (
                "call",
                json!({"target": "## A", "input": "x"}),
                SectionRequest::Call {
                    target: "## A".into(),
                    input: Some("x".into()),
                },
            ),
            (
                "fanout",
                json!({"worker": "## W", "items": {}}),
                SectionRequest::Fanout {
                    worker: "## W".into(),
                    items: Vec::new(),
                },
            ),
            ("sync", Json::Null, SectionRequest::Sync),
            ("input.ask", json!({}), SectionRequest::Ask),
            (
                "tool.call",
                json!({"alias": "f", "path": "p/f", "args": {}}),
                SectionRequest::ToolCall {
                    alias: "f".into(),
                    path: "p/f".into(),
                    args: json!({}),
                },
            ),
            (
                "tasks.spawn",
                json!({"target": "## T", "item": null, "has_item": true, "index": 2}),
                SectionRequest::Tasks(TasksCall::Spawn {
                    target: "## T".into(),
                    input: None,
                    item: Some(Json::Null),
                    index: Some(2),
                }),
            ),
            (
                "tasks.join",
                json!({"members": ["1.0"], "timeout": 1.5}),
                SectionRequest::Tasks(TasksCall::Wait {
                    all: true,
                    members: vec!["1.0".into()],
                    timeout: Some(1.5),
                }),
            ),
            (
                "tasks.tool",
                json!({"name": "task", "args": {"target": "## T"}, "allow": {}}),
                SectionRequest::Tasks(TasksCall::Tool {
                    name: "task".into(),
                    args: json!({"target": "## T"}),
                    allow: None,
                }),
            ),
            (
                "tasks.notices",
                json!({}),
                SectionRequest::Tasks(TasksCall::Notices),
            ),
        ];
        for (op, payload, expected) in cases {
            let decoded = SectionRequest::decode(op, payload).unwrap();
            assert_eq!(decoded, expected, "{op}");
            assert_eq!(decoded.name(), op);
        }
        let store = SectionRequest::decode(
            "store",
            json!({"op": "read", "path": "a", "first": {"type": "integer", "value": 2},
                   "last": {"type": "nil"}}),
        )
        .unwrap();
        let SectionRequest::Store(call) = store else {
            panic!("{store:?}")
        };
        assert_eq!(call.op, "read");
        assert_eq!(call.first.unwrap().value, Some(json!(2)));
        assert_eq!(call.last.unwrap().type_name, "nil");
        assert!(SectionRequest::decode("tasks.nope", json!({})).is_err());
        assert!(SectionRequest::decode("nope", json!({})).is_err());
    }

    #[test]
    fn only_a_strands_own_calls_are_local() {
        let tool = |path: &str| SectionRequest::ToolCall {
            alias: "a".into(),
            path: path.into(),
            args: json!({}),
        };
        assert!(tool("p/f").is_local());
        assert!(!tool(ASK_TOOL_PATH).is_local());
        assert!(!SectionRequest::Sync.is_local());
        assert!(!SectionRequest::Tasks(TasksCall::Notices).is_local());
    }
}
