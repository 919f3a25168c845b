//! Tasks (chapter 15) as the run drives them: everything that starts a task, waits on one,
//! reads one, or ends one (`tasks.*`, the end of a chain with its leaked and abandoned tasks,
//! and the model's four task built-ins with their notices). The registry itself and what it
//! answers on its own live in `crate::tasks`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use promptforge_lua::untrusted;
use promptforge_protocol::request::TasksCall;
use serde_json::{Value as Json, json};

use super::dispatch::{Dispatch, Starter};
use super::{MAIN, Run, StrandEnd};
use crate::determinism::ChainRef;
use crate::events::{AbandonReason, EventKind, Origin, TaskEnding};
use crate::failure::error_value_of;
use crate::ids::TaskId;
use crate::protocol::{Answer, Effect, ErrorValue};
use crate::requests::lua_error;
use crate::strand::{Chain, Entry, Notice, Seed, Slot, Start, Strand, StrandId, TaskWait};
use crate::tasks::{
    Held, ModelCall, StatusView, TaskRecord, TaskState, await_expired, committed_activity,
    tasks_live,
};

impl Run {
    /// Start a task: the next child id of the strand's top chain, a fork of the strand's
    /// claims, a queued strand holding no VM, and its record. Fanout arms are not listed among
    /// the chain's own tasks (their fanout settles them).
    pub(crate) fn spawn_task(
        &mut self,
        s: &mut Strand,
        start: Start,
        origin: Origin,
        target: Arc<str>,
        fanout: Option<(u64, usize, crate::events::Arm)>,
    ) -> TaskId {
        let strand_id = self.take_strand_id();
        let seq = self.take_seq();
        let Some(top) = s.top_mut() else {
            return TaskId::root();
        };
        let id = top.id.child(top.children);
        top.children += 1;
        let depth = top.depth + 1;
        let owner = top.id.clone();
        let owner_key = top.key;
        if fanout.is_none() {
            top.owned.push(id.clone());
        }
        let (fanout, arm) = match fanout {
            Some((fanout, index, arm)) => (Some((fanout, index)), Some(arm)),
            None => (None, None),
        };
        let claims = self
            .claims
            .fork(s.claims, id.to_string())
            .unwrap_or(s.claims);
        self.tasks.records.insert(
            id.clone(),
            TaskRecord {
                strand: Some(strand_id),
                owner,
                owner_strand: s.id,
                origin,
                target: target.clone(),
                state: TaskState::Running,
                ok: None,
                held: None,
                delivered: false,
                settled: false,
                note: None,
                turns: 0,
                depth,
                claims,
                fanout,
            },
        );
        let mut strand = Box::new(Strand::new(
            strand_id,
            id.clone(),
            claims,
            Some(owner_key),
            seq,
            Slot::Queued,
            depth,
        ));
        strand.start = Some(Box::new(start));
        self.queue_for_slot(&mut strand);
        self.strands.insert(strand_id, strand);
        self.event(
            &s.task,
            EventKind::TaskSpawned {
                id: id.to_string(),
                target: target.to_string(),
                origin,
                arm,
            },
        );
        // A free slot is taken at once: the task is admitted (not `queued`), though it first
        // runs only when its owner waits.
        self.admit();
        id
    }

    /// A task's own chain ended: its result or failure is held for its owner (or its fanout),
    /// and whoever waits on it is woken.
    pub(crate) fn task_ended(&mut self, strand: Box<Strand>, end: StrandEnd) {
        let id = strand.task.clone();
        let turns = strand.turns;
        drop(strand);
        let (ending, held, arm) = match end {
            StrandEnd::Returned(result) => {
                let text = result.unwrap_or_default();
                (
                    TaskEnding::Succeeded,
                    Held::Returned(text.clone()),
                    Ok(text),
                )
            }
            StrandEnd::Failed { failure, .. } => (
                TaskEnding::Failed,
                Held::Failed(error_value_of(&failure)),
                Err(failure),
            ),
        };
        self.record_ending(&id, ending);
        let Some(record) = self.tasks.records.get_mut(&id) else {
            return;
        };
        record.turns = turns;
        let fanout = record.fanout;
        if fanout.is_none() {
            record.held = Some(held.clone());
        }
        let (origin, owner, owner_strand, target) = (
            record.origin,
            record.owner.clone(),
            record.owner_strand,
            record.target.clone(),
        );
        if let Some((fanout, index)) = fanout {
            self.arm_ended(fanout, index, arm);
            return;
        }
        if origin == Origin::Model {
            let head = format!("Task id={id} (## {target})");
            let text = match &held {
                Held::Returned(result) => {
                    format!(
                        "{head} completed: {}",
                        untrusted::wrap(result, &self.setup.nonce)
                    )
                }
                Held::Failed(error) => format!("{head} failed: {}", error.message),
            };
            self.notify_model_owner(
                owner_strand,
                &owner,
                Notice {
                    task: id.clone(),
                    text,
                },
            );
        }
        self.member_ended(owner_strand, &id);
    }

