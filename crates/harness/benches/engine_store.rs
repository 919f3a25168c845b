#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code
//! Store calls made by a prompt: a Lua loop of 10,000 small `store.write` calls, and one of
//! 10,000 `store.read` calls, driven through the engine's [`Run`] by a Host loop that answers
//! every `Effect::Store` from a real [`Store`]: in memory, and in a directory on disk (buffered
//! durability; the synced variant, one fsync per write, runs 1,000 writes to stay short).
//!
//! Beside each engine run, the same operations performed directly on the store (no engine, no
//! Lua) are the baseline, so the engine's cost per call is (engine − direct) / calls. Each
//! benchmark reports its throughput in calls; divide the iteration time by the call count for
//! the time per call (`docs/benchmarks.md` lists measured figures).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use promptforge_engine::protocol::{store_answer, store_error_answer};
use promptforge_engine::{Effect, Outcome, Run, RunContext, Step};
use promptforge_harness::store::{DirBackend, Durability, Store, StoreOp};
use promptforge_syntax::Prompt;

/// Calls per run.
const OPS: usize = 10_000;
/// Calls per synced run.
const SYNCED_OPS: usize = 1_000;

/// A prompt whose one section makes `count` store calls of one kind in a Lua loop. The paths
/// spread over 50 folders, as in the direct store bench.
fn prompt(count: usize, call: &str) -> Arc<Prompt> {
    let body = match call {
        "write" => "store.write(path, 'line ' .. i .. '\\nsecond line\\n')",
        "read" => "total = total + #store.read(path)",
        other => panic!("no such call {other}"),
    };
    let text = format!(
        "---\nname: store-bench\ndescription: store calls in a Lua loop\npromptforge: 0\n---\n\n\
         # Store bench\n\n## Calls\n\n```lua\nlocal total = 0\nfor i = 1, {count} do\n  \
         local path = 'bench/d' .. (i % 50) .. '/f' .. i .. '.txt'\n  {body}\nend\n\
         return tostring(total)\n```\n"
    );
    Arc::new(Prompt::parse(&text).unwrap())
}

/// The same paths and contents as the prompt's loop (Lua counts `i` from 1).
fn write_ops(count: usize) -> Vec<StoreOp> {
    (1..=count)
        .map(|i| StoreOp::Write {
            path: format!("bench/d{}/f{i}.txt", i % 50),
            contents: format!("line {i}\nsecond line\n"),
        })
        .collect()
}

fn read_ops(count: usize) -> Vec<StoreOp> {
    (1..=count)
        .map(|i| StoreOp::Read {
            path: format!("bench/d{}/f{i}.txt", i % 50),
            range: None,
        })
        .collect()
}

/// The Host loop: run the prompt to its end, answering every store effect from `store`.
fn drive(prompt: &Arc<Prompt>, store: &mut Store) -> Outcome {
    let mut run = Run::new(prompt.clone(), RunContext::new(1, 1_767_225_600_000));
    loop {
        match run.step() {
            Step::Done(outcome) => return outcome,
            Step::Effects(batch) => {
                assert!(
                    !batch.issued.is_empty(),
                    "the run is blocked with nothing issued"
                );
                for (id, effect) in batch.issued {
                    let answer = match effect {
                        Effect::Store(op) => match store.perform(&op) {
                            Ok(answer) => store_answer(answer),
                            Err(err) => store_error_answer(&err),
                        },
                        Effect::ModelRound(_)
                        | Effect::Ask
                        | Effect::Tool { .. }
                        | Effect::Timer { .. } => {
                            panic!("this prompt makes no model round, asks no one, never waits")
                        }
                    };
                    run.resume(id, answer);
                }
            }
        }
    }
}

fn completed(outcome: &Outcome) {
    assert!(
        matches!(outcome, Outcome::Completed(_)),
        "the run did not complete: {outcome:?}"
    );
}

fn directory(durability: Durability) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let backend = DirBackend::open(dir.path())
        .unwrap()
        .with_durability(durability);
    (dir, Store::new(Box::new(backend)))
}

