//! The walk's own state, decided over the prompt alone: where a chain's walk goes next (its
//! levels of sibling sections, the end of the walk, a `jump`), and how a section entry steps
//! through its stages (the shared library replay, then each Lua block with the prose before
//! it).
//!
//! Nothing here reaches the rest of the run. A chain answers with the section to enter; an
//! entry's [`Entry::step`] runs its VM until something needs the run ([`EntryStep`]: a
//! suspended call, the entry's end, a jump, a failure) and puts the events it reports in a
//! sink, in order. `run/walk.rs` decides what each answer means for strands, tasks and effects.

use promptforge_lua::vm::{BlockStep, LuaFailure, Request};
use promptforge_syntax::{Block, Prompt, SectionId};

use crate::events::EventKind;
use crate::strand::{Chain, Entry, Level, Place, Stage};
use crate::visible;

/// A chain's walk as it starts at `section`: one level, the section's siblings, positioned
/// at the section itself.
pub(crate) fn levels_at(prompt: &Prompt, section: SectionId) -> Vec<Level> {
    vec![level_at(prompt, section)]
}

/// The level of a section's siblings, positioned at the section.
fn level_at(prompt: &Prompt, section: SectionId) -> Level {
    let parent = prompt.section(section).and_then(|x| x.parent);
    let next = visible::siblings(prompt, parent)
        .iter()
        .position(|x| *x == section)
        .unwrap_or(0);
    Level { parent, next }
}

impl Chain {
    /// The next section the walk enters and the entry's id (`{chain}.{n}`), moving past
    /// levels that ran out; `None` when the whole walk has (the chain ends with no result).
    pub(crate) fn next_section(&mut self, prompt: &Prompt) -> Option<(SectionId, String)> {
        let id = loop {
            let level = self.levels.last_mut()?;
            match visible::siblings(prompt, level.parent).get(level.next) {
                Some(&id) => {
                    level.next += 1;
                    break id;
                }
                None => {
                    self.levels.pop();
                }
            }
        };
        let entry_id = format!("{}.{}", self.id, self.entries);
        self.entries += 1;
        Some((id, entry_id))
    }

    /// Move the walk to a jump's target, resolved from where the jump was made: a sibling
    /// (or, from the H1 pass, any top-level section) continues the walk there; a direct child
    /// starts a child level whose end resumes the parent level after the jumper. `Err` is the
    /// message of a target that does not resolve.
    pub(crate) fn jump(
        &mut self,
        prompt: &Prompt,
        from: Place,
        target: &str,
    ) -> Result<(), String> {
        let id = visible::resolve(prompt, from, target)?;
        let is_child = match from {
            Place::Section(from) => prompt
                .section(from)
                .is_some_and(|x| x.children.contains(&id)),
            Place::H1 => false,
        };
        let level = level_at(prompt, id);
        if is_child {
            self.levels.push(level);
        } else if let Some(current) = self.levels.last_mut() {
            current.next = level.next;
        }
        Ok(())
    }
}

/// What an entry's step came to: something only the run can act on.
#[derive(Debug)]
pub(crate) enum EntryStep {
    /// A coroutine suspended on a call to the engine (or the strand had run ahead to one).
    Suspended(Box<Request>),
    /// The entry is done: its blocks ran out (`None`), or a block returned a scalar.
    Done(Option<String>),
    /// A block recorded a `jump` to this target (it wins however the block ended).
    Jumped(String),
    /// The shared library replay failed.
    SharedFailed(LuaFailure),
    /// A block failed; `around`: the read-back of `var` after it did (which stays `Lua` in
    /// the H1 pass).
    BlockFailed { failure: LuaFailure, around: bool },
}

