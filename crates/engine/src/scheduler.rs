//! Scheduling, as data: which answer the run takes next ([`Effects`]), and which queued task
//! runs next under the concurrency limit ([`Admission`]).
//!
//! Nothing here knows about Lua or sections; the run asks these two structures what to do and
//! tells them what happened. Both are deterministic: given the same calls in the same order they
//! give the same answers, whatever the Host's timing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::ids::StrandId;
use crate::protocol::{Answer, Batch, Commits, Delivery, Effect, EffectId, PROVISIONAL};

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
    /// The id the Host knows it by: its provisional id when it was issued ahead.
    sent_as: EffectId,
    /// It has its final id and a place in its lane.
    committed: bool,
}

/// An answer the run takes now.
#[derive(Debug)]
pub(crate) struct Delivered {
    pub(crate) id: EffectId,
    pub(crate) strand: StrandId,
    pub(crate) work: Work,
    /// The answer; `None` when the strand already consumed it running ahead (its segment is
    /// committed instead).
    pub(crate) answer: Option<Answer>,
}

/// An answer a strand consumes ahead of the committed order.
#[derive(Debug)]
pub(crate) struct AheadAnswer {
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
///
/// Beside that committed order, a strand may run ahead on its own answers
/// ([`Effects::take_ahead`]): the answer is consumed at once but the effect keeps its place in
/// its lane, so the committed order still takes it where it would have. Effects a strand
/// issues while it runs ahead get a provisional id (at or above [`PROVISIONAL`]) and go to the
/// Host at once; they get their final id, in issue order, when the work that issued them is
/// committed ([`Effects::commit`]), so final ids are the same whatever the timing.
#[derive(Debug)]
pub(crate) struct Effects {
    /// The Host's operator is a person (their answers are taken on arrival).
    live_operator: bool,
    next_id: EffectId,
    next_provisional: EffectId,
    live: BTreeMap<EffectId, Live>,
    answers: BTreeMap<EffectId, Answer>,
    /// Answered effects whose answer a strand consumed running ahead.
    consumed: BTreeSet<EffectId>,
    /// Provisional ids of committed effects still outstanding, to their final ids.
    aliases: HashMap<EffectId, EffectId>,
    immediate: BTreeSet<EffectId>,
    ordered: BTreeSet<EffectId>,
    on_arrival: BTreeSet<EffectId>,
    batch: Batch,
    commits: Commits,
    /// Effects issued by a task started before a slot was free in fact, kept from the Host
    /// until the task gets one: their requests, by provisional id.
    held: BTreeMap<EffectId, Effect>,
}

impl Default for Effects {
    fn default() -> Self {
        Effects::new(false)
    }
}

impl Effects {
    /// No effects yet; `live_operator`: the Host's operator is a person.
    pub(crate) fn new(live_operator: bool) -> Effects {
        Effects {
            live_operator,
            next_id: 0,
            next_provisional: PROVISIONAL,
            live: BTreeMap::new(),
            answers: BTreeMap::new(),
            consumed: BTreeSet::new(),
            aliases: HashMap::new(),
            immediate: BTreeSet::new(),
            ordered: BTreeSet::new(),
            on_arrival: BTreeSet::new(),
            batch: Batch::default(),
            commits: Commits::default(),
            held: BTreeMap::new(),
        }
    }

    /// Issue an effect for a strand; it goes out with the next batch.
    pub(crate) fn issue(&mut self, strand: StrandId, effect: Effect) -> (EffectId, Work) {
        let id = self.next_id;
        self.next_id += 1;
        let work = self.track(id, strand, &effect, true);
        self.batch.issued.push((id, effect));
        (id, work)
    }

    /// Keep an effect outstanding under `id` (in its lane when `committed`).
    fn track(&mut self, id: EffectId, strand: StrandId, effect: &Effect, committed: bool) -> Work {
        let delivery = effect.delivery(self.live_operator);
        let work = Work::of(effect);
        if committed {
            self.lane(delivery).insert(id);
        }
        self.live.insert(
            id,
            Live {
                strand,
                delivery,
                work,
                sent_as: id,
                committed,
            },
        );
        work
    }

    /// Issue an effect for a strand running ahead: it goes out with the next batch under a
    /// provisional id, and takes no place in the order until it is committed.
    /// `hold`: keep it from the Host until [`Effects::release`] (a task started before a slot
    /// was free in fact).
    pub(crate) fn issue_ahead(
        &mut self,
        strand: StrandId,
        effect: Effect,
        hold: bool,
    ) -> (EffectId, Work) {
        let id = self.next_provisional;
        self.next_provisional += 1;
        let work = self.track(id, strand, &effect, false);
        if hold {
            self.held.insert(id, effect);
        } else {
            self.batch.issued.push((id, effect));
        }
        (id, work)
    }