    /// End a live task from outside (cancel, fail-fast, its owner's end): recorded once, its
    /// strand stopped, and the tasks it owns abandoned in turn.
    pub(crate) fn stop_task(&mut self, id: &TaskId, ending: TaskEnding) {
        let Some(record) = self.tasks.records.get_mut(id) else {
            return;
        };
        if record.state != TaskState::Running {
            return;
        }
        let strand = record.strand.and_then(|sid| self.strands.remove(&sid));
        if let Some(strand) = &strand
            && let Some(record) = self.tasks.records.get_mut(id)
        {
            record.turns = strand.committed_turns();
        }
        self.record_ending(id, ending);
        if let Some(strand) = strand {
            self.stop_strand(strand);
        }
    }

    /// Record how a task ended, in its record and as its one `TaskEnded` event.
    pub(crate) fn record_ending(&mut self, id: &TaskId, ending: TaskEnding) {
        self.tasks.mark_ended(id, ending);
        self.event(id, EventKind::TaskEnded { ending });
    }

    /// Abandon every live task in `ids` for `reason`.
    pub(crate) fn abandon_owned(&mut self, ids: &[TaskId], reason: AbandonReason) {
        for id in ids {
            self.stop_task(id, TaskEnding::Abandoned(reason));
        }
    }

    /// Hand task notices to the model: each joins its task's claims, and a task whose notice
    /// the model has read is settled (no longer pending), though its result stays for a wait.
    fn take_notices(&mut self, waiter: ChainRef, notices: Vec<Notice>) -> Vec<String> {
        notices
            .into_iter()
            .map(|n| {
                self.deliver_claims(waiter, &n.task);
                if let Some(record) = self.tasks.records.get_mut(&n.task) {
                    record.settled = true;
                }
                n.text
            })
            .collect()
    }

    /// Order everything a task did before the waiter's next step (a delivery is a join).
    pub(crate) fn deliver_claims(&mut self, waiter: ChainRef, id: &TaskId) {
        if let Some(record) = self.tasks.records.get(id) {
            let _ = self.claims.join(waiter, record.claims);
        }
    }

    /// A chain ends: its live tasks are abandoned (for `reason`), every task it owns is
    /// joined, and an author task still live after a normal end is a `tasks_live` failure.
    pub(crate) fn settle_chain(
        &mut self,
        s: &Strand,
        chain: &Chain,
        reason: AbandonReason,
    ) -> Option<ErrorValue> {
        let owned = chain.all_owned();
        let leaked: Vec<TaskId> = owned
            .iter()
            .filter(|id| {
                reason == AbandonReason::OwnerReturned
                    && self
                        .tasks
                        .records
                        .get(*id)
                        .is_some_and(|r| !r.settled && r.origin == Origin::Author)
            })
            .cloned()
            .collect();
        self.abandon_owned(&owned, reason);
        for id in &owned {
            if let Some(record) = self.tasks.records.get_mut(id) {
                record.settled = true;
            }
        }
        for id in &owned {
            self.deliver_claims(s.claims, id);
        }
        (!leaked.is_empty()).then(|| tasks_live(&leaked))
    }

    /// A task the strand's top chain owns, or the `task_not_owned` refusal.
    fn owned_by(&self, s: &Strand, text: &str) -> Result<TaskId, ErrorValue> {
        self.tasks.owned(s.top().map(|c| &c.id), text)
    }

    /// A task the chain owns, or the task the code runs inside (a task may read itself).
    fn readable_by(&self, s: &Strand, text: &str) -> Result<TaskId, ErrorValue> {
        if s.id != MAIN
            && let Some(id) = TaskId::parse(text)
            && id == s.task
        {
            return Ok(id);
        }
        self.owned_by(s, text)
    }

