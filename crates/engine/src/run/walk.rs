//! Advancing one strand: its top chain's walk (levels of sibling sections, `jump`, the end of
//! the walk), its section entries (a fresh VM each, the shared library replay, then the blocks),
//! and the end of a chain (a called chain's result or failure answered at its caller's `call`,
//! the strand's own chain ending the strand).

use std::sync::Arc;

use promptforge_lua::vm::{ArgvMode, BlockStep, FailureKind, LuaFailure, SectionVm};
use promptforge_syntax::Block;
use serde_json::Value as Json;

use crate::entry::EntryStart;
use crate::events::{AbandonReason, EventKind};
use crate::failure::{engine_failure, error_value_of, internal_failure, is_exhausted};
use crate::ids::TaskId;
use crate::protocol::{Answer, ErrorValue};
use crate::run::{Progress, Run, StrandEnd};
use crate::strand::{Chain, Entry, Level, Place, Stage, Start, Strand, Wait};
use crate::visible;

impl Run {
    /// Do one unit of work on the strand's top chain.
    pub(crate) fn advance_top(&mut self, s: &mut Strand) -> Progress {
        let Some(chain) = s.top_mut() else {
            return Progress::Ended(StrandEnd::Failed {
                failure: internal_failure("internal invariant violated: a strand has no chain"),
                h1_gate: false,
            });
        };
        match chain.entry.take() {
            Some(entry) => {
                if entry.waiting.is_some() {
                    chain.entry = Some(entry);
                    return Progress::Parked;
                }
                self.advance_entry(s, entry)
            }
            None => self.enter_next(s),
        }
    }

    /// Build a queued task's own chain from its start (at its first admission).
    pub(crate) fn start_chain(&mut self, s: &mut Strand, start: Start) {
        let Some(owner) = s.owner else {
            return;
        };
        let chain = self.chain_from(s.task.clone(), owner, s.depth, start, true);
        s.stack.push(chain);
    }

    /// A new chain `id` under admission node `parent`, whose walk starts at the start's
    /// section among its siblings; `seeded`: its first entry gets the start's `item` and
    /// `sys.index` (a task's or arm's chain, not a called one).
    pub(crate) fn chain_from(
        &mut self,
        id: TaskId,
        parent: crate::scheduler::ChainKey,
        depth: u32,
        start: Start,
        seeded: bool,
    ) -> Chain {
        let section = self.prompt.section(start.section).and_then(|x| x.parent);
        let next = visible::siblings(&self.prompt, section)
            .iter()
            .position(|x| *x == start.section)
            .unwrap_or(0);
        Chain {
            id,
            key: self.admission.add_chain(Some(parent)),
            entries: 0,
            children: 0,
            levels: vec![Level {
                parent: section,
                next,
            }],
            var: Arc::unwrap_or_clone(start.var),
            args: start.args,
            argv: start.argv,
            depth,
            entry: None,
            seed: seeded.then_some(start.seed),
            owned: Vec::new(),
            carried: None,
        }
    }

    /// Build a section VM for the strand's top chain (its shared library replay then runs as
    /// the entry's first stage).
    pub(crate) fn new_entry(
        &mut self,
        s: &Strand,
        place: Place,
        name: String,
        id: &str,
    ) -> Result<Box<Entry>, LuaFailure> {
        let Some(chain) = s.top() else {
            return Err(internal_failure(
                "internal invariant violated: a strand has no chain",
            ));
        };
        let argv = match place {
            Place::H1 => ArgvMode::Writable((*chain.argv).clone()),
            Place::Section(_) => ArgvMode::Frozen((*chain.argv).clone()),
        };
        // A task's or arm's item and index reach only its first entry, the target section.
        let seed = if chain.entries == 1 {
            chain.seed.clone().unwrap_or_default()
        } else {
            Default::default()
        };
        let carried = chain.carried.as_ref().map(|c| (c.0.clone(), c.1.clone()));
        let cfg = self.setup.vm_config(
            &self.prompt,
            &self.ctx,
            EntryStart {
                place,
                name: &name,
                id,
                task: &s.task,
                args: chain.args.to_string(),
                argv,
                var: chain.var.clone(),
                seed,
                model_tasks: carried.as_ref().is_some_and(|c| !c.0.is_empty()),
            },
        );
        let vm = SectionVm::new(cfg)?;
        self.event(
            &s.task,
            EventKind::SharedLoadStarted {
                section: name.clone(),
            },
        );
        let (model_tasks, notices) = carried.unwrap_or_default();
        Ok(Box::new(Entry {
            place,
            name,
            vm,
            stage: Stage::Shared,
            next_block: 0,
            running: false,
            waiting: None,
            answer: None,
            model_tasks,
            notices,
            pending: None,
            awaiting: None,
        }))
    }