impl Entry {
    /// Run the entry until it needs the run: start its stages in order (the shared library
    /// replay, then each Lua block, the prose block before it as its `prose`), resume its
    /// coroutine with the answer it holds, and report what happened. A call the strand ran
    /// ahead to comes back first. The events reported on the way (shared load, block starts
    /// and ends, an answered round or tool call, the VM's own reports) go to `events`.
    pub(crate) fn step(&mut self, prompt: &Prompt, events: &mut Vec<EventKind>) -> EntryStep {
        if let Some(request) = self.pending.take() {
            return EntryStep::Suspended(request);
        }
        loop {
            if !self.running {
                match self.stage {
                    Stage::Shared => {
                        // Every section VM replays the shared library; a prompt without one
                        // replays an empty library, which runs nothing but still reports it.
                        let Some(shared) = &prompt.shared else {
                            if let Err(failure) = self.shared_loaded(events) {
                                return EntryStep::BlockFailed {
                                    failure,
                                    around: false,
                                };
                            }
                            continue;
                        };
                        if let Err(failure) = self.vm.start_shared(shared) {
                            return EntryStep::SharedFailed(failure);
                        }
                    }
                    Stage::Blocks => {
                        let blocks = visible::blocks_of(prompt, self.place);
                        // The next Lua block; prose blocks are read by the block after them.
                        let mut index = self.next_block;
                        while index < blocks.len() && !matches!(blocks[index], Block::Lua(_)) {
                            index += 1;
                        }
                        let Some(Block::Lua(region)) = blocks.get(index) else {
                            return EntryStep::Done(None);
                        };
                        let prose = match index.checked_sub(1).and_then(|i| blocks.get(i)) {
                            Some(Block::Prose(p)) => p.text.as_str(),
                            _ => "",
                        };
                        self.next_block = index + 1;
                        events.push(EventKind::BlockStarted {
                            section: self.name.clone(),
                            label: region.label.clone(),
                        });
                        if let Err(failure) = self.vm.start_block(region, prose) {
                            return EntryStep::BlockFailed {
                                failure,
                                around: false,
                            };
                        }
                    }
                }
                self.running = true;
            }
            let answer = self.answer.take();
            if let (Some(awaiting), Some(answer)) = (self.awaiting.take(), &answer) {
                events.push(crate::report::answered(&self.name, awaiting, answer));
            }
            let step = self.vm.resume(answer);
            for report in self.vm.take_reports() {
                events.push(crate::report::of_vm(&self.name, report));
            }
            // A recorded jump wins over however the block ended (pcall cannot cancel it).
            if self.stage == Stage::Blocks
                && !matches!(step, BlockStep::Suspended(_))
                && let Some(target) = self.vm.take_jump()
            {
                self.running = false;
                self.block_succeeded(prompt, events);
                return EntryStep::Jumped(target);
            }
            match step {
                BlockStep::Suspended(request) => return EntryStep::Suspended(request),
                BlockStep::Failed(failure) => {
                    return match self.stage {
                        Stage::Shared => EntryStep::SharedFailed(failure),
                        Stage::Blocks => EntryStep::BlockFailed {
                            failure,
                            around: false,
                        },
                    };
                }
                BlockStep::Finished(result) => {
                    self.running = false;
                    if self.stage == Stage::Shared {
                        if let Err(failure) = self.shared_loaded(events) {
                            return EntryStep::BlockFailed {
                                failure,
                                around: false,
                            };
                        }
                        continue;
                    }
                    self.block_succeeded(prompt, events);
                    if result.is_some() {
                        return EntryStep::Done(result);
                    }
                    // A block's end reads var back: a reassigned var fails here.
                    if let Err(failure) = self.vm.read_back_var() {
                        return EntryStep::BlockFailed {
                            failure,
                            around: true,
                        };
                    }
                }
            }
        }
    }

    /// The shared library replay is done (or there was none): report it, install the alias
    /// globals (step 11), and move on to the blocks.
    fn shared_loaded(&mut self, events: &mut Vec<EventKind>) -> Result<(), LuaFailure> {
        events.push(EventKind::SharedLoadSucceeded {
            section: self.name.clone(),
        });
        self.vm.install_alias_globals()?;
        self.stage = Stage::Blocks;
        Ok(())
    }

