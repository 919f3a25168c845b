//! The task registry (chapter 15): every task the run started, its state, its owner and what
//! a wait has taken of it, the `tasks.status` view, and the errors a task call raises. The run
//! drives tasks (`run/tasks.rs`); this module answers what the registry alone can.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value as Json, json};

use crate::determinism::ChainRef;
use crate::events::{Origin, TaskEnding};
use crate::ids::{TaskId, join_ids};
use crate::protocol::{ErrorValue, RunErrorKind};
use crate::scheduler::Work;
use crate::strand::{Slot, Strand, StrandId, Wait};

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskState {
    Running,
    Done,
    Cancelled,
    Abandoned,
}

impl TaskState {
    fn as_str(self) -> &'static str {
        match self {
            TaskState::Running => "running",
            TaskState::Done => "done",
            TaskState::Cancelled => "cancelled",
            TaskState::Abandoned => "abandoned",
        }
    }
}

/// What an ended task holds for the wait that takes it.
#[derive(Debug, Clone)]
pub(crate) enum Held {
    Returned(String),
    Failed(ErrorValue),
}

/// One task, for the whole run (its status outlives it).
#[derive(Debug)]
pub(crate) struct TaskRecord {
    /// Its strand, while it is live.
    pub(crate) strand: Option<StrandId>,
    /// The chain that owns it.
    pub(crate) owner: TaskId,
    /// The strand that chain runs in.
    pub(crate) owner_strand: StrandId,
    pub(crate) origin: Origin,
    /// The section it started at, without heading marks.
    pub(crate) target: Arc<str>,
    pub(crate) state: TaskState,
    pub(crate) ok: Option<bool>,
    pub(crate) held: Option<Held>,
    /// A wait took its result.
    pub(crate) delivered: bool,
    /// Waited on or cancelled (or abandoned): no longer pending for its owner. A task that
    /// ended stays pending until then, so `tasks.pending` lists it and a chain that ends
    /// without collecting it leaks it.
    pub(crate) settled: bool,
    pub(crate) note: Option<String>,
    /// The round count when it ended (live: the strand's).
    pub(crate) turns: u32,
    pub(crate) depth: u32,
    pub(crate) claims: ChainRef,
    /// For a fanout arm: its fanout and position.
    pub(crate) fanout: Option<(u64, usize)>,
}

/// Every task of the run, by id.
#[derive(Debug, Default)]
pub(crate) struct Tasks {
    pub(crate) records: BTreeMap<TaskId, TaskRecord>,
}

impl Tasks {
    /// The task `owner` (a chain's id) owns by the id `text`, or the `task_not_owned` refusal.
    pub(crate) fn owned(&self, owner: Option<&TaskId>, text: &str) -> Result<TaskId, ErrorValue> {
        TaskId::parse(text)
            .filter(|id| {
                self.records
                    .get(id)
                    .is_some_and(|r| Some(&r.owner) == owner)
            })
            .ok_or_else(|| not_owned(text))
    }

    /// The members of a wait, in order: each one `owner` owns, none whose result a wait has
    /// taken (`task_consumed`), none abandoned (its owner ended: it never reaches a wait).
    pub(crate) fn wait_members(
        &self,
        owner: Option<&TaskId>,
        set: &[String],
    ) -> Result<Vec<TaskId>, ErrorValue> {
        let mut members = Vec::with_capacity(set.len());
        for text in set {
            let id = self.owned(owner, text)?;
            match self.records.get(&id).map(|r| (r.state, r.delivered)) {
                Some((TaskState::Done, true)) => return Err(consumed(&id)),
                Some((TaskState::Abandoned, _)) => return Err(not_owned(text)),
                _ => {}
            }
            members.push(id);
        }
        Ok(members)
    }

    /// Take an ended task's end for a waiter: `{task, ok, result}` or `{task, ok, error}`, and
    /// whether the delivery joins the task's claims into the waiter's. A result is taken once;
    /// a cancelled task holds no result, so every wait on it gets the same `cancelled` error.
    pub(crate) fn take_end(&mut self, id: &TaskId) -> (Json, bool) {
        let task = id.to_string();
        let Some(record) = self.records.get_mut(id) else {
            return (
                json!({"task": task, "ok": false, "error": not_owned(&task)}),
                false,
            );
        };
        if record.state != TaskState::Done {
            // A cancelled task holds no result, but its delivery still orders what it did.
            return (
                json!({"task": task, "ok": false, "error": cancelled(id)}),
                true,
            );
        }
        record.delivered = true;
        record.settled = true;
        let end = match record.held.take() {
            Some(Held::Returned(text)) => json!({"task": task, "ok": true, "result": text}),
            Some(Held::Failed(error)) => json!({"task": task, "ok": false, "error": error}),
            None => json!({"task": task, "ok": true, "result": ""}),
        };
        (end, true)
    }

