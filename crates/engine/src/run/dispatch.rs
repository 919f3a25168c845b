//! What a suspended call becomes: Harness work, an answer given at once (an argument error, a
//! `tasks` call that never waits), a called chain pushed on the strand, a park on tasks, or the
//! end of the run (a claims conflict, which nothing catches).

use std::sync::Arc;

use promptforge_lua::vm::Request;
use promptforge_protocol::request::{SectionRequest, StoreCall};
use serde_json::Value as Json;

use crate::args::derive_argv;
use crate::determinism::Claims;
use crate::outcome::RunError;
use crate::protocol::{Answer, Effect, store_error_answer};
use crate::requests::{lua_error, store_op};
use crate::run::{CALL_DEPTH_CAP, Run};
use crate::strand::Seed;
use crate::strand::{Chain, Entry, Start, Strand};
use promptforge_syntax::Prompt;

/// What a suspended call's request becomes.
#[derive(Debug)]
pub(crate) enum Dispatch {
    /// Work for the Harness.
    Effect(Effect),
    /// An answer the engine gives at once.
    Answer(Answer),
    /// A `call` starts this chain; the caller waits on it.
    Call(Box<Chain>),
    /// The strand parks on the wait its `wait` field now holds.
    Park,
    /// The run ends.
    Fail(RunError),
}

/// Which call is starting a chain: it decides the depth cap's message and whether a list
/// section may be the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Starter {
    /// `call`.
    Call,
    /// `tasks.spawn` and the model's `task`.
    Spawn,
    /// `fanout`.
    Fanout,
}

impl Run {
    /// Turn a suspended call's request into work.
    pub(crate) fn dispatch(
        &mut self,
        s: &mut Strand,
        entry: &mut Entry,
        request: &Request,
    ) -> Result<Dispatch, String> {
        let call = request.call.as_ref().map_err(Clone::clone)?;
        Ok(match call {
            SectionRequest::Store(call) => store_call(&mut self.claims, s, call),
            SectionRequest::Call { target, input } => {
                self.start_call(s, entry, target, input.as_deref())
            }
            SectionRequest::Fanout { worker, items } => self.start_fanout(s, entry, worker, items),
            // The shim's pause before reading or changing run-wide model state while the
            // strand ran ahead: in the committed order it returns at once.
            SectionRequest::Sync => Dispatch::Answer(Answer::Value(Json::Null)),
            SectionRequest::Tasks(call) => self.tasks_call(s, entry, call),
            SectionRequest::Round(round) => Dispatch::Effect(Effect::ModelRound(round.clone())),
            SectionRequest::Ask => Dispatch::Effect(Effect::Ask),
            SectionRequest::ToolCall { alias, path, args } => Dispatch::Effect(Effect::Tool {
                alias: alias.clone(),
                path: path.clone(),
                args: args.clone(),
            }),
        })
    }

    /// `call(target, input?)`: a called chain on top of the caller's, or a refusal at the call.
    fn start_call(
        &mut self,
        s: &mut Strand,
        entry: &Entry,
        target: &str,
        input: Option<&str>,
    ) -> Dispatch {
        let start = match chain_start(&self.prompt, s, entry, target, input, Starter::Call) {
            Ok(start) => start,
            Err(message) => return Dispatch::Answer(lua_error(message)),
        };
        let Some(top) = s.top_mut() else {
            return Dispatch::Answer(lua_error("internal invariant violated: no chain"));
        };
        let id = top.id.child(top.children);
        top.children += 1;
        let (depth, parent) = (top.depth + 1, top.key);
        Dispatch::Call(Box::new(self.chain_from(id, parent, depth, start, false)))
    }
}

/// A store call: its path and arguments are checked and its claim recorded before it
/// reaches the store; a claims conflict ends the run.
fn store_call(claims: &mut Claims, s: &Strand, call: &StoreCall) -> Dispatch {
    let op = match store_op(call) {
        Ok(op) => op,
        Err(answer) => return Dispatch::Answer(answer),
    };
    let access = match crate::determinism::Access::of(&op) {
        Ok(access) => access,
        Err(err) => return Dispatch::Answer(store_error_answer(&err)),
    };
    if let Err(conflict) = claims.claim(s.claims, &access) {
        return Dispatch::Fail(conflict.to_run_error());
    }
    Dispatch::Effect(Effect::Store(op))
}

