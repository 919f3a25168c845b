//! Scheduling, as data: which answer the run takes next ([`Effects`]), and which queued task
//! runs next under the concurrency limit ([`Admission`]).
//!
//! Nothing here knows about Lua or sections; the run asks these two structures what to do and
//! tells them what happened. Both are deterministic: given the same calls in the same order they
//! give the same answers, whatever the Host's timing.

use std::collections::{BTreeMap, BTreeSet};

use crate::protocol::{Answer, Batch, Delivery, Effect, EffectId};
use crate::strand::StrandId;

/// What kind of work an outstanding effect is, for the status of the strand waiting on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// A model round (`blocked` reads `chat`).
    Chat,
    /// A tool call or an operator question (`tool_call`).
    ToolCall,
    /// A store call (`store`).
    Store,
    /// The timeout of a wait (`tasks`).
    Timer,
}

impl Work {
    fn of(effect: &Effect) -> Work {
        match effect {
            Effect::ModelRound(_) => Work::Chat,
            Effect::Store(_) => Work::Store,
            Effect::Ask | Effect::Tool { .. } => Work::ToolCall,
            Effect::Timer { .. } => Work::Timer,
        }
    }
}

#[derive(Debug)]
struct Live {
    strand: StrandId,
    delivery: Delivery,
    work: Work,
}

/// An answer the run takes now.
#[derive(Debug)]
pub(crate) struct Delivered {
    pub(crate) id: EffectId,
    pub(crate) strand: StrandId,
    pub(crate) work: Work,
    pub(crate) answer: Answer,
}

/// Outstanding effects and their answers, and the order in which the run takes the answers.
///
/// The order (see [`Delivery`]): an answered store effect first, lowest id first, and nothing
/// else while any store effect is unanswered; then the oldest outstanding ordered effect, once
/// it is answered; then the oldest answered timer. One answer is taken at a time, and the run
/// runs every chain it unblocks before it takes the next, so the interleaving of chains depends
/// only on the answers, never on when they arrived.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// The Host's operator is a person (their answers are taken on arrival).
    live_operator: bool,
    next_id: EffectId,
    live: BTreeMap<EffectId, Live>,
    answers: BTreeMap<EffectId, Answer>,
    immediate: BTreeSet<EffectId>,
    ordered: BTreeSet<EffectId>,
    on_arrival: BTreeSet<EffectId>,
    batch: Batch,
}

impl Effects {
    /// No effects yet; `live_operator`: the Host's operator is a person.
    pub(crate) fn new(live_operator: bool) -> Effects {
        Effects {
            live_operator,
            ..Effects::default()
        }
    }

    /// Issue an effect for a strand; it goes out with the next batch.
    pub(crate) fn issue(&mut self, strand: StrandId, effect: Effect) -> (EffectId, Work) {
        let id = self.next_id;
        self.next_id += 1;
        let delivery = effect.delivery(self.live_operator);
        let work = Work::of(&effect);
        self.lane(delivery).insert(id);
        self.live.insert(
            id,
            Live {
                strand,
                delivery,
                work,
            },
        );
        self.batch.issued.push((id, effect));
        (id, work)
    }

    /// The strand waiting on an outstanding effect.
    pub(crate) fn strand_of(&self, id: EffectId) -> Option<StrandId> {
        self.live.get(&id).map(|live| live.strand)
    }

    /// Record the Host's answer; an answer to an effect that is not outstanding is ignored.
    pub(crate) fn answer(&mut self, id: EffectId, answer: Answer) {
        if self.live.contains_key(&id) {
            self.answers.insert(id, answer);
        }
    }

    /// The run no longer wants this effect's answer. An effect not yet handed to the Host is
    /// taken back out of the batch; one already out is listed as withdrawn.
    pub(crate) fn withdraw(&mut self, id: EffectId) {
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        self.answers.remove(&id);
        self.lane(live.delivery).remove(&id);
        if let Some(at) = self.batch.issued.iter().position(|(i, _)| *i == id) {
            self.batch.issued.remove(at);
        } else {
            self.batch.withdrawn.push(id);
        }
    }

    /// Withdraw everything outstanding (the run ended).
    pub(crate) fn withdraw_all(&mut self) {
        let ids: Vec<EffectId> = self.live.keys().copied().collect();
        for id in ids {
            self.withdraw(id);
        }
    }

    /// The next answer to take, if the order allows one now.
    pub(crate) fn next(&mut self) -> Option<Delivered> {
        let id = match self.immediate.first() {
            Some(&id) => {
                if !self.answers.contains_key(&id) {
                    return None;
                }
                id
            }
            None => match self.ordered.first() {
                Some(&id) if self.answers.contains_key(&id) => id,
                _ => *self
                    .on_arrival
                    .iter()
                    .find(|id| self.answers.contains_key(id))?,
            },
        };
        let answer = self.answers.remove(&id)?;
        let live = self.live.remove(&id)?;
        self.lane(live.delivery).remove(&id);
        Some(Delivered {
            id,
            strand: live.strand,
            work: live.work,
            answer,
        })
    }