    /// Enter the top chain's next section, or end the chain when its walk runs out.
    fn enter_next(&mut self, s: &mut Strand) -> Progress {
        let Some(chain) = s.top_mut() else {
            return Progress::Continue;
        };
        let id = loop {
            let Some(level) = chain.levels.last_mut() else {
                // The walk ran past its end: no result.
                return self.finish_chain(s, None);
            };
            let parent = level.parent;
            let next = level.next;
            match visible::siblings(&self.prompt, parent).get(next) {
                Some(&id) => {
                    level.next += 1;
                    break id;
                }
                None => {
                    chain.levels.pop();
                }
            }
        };
        let entry_id = format!("{}.{}", chain.id, chain.entries);
        chain.entries += 1;
        let Some(name) = self.prompt.section(id).map(|x| x.name.clone()) else {
            return Progress::Ended(StrandEnd::Failed {
                failure: internal_failure("internal invariant violated: section out of range"),
                h1_gate: false,
            });
        };
        self.event(
            &s.task,
            EventKind::SectionStarted {
                section: name.clone(),
                id: entry_id.clone(),
            },
        );
        match self.new_entry(s, Place::Section(id), name.clone(), &entry_id) {
            Ok(entry) => {
                if let Some(chain) = s.top_mut() {
                    chain.carried = None;
                    chain.entry = Some(entry);
                }
                Progress::Continue
            }
            Err(failure) => {
                self.teardown(&s.task, &name);
                self.chain_failed(s, Place::Section(id), failure, true)
            }
        }
    }

    /// Put an entry back as the top chain's entry.
    fn park_entry(s: &mut Strand, entry: Box<Entry>) {
        if let Some(chain) = s.top_mut() {
            chain.entry = Some(entry);
        }
    }