/// Resolve a chain's start (`call`, `tasks.spawn`, a fanout's worker, the model's `task`)
/// from the calling entry: the target over its visible set, the list-section and depth
/// rules, and the input it runs under (`input`, or the caller's own). The caller's `var`
/// snapshot is taken now.
pub(crate) fn chain_start(
    prompt: &Prompt,
    s: &Strand,
    entry: &Entry,
    target: &str,
    input: Option<&str>,
    starter: Starter,
) -> Result<Start, String> {
    let top = s
        .top()
        .ok_or("internal invariant violated: a strand has no chain")?;
    let section = crate::visible::resolve(prompt, entry.place, target)?;
    if starter != Starter::Call
        && let Some(found) = prompt.section(section)
        && found.items.is_some()
    {
        return Err(format!(
            "section `{}` is a list section, not a worker template",
            found.name
        ));
    }
    if top.depth + 1 > CALL_DEPTH_CAP {
        let word = match starter {
            Starter::Call | Starter::Spawn => "call",
            Starter::Fanout => "fanout",
        };
        return Err(format!("{word} recursion exceeded cap of {CALL_DEPTH_CAP}"));
    }
    let var = entry
        .vm
        .read_back_var()
        .map_err(|failure| failure.message)?;
    let (args, argv) = match input {
        Some(input) => (
            Arc::from(input),
            Arc::new(derive_argv(&prompt.frontmatter.args, input)),
        ),
        None => (top.args.clone(), top.argv.clone()),
    };
    Ok(Start {
        section,
        var: Arc::new(var),
        args,
        argv,
        seed: Seed::default(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code

    use super::*;
    use crate::driver::drive_kept as driven;

    /// A call nested past the cap is refused at the call, as a `lua` error the caller sees.
    #[test]
    fn calls_past_the_depth_cap_are_refused_at_the_call() {
        let (_, t) = driven(
            "## Main\n\n```lua\nreturn call('## A')\n```\n\n## A\n\n```lua\nlocal ok, r = pcall(call, '## B')\nif not ok then return 'refused: ' .. tostring(r) end\nreturn r\n```\n\n## B\n\n```lua\nlocal ok, r = pcall(call, '## A')\nif not ok then return 'refused: ' .. tostring(r) end\nreturn r\n```\n",
        );
        assert_eq!(
            t.result(),
            format!("refused: call recursion exceeded cap of {CALL_DEPTH_CAP}")
        );
    }

    /// A line bound no JSON number can carry is refused at the call like any non-integer
    /// number, a catchable error, and never reaches the store.
    #[test]
    fn a_bound_that_is_not_finite_is_refused_at_the_call() {
        let (_, t) = driven(
            "## Main\n\n```lua\nlocal ok1, e1 = pcall(store.read, 'f', 1, math.huge)\nlocal ok2, e2 = pcall(store.read_numbered, 'f', 0/0)\nreturn tostring(e1) .. ' | ' .. tostring(e2)\n```\n",
        );
        assert_eq!(
            t.result(),
            "end must be an integer, got number | start must be an integer, got number"
        );
        assert!(t.effects.is_empty());
    }

    /// Store calls become store effects after their claims; a bad path is refused at the call
    /// with a store error and claims nothing.
    #[test]
    fn store_calls_claim_then_reach_the_store() {
        let (run, t) = driven(
            "## Main\n\n```lua\nstore.write('a.txt', 'x')\nlocal ok, err = pcall(store.read, '/abs')\nreturn store.read('a.txt') .. ' ' .. err.reason\n```\n",
        );
        assert_eq!(t.result(), "x invalid_path");
        let stores = t
            .effects
            .iter()
            .filter(|(_, e)| matches!(e, Effect::Store(_)))
            .count();
        assert_eq!(stores, 2, "the refused read never reached the store");
        drop(run);
    }
}
