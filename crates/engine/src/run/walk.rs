//! Driving one strand's walk: entering the section its top chain's walk names next (a fresh
//! VM each), acting on what an entry's step comes to (a call dispatched, the entry finished
//! or failed, a jump), and the end of a chain (a called chain's result or failure answered at
//! its caller's `call`, the strand's own chain ending the strand). Where the walk goes and how
//! an entry steps are the walk room's (`crate::walk`).

use std::sync::Arc;

use promptforge_lua::vm::{ArgvMode, FailureKind, LuaFailure, SectionVm};
use serde_json::Value as Json;

use crate::entry::EntryStart;
use crate::events::{AbandonReason, EventKind};
use crate::failure::{engine_failure, error_value_of, internal_failure, is_exhausted};
use crate::ids::TaskId;
use crate::protocol::{Answer, ErrorValue};
use crate::run::{Progress, Run, StrandEnd};
use crate::strand::{Chain, Entry, Place, Stage, Start, Strand, Wait};
use crate::walk::EntryStep;

use super::dispatch::Dispatch;

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
        Chain {
            id,
            key: self.admission.add_chain(Some(parent)),
            entries: 0,
            children: 0,
            levels: crate::walk::levels_at(&self.prompt, start.section),
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
        let Some((id, entry_id)) = chain.next_section(&self.prompt) else {
            // The walk ran past its end: no result.
            return self.finish_chain(s, None);
        };
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
        let mut events = Vec::new();
        loop {
            let step = entry.step(&self.prompt, &mut events);
            for kind in events.drain(..) {
                self.event(&s.task, kind);
            }
            let request = match step {
                EntryStep::Suspended(request) => request,
                EntryStep::Done(result) => return self.finish_entry(s, entry, result, None),
                EntryStep::Jumped(target) => {
                    return self.finish_entry(s, entry, None, Some(target));
                }
                EntryStep::SharedFailed(failure) => return self.shared_failed(s, entry, failure),
                EntryStep::BlockFailed { failure, around } => {
                    return self.entry_failed(s, entry, failure, around);
                }
            };
            if self.ahead.is_some()
                && !request
                    .call
                    .as_ref()
                    .is_ok_and(promptforge_protocol::request::SectionRequest::is_local)
            {
                // Only the committed order may pass this call: the strand stops here.
                entry.pending = Some(request);
                Self::park_entry(s, entry);
                return Progress::Paused;
            }
            match self.dispatch(s, &mut entry, &request) {
                Ok(Dispatch::Effect(effect)) => {
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
                Ok(Dispatch::Answer(answer)) => {
                    entry.answer = Some(answer);
                }
                Ok(Dispatch::Call(chain)) => {
                    entry.waiting = Some(Wait::Chain);
                    Self::park_entry(s, entry);
                    s.stack.push(*chain);
                    return Progress::Continue;
                }
                Ok(Dispatch::Park) => {
                    entry.waiting = Some(Wait::Tasks);
                    Self::park_entry(s, entry);
                    // A strand parked on a wait gives its slot back.
                    self.release_slot(s, crate::strand::Slot::Lent);
                    return Progress::Parked;
                }
                Ok(Dispatch::Fail(error)) => {
                    let name = entry.name.clone();
                    drop(entry);
                    self.teardown(&s.task, &name);
                    self.end(crate::outcome::Outcome::Failed(error));
                    return Progress::Continue;
                }
                Err(message) => {
                    let failure = internal_failure(message);
                    return match entry.stage {
                        Stage::Shared => self.shared_failed(s, entry, failure),
                        Stage::Blocks => self.entry_failed(s, entry, failure, false),
                    };
                }
            }
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

    /// Move the top chain's walk to a jump's target (see [`Chain::jump`]); a bad target fails
    /// the chain with `Lua`.
    fn apply_jump(&mut self, s: &mut Strand, place: Place, target: &str) -> Progress {
        let Some(chain) = s.top_mut() else {
            return Progress::Continue;
        };
        match chain.jump(&self.prompt, place, target) {
            Ok(()) => Progress::Continue,
            Err(message) => {
                let failure = engine_failure(ErrorValue::lua(message));
                self.chain_failed(s, place, failure, true)
            }
        }
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