    /// Run the entry (its shared library replay, then its blocks) until a coroutine suspends
    /// on work that is not answered at once, or the entry ends.
    fn advance_entry(&mut self, s: &mut Strand, mut entry: Box<Entry>) -> Progress {
        loop {
            if !entry.running {
                match entry.stage {
                    Stage::Shared => {
                        // Every section VM replays the shared library; a prompt without one
                        // replays an empty library, which runs nothing but still reports it.
                        let Some(shared) = self.prompt.shared.clone() else {
                            if let Err(failure) = self.shared_loaded(&s.task, &mut entry) {
                                return self.entry_failed(s, entry, failure, false);
                            }
                            continue;
                        };
                        if let Err(failure) = entry.vm.start_shared(&shared) {
                            return self.shared_failed(s, entry, failure);
                        }
                    }
                    Stage::Blocks => {
                        let prompt = self.prompt.clone();
                        let blocks = match entry.place {
                            Place::H1 => &prompt.h1_blocks[..],
                            Place::Section(id) => {
                                prompt.section(id).map_or(&[][..], |x| x.blocks.as_slice())
                            }
                        };
                        // The next Lua block; prose blocks are read by the block after them.
                        let mut index = entry.next_block;
                        while index < blocks.len() && !matches!(blocks[index], Block::Lua(_)) {
                            index += 1;
                        }
                        let Some(Block::Lua(region)) = blocks.get(index) else {
                            return self.finish_entry(s, entry, None, None);
                        };
                        let prose = match index.checked_sub(1).and_then(|i| blocks.get(i)) {
                            Some(Block::Prose(p)) => p.text.as_str(),
                            _ => "",
                        };
                        entry.next_block = index + 1;
                        self.event(
                            &s.task,
                            EventKind::BlockStarted {
                                section: entry.name.clone(),
                                label: region.label.clone(),
                            },
                        );
                        if let Err(failure) = entry.vm.start_block(region, prose) {
                            return self.entry_failed(s, entry, failure, false);
                        }
                    }
                }
                entry.running = true;
            }
            // A call the strand ran ahead to is dispatched now, in the committed order.
            let step = match entry.pending.take() {
                Some(request) => BlockStep::Suspended(request),
                None => {
                    let answer = entry.answer.take();
                    if let (Some(awaiting), Some(answer)) = (entry.awaiting.take(), &answer) {
                        let kind = crate::report::answered(&entry.name, awaiting, answer);
                        self.event(&s.task, kind);
                    }
                    let step = entry.vm.resume(answer);
                    for report in entry.vm.take_reports() {
                        let kind = crate::report::of_vm(&entry.name, report);
                        self.event(&s.task, kind);
                    }
                    // A recorded jump wins over however the block ended (pcall cannot cancel
                    // it).
                    if entry.stage == Stage::Blocks
                        && !matches!(step, BlockStep::Suspended(_))
                        && let Some(target) = entry.vm.take_jump()
                    {
                        entry.running = false;
                        self.block_succeeded(&s.task, &entry);
                        return self.finish_entry(s, entry, None, Some(target));
                    }
                    step
                }
            };
            if let BlockStep::Suspended(request) = &step
                && self.ahead.is_some()
                && !request
                    .call
                    .as_ref()
                    .is_ok_and(promptforge_protocol::request::SectionRequest::is_local)
            {
                // Only the committed order may pass this call: the strand stops here.
                if let BlockStep::Suspended(request) = step {
                    entry.pending = Some(request);
                }
                Self::park_entry(s, entry);
                return Progress::Paused;
            }
            match step {
                BlockStep::Suspended(request) => match self.dispatch(s, &mut entry, &request) {
                    Ok(super::dispatch::Dispatch::Effect(effect)) => {
                        entry.awaiting = crate::report::awaiting(&effect);
                        let (id, work) = if self.ahead.is_some() {
                            let issued = self.effects.issue_ahead(s.id, effect, s.held);
                            self.ahead_issued.push(issued.0);
                            issued
                        } else {
                            self.effects.issue(s.id, effect)
                        };
                        if self.ctx.effect_sites {
                            self.sites.insert(
                                id,
                                crate::run::EffectSite {
                                    section: entry.name.clone(),
                                    line: request.site.as_ref().map(|(_, line)| *line),
                                },
                            );
                        }
                        entry.waiting = Some(Wait::Effect(id, work));
                        Self::park_entry(s, entry);
                        return Progress::Parked;
                    }
                    Ok(super::dispatch::Dispatch::Answer(answer)) => {
                        entry.answer = Some(answer);
                    }
                    Ok(super::dispatch::Dispatch::Call(chain)) => {
                        entry.waiting = Some(Wait::Chain);
                        Self::park_entry(s, entry);
                        s.stack.push(*chain);
                        return Progress::Continue;
                    }
                    Ok(super::dispatch::Dispatch::Park) => {
                        entry.waiting = Some(Wait::Tasks);
                        Self::park_entry(s, entry);
                        // A strand parked on a wait gives its slot back.
                        self.release_slot(s, crate::strand::Slot::Lent);
                        return Progress::Parked;
                    }
                    Ok(super::dispatch::Dispatch::Fail(error)) => {
                        let name = entry.name.clone();
                        drop(entry);
                        self.teardown(&s.task, &name);
                        self.end(crate::outcome::Outcome::Failed(error));
                        return Progress::Continue;
                    }
                    Err(message) => {
                        return self.coroutine_failed(s, entry, internal_failure(message));
                    }
                },
                BlockStep::Failed(failure) => return self.coroutine_failed(s, entry, failure),
                BlockStep::Finished(result) => {
                    entry.running = false;
                    if entry.stage == Stage::Shared {
                        if let Err(failure) = self.shared_loaded(&s.task, &mut entry) {
                            return self.entry_failed(s, entry, failure, false);
                        }
                        continue;
                    }
                    self.block_succeeded(&s.task, &entry);
                    if let Some(result) = result {
                        return self.finish_entry(s, entry, Some(result), None);
                    }
                    // A block's end reads var back: a reassigned var fails here.
                    if let Err(failure) = entry.vm.read_back_var() {
                        return self.entry_failed(s, entry, failure, true);
                    }
                }
            }
        }
    }

    /// The shared library replay is done (or there was none): report it, install the alias
    /// globals (step 11), and move on to the blocks.
    fn shared_loaded(&mut self, task: &TaskId, entry: &mut Entry) -> Result<(), LuaFailure> {
        self.event(
            task,
            EventKind::SharedLoadSucceeded {
                section: entry.name.clone(),
            },
        );
        entry.vm.install_alias_globals()?;
        entry.stage = Stage::Blocks;
        Ok(())
    }

