//! What a section entry's VM gets from its run (chapter 04's section entry, chapter 05's
//! Engine globals): the run-wide part, fixed once the run is prepared, and the chain's part,
//! given per entry. A room over the prompt and the run's context: it builds a `VmConfig` and
//! knows nothing of strands or effects.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use promptforge_lua::models::ModelsState;
use promptforge_lua::untrusted::nonce_for_run;
use promptforge_lua::vm::{ArgvMode, BoundTool, VmConfig};
use promptforge_syntax::Prompt;
use serde_json::{Map, Value as Json};

use crate::context::RunContext;
use crate::ids::TaskId;
use crate::strand::{Place, Seed};
use crate::visible;
use crate::when::render_when;

/// The run-wide part of every section entry that the run derives from its prompt and context
/// (the rest it reads from them as they are).
#[derive(Debug)]
pub(crate) struct EntrySetup {
    /// `sys.when`.
    when: String,
    /// Every Lua region's location label, for errors.
    labels: Arc<[String]>,
    /// Run-wide model roles, the current model and the prompt-wide default.
    pub(crate) models: Rc<RefCell<ModelsState>>,
    /// The run's nonce for `untrusted` envelopes.
    pub(crate) nonce: String,
    /// The bound tool slots (filled at prepare).
    pub(crate) bound_tools: Arc<[BoundTool]>,
    /// The `promptforge/user-input` prelude: `Some(connected)` when declared and provided.
    pub(crate) input_plugin: Option<bool>,
}

/// The chain's part of one section entry.
#[derive(Debug)]
pub(crate) struct EntryStart<'a> {
    /// Where the entry runs.
    pub(crate) place: Place,
    /// The section name (`sys.section_name`).
    pub(crate) name: &'a str,
    /// The entry id (`sys.id`).
    pub(crate) id: &'a str,
    /// The task the entry runs in (`sys.taskid`).
    pub(crate) task: &'a TaskId,
    /// The chain's argument string.
    pub(crate) args: String,
    /// The chain's input, writable only in the H1 pass.
    pub(crate) argv: ArgvMode,
    /// The `var` the entry starts with.
    pub(crate) var: Json,
    /// A task's or arm's `item` and `sys.index` (only at its first entry).
    pub(crate) seed: Seed,
    /// The section's model has started tasks: its rounds gather task notices.
    pub(crate) model_tasks: bool,
}

impl EntrySetup {
    /// The run-wide part for `prompt` under `ctx`, with the run's model state.
    pub(crate) fn new(
        prompt: &Arc<Prompt>,
        ctx: &RunContext,
        models: Rc<RefCell<ModelsState>>,
    ) -> EntrySetup {
        EntrySetup {
            when: render_when(ctx.start_ms),
            labels: prompt.lua_regions().map(|r| r.label.clone()).collect(),
            models,
            nonce: nonce_for_run(ctx.seed),
            bound_tools: Arc::from(Vec::new()),
            input_plugin: None,
        }
    }

    /// The VM configuration of one entry of a run of `prompt` under `ctx`.
    pub(crate) fn vm_config(
        &self,
        prompt: &Arc<Prompt>,
        ctx: &RunContext,
        entry: EntryStart<'_>,
    ) -> VmConfig {
        let sys = self.sys(prompt, ctx, &entry);
        VmConfig {
            section_name: entry.name.to_owned(),
            args: entry.args,
            argv: entry.argv,
            var: entry.var,
            sys,
            item: entry.seed.item,
            snapshot: ctx.snapshot.clone(),
            visible: visible::visible_set(prompt, entry.place),
            log_events: ctx.log_events,
            cancel: ctx.cancel.clone(),
            region_labels: self.labels.clone(),
            random_seed: ctx.seed ^ fnv1a(entry.id.as_bytes()),
            models: self.models.clone(),
            round_cap: prompt
                .frontmatter
                .max_tool_iterations
                .unwrap_or(ctx.round_cap),
            nonce: self.nonce.clone(),
            input_plugin: self.input_plugin,
            bound_tools: self.bound_tools.clone(),
            model_tasks: entry.model_tasks,
            call_sites: ctx.effect_sites,
        }
    }