    /// Live tasks, in id order.
    pub(crate) fn live(&self) -> impl Iterator<Item = (&TaskId, &TaskRecord)> {
        self.records
            .iter()
            .filter(|(_, r)| r.state == TaskState::Running)
    }

    pub(crate) fn is_live(&self, id: &TaskId) -> bool {
        self.records
            .get(id)
            .is_some_and(|r| r.state == TaskState::Running)
    }

    /// Which of `ids` are still running, in their order.
    pub(crate) fn running(&self, ids: &[TaskId]) -> Vec<TaskId> {
        ids.iter().filter(|t| self.is_live(t)).cloned().collect()
    }

    /// Not yet waited on, cancelled or abandoned.
    pub(crate) fn is_pending(&self, id: &TaskId) -> bool {
        self.records.get(id).is_some_and(|r| !r.settled)
    }

    /// A fanout took its arm's result.
    pub(crate) fn mark_delivered(&mut self, id: &TaskId) {
        if let Some(record) = self.records.get_mut(id) {
            record.delivered = true;
            record.settled = true;
        }
    }

    /// `tasks.pending(opts)`: of the tasks a chain owns, in spawn order, those not settled
    /// yet, of one origin when `origin` names one, as `{task = id}` entries.
    pub(crate) fn pending_of(&self, owned: &[TaskId], origin: Option<&str>) -> Json {
        Json::Array(
            owned
                .iter()
                .filter(|id| {
                    self.records.get(*id).is_some_and(|r| {
                        !r.settled && origin.is_none_or(|o| o == r.origin.as_str())
                    })
                })
                .map(|id| json!({"task": id.to_string()}))
                .collect(),
        )
    }

    /// `tasks.note(text)` from inside a task: its note, read by `tasks.status`.
    pub(crate) fn set_note(&mut self, task: &TaskId, text: &str) {
        if let Some(record) = self.records.get_mut(task) {
            record.note = Some(text.to_owned());
        }
    }

    /// The target of a task the model started that is still running (what a cancel from the
    /// prompt tells the model), if it is one.
    pub(crate) fn running_model_target(&self, id: &TaskId) -> Option<Arc<str>> {
        self.records
            .get(id)
            .filter(|r| r.state == TaskState::Running && r.origin == Origin::Model)
            .map(|r| r.target.clone())
    }

    /// A cancelled task is settled: nothing waits to take it (cancelling an ended task
    /// changes nothing else about it).
    pub(crate) fn settle(&mut self, id: &TaskId) {
        if let Some(record) = self.records.get_mut(id) {
            record.settled = true;
        }
    }

    /// Record that a task ended (nothing else: the caller deals with its strand).
    pub(crate) fn mark_ended(&mut self, id: &TaskId, ending: TaskEnding) {
        if let Some(record) = self.records.get_mut(id) {
            record.state = match ending {
                TaskEnding::Succeeded | TaskEnding::Failed => TaskState::Done,
                TaskEnding::Cancelled => TaskState::Cancelled,
                TaskEnding::Abandoned(_) => TaskState::Abandoned,
            };
            record.ok = Some(ending == TaskEnding::Succeeded);
            record.strand = None;
            if matches!(ending, TaskEnding::Cancelled | TaskEnding::Abandoned(_)) {
                record.settled = true;
            }
        }
    }
}

pub(crate) fn task_error(kind: &str, id: &str, message: String) -> ErrorValue {
    ErrorValue::new(kind, message, Some(RunErrorKind::Lua)).with_field("task", id)
}

pub(crate) fn not_owned(id: &str) -> ErrorValue {
    task_error(
        "task_not_owned",
        id,
        format!("task `{id}` is not a task this chain owns"),
    )
}

pub(crate) fn consumed(id: &TaskId) -> ErrorValue {
    let id = id.to_string();
    task_error(
        "task_consumed",
        &id,
        format!("task `{id}` was already delivered: a task's result is taken by one wait"),
    )
}