    /// Hand a strand's held effects to the Host (it got its slot), in issue order.
    pub(crate) fn release(&mut self, strand: StrandId) {
        let ids: Vec<EffectId> = self
            .held
            .keys()
            .copied()
            // A held effect is never committed (committing releases it): its id is its own.
            .filter(|id| self.live.get(id).is_some_and(|l| l.strand == strand))
            .collect();
        for id in ids {
            self.release_one(id);
        }
    }

    fn release_one(&mut self, provisional: EffectId) {
        if let Some(effect) = self.held.remove(&provisional) {
            self.batch.issued.push((provisional, effect));
        }
    }

    /// Give an effect issued ahead its final id and its place in the order (the work that
    /// issued it is being committed). Returns the final id.
    pub(crate) fn commit(&mut self, provisional: EffectId) -> Option<EffectId> {
        // The order issued it: the Host gets it now, whatever held it back.
        self.release_one(provisional);
        let mut live = self.live.remove(&provisional)?;
        let id = self.next_id;
        self.next_id += 1;
        live.committed = true;
        let delivery = live.delivery;
        self.live.insert(id, live);
        self.lane(delivery).insert(id);
        if let Some(answer) = self.answers.remove(&provisional) {
            self.answers.insert(id, answer);
        }
        if self.consumed.remove(&provisional) {
            self.consumed.insert(id);
        }
        self.aliases.insert(provisional, id);
        self.commits.renamed.push((provisional, id));
        Some(id)
    }

    /// The current id of an effect the Host may know by its provisional id.
    fn resolve(&self, id: EffectId) -> EffectId {
        self.aliases.get(&id).copied().unwrap_or(id)
    }

    /// The strand waiting on an outstanding effect.
    pub(crate) fn strand_of(&self, id: EffectId) -> Option<StrandId> {
        self.live.get(&self.resolve(id)).map(|live| live.strand)
    }

    /// Record the Host's answer; an answer to an effect that is not outstanding is ignored.
    pub(crate) fn answer(&mut self, id: EffectId, answer: Answer) {
        let id = self.resolve(id);
        if self.live.contains_key(&id) && !self.consumed.contains(&id) {
            self.answers.insert(id, answer);
        }
    }

    /// Forget an effect that left: its alias, its answer, its lane.
    fn forget(&mut self, id: EffectId) -> Option<Live> {
        let live = self.live.remove(&id)?;
        self.answers.remove(&id);
        self.consumed.remove(&id);
        if live.sent_as != id {
            self.aliases.remove(&live.sent_as);
        }
        if live.committed {
            self.lane(live.delivery).remove(&id);
        }
        Some(live)
    }

    /// The run no longer wants this effect's answer: it is listed as withdrawn, by the id the
    /// Host knows it by. An effect issued in the committed order stays in the batch even when
    /// it is withdrawn before the Host saw it (the Host then records it and never starts it),
    /// so a record holds every effect the order issued, however the steps fell; only an
    /// effect issued ahead and never committed is taken back out unseen.
    pub(crate) fn withdraw(&mut self, id: EffectId) {
        let id = self.resolve(id);
        let Some(live) = self.forget(id) else {
            return;
        };
        let sent = live.sent_as;
        if self.held.remove(&sent).is_some() {
            // Never reached the Host, and never committed.
            return;
        }
        match self.batch.issued.iter().position(|(i, _)| *i == sent) {
            Some(at) if !live.committed => {
                self.batch.issued.remove(at);
            }
            _ => self.batch.withdrawn.push(sent),
        }
    }

    /// Withdraw everything outstanding (the run ended): what the order issued that never
    /// went out is kept for [`Commits::unsent`].
    pub(crate) fn withdraw_all(&mut self) {
        let ids: Vec<EffectId> = self.live.keys().copied().collect();
        for id in ids {
            self.withdraw(id);
        }
        let batch = std::mem::take(&mut self.batch);
        self.commits.unsent.extend(batch.issued);
    }

    /// The next answer to take, if the order allows one now.
    pub(crate) fn next(&mut self) -> Option<Delivered> {
        let ready = |id: &EffectId| self.answers.contains_key(id) || self.consumed.contains(id);
        let id = match self.immediate.first() {
            Some(&id) => {
                if !ready(&id) {
                    return None;
                }
                id
            }
            None => match self.ordered.first() {
                Some(&id) if ready(&id) => id,
                _ => *self.on_arrival.iter().find(|id| ready(id))?,
            },
        };
        let answer = self.answers.remove(&id);
        let live = self.forget(id)?;
        self.commits.taken.push(id);
        Some(Delivered {
            id,
            strand: live.strand,
            work: live.work,
            answer,
        })
    }

