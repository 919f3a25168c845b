#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code
//! A fanout over 10,000 members, each arm one `models.infer` round, against an instant
//! in-process model: the engine's throughput in arms per second (criterion's throughput), and
//! its peak memory (the process's resident high-water mark around one run, printed once).
//!
//! Every arm is a task strand: queued arms hold no VM, at most 8 run at once, and each builds
//! a section VM, issues one round, and ends. The Host loop answers every effect at once.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use promptforge_engine::{
    Answer, Effect, ModelInfo, Outcome, Run, RunContext, Step, ThinkingCapability,
};
use promptforge_syntax::Prompt;
use serde_json::json;

// The binary's allocator, so the figures match what a user runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ARMS: usize = 10_000;

fn prompt(arms: usize) -> String {
    format!(
        "---\nname: wide\ndescription: one round per arm\npromptforge: 0\nmodels:\n  writer: {{}}\n---\n\n# Wide\n\n```lua\nmodels.default('writer')\n```\n\n## Main\n\n```lua\nlocal members = {{}}\nfor i = 1, {arms} do members[i] = 'm' .. i end\nlocal r = fanout('### Ask', members)\nreturn tostring(#r)\n```\n\n### Ask\n\n```lua\nreturn models.infer(item)\n```\n"
    )
}

fn drive(prompt: &Arc<Prompt>) -> Outcome {
    let mut ctx = RunContext::new(1, 1_767_225_600_000);
    ctx.host.model = Some(ModelInfo {
        id: "bench".into(),
        context: 128_000,
        thinking: ThinkingCapability::Never,
        description: String::new(),
    });
    let mut run = Run::new(prompt.clone(), ctx);
    loop {
        match run.step() {
            Step::Done(outcome) => return outcome,
            Step::Effects(batch) => {
                for (id, effect) in batch.issued {
                    let answer = match effect {
                        Effect::ModelRound(round) => {
                            let text = round
                                .messages
                                .first()
                                .map(|m| m.content().text())
                                .unwrap_or_default();
                            Answer::Value(json!({"text": text, "finish_reason": "stop"}))
                        }
                        other => panic!("unexpected effect {other:?}"),
                    };
                    run.resume(id, answer);
                }
            }
        }
    }
}

/// A `/proc/self/status` figure in kB (Linux), or 0.
fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn bench_fanout(c: &mut Criterion) {
    let wide = Arc::new(Prompt::parse(&prompt(ARMS)).unwrap());
    // Peak memory of one run, before criterion's own allocations.
    let before = status_kb("VmRSS:");
    let outcome = drive(&wide);
    assert_eq!(outcome, Outcome::Completed(ARMS.to_string()));
    let peak = status_kb("VmHWM:");
    println!(
        "fanout of {ARMS} arms: peak resident {:.1} MB above a {:.1} MB baseline",
        peak.saturating_sub(before) as f64 / 1024.0,
        before as f64 / 1024.0
    );
    let mut group = c.benchmark_group("fanout");
    group.sample_size(10);
    group.throughput(Throughput::Elements(ARMS as u64));
    group.bench_function("10000 arms, one instant round each", |b| {
        b.iter(|| black_box(drive(&wide)));
    });
    group.finish();
}

criterion_group!(benches, bench_fanout);
criterion_main!(benches);