pub(crate) fn cancelled(id: &TaskId) -> ErrorValue {
    let id = id.to_string();
    task_error("cancelled", &id, format!("task `{id}` was cancelled"))
}

/// The `tasks_live` failure of a chain that ended with author tasks still live.
pub(crate) fn tasks_live(ids: &[TaskId]) -> ErrorValue {
    let list = join_ids(ids);
    ErrorValue::new(
        "tasks_live",
        format!(
            "chain ended with author tasks still live: {list}; wait on or cancel every task a chain spawns before it ends"
        ),
        Some(RunErrorKind::Lua),
    )
    .with_field("tasks", list)
}

/// The last line of an `await_tasks` whose timeout ran out: the model tasks still running, or,
/// with none running, how long it slept.
pub(crate) fn await_expired(running: &[TaskId], seconds: f64) -> String {
    if running.is_empty() {
        format!("slept {} seconds", render_seconds(seconds))
    } else {
        format!("timed out; tasks {} still running", join_ids(running))
    }
}

/// A model task built-in's call (`task`, `task_status`, `task_cancel`, `await_tasks`),
/// its arguments checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ModelCall {
    /// Start a task at `target` (trimmed, allowed), under `input` when given.
    Start {
        target: String,
        input: Option<String>,
    },
    /// Read one of the section's model tasks.
    Status(TaskId),
    /// Cancel one of the section's model tasks.
    Cancel(TaskId),
    /// Wait for the section's model tasks, at most `timeout` seconds when given.
    Await { timeout: Option<f64> },
}

/// Check a model built-in's arguments: what the model asked for, or the refusal text it
/// reads back (every fault the model can cause is text, never an error). `allow` is the
/// section's `tools.allow_tasks` list (`None`: any target); `own` the tasks the section's
/// model started, the only ones it may name.
pub(crate) fn model_call(
    name: &str,
    args: &Json,
    allow: Option<&[String]>,
    own: &[TaskId],
) -> Result<ModelCall, String> {
    match name {
        "task" => {
            let Some(target) = args.get("target").and_then(Json::as_str) else {
                return Err(
                    "task: `target` must be a string naming a section heading, such as `## Research`"
                        .to_owned(),
                );
            };
            let input = match args.get("input") {
                None | Some(Json::Null) => None,
                Some(Json::String(input)) => Some(input.clone()),
                Some(_) => return Err("task: `input` must be a string when given".to_owned()),
            };
            let target = target.trim();
            if let Some(allowed) = allow {
                let allowed: Vec<&str> = allowed.iter().map(|a| a.trim()).collect();
                if !allowed.contains(&target) {
                    return Err(format!(
                        "task: target `{target}` is not allowed; allowed targets: {}",
                        allowed.join(", ")
                    ));
                }
            }
            Ok(ModelCall::Start {
                target: target.to_owned(),
                input,
            })
        }
        "task_status" | "task_cancel" => {
            let Some(text) = args.get("id").and_then(Json::as_str) else {
                return Err(format!(
                    "{name}: `id` must be a task id string, exactly as `task` returned it"
                ));
            };
            let Some(id) = TaskId::parse(text) else {
                return Err(format!(
                    "{name}: `{text}` is not a task id; use the id `task` returned"
                ));
            };
            if !own.contains(&id) {
                return Err(format!("{name}: no model task with id {id}"));
            }
            Ok(match name {
                "task_status" => ModelCall::Status(id),
                _ => ModelCall::Cancel(id),
            })
        }
        "await_tasks" => match args.get("timeout") {
            None | Some(Json::Null) => Ok(ModelCall::Await { timeout: None }),
            Some(Json::Number(n)) if n.as_f64().is_some_and(|t| t >= 0.0) => Ok(ModelCall::Await {
                timeout: n.as_f64(),
            }),
            Some(_) => Err(
                "await_tasks: `timeout` must be a non-negative number of seconds when given"
                    .to_owned(),
            ),
        },
        other => Err(format!("{other}: not a task built-in")),
    }
}

/// A JSON number the way the model wrote it: integers plainly, fractions in their shortest
/// form (`0.05`, `2`).
pub(crate) fn render_seconds(seconds: f64) -> String {
    format!("{seconds}")
}