    /// `tasks.*`: every call but a wait that has to wait is answered at once.
    pub(crate) fn tasks_call(
        &mut self,
        s: &mut Strand,
        entry: &mut Entry,
        call: &TasksCall,
    ) -> Dispatch {
        let refused = |error: ErrorValue| Dispatch::Answer(Answer::Error(error));
        match call {
            TasksCall::Spawn {
                target,
                input,
                item,
                index,
            } => self.spawn_call(s, entry, target, input.as_deref(), item, *index),
            TasksCall::Wait {
                all,
                members,
                timeout,
            } => self.wait_call(s, *all, members, *timeout),
            TasksCall::Concurrency { limit } => {
                let Some(key) = s.top().map(|c| c.key) else {
                    return Dispatch::Answer(lua_error("internal invariant violated: no chain"));
                };
                let limit = match *limit {
                    Some(n) => {
                        let limit = self
                            .admission
                            .set_limit(key, u32::try_from(n).unwrap_or(u32::MAX));
                        // A raised limit admits queued tasks at once.
                        self.admit();
                        limit
                    }
                    None => self.admission.effective_limit(key),
                };
                Dispatch::Answer(Answer::Value(Json::from(limit)))
            }
            TasksCall::Ready { task } => match self.readable_by(s, task) {
                Ok(id) => Dispatch::Answer(Answer::Value(Json::Bool(!self.tasks.is_live(&id)))),
                Err(error) => refused(error),
            },
            TasksCall::Status { task } => match self.readable_by(s, task) {
                Ok(id) => Dispatch::Answer(Answer::Value(
                    self.status_view(&id, s, Some(entry))
                        .map_or(Json::Null, |v| v.table()),
                )),
                Err(error) => refused(error),
            },
            TasksCall::Pending { origin } => {
                let owned = s.top().map_or(&[][..], |c| c.owned.as_slice());
                Dispatch::Answer(Answer::Value(
                    self.tasks.pending_of(owned, origin.as_deref()),
                ))
            }
            TasksCall::Note { text } => {
                if s.id != MAIN {
                    self.tasks.set_note(&s.task, text);
                }
                Dispatch::Answer(Answer::Value(Json::Null))
            }
            TasksCall::Cancel { task } => match self.owned_by(s, task) {
                Ok(id) => {
                    let live_model = self.tasks.running_model_target(&id);
                    self.stop_task(&id, TaskEnding::Cancelled);
                    self.tasks.settle(&id);
                    if let Some(target) = live_model
                        && entry.model_tasks.contains(&id)
                    {
                        // A cancel from the prompt tells the model.
                        entry.notices.push(Notice {
                            text: format!(
                                "Task id={id} (## {target}) was canceled: the author cancelled it"
                            ),
                            task: id,
                        });
                    }
                    Dispatch::Answer(Answer::Value(Json::Null))
                }
                Err(error) => refused(error),
            },
            TasksCall::Tool { name, args, allow } => {
                self.model_tool(s, entry, name, args, allow.as_deref())
            }
            TasksCall::Notices => {
                let notices = std::mem::take(&mut entry.notices);
                let texts = self.take_notices(s.claims, notices);
                Dispatch::Answer(Answer::Value(Json::from(texts)))
            }
        }
    }

    /// `tasks.spawn(target, opts)`: the options were checked in Lua; the target and the depth
    /// cap are checked here.
    fn spawn_call(
        &mut self,
        s: &mut Strand,
        entry: &Entry,
        target: &str,
        input: Option<&str>,
        item: &Option<Json>,
        index: Option<i64>,
    ) -> Dispatch {
        let mut start = match super::dispatch::chain_start(
            &self.prompt,
            s,
            entry,
            target,
            input,
            Starter::Spawn,
        ) {
            Ok(start) => start,
            Err(message) => return Dispatch::Answer(lua_error(message)),
        };
        start.seed = Seed {
            item: item.clone(),
            index,
        };
        let target = self.target_name(&start);
        let id = self.spawn_task(s, start, Origin::Author, target, None);
        Dispatch::Answer(Answer::Value(json!({"task": id.to_string()})))
    }

    /// The name of the section a task starts at (its `target` in status reads and events).
    pub(crate) fn target_name(&self, start: &Start) -> Arc<str> {
        crate::visible::section_name(&self.prompt, start.section)
    }