    fn lane(&mut self, delivery: Delivery) -> &mut BTreeSet<EffectId> {
        match delivery {
            Delivery::Immediate => &mut self.immediate,
            Delivery::Ordered => &mut self.ordered,
            Delivery::OnArrival => &mut self.on_arrival,
        }
    }

    /// Whether any effect is outstanding.
    pub(crate) fn any_live(&self) -> bool {
        !self.live.is_empty()
    }

    /// Take the batch for the Host.
    pub(crate) fn take_batch(&mut self) -> Batch {
        std::mem::take(&mut self.batch)
    }
}

/// A chain's node in the admission tree.
pub(crate) type ChainKey = u64;

#[derive(Debug)]
struct Node {
    parent: Option<ChainKey>,
    /// The limit `tasks.concurrency` set (already clamped to the parent's at the time).
    limit: Option<u32>,
    /// Slots held by tasks whose owner is this chain or one of its descendants.
    active: u32,
    /// Tasks of this owner waiting for a slot, by spawn sequence.
    queue: BTreeMap<u64, StrandId>,
}

/// The concurrency limit (chapters 14 and 15): every task holds a slot at its owner chain and
/// every ancestor chain while it runs; a chain's limit (the Harness ceiling for the main walk,
/// lowered by `tasks.concurrency`) caps the slots held beneath it; queued tasks are admitted in
/// spawn order as slots free up. A task parked on a wait gives its slot back and queues again,
/// with its original spawn position, when the wait returns.
///
/// Queues are kept per owner: every task of one owner shares one chain of ancestors, so when
/// one of them cannot run, none of that owner's can, and the owner is skipped whole.
#[derive(Debug)]
pub(crate) struct Admission {
    ceiling: u32,
    next_key: ChainKey,
    nodes: BTreeMap<ChainKey, Node>,
    /// Owners with queued tasks, by the spawn sequence of their first queued task.
    heads: BTreeSet<(u64, ChainKey)>,
}

impl Admission {
    /// An admission tree under the Harness's ceiling (at least 1).
    pub(crate) fn new(ceiling: u32) -> Admission {
        Admission {
            ceiling: ceiling.max(1),
            next_key: 0,
            nodes: BTreeMap::new(),
            heads: BTreeSet::new(),
        }
    }

    /// Add a chain under `parent` (`None` for the main walk).
    pub(crate) fn add_chain(&mut self, parent: Option<ChainKey>) -> ChainKey {
        let key = self.next_key;
        self.next_key += 1;
        self.nodes.insert(
            key,
            Node {
                parent,
                limit: None,
                active: 0,
                queue: BTreeMap::new(),
            },
        );
        key
    }

    /// Forget a chain that ended (its tasks have all ended or been settled).
    pub(crate) fn remove_chain(&mut self, key: ChainKey) {
        if let Some(node) = self.nodes.remove(&key)
            && let Some((&seq, _)) = node.queue.first_key_value()
        {
            self.heads.remove(&(seq, key));
        }
    }

    fn path(&self, key: ChainKey) -> impl Iterator<Item = (ChainKey, &Node)> {
        let mut next = Some(key);
        std::iter::from_fn(move || {
            let key = next?;
            let node = self.nodes.get(&key)?;
            next = node.parent;
            Some((key, node))
        })
    }

    /// The chain's effective limit: its own, clamped by every ancestor's and the ceiling.
    pub(crate) fn effective_limit(&self, key: ChainKey) -> u32 {
        self.path(key)
            .filter_map(|(_, node)| node.limit)
            .fold(self.ceiling, u32::min)
    }

    /// `tasks.concurrency(n)`: the chain's limit becomes `min(n, parent's)`; returns the
    /// effective limit.
    pub(crate) fn set_limit(&mut self, key: ChainKey, n: u32) -> u32 {
        let parent = self
            .nodes
            .get(&key)
            .and_then(|node| node.parent)
            .map_or(self.ceiling, |p| self.effective_limit(p));
        if let Some(node) = self.nodes.get_mut(&key) {
            node.limit = Some(n.max(1).min(parent));
        }
        self.effective_limit(key)
    }

    fn has_room(&self, owner: ChainKey) -> bool {
        let mut limit = self.ceiling;
        // Limits clamp downward along the path, so a node's effective limit is the minimum of
        // its own and every ancestor's; walking up, check each node against the limit seen so
        // far from above. Collect first: the walk runs leaf to root.
        let path: Vec<&Node> = self.path(owner).map(|(_, node)| node).collect();
        for node in path.iter().rev() {
            if let Some(own) = node.limit {
                limit = limit.min(own);
            }
            if node.active >= limit {
                return false;
            }
        }
        true
    }