    /// The `sys` fields of an entry.
    fn sys(&self, prompt: &Prompt, ctx: &RunContext, entry: &EntryStart<'_>) -> Json {
        let (name, id, task, index) = (entry.name, entry.id, entry.task, entry.seed.index);
        let mut sys = Map::new();
        sys.insert("when".into(), Json::String(self.when.clone()));
        sys.insert("id".into(), Json::String(id.to_owned()));
        sys.insert("taskid".into(), Json::String(task.to_string()));
        if let Some(index) = index {
            sys.insert("index".into(), Json::from(index));
        }
        sys.insert("section_name".into(), Json::String(name.to_owned()));
        sys.insert("execution".into(), Json::String(ctx.execution.clone()));
        sys.insert("section_count".into(), Json::from(prompt.top_level.len()));
        Json::Object(sys)
    }
}

/// A small, stable hash (FNV-1a) for deriving per-entry seeds from entry ids.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use serde_json::json;

    use super::*;

    fn setup(frontmatter: &str) -> (Arc<Prompt>, RunContext, EntrySetup) {
        let prompt = Arc::new(
            Prompt::parse(&format!(
                "---\nname: t\ndescription: d\npromptforge: 0\n{frontmatter}---\n\n# T\n\n## A\n\n```lua\nreturn 1\n```\n\n## B\n\nB.\n"
            ))
            .unwrap(),
        );
        let mut ctx = RunContext::new(42, 1_700_000_000_000);
        ctx.execution = "t".into();
        let models = Rc::new(RefCell::new(ModelsState::default()));
        let setup = EntrySetup::new(&prompt, &ctx, models);
        (prompt, ctx, setup)
    }

    fn start<'a>(task: &'a TaskId, place: Place, seed: Seed) -> EntryStart<'a> {
        EntryStart {
            place,
            name: "A",
            id: "0.1",
            task,
            args: "x".into(),
            argv: ArgvMode::Frozen(json!({"prose": "x"})),
            var: json!({}),
            seed,
            model_tasks: false,
        }
    }

    #[test]
    fn an_entry_gets_its_sys_fields_and_a_seed_of_its_own() {
        let (prompt, ctx, setup) = setup("");
        let task = TaskId::parse("0").unwrap();
        let place = Place::Section(prompt.top_level[0]);
        let seed = Seed {
            item: Some(json!("m")),
            index: Some(2),
        };
        let cfg = setup.vm_config(&prompt, &ctx, start(&task, place, seed));
        assert_eq!(
            cfg.sys,
            json!({"when": render_when(1_700_000_000_000), "id": "0.1", "taskid": "0",
                   "index": 2, "section_name": "A", "execution": "t", "section_count": 2})
        );
        assert_eq!(cfg.item, Some(json!("m")));
        assert_eq!(cfg.random_seed, 42 ^ fnv1a(b"0.1"));
        assert_eq!(cfg.round_cap, RunContext::new(0, 0).round_cap);
        assert_eq!(cfg.region_labels.len(), 1);
        let other = setup.vm_config(
            &prompt,
            &ctx,
            EntryStart {
                id: "0.2",
                ..start(&task, place, Seed::default())
            },
        );
        assert_ne!(other.random_seed, cfg.random_seed);
        assert!(other.sys.get("index").is_none());
    }

    #[test]
    fn the_prompts_round_cap_wins_over_the_runs() {
        let (prompt, ctx, setup) = setup("max_tool_iterations: 3\n");
        let task = TaskId::parse("0").unwrap();
        let cfg = setup.vm_config(
            &prompt,
            &ctx,
            start(&task, Place::Section(prompt.top_level[0]), Seed::default()),
        );
        assert_eq!(cfg.round_cap, 3);
    }
}