    /// Start a wait's timer.
    fn timer(&mut self, s: &Strand, seconds: f64) -> crate::protocol::EffectId {
        let duration = Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX);
        self.effects.issue(s.id, Effect::Timer { duration }).0
    }

    /// `tasks.join_any(set, opts)` and `tasks.join(set, opts)`: the set and options were
    /// checked in Lua; ownership and delivery are checked here, member by member.
    fn wait_call(
        &mut self,
        s: &mut Strand,
        all: bool,
        set: &[String],
        timeout: Option<f64>,
    ) -> Dispatch {
        let members = match self.tasks.wait_members(s.top().map(|c| &c.id), set) {
            Ok(members) => members,
            Err(error) => return Dispatch::Answer(Answer::Error(error)),
        };
        // Every timed wait takes one child index, even one answered at once (the chapter's
        // only exceptions: no timeout, and refused options, which never get here).
        if timeout.is_some()
            && let Some(top) = s.top_mut()
        {
            top.children += 1;
        }
        let ended = |run: &Run, id: &TaskId| !run.tasks.is_live(id);
        if all {
            if members.iter().all(|id| ended(self, id)) {
                return Dispatch::Answer(self.join_results(s.claims, &members, false));
            }
        } else if let Some(id) = members.iter().find(|id| ended(self, id)).cloned() {
            return Dispatch::Answer(Answer::Value(self.take_end(s.claims, &id)));
        }
        // A zero timeout has already run out: nothing ended, so the wait is over at once.
        if timeout == Some(0.0) {
            return Dispatch::Answer(if all {
                self.join_results(s.claims, &members, true)
            } else {
                Answer::Value(Json::Null)
            });
        }
        let timer = timeout.map(|seconds| self.timer(s, seconds));
        s.wait = Some(if all {
            TaskWait::Join { members, timer }
        } else {
            TaskWait::JoinAny { members, timer }
        });
        Dispatch::Park
    }

    /// Deliver one ended task to a waiter (see [`Tasks::take_end`]), joining what it did
    /// into the waiter's claims.
    fn take_end(&mut self, waiter: ChainRef, id: &TaskId) -> Json {
        let (end, deliver) = self.tasks.take_end(id);
        if deliver {
            self.deliver_claims(waiter, id);
        }
        end
    }

    /// A `tasks.join` answer: every ended member delivered once (filling each position it
    /// was named at), unfinished members as holes.
    fn join_results(&mut self, waiter: ChainRef, members: &[TaskId], timed_out: bool) -> Answer {
        let mut taken: BTreeMap<TaskId, Json> = BTreeMap::new();
        let mut results = Vec::with_capacity(members.len());
        for id in members {
            if self.tasks.is_live(id) {
                results.push(Json::Null);
                continue;
            }
            if !taken.contains_key(id) {
                let end = self.take_end(waiter, id);
                taken.insert(id.clone(), end);
            }
            results.push(taken.get(id).cloned().unwrap_or(Json::Null));
        }
        Answer::Value(json!({"results": results, "timed_out": timed_out}))
    }

    /// A task ended: if its owner waits on it, the wait may be over.
    fn member_ended(&mut self, owner: StrandId, id: &TaskId) {
        let Some(strand) = self.strands.get(&owner) else {
            return;
        };
        let claims = strand.claims;
        let answer = match &strand.wait {
            Some(TaskWait::JoinAny { members, .. }) if members.contains(id) => {
                Answer::Value(self.take_end(claims, id))
            }
            Some(TaskWait::Join { members, .. }) if members.contains(id) => {
                if members.iter().any(|m| self.tasks.is_live(m)) {
                    return;
                }
                let members = members.clone();
                self.join_results(claims, &members, false)
            }
            _ => return,
        };
        self.wake(owner, answer);
    }

    /// A wait's timer fired before the wait was over.
    pub(crate) fn wait_timed_out(&mut self, id: StrandId) {
        let Some(strand) = self.strands.get_mut(&id) else {
            return;
        };
        let claims = strand.claims;
        let answer = match strand.wait.clone() {
            Some(TaskWait::JoinAny { .. }) => Answer::Value(Json::Null),
            Some(TaskWait::Join { members, .. }) => self.join_results(claims, &members, true),
            Some(TaskWait::Await { seconds, .. }) => {
                let Some(entry) = strand.top_mut().and_then(|c| c.entry.as_mut()) else {
                    return;
                };
                let notices = std::mem::take(&mut entry.notices);
                let running = self.tasks.running(&entry.model_tasks);
                let mut lines = self.take_notices(claims, notices);
                if running.is_empty() && !lines.is_empty() {
                    return self.wake(
                        id,
                        Answer::Value(json!({"text": lines.join("\n"), "ok": true})),
                    );
                }
                lines.push(await_expired(&running, seconds.unwrap_or(0.0)));
                Answer::Value(json!({"text": lines.join("\n"), "ok": true}))
            }
            Some(TaskWait::Fanout(_)) | None => return,
        };
        self.wake(id, answer);
    }

    /// Queue a model task's notice for the entry whose model started it; an `await_tasks`
    /// held there wakes with every notice that has arrived.
    fn notify_model_owner(&mut self, owner_strand: StrandId, owner: &TaskId, notice: Notice) {
        let Some(strand) = self.strands.get_mut(&owner_strand) else {
            return;
        };
        let awaiting = matches!(strand.wait, Some(TaskWait::Await { .. }))
            && strand.top().is_some_and(|c| &c.id == owner);
        let claims = strand.claims;
        let Some(chain) = strand.stack.iter_mut().find(|c| &c.id == owner) else {
            return;
        };
        if let Some(entry) = chain.entry.as_mut()
            && entry.model_tasks.contains(&notice.task)
        {
            entry.notices.push(notice);
        } else if let Some(carried) = chain.carried.as_mut()
            && carried.0.contains(&notice.task)
        {
            carried.1.push(notice);
            return;
        } else {
            return;
        }
        if !awaiting {
            return;
        }
        let Some(entry) = chain.entry.as_mut() else {
            return;
        };
        let notices = std::mem::take(&mut entry.notices);
        let text = self.take_notices(claims, notices).join("\n");
        self.wake(
            owner_strand,
            Answer::Value(json!({"text": text, "ok": true})),
        );
    }

    /// A task's status, as `tasks.status` and `task_status` both read it. `asking` is the
    /// entry whose Lua asks, when it may be the task itself (a task reading itself is
    /// running Lua, so it waits on nothing and is in its own chain's section).
    fn status_view(
        &self,
        id: &TaskId,
        current: &Strand,
        asking: Option<&Entry>,
    ) -> Option<StatusView> {
        let record = self.tasks.records.get(id)?;
        let strand = record.strand.and_then(|sid| {
            if sid == current.id {
                Some(current)
            } else {
                self.strands.get(&sid).map(|b| &**b)
            }
        });
        let (section, blocked) = match strand {
            Some(me) if me.id == current.id => {
                let bottom = me
                    .stack
                    .first()
                    .and_then(|c| c.entry.as_deref())
                    .or(asking)
                    .map(|e| e.name.clone());
                (bottom, None)
            }
            Some(other) => committed_activity(other),
            None => (None, None),
        };
        Some(StatusView {
            target: record.target.clone(),
            origin: record.origin,
            state: record.state,
            ok: record.ok,
            section,
            blocked,
            turns: strand.map_or(record.turns, |s| s.committed_turns()),
            tasks: strand.map(|s| self.live_children(s)).unwrap_or_default(),
            depth: record.depth,
            note: record.note.clone(),
        })
    }

    /// The live tasks a strand's chains started, in spawn order.
    fn live_children(&self, s: &Strand) -> Vec<TaskId> {
        let mut ids: Vec<TaskId> = s
            .stack
            .iter()
            .flat_map(Chain::all_owned)
            .filter(|id| self.tasks.is_pending(id))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// The model's task built-ins (`task`, `task_status`, `task_cancel`, `await_tasks`). Every
    /// fault the model can cause comes back as text it can read.
    fn model_tool(
        &mut self,
        s: &mut Strand,
        entry: &mut Entry,
        name: &str,
        args: &Json,
        allow: Option<&[String]>,
    ) -> Dispatch {
        let call = match crate::tasks::model_call(name, args, allow, &entry.model_tasks) {
            Ok(call) => call,
            Err(refusal) => return tool_text(refusal, false),
        };
        match call {
            ModelCall::Start { target, input } => {
                let start = match super::dispatch::chain_start(
                    &self.prompt,
                    s,
                    entry,
                    &target,
                    input.as_deref(),
                    Starter::Spawn,
                ) {
                    Ok(start) => start,
                    Err(message) => return tool_text(format!("task: {message}"), false),
                };
                let name = self.target_name(&start);
                let id = self.spawn_task(s, start, Origin::Model, name, None);
                entry.model_tasks.push(id.clone());
                Dispatch::Answer(Answer::Value(
                    json!({"text": format!("Task id={id} started"), "ok": true, "started": true}),
                ))
            }
            ModelCall::Status(id) => {
                let line = self
                    .status_view(&id, s, None)
                    .map(|v| v.line(&id))
                    .unwrap_or_default();
                tool_text(line, true)
            }
            ModelCall::Cancel(id) => {
                // The model's own cancel queues no notice: its confirmation says it all.
                self.stop_task(&id, TaskEnding::Cancelled);
                self.tasks.settle(&id);
                tool_text(format!("Task id={id} cancelled"), true)
            }
            ModelCall::Await { timeout: seconds } => {
                if !entry.notices.is_empty() {
                    let notices = std::mem::take(&mut entry.notices);
                    let text = self.take_notices(s.claims, notices).join("\n");
                    return tool_text(text, true);
                }
                let running = self.tasks.running(&entry.model_tasks);
                if running.is_empty() && seconds.is_none() {
                    return tool_text("nothing to wait for", true);
                }
                // A zero timeout has already run out.
                if seconds == Some(0.0) {
                    return tool_text(await_expired(&running, 0.0), true);
                }
                // A timed `await_tasks` that has to wait takes the owner's next child index.
                if seconds.is_some()
                    && let Some(top) = s.top_mut()
                {
                    top.children += 1;
                }
                let timer = seconds.map(|t| self.timer(s, t));
                s.wait = Some(TaskWait::Await { timer, seconds });
                Dispatch::Park
            }
        }
    }
}

