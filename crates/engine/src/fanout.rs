//! Fanouts in progress (chapter 14), as a room that owns its state: each fanout's caller, its
//! arms in collection order, each arm's member and end, and the bytes of the results gathered
//! so far. The run tells it when a fanout opens and when an arm ends; it answers with what the
//! run must do next ([`Settled`]: fail fast and cancel the siblings, or deliver the results in
//! collection order). It never touches a strand or a task itself, so it is tested on its own.

use std::collections::BTreeMap;

use promptforge_lua::json::display_value;
use promptforge_lua::vm::LuaFailure;
use serde_json::{Value as Json, json};

use crate::failure::{error_value_of, is_exhausted};
use crate::ids::TaskId;
use crate::protocol::Answer;
use crate::strand::StrandId;

/// How an arm ended, kept until every arm has.
#[derive(Debug)]
enum ArmEnd {
    /// With this result ('' when it ran off its walk).
    Done(String),
    /// Its `models.loop` ran past the round cap.
    Exhausted,
}

/// A fanout in progress.
#[derive(Debug)]
struct Fanout {
    /// The strand parked on the `fanout` call.
    caller: StrandId,
    /// The arms' task ids, in collection order.
    arms: Vec<TaskId>,
    /// Each arm's member (an exhausted arm's stub names it).
    items: Vec<Json>,
    ends: Vec<Option<ArmEnd>>,
    remaining: usize,
    /// The bytes of the results gathered so far: they are delivered into the caller's VM,
    /// so more than its memory ceiling fails the fanout before they pile up here.
    bytes: usize,
}

/// A fanout that has settled: what the run does with it.
#[derive(Debug)]
pub(crate) struct Settled {
    /// The strand parked on the call, woken with `answer`.
    pub(crate) caller: StrandId,
    /// Every arm, in collection order.
    pub(crate) arms: Vec<TaskId>,
    /// The results in collection order, or the first arm failure raised at the call.
    pub(crate) answer: Answer,
    /// An arm failed: its live siblings are cancelled before the results are taken.
    pub(crate) failed: bool,
}

/// Every fanout in progress, by id (ids in the order the run opened them).
#[derive(Debug, Default)]
pub(crate) struct Fanouts {
    open: BTreeMap<u64, Fanout>,
    next: u64,
}

impl Fanouts {
    /// The id the next fanout will get (the arms carry it before the fanout is opened).
    pub(crate) fn next_id(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        id
    }

    /// Open fanout `id` for `caller` over `arms`, one per member of `items`.
    pub(crate) fn open(&mut self, id: u64, caller: StrandId, arms: Vec<TaskId>, items: Vec<Json>) {
        let count = arms.len();
        self.open.insert(
            id,
            Fanout {
                caller,
                arms,
                items,
                ends: (0..count).map(|_| None).collect(),
                remaining: count,
                bytes: 0,
            },
        );
    }

    /// Whether no fanout is in progress.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Forget every fanout (the run ended).
    pub(crate) fn clear(&mut self) {
        self.open.clear();
    }

    /// Arm `index` of fanout `id` ended. A failure other than round-cap exhaustion settles the
    /// fanout at once (fail-fast); otherwise it settles when every arm has ended. `None`: still
    /// waiting (or no such fanout).
    pub(crate) fn arm_ended(
        &mut self,
        id: u64,
        index: usize,
        end: Result<String, LuaFailure>,
        memory_limit: usize,
    ) -> Option<Settled> {
        let fan = self.open.get_mut(&id)?;
        let failure = match end {
            Ok(text) => {
                fan.bytes = fan.bytes.saturating_add(text.len());
                if fan.bytes > memory_limit {
                    // The caller could never hold them: fail as its VM would, at once.
                    Some(LuaFailure::lua("not enough memory"))
                } else {
                    if let Some(slot) = fan.ends.get_mut(index) {
                        *slot = Some(ArmEnd::Done(text));
                    }
                    None
                }
            }
            Err(failure) if is_exhausted(&failure) => {
                if let Some(slot) = fan.ends.get_mut(index) {
                    *slot = Some(ArmEnd::Exhausted);
                }
                None
            }
            Err(failure) => Some(failure),
        };
        fan.remaining = fan.remaining.saturating_sub(1);
        if failure.is_none() && fan.remaining > 0 {
            return None;
        }
        let fan = self.open.remove(&id)?;
        let (answer, failed) = match failure {
            Some(failure) => (Answer::Error(error_value_of(&failure)), true),
            None => (Answer::Value(results(&fan)), false),
        };
        Some(Settled {
            caller: fan.caller,
            arms: fan.arms,
            answer,
            failed,
        })
    }