/// Everything a status read reports about one task.
#[derive(Debug)]
pub(crate) struct StatusView {
    pub(crate) target: Arc<str>,
    pub(crate) origin: Origin,
    pub(crate) state: TaskState,
    pub(crate) ok: Option<bool>,
    pub(crate) section: Option<String>,
    pub(crate) blocked: Option<&'static str>,
    pub(crate) turns: u32,
    pub(crate) tasks: Vec<TaskId>,
    pub(crate) depth: u32,
    pub(crate) note: Option<String>,
}

impl StatusView {
    /// The `tasks.status` table: nil fields are left out.
    pub(crate) fn table(&self) -> Json {
        let mut table = serde_json::Map::new();
        table.insert("target".into(), Json::from(&*self.target));
        table.insert("origin".into(), Json::from(self.origin.as_str()));
        table.insert("state".into(), Json::from(self.state.as_str()));
        if let Some(ok) = self.ok {
            table.insert("ok".into(), Json::Bool(ok));
        }
        if let Some(section) = &self.section {
            table.insert("section".into(), Json::from(section.as_str()));
        }
        if let Some(blocked) = self.blocked {
            table.insert("blocked".into(), Json::from(blocked));
        }
        table.insert("turns".into(), Json::from(self.turns));
        let tasks = self.tasks.iter().map(|t| Json::String(t.to_string()));
        table.insert("tasks".into(), Json::Array(tasks.collect()));
        table.insert("depth".into(), Json::from(self.depth));
        if let Some(note) = &self.note {
            table.insert("note".into(), Json::from(note.as_str()));
        }
        Json::Object(table)
    }

    /// The `task_status` line: `Task id={task} (## {target}): {state}[, ok | , failed]
    /// [, in ## {section}][, waiting on {blocked}], turns {n}[, tasks {ids}][, note: {note}]`.
    pub(crate) fn line(&self, id: &TaskId) -> String {
        let mut line = format!("Task id={id} (## {}): {}", self.target, self.state.as_str());
        if self.state == TaskState::Done {
            line.push_str(if self.ok == Some(true) {
                ", ok"
            } else {
                ", failed"
            });
        }
        if let Some(section) = &self.section {
            line.push_str(&format!(", in ## {section}"));
        }
        if let Some(blocked) = self.blocked {
            line.push_str(&format!(", waiting on {blocked}"));
        }
        line.push_str(&format!(", turns {}", self.turns));
        if !self.tasks.is_empty() {
            line.push_str(&format!(", tasks {}", join_ids(&self.tasks)));
        }
        if let Some(note) = &self.note {
            line.push_str(&format!(", note: {note}"));
        }
        line
    }
}

/// A live task's activity where the committed order left it: a strand that ran ahead is
/// seen as its view keeps it, its slot (the order's own) read now.
pub(crate) fn committed_activity(strand: &Strand) -> (Option<String>, Option<&'static str>) {
    let Some(ahead) = &strand.ahead else {
        return activity(strand);
    };
    let view = &ahead.view;
    let blocked = if strand.slot == Slot::Queued {
        Some("queued")
    } else {
        view.blocked
    };
    (view.section.clone(), blocked)
}

/// What a live task is doing, from its own chain's point of view: the section it is in and
/// what it waits on (`queued`, `chat`, `tool_call`, `store`, `tasks`, `call`).
pub(crate) fn activity(strand: &Strand) -> (Option<String>, Option<&'static str>) {
    if strand.slot == Slot::Queued {
        return (running_activity(strand).0, Some("queued"));
    }
    running_activity(strand)
}