fn filled(mut store: Store, writes: &[StoreOp]) -> Store {
    for op in writes {
        store.perform(op).unwrap();
    }
    store
}

fn bench_engine_store(c: &mut Criterion) {
    let write_prompt = prompt(OPS, "write");
    let read_prompt = prompt(OPS, "read");
    let synced_prompt = prompt(SYNCED_OPS, "write");
    let writes = write_ops(OPS);
    let reads = read_ops(OPS);
    let synced_writes = write_ops(SYNCED_OPS);

    // The prompts do what the direct baselines do.
    {
        let mut store = Store::memory();
        completed(&drive(&write_prompt, &mut store));
        let outcome = drive(&read_prompt, &mut store);
        let bytes: usize = writes
            .iter()
            .map(|op| match op {
                StoreOp::Write { contents, .. } => contents.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(outcome, Outcome::Completed(bytes.to_string()));
    }

    let mut group = c.benchmark_group("engine store");
    group.sample_size(10);
    group.throughput(Throughput::Elements(OPS as u64));

    // Memory.
    group.bench_function("memory/10k writes/engine", |b| {
        b.iter_batched(
            Store::memory,
            |mut store| {
                completed(&drive(&write_prompt, &mut store));
                store
            },
            BatchSize::PerIteration,
        );
    });
    group.bench_function("memory/10k writes/direct", |b| {
        b.iter_batched(
            Store::memory,
            |mut store| {
                for op in &writes {
                    black_box(store.perform(op).unwrap());
                }
                store
            },
            BatchSize::PerIteration,
        );
    });
    let mut memory = filled(Store::memory(), &writes);
    group.bench_function("memory/10k reads/engine", |b| {
        b.iter(|| completed(&drive(&read_prompt, &mut memory)));
    });
    group.bench_function("memory/10k reads/direct", |b| {
        b.iter(|| {
            for op in &reads {
                black_box(memory.perform(op).unwrap());
            }
        });
    });

    // A directory on disk, buffered.
    group.bench_function("directory-buffered/10k writes/engine", |b| {
        b.iter_batched(
            || directory(Durability::Buffered),
            |(dir, mut store)| {
                completed(&drive(&write_prompt, &mut store));
                (dir, store)
            },
            BatchSize::PerIteration,
        );
    });
    group.bench_function("directory-buffered/10k writes/direct", |b| {
        b.iter_batched(
            || directory(Durability::Buffered),
            |(dir, mut store)| {
                for op in &writes {
                    black_box(store.perform(op).unwrap());
                }
                (dir, store)
            },
            BatchSize::PerIteration,
        );
    });
    let (_dir, disk) = directory(Durability::Buffered);
    let mut disk = filled(disk, &writes);
    group.bench_function("directory-buffered/10k reads/engine", |b| {
        b.iter(|| completed(&drive(&read_prompt, &mut disk)));
    });
    group.bench_function("directory-buffered/10k reads/direct", |b| {
        b.iter(|| {
            for op in &reads {
                black_box(disk.perform(op).unwrap());
            }
        });
    });

    // A directory on disk, synced (Store::directory's default): 1,000 writes.
    group.throughput(Throughput::Elements(SYNCED_OPS as u64));
    group.bench_function("directory-synced/1k writes/engine", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().unwrap();
                let store = Store::directory(dir.path()).unwrap();
                (dir, store)
            },
            |(dir, mut store)| {
                completed(&drive(&synced_prompt, &mut store));
                (dir, store)
            },
            BatchSize::PerIteration,
        );
    });
    group.bench_function("directory-synced/1k writes/direct", |b| {
        b.iter_batched(
            || directory(Durability::Synced),
            |(dir, mut store)| {
                for op in &synced_writes {
                    black_box(store.perform(op).unwrap());
                }
                (dir, store)
            },
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

criterion_group!(benches, bench_engine_store);
criterion_main!(benches);
