//! `fanout` (chapter 14) as the run drives it: the arms spawned up front, their ends gathered,
//! the results delivered in collection order. The fanout's own record lives in
//! `crate::fanout`.

use promptforge_lua::json::display_value;
use promptforge_lua::vm::LuaFailure;
use serde_json::{Value as Json, json};

use super::Run;
use super::dispatch::{Dispatch, Starter};
use crate::events::{AbandonReason, Origin, TaskEnding};
use crate::failure::{error_value_of, is_exhausted};
use crate::fanout::{ArmEnd, Fanout};
use crate::protocol::Answer;
use crate::requests::lua_error;
use crate::strand::{Entry, Seed, Start, Strand, TaskWait};

impl Run {
    /// `fanout(worker, collection)`: one arm per member, each a task one level deeper starting
    /// at the worker section with a snapshot of the caller's `var`; or a refusal at the call.
    pub(crate) fn start_fanout(
        &mut self,
        s: &mut Strand,
        entry: &Entry,
        worker: &str,
        items: &[Json],
    ) -> Dispatch {
        let items = items.to_vec();
        let start = match self.chain_start(s, entry, worker, None, Starter::Fanout) {
            Ok(start) => start,
            Err(message) => return Dispatch::Answer(lua_error(message)),
        };
        if items.is_empty() {
            return Dispatch::Answer(Answer::Value(Json::Array(Vec::new())));
        }
        let target = self.target_name(&start);
        let id = self.take_fanout_id();
        let mut arms = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let arm = Start {
                section: start.section,
                var: start.var.clone(),
                args: start.args.clone(),
                argv: start.argv.clone(),
                seed: Seed {
                    item: Some(item.clone()),
                    index: i64::try_from(index + 1).ok(),
                },
            };
            arms.push(self.spawn_task(s, arm, Origin::Author, target.clone(), Some((id, index))));
        }
        let count = arms.len();
        self.fanouts.insert(
            id,
            Fanout {
                caller: s.id,
                arms,
                items,
                ends: (0..count).map(|_| None).collect(),
                remaining: count,
                bytes: 0,
            },
        );
        s.wait = Some(TaskWait::Fanout(id));
        Dispatch::Park
    }

    /// An arm's chain ended. A failure other than round-cap exhaustion fails the fanout at
    /// once; when every arm has ended, the caller gets the results.
    pub(crate) fn arm_ended(&mut self, fanout: u64, index: usize, end: Result<String, LuaFailure>) {
        let Some(fan) = self.fanouts.get_mut(&fanout) else {
            return;
        };
        let failure = match end {
            Ok(text) => {
                fan.bytes = fan.bytes.saturating_add(text.len());
                if fan.bytes > promptforge_lua::vm::MEMORY_LIMIT {
                    // The caller could never hold them: fail as its VM would, at once.
                    Some(LuaFailure::lua("not enough memory"))
                } else {
                    fan.ends[index] = Some(ArmEnd::Done(text));
                    None
                }
            }
            Err(failure) if is_exhausted(&failure) => {
                fan.ends[index] = Some(ArmEnd::Exhausted);
                None
            }
            Err(failure) => Some(failure),
        };
        fan.remaining = fan.remaining.saturating_sub(1);
        if failure.is_none() && fan.remaining > 0 {
            return;
        }
        let Some(fan) = self.fanouts.remove(&fanout) else {
            return;
        };
        let answer = match failure {
            Some(failure) => {
                // Fail-fast: every live sibling is cancelled, unstarted arms never run.
                for arm in &fan.arms {
                    self.stop_task(arm, TaskEnding::Cancelled);
                }
                Answer::Error(error_value_of(&failure))
            }
            None => Answer::Value(Json::Array(
                fan.ends
                    .iter()
                    .zip(&fan.items)
                    .map(|(end, item)| match end {
                        Some(ArmEnd::Done(text)) => {
                            json!({"ok": true, "exhausted": false, "text": text})
                        }
                        _ => json!({
                            "ok": false,
                            "exhausted": true,
                            "text": format!(
                                "## {}\n\nUNKNOWN\n\n(section incomplete: tool loop exhausted)",
                                display_value(item)
                            ),
                        }),
                    })
                    .collect(),
            )),
        };
        // Every arm is delivered (or cancelled): join them into the caller; their results
        // are taken, so a later wait on an arm's id is `task_consumed`.
        let caller = self.strands.get(&fan.caller).map(|c| c.claims);
        for arm in &fan.arms {
            if let Some(waiter) = caller {
                self.deliver_claims(waiter, arm);
            }
            self.tasks.mark_delivered(arm);
        }
        self.wake(fan.caller, answer);
    }

    /// Stop a fanout whose caller is being stopped: its live arms are abandoned.
    pub(crate) fn stop_fanout(&mut self, fanout: u64, reason: AbandonReason) {
        if let Some(fan) = self.fanouts.remove(&fanout) {
            for arm in &fan.arms {
                self.stop_task(arm, TaskEnding::Abandoned(reason));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code

    use crate::driver::drive_kept as driven;

    /// Results come back in collection order, every arm's task is delivered, and nothing of
    /// the fanout is left once it returned.
    #[test]
    fn results_in_collection_order_and_nothing_left_behind() {
        let (run, t) = driven(
            "## Main\n\n```lua\nlocal r = fanout('### Ask', { 'x', 'y', 'z' })\nreturn r[1].text .. '|' .. r[2].text .. '|' .. r[3].text\n```\n\n### Ask\n\n```lua\nreturn models.infer(item)\n```\n",
        );
        assert_eq!(t.result(), "echo: x|echo: y|echo: z");
        assert!(run.fanouts.is_empty());
        assert_eq!(run.tasks.records.len(), 3);
        assert!(run.tasks.records.values().all(|r| r.delivered && r.settled));
    }

    /// The first arm that fails cancels its live siblings and is raised at the call; no arm
    /// is left running and the fanout's record is gone.
    #[test]
    fn a_failing_arm_is_raised_at_the_call_and_its_siblings_stop() {
        let (run, t) = driven(
            "## Main\n\n```lua\nlocal ok, err = pcall(fanout, '### Ask', { 'slow', 'bad', 'other' })\nreturn tostring(ok) .. ' ' .. tostring(err):match('boom') \n```\n\n### Ask\n\n```lua\nif item == 'bad' then error('boom') end\nreturn models.infer(models.infer(item))\n```\n",
        );
        assert_eq!(t.result(), "false boom");
        assert!(run.fanouts.is_empty());
        assert!(run.tasks.live().next().is_none());
    }
}