/// The text of a model built-in's result: `{text, ok}` (`ok` false for a refusal).
fn tool_text(text: impl Into<String>, ok: bool) -> Dispatch {
    Dispatch::Answer(Answer::Value(json!({"text": text.into(), "ok": ok})))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code

    use super::*;
    use crate::driver::drive_kept as driven;

    /// A task waited on is delivered and settled; one cancelled is settled without a result;
    /// neither is live when the run ends, and the registry keeps both.
    #[test]
    fn waits_and_cancels_leave_the_registry_settled() {
        let (run, t) = driven(
            "## Main\n\n```lua\nlocal a = tasks.spawn('### A')\nlocal b = tasks.spawn('### B')\ntasks.cancel(b)\nlocal first, ok, result = tasks.join_any({ a })\nreturn first.task .. ' ' .. tostring(ok) .. ' ' .. result .. ' ' .. #tasks.pending()\n```\n\n### A\n\n```lua\nreturn models.infer('a')\n```\n\n### B\n\n```lua\nreturn models.infer('b')\n```\n",
        );
        assert_eq!(t.result(), "0.0 true echo: a 0");
        assert!(run.tasks.live().next().is_none());
        let states: Vec<(String, TaskState, bool, bool)> = run
            .tasks
            .records
            .iter()
            .map(|(id, r)| (id.to_string(), r.state, r.delivered, r.settled))
            .collect();
        assert_eq!(
            states,
            [
                ("0.0".to_owned(), TaskState::Done, true, true),
                ("0.1".to_owned(), TaskState::Cancelled, false, true),
            ]
        );
    }

    /// A chain that ends with a task it never waited on fails with `tasks_live`, naming it.
    #[test]
    fn a_chain_ending_with_live_tasks_fails() {
        let (_, t) = driven(
            "## Main\n\n```lua\ntasks.spawn('### A')\nreturn 'done'\n```\n\n### A\n\n```lua\nreturn models.infer('a')\n```\n",
        );
        match &t.outcome {
            crate::Outcome::Failed(err) => {
                assert!(
                    err.message
                        .contains("chain ended with author tasks still live: 0.0"),
                    "{}",
                    err.message
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// The model's task built-ins answer with text, a refusal included.
    #[test]
    fn a_model_built_in_refuses_a_bad_target_as_text() {
        let Dispatch::Answer(Answer::Value(answer)) = tool_text("no", false) else {
            panic!("a tool text is an answer")
        };
        assert_eq!(answer, json!({"text": "no", "ok": false}));
    }
}