/// A strand's activity as if it held its slot (what a view keeps: the slot is read when
/// the view is).
pub(crate) fn running_activity(strand: &Strand) -> (Option<String>, Option<&'static str>) {
    let bottom = strand.stack.first();
    let section = bottom
        .and_then(|c| c.entry.as_ref())
        .map(|e| e.name.clone());
    let Some(bottom) = bottom else {
        return (None, None);
    };
    let blocked = if strand.stack.len() > 1 {
        Some("call")
    } else {
        match bottom.entry.as_ref().and_then(|e| e.waiting) {
            Some(Wait::Effect(_, Work::Chat)) => Some("chat"),
            Some(Wait::Effect(_, Work::ToolCall)) => Some("tool_call"),
            Some(Wait::Effect(_, Work::Store)) => Some("store"),
            Some(Wait::Effect(_, Work::Timer) | Wait::Tasks) => Some("tasks"),
            Some(Wait::Chain) => Some("call"),
            None => None,
        }
    };
    (section, blocked)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    fn id(text: &str) -> TaskId {
        TaskId::parse(text).unwrap()
    }

    #[test]
    fn a_model_built_in_call_is_checked_into_what_it_asks_or_a_refusal() {
        let own = [id("0.0")];
        let allow = ["  ## Research ".to_owned()];
        assert_eq!(
            model_call(
                "task",
                &json!({"target": " ## Research", "input": "x"}),
                Some(&allow),
                &own
            ),
            Ok(ModelCall::Start {
                target: "## Research".into(),
                input: Some("x".into())
            })
        );
        assert_eq!(
            model_call("task", &json!({"target": "## Draft"}), Some(&allow), &own),
            Err("task: target `## Draft` is not allowed; allowed targets: ## Research".into())
        );
        assert_eq!(
            model_call("task", &json!({"target": 3}), None, &own),
            Err(
                "task: `target` must be a string naming a section heading, such as `## Research`"
                    .into()
            )
        );
        assert_eq!(
            model_call("task", &json!({"target": "## A", "input": 1}), None, &own),
            Err("task: `input` must be a string when given".into())
        );
        assert_eq!(
            model_call("task_status", &json!({"id": "0.0"}), None, &own),
            Ok(ModelCall::Status(id("0.0")))
        );
        assert_eq!(
            model_call("task_cancel", &json!({"id": "0.1"}), None, &own),
            Err("task_cancel: no model task with id 0.1".into())
        );
        assert_eq!(
            model_call("task_status", &json!({"id": "x"}), None, &own),
            Err("task_status: `x` is not a task id; use the id `task` returned".into())
        );
        assert_eq!(
            model_call("await_tasks", &json!({"timeout": 0.5}), None, &own),
            Ok(ModelCall::Await { timeout: Some(0.5) })
        );
        assert_eq!(
            model_call("await_tasks", &json!({"timeout": -1}), None, &own),
            Err(
                "await_tasks: `timeout` must be a non-negative number of seconds when given".into()
            )
        );
        assert_eq!(
            model_call("spawn", &json!({}), None, &own),
            Err("spawn: not a task built-in".into())
        );
    }

    #[test]
    fn the_errors_a_task_call_raises() {
        let e = not_owned("0.3");
        assert_eq!(
            (e.kind.as_str(), e.message.as_str()),
            ("task_not_owned", "task `0.3` is not a task this chain owns")
        );
        assert_eq!(e.fields["task"], "0.3");
        let e = consumed(&id("0.1"));
        assert_eq!(e.kind, "task_consumed");
        assert!(e.message.starts_with("task `0.1` was already delivered"));
        assert_eq!(cancelled(&id("0.2")).message, "task `0.2` was cancelled");
        let e = tasks_live(&[id("0.0"), id("0.4")]);
        assert_eq!(e.kind, "tasks_live");
        assert!(e.message.contains("still live: 0.0, 0.4"), "{}", e.message);
        assert_eq!(e.run_kind, Some(RunErrorKind::Lua));
    }

    #[test]
    fn an_await_that_ran_out_says_what_is_still_running() {
        assert_eq!(await_expired(&[], 0.05), "slept 0.05 seconds");
        assert_eq!(await_expired(&[], 2.0), "slept 2 seconds");
        assert_eq!(
            await_expired(&[id("0.1")], 1.0),
            "timed out; tasks 0.1 still running"
        );
    }

    #[test]
    fn an_empty_registry_has_nothing_live_or_pending() {
        let tasks = Tasks::default();
        assert!(tasks.live().next().is_none());
        assert!(!tasks.is_live(&id("0.0")));
        assert!(!tasks.is_pending(&id("0.0")));
        assert!(tasks.running(&[id("0.0")]).is_empty());
    }
}