    fn block_succeeded(&mut self, task: &TaskId, entry: &Entry) {
        let label = visible::blocks_of(&self.prompt, entry.place)
            .get(entry.next_block.saturating_sub(1))
            .and_then(Block::as_lua)
            .map(|r| r.label.clone())
            .unwrap_or_default();
        self.event(
            task,
            EventKind::BlockSucceeded {
                section: entry.name.clone(),
                label,
            },
        );
    }

    /// The entry's coroutine failed: the shared library load or a block, by its stage.
    fn coroutine_failed(
        &mut self,
        s: &mut Strand,
        entry: Box<Entry>,
        failure: LuaFailure,
    ) -> Progress {
        match entry.stage {
            Stage::Shared => self.shared_failed(s, entry, failure),
            Stage::Blocks => self.entry_failed(s, entry, failure, false),
        }
    }

    /// The shared library failed to load: `Lua` wherever it happens (H1 pass included).
    fn shared_failed(
        &mut self,
        s: &mut Strand,
        entry: Box<Entry>,
        failure: LuaFailure,
    ) -> Progress {
        self.event(
            &s.task,
            EventKind::SharedLoadFailed {
                section: entry.name.clone(),
            },
        );
        let place = entry.place;
        self.end_entry_on_failure(s, entry, &failure);
        self.chain_failed(s, place, failure, true)
    }

    /// A block failed (`around`: a read-back after it, which stays `Lua` in the H1 pass).
    fn entry_failed(
        &mut self,
        s: &mut Strand,
        entry: Box<Entry>,
        failure: LuaFailure,
        around: bool,
    ) -> Progress {
        if !around {
            self.event(
                &s.task,
                EventKind::BlockFailed {
                    section: entry.name.clone(),
                },
            );
        }
        let place = entry.place;
        self.end_entry_on_failure(s, entry, &failure);
        self.chain_failed(s, place, failure, around)
    }

    /// Tear a failed entry down; the model tasks it started are abandoned.
    fn end_entry_on_failure(&mut self, s: &Strand, entry: Box<Entry>, failure: &LuaFailure) {
        let reason = if is_exhausted(failure) {
            AbandonReason::ToolLoopExhausted
        } else {
            AbandonReason::OwnerFailed
        };
        let name = entry.name.clone();
        let model_tasks = entry.model_tasks.clone();
        drop(entry);
        self.teardown(&s.task, &name);
        self.abandon_owned(&model_tasks, reason);
    }

    /// The entry ran out of blocks, returned, or jumped: read back, tear down, and move on.
    fn finish_entry(
        &mut self,
        s: &mut Strand,
        entry: Box<Entry>,
        result: Option<String>,
        jump: Option<String>,
    ) -> Progress {
        let var = entry.vm.read_back_var();
        let argv = match entry.place {
            Place::H1 if result.is_none() => Some(entry.vm.read_back_argv()),
            _ => None,
        };
        let Entry {
            name,
            place,
            model_tasks,
            notices,
            ..
        } = *entry;
        self.teardown(&s.task, &name);
        // A read-back failure fails the chain, the section's model tasks with it.
        let (var, argv) = match (var, argv.transpose()) {
            (Ok(var), Ok(argv)) => (var, argv),
            (Err(failure), _) | (_, Err(failure)) => {
                self.abandon_owned(&model_tasks, AbandonReason::OwnerFailed);
                return self.chain_failed(s, place, failure, true);
            }
        };
        if place == Place::H1 && result.is_none() {
            // The H1 pass hands its model tasks and their notices to the walk.
            if let Some(chain) = s.top_mut()
                && !model_tasks.is_empty()
            {
                chain.carried = Some(Box::new((model_tasks, notices)));
            }
        } else {
            self.abandon_owned(&model_tasks, AbandonReason::OwnerReturned);
        }
        if let Some(chain) = s.top_mut() {
            chain.var = var;
            if let Some(argv) = argv {
                chain.argv = Arc::new(argv);
            }
        }
        if let Place::Section(_) = place {
            self.event(&s.task, EventKind::SectionFinished { section: name });
        }
        if let Some(result) = result {
            return self.finish_chain(s, Some(result));
        }
        if let Some(target) = jump {
            return self.apply_jump(s, place, &target);
        }
        Progress::Continue
    }

