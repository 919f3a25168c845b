//! `fanout` (chapter 14) as the run drives it: the arms spawned up front, their ends gathered,
//! the results delivered in collection order. The fanout's own record lives in
//! `crate::fanout`.

use promptforge_lua::vm::LuaFailure;
use serde_json::Value as Json;

use super::Run;
use super::dispatch::{Dispatch, Starter};
use crate::events::{AbandonReason, Origin, TaskEnding};
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
        let start = match super::dispatch::chain_start(
            &self.prompt,
            s,
            entry,
            worker,
            None,
            Starter::Fanout,
        ) {
            Ok(start) => start,
            Err(message) => return Dispatch::Answer(lua_error(message)),
        };
        if items.is_empty() {
            return Dispatch::Answer(Answer::Value(Json::Array(Vec::new())));
        }
        let target = self.target_name(&start);
        let id = self.fanouts.next_id();
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
            let place = crate::events::Arm {
                index: index + 1,
                of: items.len(),
                item: preview(item),
            };
            arms.push(self.spawn_task(
                s,
                arm,
                Origin::Author,
                target.clone(),
                Some((id, index, place)),
            ));
        }
        self.fanouts.open(id, s.id, arms, items);
        s.wait = Some(TaskWait::Fanout(id));
        Dispatch::Park
    }

    /// An arm's chain ended: the fanout decides whether it settled; a settled fanout cancels
    /// the live siblings of a failed arm, joins every arm into the caller (their results are
    /// taken, so a later wait on an arm's id is `task_consumed`), and wakes the caller.
    pub(crate) fn arm_ended(&mut self, fanout: u64, index: usize, end: Result<String, LuaFailure>) {
        let Some(settled) =
            self.fanouts
                .arm_ended(fanout, index, end, promptforge_lua::vm::MEMORY_LIMIT)
        else {
            return;
        };
        if settled.failed {
            // Fail-fast: every live sibling is cancelled, unstarted arms never run.
            for arm in &settled.arms {
                self.stop_task(arm, TaskEnding::Cancelled);
            }
        }
        let caller = self.strands.get(&settled.caller).map(|c| c.claims);
        for arm in &settled.arms {
            if let Some(waiter) = caller {
                self.deliver_claims(waiter, arm);
            }
            self.tasks.mark_delivered(arm);
        }
        self.wake(settled.caller, settled.answer);
    }

    /// Stop a fanout whose caller is being stopped: its live arms are abandoned.
    pub(crate) fn stop_fanout(&mut self, fanout: u64, reason: AbandonReason) {
        for arm in self.fanouts.stop(fanout) {
            self.stop_task(&arm, TaskEnding::Abandoned(reason));
        }
    }
}

/// An arm's item as a display shows it: a string as written, anything else as compact JSON,
/// on one line, at most 40 characters.
fn preview(item: &Json) -> String {
    const MOST: usize = 40;
    let text = match item {
        Json::String(text) => text.clone(),
        other => other.to_string(),
    };
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= MOST {
        return line;
    }
    let mut cut: String = line.chars().take(MOST - 1).collect();
    cut.push('…');
    cut
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

    #[test]
    fn an_arm_item_preview_is_one_short_line() {
        assert_eq!(super::preview(&serde_json::json!("the Moon")), "the Moon");
        assert_eq!(
            super::preview(&serde_json::json!({"q": "x"})),
            r#"{"q":"x"}"#
        );
        let long = super::preview(&serde_json::json!("a  b\nc ".repeat(20)));
        assert_eq!(long.chars().count(), 40);
        assert!(
            long.starts_with("a b c a b c") && long.ends_with('…'),
            "{long}"
        );
    }
}