#[cfg(test)]
mod registry_tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;
    use crate::determinism::Claims;

    fn id(text: &str) -> TaskId {
        TaskId::parse(text).unwrap()
    }

    /// A registry where chain `0` owns `0.0` (done, returned "r"), `0.1` (cancelled) and
    /// `0.2` (abandoned), and chain `0.0` owns `0.0.0` (running).
    fn registry() -> Tasks {
        let mut claims = Claims::new();
        let chain = claims.root("0");
        let record = |owner: &str, state: TaskState, held: Option<Held>| TaskRecord {
            strand: None,
            owner: id(owner),
            owner_strand: 0,
            origin: Origin::Author,
            target: Arc::from("Child"),
            state,
            ok: Some(state == TaskState::Done),
            held,
            delivered: false,
            settled: false,
            note: None,
            turns: 0,
            depth: 1,
            claims: chain,
            fanout: None,
        };
        let mut tasks = Tasks::default();
        let returned = Some(Held::Returned("r".into()));
        tasks
            .records
            .insert(id("0.0"), record("0", TaskState::Done, returned));
        tasks
            .records
            .insert(id("0.1"), record("0", TaskState::Cancelled, None));
        tasks
            .records
            .insert(id("0.2"), record("0", TaskState::Abandoned, None));
        tasks
            .records
            .insert(id("0.0.0"), record("0.0", TaskState::Running, None));
        tasks
    }

    #[test]
    fn only_the_owner_reads_a_task() {
        let tasks = registry();
        let owner = id("0");
        assert_eq!(tasks.owned(Some(&owner), "0.0").unwrap(), id("0.0"));
        assert_eq!(
            tasks.owned(Some(&owner), "0.0.0").unwrap_err().kind,
            "task_not_owned"
        );
        assert_eq!(tasks.owned(None, "0.0").unwrap_err().kind, "task_not_owned");
        assert_eq!(
            tasks.owned(Some(&owner), "not an id").unwrap_err().kind,
            "task_not_owned"
        );
    }

    #[test]
    fn a_result_is_taken_once_and_a_cancelled_task_always_says_so() {
        let mut tasks = registry();
        let owner = id("0");
        let (end, deliver) = tasks.take_end(&id("0.0"));
        assert_eq!(end, json!({"task": "0.0", "ok": true, "result": "r"}));
        assert!(deliver);
        assert!(tasks.records[&id("0.0")].delivered && tasks.records[&id("0.0")].settled);
        // A second wait on a delivered task is refused before it waits.
        let err = tasks
            .wait_members(Some(&owner), &["0.0".to_owned()])
            .unwrap_err();
        assert_eq!(err.kind, "task_consumed");
        for _ in 0..2 {
            let (end, deliver) = tasks.take_end(&id("0.1"));
            assert_eq!(end["error"]["kind"], "cancelled");
            assert!(deliver);
        }
        let (end, deliver) = tasks.take_end(&id("9.9"));
        assert_eq!(end["error"]["kind"], "task_not_owned");
        assert!(!deliver);
    }

    #[test]
    fn pending_lists_unsettled_owned_tasks_by_origin_and_a_cancel_settles() {
        let mut tasks = registry();
        if let Some(record) = tasks.records.get_mut(&id("0.0.0")) {
            record.origin = Origin::Model;
        }
        let owned = [id("0.0"), id("0.1"), id("0.0.0")];
        assert_eq!(
            tasks.pending_of(&owned, None),
            json!([{"task": "0.0"}, {"task": "0.1"}, {"task": "0.0.0"}])
        );
        assert_eq!(
            tasks.pending_of(&owned, Some("model")),
            json!([{"task": "0.0.0"}])
        );
        // Only a running task the model started has a target to tell the model of.
        assert_eq!(
            tasks.running_model_target(&id("0.0.0")).as_deref(),
            Some("Child")
        );
        assert_eq!(tasks.running_model_target(&id("0.0")), None);
        tasks.settle(&id("0.1"));
        assert_eq!(
            tasks.pending_of(&owned, Some("author")),
            json!([{"task": "0.0"}])
        );
        tasks.set_note(&id("0.0.0"), "working");
        assert_eq!(tasks.records[&id("0.0.0")].note.as_deref(), Some("working"));
    }

    #[test]
    fn an_abandoned_task_never_reaches_a_wait() {
        let tasks = registry();
        let owner = id("0");
        let err = tasks
            .wait_members(Some(&owner), &["0.1".to_owned(), "0.2".to_owned()])
            .unwrap_err();
        assert_eq!(err.kind, "task_not_owned");
        assert_eq!(
            tasks
                .wait_members(Some(&owner), &["0.1".to_owned(), "0.1".to_owned()])
                .unwrap(),
            [id("0.1"), id("0.1")]
        );
    }
}
