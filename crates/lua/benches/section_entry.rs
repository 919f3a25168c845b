//! Section entry: building a section VM, replaying the shared library, running one block and
//! tearing the VM down, beside a bare mlua VM doing the same block as the baseline.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use criterion::{Criterion, criterion_group, criterion_main};
use mlua::{Lua, LuaOptions, StdLib};
use promptforge_lua::vm::{ArgvMode, BlockStep, SectionVm, VmConfig};
use promptforge_syntax::Prompt;
use serde_json::json;

// The same allocator the `promptforge` binary uses, so the figures are the product's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PROMPT: &str = "---\nname: bench\ndescription: d\npromptforge: 0\n---\n\n# Bench\n\n```lua shared\nfunction twice(s) return s .. s end\n```\n\n## Main\n\nSome prose.\n\n```lua\nlocal t = {}\nfor i = 1, 10 do t[i] = i end\nreturn twice('x') .. #t\n```\n";

fn config() -> VmConfig {
    VmConfig {
        section_name: "Main".into(),
        args: String::new(),
        argv: ArgvMode::Frozen(json!({"prose": ""})),
        var: json!({}),
        sys: json!({"id": "0.1", "when": "2026-01-01T00:00:00Z", "taskid": "0", "section_name": "Main", "execution": "bench", "section_count": 1}),
        snapshot: None,
        visible: promptforge_lua::vm::VisibleSet::Listed(std::sync::Arc::from(Vec::new())),
        log_events: 1024,
        cancel: Arc::new(AtomicBool::new(false)),
        region_labels: Arc::from(vec![
            "prompt shared library".into(),
            "section `Main` epilog".into(),
        ]),
        random_seed: 1,
        models: Default::default(),
        round_cap: 24,
        nonce: "0123456789abcdef0123456789abcdef".into(),
        input_plugin: None,
        bound_tools: Arc::from(Vec::new()),
        item: None,
        model_tasks: false,
        call_sites: false,
    }
}

fn bench_entry(c: &mut Criterion) {
    let prompt = Prompt::parse(PROMPT).unwrap();
    let shared = prompt.shared.clone().unwrap();
    let block = prompt.sections[0].lua_blocks().next().unwrap().clone();
    let mut group = c.benchmark_group("section entry");
    group.bench_function("bare mlua VM, Lua::new() (baseline)", |b| {
        b.iter(|| {
            let lua = Lua::new();
            lua.load(&shared.bytecode[..]).exec().unwrap();
            let out: String = lua.load(&block.bytecode[..]).eval().unwrap();
            drop(lua);
            out
        })
    });
    group.bench_function("bare mlua VM, sandbox libraries only (baseline)", |b| {
        b.iter(|| {
            let lua = Lua::new_with(
                StdLib::STRING | StdLib::TABLE | StdLib::MATH,
                LuaOptions::new(),
            )
            .unwrap();
            lua.load(&shared.bytecode[..]).exec().unwrap();
            let out: String = lua.load(&block.bytecode[..]).eval().unwrap();
            drop(lua);
            out
        })
    });
    group.bench_function("section VM", |b| {
        b.iter(|| {
            let mut vm = SectionVm::new(config()).unwrap();
            vm.load_shared(&shared).unwrap();
            vm.start_block(&block, "Some prose.").unwrap();
            let step = vm.resume(None);
            let var = vm.read_back_var().unwrap();
            drop(vm);
            match step {
                BlockStep::Finished(result) => (result, var),
                other => panic!("{other:?}"),
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench_entry);
criterion_main!(benches);