    /// Move the top chain's walk to a jump's target: a sibling (or, from the H1 pass, any
    /// top-level section) continues the walk there; a direct child starts a child walk whose
    /// end resumes the parent level after the jumper. A bad target fails with `Lua`.
    fn apply_jump(&mut self, s: &mut Strand, place: Place, target: &str) -> Progress {
        let id = match visible::resolve(&self.prompt, place, target) {
            Ok(id) => id,
            Err(message) => {
                let failure = engine_failure(ErrorValue::lua(message));
                return self.chain_failed(s, place, failure, true);
            }
        };
        let from = match place {
            Place::Section(from) => Some(from),
            Place::H1 => None,
        };
        let is_child = from
            .and_then(|f| self.prompt.section(f))
            .is_some_and(|x| x.children.contains(&id));
        let parent = self.prompt.section(id).and_then(|x| x.parent);
        let index = visible::siblings(&self.prompt, parent)
            .iter()
            .position(|x| *x == id)
            .unwrap_or(0);
        let Some(chain) = s.top_mut() else {
            return Progress::Continue;
        };
        if is_child {
            chain.levels.push(Level {
                parent,
                next: index,
            });
        } else if let Some(level) = chain.levels.last_mut() {
            level.next = index;
        }
        Progress::Continue
    }

    /// The top chain ended normally, with a result or by running off its walk. Its live tasks
    /// are settled first: author tasks still live fail the chain with `tasks_live`.
    pub(crate) fn finish_chain(&mut self, s: &mut Strand, result: Option<String>) -> Progress {
        let Some(chain) = s.stack.pop() else {
            return Progress::Continue;
        };
        let leaked = self.settle_chain(s, &chain, AbandonReason::OwnerReturned);
        self.admission.remove_chain(chain.key);
        let outcome = match leaked {
            Some(error) => Err(error),
            None => Ok(result),
        };
        match (s.top_mut().and_then(|c| c.entry.as_mut()), outcome) {
            // A called chain's result is what `call` returns ('' when it ran off its walk).
            (Some(caller), Ok(result)) => {
                caller.answer_with(Answer::Value(Json::String(result.unwrap_or_default())));
                Progress::Continue
            }
            (Some(caller), Err(error)) => {
                caller.answer_with(Answer::Error(error));
                Progress::Continue
            }
            (None, Ok(result)) => Progress::Ended(StrandEnd::Returned(result)),
            (None, Err(error)) => Progress::Ended(StrandEnd::Failed {
                failure: engine_failure(error),
                h1_gate: false,
            }),
        }
    }

    /// A failure ended the top chain: a called chain's failure is raised at its caller's
    /// `call` as the chain's own error value; the strand's own chain ends the strand. Its live
    /// tasks are abandoned.
    pub(crate) fn chain_failed(
        &mut self,
        s: &mut Strand,
        place: Place,
        failure: LuaFailure,
        around: bool,
    ) -> Progress {
        if failure.kind == FailureKind::Cancelled {
            if self.ahead.is_some() {
                // Ending the run is the committed order's to do.
                s.cont = Some(Box::new(crate::strand::Cont::Failed {
                    place,
                    failure,
                    around,
                }));
                return Progress::Paused;
            }
            // The Host cancelled: the whole run ends, whichever chain saw it.
            self.end(crate::outcome::Outcome::Cancelled);
            return Progress::Continue;
        }
        let Some(chain) = s.stack.pop() else {
            return Progress::Continue;
        };
        // The chain's tasks are abandoned because it failed; only the failing entry's model
        // tasks (abandoned as the entry ended) are told the tool loop was exhausted.
        self.settle_chain(s, &chain, AbandonReason::OwnerFailed);
        self.admission.remove_chain(chain.key);
        match s.top_mut().and_then(|c| c.entry.as_mut()) {
            Some(caller) => {
                caller.answer_with(Answer::Error(error_value_of(&failure)));
                Progress::Continue
            }
            None => Progress::Ended(StrandEnd::Failed {
                failure,
                h1_gate: place == Place::H1 && !around,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code

    use crate::driver::drive_kept as driven;

    /// `call` runs the callee and returns to the caller; `jump` leaves the walk for its target;
    /// the walk visits sections in document order, and no strand is left when it ends.
    #[test]
    fn call_returns_and_jump_moves_the_walk() {
        let (run, t) = driven(
            "## One\n\n```lua\nvar.trail = (var.trail or '') .. 'one,' .. call('## Helper')\njump('## Three')\n```\n\n## Two\n\n```lua\nvar.trail = var.trail .. 'two,'\n```\n\n## Three\n\n```lua\nreturn var.trail .. 'three'\n```\n\n## Helper\n\n```lua\nreturn 'helper,'\n```\n",
        );
        assert_eq!(t.result(), "one,helper,three");
        assert!(run.strands.is_empty());
        assert!(run.runnable.is_empty());
    }
}