    fn adjust(&mut self, owner: ChainKey, up: bool) {
        let mut next = Some(owner);
        while let Some(key) = next {
            let Some(node) = self.nodes.get_mut(&key) else {
                break;
            };
            if up {
                node.active += 1;
            } else {
                node.active = node.active.saturating_sub(1);
            }
            next = node.parent;
        }
    }

    /// Queue a strand of `owner` for a slot at spawn position `seq`.
    pub(crate) fn enqueue(&mut self, owner: ChainKey, seq: u64, strand: StrandId) {
        let Some(node) = self.nodes.get_mut(&owner) else {
            return;
        };
        let old_head = node.queue.first_key_value().map(|(&s, _)| s);
        node.queue.insert(seq, strand);
        if old_head.is_none_or(|head| seq < head) {
            if let Some(head) = old_head {
                self.heads.remove(&(head, owner));
            }
            self.heads.insert((seq, owner));
        }
    }

    /// Take a queued strand out of its owner's queue (it was cancelled before it ran).
    pub(crate) fn dequeue(&mut self, owner: ChainKey, seq: u64) {
        let Some(node) = self.nodes.get_mut(&owner) else {
            return;
        };
        let old_head = node.queue.first_key_value().map(|(&s, _)| s);
        node.queue.remove(&seq);
        let new_head = node.queue.first_key_value().map(|(&s, _)| s);
        if old_head != new_head {
            if let Some(head) = old_head {
                self.heads.remove(&(head, owner));
            }
            if let Some(head) = new_head {
                self.heads.insert((head, owner));
            }
        }
    }

    /// Give back a slot held under `owner`.
    pub(crate) fn release(&mut self, owner: ChainKey) {
        self.adjust(owner, false);
    }