    /// Fanout `id`'s caller is being stopped: the fanout is gone, and these are its arms.
    pub(crate) fn stop(&mut self, id: u64) -> Vec<TaskId> {
        self.open
            .remove(&id)
            .map(|fan| fan.arms)
            .unwrap_or_default()
    }
}

/// The results of a fanout every arm of which ended, in collection order: an exhausted arm's
/// stub names its member.
fn results(fan: &Fanout) -> Json {
    Json::Array(
        fan.ends
            .iter()
            .zip(&fan.items)
            .map(|(end, item)| match end {
                Some(ArmEnd::Done(text)) => json!({"ok": true, "exhausted": false, "text": text}),
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
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code

    use super::*;
    use crate::protocol::{ErrorValue, RunErrorKind};

    fn arms(n: usize) -> Vec<TaskId> {
        (0..n)
            .map(|i| TaskId::parse(&format!("0.{i}")).unwrap())
            .collect()
    }

    fn opened(items: &[&str]) -> (Fanouts, u64) {
        let mut fanouts = Fanouts::default();
        let id = fanouts.next_id();
        let items: Vec<Json> = items.iter().map(|i| json!(i)).collect();
        fanouts.open(id, 3, arms(items.len()), items);
        (fanouts, id)
    }

    #[test]
    fn results_come_back_in_collection_order_whatever_order_arms_end_in() {
        let (mut fanouts, id) = opened(&["a", "b", "c"]);
        assert!(fanouts.arm_ended(id, 2, Ok("C".into()), 100).is_none());
        assert!(fanouts.arm_ended(id, 0, Ok("A".into()), 100).is_none());
        let settled = fanouts.arm_ended(id, 1, Ok("B".into()), 100).unwrap();
        assert_eq!(settled.caller, 3);
        assert!(!settled.failed);
        let Answer::Value(results) = settled.answer else {
            panic!("results")
        };
        let texts: Vec<&str> = results
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["A", "B", "C"]);
        assert!(fanouts.is_empty());
    }

    #[test]
    fn an_exhausted_arm_gets_the_stub_naming_its_member() {
        let (mut fanouts, id) = opened(&["only"]);
        let mut exhausted = LuaFailure::lua("tool-call loop did not converge");
        exhausted.error = Some(Box::new(ErrorValue::new(
            "tool_loop_exhausted",
            "tool-call loop did not converge",
            Some(RunErrorKind::Tool),
        )));
        let settled = fanouts.arm_ended(id, 0, Err(exhausted), 100).unwrap();
        let Answer::Value(results) = settled.answer else {
            panic!("results")
        };
        assert_eq!(results[0]["exhausted"], true);
        assert_eq!(
            results[0]["text"],
            "## only\n\nUNKNOWN\n\n(section incomplete: tool loop exhausted)"
        );
    }

    #[test]
    fn the_first_failure_settles_at_once_and_later_ends_are_ignored() {
        let (mut fanouts, id) = opened(&["a", "b", "c"]);
        let settled = fanouts
            .arm_ended(id, 1, Err(LuaFailure::lua("boom")), 100)
            .unwrap();
        assert!(settled.failed);
        assert_eq!(settled.arms.len(), 3);
        assert!(matches!(settled.answer, Answer::Error(ref e) if e.message.contains("boom")));
        assert!(fanouts.arm_ended(id, 0, Ok("late".into()), 100).is_none());
    }

    #[test]
    fn results_past_the_callers_memory_fail_as_its_vm_would() {
        let (mut fanouts, id) = opened(&["a", "b"]);
        assert!(fanouts.arm_ended(id, 0, Ok("12345".into()), 8).is_none());
        let settled = fanouts.arm_ended(id, 1, Ok("6789".into()), 8).unwrap();
        assert!(settled.failed);
        assert!(matches!(settled.answer, Answer::Error(ref e) if e.message == "not enough memory"));
    }

    #[test]
    fn stopping_a_fanout_gives_back_its_arms() {
        let (mut fanouts, id) = opened(&["a", "b"]);
        assert_eq!(fanouts.stop(id).len(), 2);
        assert!(fanouts.is_empty());
        assert!(fanouts.stop(id).is_empty());
    }
}