    /// The block that just ran succeeded.
    fn block_succeeded(&self, prompt: &Prompt, events: &mut Vec<EventKind>) {
        let label = visible::blocks_of(prompt, self.place)
            .get(self.next_block.saturating_sub(1))
            .and_then(Block::as_lua)
            .map(|r| r.label.clone())
            .unwrap_or_default();
        events.push(EventKind::BlockSucceeded {
            section: self.name.clone(),
            label,
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code

    use std::sync::Arc;

    use serde_json::Value as Json;

    use super::*;
    use crate::ids::TaskId;
    use crate::scheduler::Admission;

    const PROMPT: &str = "---\nname: w\ndescription: d\npromptforge: 0\n---\n\n# W\n\n## A\n\nhi\n\n### A1\n\nx\n\n### A2\n\ny\n\n## B\n\nz\n\n## C\n\nw\n";

    fn chain_at(prompt: &Prompt, name: &str) -> Chain {
        let section = SectionId(prompt.sections.iter().position(|s| s.name == name).unwrap());
        Chain {
            id: TaskId::root(),
            key: Admission::new(1).add_chain(None),
            entries: 0,
            children: 0,
            levels: levels_at(prompt, section),
            var: Json::Null,
            args: Arc::from(""),
            argv: Arc::new(Json::Null),
            depth: 0,
            entry: None,
            seed: None,
            owned: Vec::new(),
            carried: None,
        }
    }

    fn walk(prompt: &Prompt, chain: &mut Chain) -> Vec<String> {
        std::iter::from_fn(|| chain.next_section(prompt))
            .map(|(id, entry)| format!("{}@{entry}", prompt.section(id).unwrap().name))
            .collect()
    }

    fn named(prompt: &Prompt, name: &str) -> Place {
        Place::Section(SectionId(
            prompt.sections.iter().position(|s| s.name == name).unwrap(),
        ))
    }

    #[test]
    fn a_walk_visits_its_siblings_in_order_and_never_enters_children() {
        let prompt = Prompt::parse(PROMPT).unwrap();
        let mut chain = chain_at(&prompt, "A");
        assert_eq!(walk(&prompt, &mut chain), ["A@0.0", "B@0.1", "C@0.2"]);
        assert!(chain.levels.is_empty());
        // A chain started at a later section walks on from there.
        let mut chain = chain_at(&prompt, "B");
        assert_eq!(walk(&prompt, &mut chain), ["B@0.0", "C@0.1"]);
    }

    #[test]
    fn a_jump_to_a_child_walks_the_children_then_resumes_after_the_jumper() {
        let prompt = Prompt::parse(PROMPT).unwrap();
        let mut chain = chain_at(&prompt, "A");
        assert_eq!(
            chain.next_section(&prompt).map(|(_, e)| e).as_deref(),
            Some("0.0")
        );
        chain.jump(&prompt, named(&prompt, "A"), "### A1").unwrap();
        assert_eq!(
            walk(&prompt, &mut chain),
            ["A1@0.1", "A2@0.2", "B@0.3", "C@0.4"]
        );
    }

    #[test]
    fn a_jump_to_a_sibling_moves_the_level_and_a_bad_target_changes_nothing() {
        let prompt = Prompt::parse(PROMPT).unwrap();
        let mut chain = chain_at(&prompt, "A");
        chain.next_section(&prompt);
        chain.jump(&prompt, named(&prompt, "A"), "## C").unwrap();
        assert_eq!(walk(&prompt, &mut chain), ["C@0.1"]);
        let mut chain = chain_at(&prompt, "A");
        chain.next_section(&prompt);
        let err = chain
            .jump(&prompt, named(&prompt, "A"), "## Nowhere")
            .unwrap_err();
        assert!(err.contains("## Nowhere"), "{err}");
        assert_eq!(walk(&prompt, &mut chain), ["B@0.1", "C@0.2"]);
        // From the H1 pass, any top-level section is a target.
        let mut chain = chain_at(&prompt, "A");
        chain.jump(&prompt, Place::H1, "## B").unwrap();
        assert_eq!(walk(&prompt, &mut chain), ["B@0.0", "C@0.1"]);
    }

    /// An entry's steps report the shared load, each block's start and end in order, and stop
    /// at a jump (through the in-process driver, which drives real section VMs).
    #[test]
    fn an_entry_reports_its_stages_in_order_and_stops_at_a_jump() {
        let t = crate::driver::drive(
            "---\nname: t\ndescription: d\npromptforge: 0\n---\n\n# T\n\n```lua shared\nlocal greeting = 'hi'\n```\n\n## One\n\nSay it.\n\n```lua\nvar.p = prose\n```\n\n```lua\njump('## Three')\n```\n\n## Two\n\n```lua\nreturn 'never'\n```\n\n## Three\n\n```lua\nreturn var.p\n```\n",
            crate::driver::Order::Issued,
        );
        assert_eq!(t.result(), "Say it.");
        let kinds: Vec<String> = t
            .events
            .iter()
            .map(|e| format!("{:?}", e.kind))
            .map(|k| {
                k.split([' ', '{', '('])
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        let start = kinds.iter().position(|k| k == "SectionStarted").unwrap();
        assert_eq!(
            &kinds[start..start + 7],
            [
                "SectionStarted",
                "SharedLoadStarted",
                "SharedLoadSucceeded",
                "BlockStarted",
                "BlockSucceeded",
                "BlockStarted",
                "BlockSucceeded",
            ]
        );
        // `## Two` is jumped over: the next section entered is `## Three`.
        let sections: Vec<String> = t
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::SectionStarted { section, .. } => Some(section.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(sections, ["One", "Three"]);
    }
}