    /// Admit every queued strand that fits, in spawn order, taking a slot for each.
    pub(crate) fn admit(&mut self) -> Vec<StrandId> {
        let mut admitted = Vec::new();
        let mut from = (0, 0);
        while let Some(&(seq, owner)) = self.heads.range(from..).next() {
            if !self.has_room(owner) {
                // Every queued task of this owner waits on the same limits: skip them all.
                from = (seq, owner + 1);
                continue;
            }
            self.heads.remove(&(seq, owner));
            let Some(node) = self.nodes.get_mut(&owner) else {
                continue;
            };
            let Some(strand) = node.queue.remove(&seq) else {
                continue;
            };
            if let Some((&next, _)) = node.queue.first_key_value() {
                self.heads.insert((next, owner));
            }
            self.adjust(owner, true);
            admitted.push(strand);
            from = (seq, owner);
        }
        admitted
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use std::time::Duration;

    use super::*;
    use crate::store_path::StoreOp;

    fn store() -> Effect {
        Effect::Store(StoreOp::Exists { path: "a".into() })
    }

    fn timer() -> Effect {
        Effect::Timer {
            duration: Duration::from_secs(1),
        }
    }

    fn value(n: u64) -> Answer {
        Answer::Value(serde_json::json!(n))
    }

    #[test]
    fn ordered_answers_are_taken_in_issue_order() {
        let mut fx = Effects::default();
        let (a, _) = fx.issue(1, Effect::Ask);
        let (b, _) = fx.issue(2, Effect::Ask);
        fx.answer(b, value(2));
        assert!(fx.next().is_none(), "b waits for a");
        fx.answer(a, value(1));
        assert_eq!(fx.next().unwrap().id, a);
        assert_eq!(fx.next().unwrap().id, b);
        assert!(fx.next().is_none());
    }

    #[test]
    fn store_answers_come_first_and_hold_the_rest() {
        let mut fx = Effects::default();
        let (a, _) = fx.issue(1, Effect::Ask);
        let (s, work) = fx.issue(2, store());
        assert_eq!(work, Work::Store);
        fx.answer(a, value(1));
        assert!(
            fx.next().is_none(),
            "an unanswered store call holds everything"
        );
        fx.answer(s, value(2));
        assert_eq!(fx.next().unwrap().id, s);
        assert_eq!(fx.next().unwrap().id, a);
    }

    #[test]
    fn timers_are_taken_when_they_fire_but_after_ready_ordered_answers() {
        let mut fx = Effects::default();
        let (t, _) = fx.issue(1, timer());
        let (a, _) = fx.issue(2, Effect::Ask);
        fx.answer(t, value(0));
        fx.answer(a, value(1));
        assert_eq!(fx.next().unwrap().id, a, "the ordered answer wins a tie");
        assert_eq!(fx.next().unwrap().id, t);
        // A timer does not wait for an unanswered ordered effect.
        let (_b, _) = fx.issue(3, Effect::Ask);
        let (t2, _) = fx.issue(4, timer());
        fx.answer(t2, value(0));
        assert_eq!(fx.next().unwrap().id, t2);
    }

    #[test]
    fn a_persons_answer_is_taken_when_it_comes() {
        let mut fx = Effects::new(true);
        let (ask, work) = fx.issue(1, Effect::Ask);
        assert_eq!(work, Work::ToolCall);
        let (tool, _) = fx.issue(
            2,
            Effect::Tool {
                alias: "t".into(),
                path: "p/x".into(),
                args: serde_json::Value::Null,
            },
        );
        fx.answer(tool, value(2));
        assert_eq!(
            fx.next().unwrap().id,
            tool,
            "the question holds nothing back"
        );
        fx.answer(ask, value(1));
        assert_eq!(fx.next().unwrap().id, ask);
    }

    #[test]
    fn withdrawn_effects_never_block_and_leave_the_batch() {
        let mut fx = Effects::default();
        let (a, _) = fx.issue(1, Effect::Ask);
        let batch = fx.take_batch();
        assert_eq!(batch.issued.len(), 1);
        let (b, _) = fx.issue(2, Effect::Ask);
        let (c, _) = fx.issue(3, Effect::Ask);
        fx.withdraw(b); // never left the engine
        fx.withdraw(a); // already with the Host
        fx.answer(a, value(1)); // a late answer is ignored
        fx.answer(c, value(3));
        assert_eq!(fx.next().unwrap().id, c);
        let batch = fx.take_batch();
        assert_eq!(
            batch.issued.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [c]
        );
        assert_eq!(batch.withdrawn, [a]);
        assert!(!fx.any_live());
    }

    #[test]
    fn admission_follows_spawn_order_under_the_ceiling() {
        let mut ad = Admission::new(2);
        let root = ad.add_chain(None);
        for seq in 0..5 {
            ad.enqueue(root, seq, 100 + seq);
        }
        assert_eq!(ad.admit(), [100, 101]);
        assert!(ad.admit().is_empty());
        ad.release(root);
        assert_eq!(ad.admit(), [102]);
    }

    #[test]
    fn nested_owners_share_the_budget_and_lower_limits_skip_whole_owners() {
        let mut ad = Admission::new(3);
        let root = ad.add_chain(None);
        let a = ad.add_chain(Some(root));
        let b = ad.add_chain(Some(root));
        assert_eq!(ad.set_limit(a, 1), 1);
        assert_eq!(ad.set_limit(b, 16), 3, "clamped to the parent");
        ad.enqueue(a, 0, 10);
        ad.enqueue(a, 1, 11);
        ad.enqueue(b, 2, 20);
        ad.enqueue(b, 3, 21);
        ad.enqueue(b, 4, 22);
        // a may run one at a time; b fills the rest of the run-wide budget.
        assert_eq!(ad.admit(), [10, 20, 21]);
        ad.release(b);
        assert_eq!(ad.admit(), [22], "a is still at its own limit");
        ad.release(a);
        assert_eq!(ad.admit(), [11], "a's next task takes the slot a freed");
        assert!(ad.admit().is_empty(), "the run-wide budget is full");
    }

    #[test]
    fn a_requeued_waiter_keeps_its_spawn_position() {
        let mut ad = Admission::new(1);
        let root = ad.add_chain(None);
        let outer = ad.add_chain(Some(root));
        ad.enqueue(root, 0, 1);
        assert_eq!(ad.admit(), [1]);
        // The outer task waits on its own two tasks: it gives its slot back.
        ad.release(root);
        ad.enqueue(outer, 5, 50);
        ad.enqueue(outer, 6, 51);
        assert_eq!(ad.admit(), [50]);
        // Its wait returns while 50 still runs: it queues again with its old position, ahead
        // of 51, and runs as soon as 50 finishes.
        ad.enqueue(root, 0, 1);
        ad.release(outer);
        assert_eq!(ad.admit(), [1]);
        ad.release(root);
        assert_eq!(ad.admit(), [51]);
    }

    #[test]
    fn dequeued_and_removed_chains_leave_no_trace() {
        let mut ad = Admission::new(1);
        let root = ad.add_chain(None);
        let c = ad.add_chain(Some(root));
        ad.enqueue(c, 3, 30);
        ad.enqueue(c, 4, 40);
        ad.dequeue(c, 3);
        assert_eq!(ad.admit(), [40]);
        ad.release(c);
        ad.enqueue(c, 5, 50);
        ad.remove_chain(c);
        assert!(ad.admit().is_empty());
        assert_eq!(ad.effective_limit(root), 1);
    }
}