    /// An answer a strand may consume ahead of the committed order: an answered ordered
    /// effect (or one issued ahead) whose strand `eligible` accepts. Its effect stays
    /// outstanding, marked consumed, until the committed order takes it.
    pub(crate) fn take_ahead(
        &mut self,
        mut eligible: impl FnMut(StrandId, EffectId) -> bool,
    ) -> Option<AheadAnswer> {
        let id = *self.answers.keys().find(|id| {
            self.live.get(id).is_some_and(|live| {
                (!live.committed || live.delivery == Delivery::Ordered)
                    && eligible(live.strand, **id)
            })
        })?;
        let answer = self.answers.remove(&id)?;
        let live = self.live.get(&id)?;
        self.consumed.insert(id);
        Some(AheadAnswer {
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

    /// Take the renames and the answers taken since the last call.
    pub(crate) fn take_commits(&mut self) -> Commits {
        std::mem::take(&mut self.commits)
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
    /// Of `active`: tasks whose strand has physically ended ahead of the committed order
    /// (their slot is free in fact, though not yet in the order).
    zombies: u32,
    /// Queued tasks whose strand has physically started ahead of their admission.
    ahead: u32,
    /// Tasks parked on a wait, their slot given back: each takes one again when its wait
    /// returns, so a slot they could reclaim is not free in fact.
    lent: u32,
    /// The spawn sequence of the last of this owner's queued tasks started ahead.
    cursor: Option<u64>,
    /// The spawn sequence of the last of this owner's queued tasks prepared (started with its
    /// work held for a slot).
    prepared: Option<u64>,
}

/// Which walk over the queues: starting a task ahead (a slot must be free in fact), or
/// preparing one (its work held for a slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Start,
    Prepare,
}

/// What a strand counts for in the physical tally beside the committed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Physical {
    /// Nothing beyond its committed slot.
    #[default]
    None,
    /// Started ahead of its admission: it uses a slot the order has not given it.
    Ahead,
    /// Ended ahead of the order: the slot it holds is free in fact.
    Zombie,
    /// Parked on a wait with its slot given back: it will want one again.
    Lent,
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
                zombies: 0,
                ahead: 0,
                lent: 0,
                cursor: None,
                prepared: None,
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

    /// Whether any owner has a queued strand.
    pub(crate) fn has_queued(&self) -> bool {
        !self.heads.is_empty()
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

    /// Move a strand's physical count under `owner` from `from` to `to`.
    pub(crate) fn recount(&mut self, owner: ChainKey, from: Physical, to: Physical) {
        if from == to {
            return;
        }
        let mut next = Some(owner);
        while let Some(key) = next {
            let Some(node) = self.nodes.get_mut(&key) else {
                break;
            };
            match from {
                Physical::Ahead => node.ahead = node.ahead.saturating_sub(1),
                Physical::Zombie => node.zombies = node.zombies.saturating_sub(1),
                Physical::Lent => node.lent = node.lent.saturating_sub(1),
                Physical::None => {}
            }
            match to {
                Physical::Ahead => node.ahead += 1,
                Physical::Zombie => node.zombies += 1,
                Physical::Lent => node.lent += 1,
                Physical::None => {}
            }
            next = node.parent;
        }
    }

    /// Whether a task of `owner` could run in fact now: the slots in use in fact (held, less
    /// those whose strand ended ahead, plus those started ahead, plus those a parked waiter
    /// will take back) are under every limit.
    fn has_physical_room(&self, owner: ChainKey) -> bool {
        let mut limit = self.ceiling;
        let path: Vec<&Node> = self.path(owner).map(|(_, node)| node).collect();
        for node in path.iter().rev() {
            if let Some(own) = node.limit {
                limit = limit.min(own);
            }
            if (node.active.saturating_sub(node.zombies) + node.ahead + node.lent) >= limit {
                return false;
            }
        }
        true
    }

    /// The next queued task to start ahead of its admission, in the order admission would
    /// take it, when a slot is free in fact: the first task of an owner with room that
    /// `fresh` accepts (one that has never run, or one prepared), after the ones already
    /// started ahead.
    pub(crate) fn next_ahead(&mut self, fresh: impl FnMut(StrandId) -> bool) -> Option<StrandId> {
        self.next_queued(Pass::Start, fresh)
    }

    /// The next queued task to prepare (start with its work held for a slot): the first, in
    /// the order admission would take them, that `fresh` accepts, past those prepared or
    /// started ahead already. No room is needed.
    pub(crate) fn next_prepare(&mut self, fresh: impl FnMut(StrandId) -> bool) -> Option<StrandId> {
        self.next_queued(Pass::Prepare, fresh)
    }

    /// The walk both share. Starting ahead follows the order admission would: each owner's
    /// next queued task past its cursor, lowest spawn position first, an owner without room
    /// skipped whole. Preparing walks the owners in turn (it uses no slot).
    fn next_queued(
        &mut self,
        pass: Pass,
        mut fresh: impl FnMut(StrandId) -> bool,
    ) -> Option<StrandId> {
        let owners: Vec<ChainKey> = self.heads.iter().map(|&(_, owner)| owner).collect();
        if pass == Pass::Start {
            let mut next: Vec<(u64, ChainKey, StrandId)> = owners
                .iter()
                .filter_map(|&owner| {
                    let node = self.nodes.get(&owner)?;
                    let from = node.cursor.map_or(0, |c| c + 1);
                    let (&seq, &strand) = node.queue.range(from..).next()?;
                    Some((seq, owner, strand))
                })
                .collect();
            next.sort_unstable();
            for (seq, owner, strand) in next {
                if !self.has_physical_room(owner) {
                    continue;
                }
                if !fresh(strand) {
                    return None;
                }
                if let Some(node) = self.nodes.get_mut(&owner) {
                    node.cursor = Some(seq);
                }
                return Some(strand);
            }
            return None;
        }
        for owner in owners {
            let Some(node) = self.nodes.get_mut(&owner) else {
                continue;
            };
            let past = node.cursor.max(node.prepared);
            let found = node
                .queue
                .range(past.map_or(0, |c| c + 1)..)
                .find(|(_, strand)| fresh(**strand))
                .map(|(&seq, &strand)| (seq, strand));
            if let Some((seq, strand)) = found {
                node.prepared = Some(seq);
                return Some(strand);
            }
        }
        None
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
        fx.withdraw(b); // never left the engine: still reported, as issued and withdrawn
        fx.withdraw(a); // already with the Host
        fx.answer(a, value(1)); // a late answer is ignored
        fx.answer(c, value(3));
        assert_eq!(fx.next().unwrap().id, c);
        let batch = fx.take_batch();
        assert_eq!(
            batch.issued.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [b, c]
        );
        assert_eq!(batch.withdrawn, [b, a]);
        assert!(!fx.any_live());
    }

    #[test]
    fn effects_issued_ahead_get_final_ids_in_commit_order() {
        let mut fx = Effects::default();
        let (a, _) = fx.issue(1, Effect::Ask);
        let (b, _) = fx.issue(2, Effect::Ask);
        // b's answer comes first: its strand runs ahead on it and issues p.
        fx.answer(b, value(2));
        assert!(fx.next().is_none(), "the order still waits for a");
        let taken = fx.take_ahead(|strand, _| strand == 2).unwrap();
        assert_eq!((taken.id, taken.strand), (b, 2));
        let (p, _) = fx.issue_ahead(2, Effect::Ask, false);
        assert!(crate::protocol::is_provisional(p));
        // p's answer arrives under its provisional id before the order reaches it.
        fx.answer(p, value(3));
        // A never-committed effect issued ahead leaves the batch unseen when withdrawn.
        let (q, _) = fx.issue_ahead(2, Effect::Ask, false);
        fx.withdraw(q);
        let batch = fx.take_batch();
        assert_eq!(
            batch.issued.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [a, b, p]
        );
        assert!(batch.withdrawn.is_empty());
        fx.answer(a, value(1));
        assert_eq!(fx.next().unwrap().id, a);
        let delivered = fx.next().unwrap();
        assert_eq!(delivered.id, b);
        assert!(delivered.answer.is_none(), "consumed ahead");
        // Committing b's segment gives p the next final id; its answer moves with it.
        let id = fx.commit(p).unwrap();
        assert_eq!(id, 2);
        assert_eq!(
            fx.strand_of(p),
            Some(2),
            "the provisional id still finds it"
        );
        let delivered = fx.next().unwrap();
        assert_eq!(delivered.id, id);
        assert!(delivered.answer.is_some());
        let commits = fx.take_commits();
        assert_eq!(commits.renamed, [(p, id)]);
        assert_eq!(commits.taken, [a, b, id]);
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
