#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Store operations performed directly: 10,000 small writes, then 10,000 reads, on the memory
//! backend and on the directory backend (buffered: creating files dominates, so the synced
//! variant, one fsync per write, runs 1,000 writes to keep the bench short).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use promptforge_harness::store::{DirBackend, Durability, Store, StoreOp};

const OPS: usize = 10_000;

fn write_ops(count: usize) -> Vec<StoreOp> {
    (0..count)
        .map(|i| StoreOp::Write {
            path: format!("bench/d{}/f{i}.txt", i % 50),
            contents: format!("line {i}\nsecond line\n"),
        })
        .collect()
}

fn read_ops() -> Vec<StoreOp> {
    (0..OPS)
        .map(|i| StoreOp::Read {
            path: format!("bench/d{}/f{i}.txt", i % 50),
            range: None,
        })
        .collect()
}

fn filled(mut store: Store, writes: &[StoreOp]) -> Store {
    for op in writes {
        store.perform(op).unwrap();
    }
    store
}

fn bench_store(c: &mut Criterion) {
    let writes = write_ops(OPS);
    let synced_writes = write_ops(OPS / 10);
    let reads = read_ops();
    let mut group = c.benchmark_group("store");
    group.sample_size(10);

    group.bench_function("memory/10k writes", |b| {
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
    group.bench_function("memory/10k reads", |b| {
        b.iter(|| {
            for op in &reads {
                black_box(memory.perform(op).unwrap());
            }
        });
    });

    let directory = |durability: Durability| {
        let dir = tempfile::tempdir().unwrap();
        let backend = DirBackend::open(dir.path())
            .unwrap()
            .with_durability(durability);
        (dir, Store::new(Box::new(backend)))
    };
    group.bench_function("directory/10k writes", |b| {
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
    group.bench_function("directory/10k reads", |b| {
        b.iter(|| {
            for op in &reads {
                black_box(disk.perform(op).unwrap());
            }
        });
    });
    group.bench_function("directory-synced/1k writes", |b| {
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

criterion_group!(benches, bench_store);
criterion_main!(benches);
