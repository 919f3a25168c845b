//! What the language server does on every change: analyse the whole document again. The
//! target (issue 26) is a 3,000-section prompt answered within 50 ms; the whole answer over
//! the protocol is `crates/cli/benches/lsp_change.rs`.

use criterion::{Criterion, criterion_group, criterion_main};
use promptforge_ide::{Analysis, sample_prompt};

fn change(c: &mut Criterion) {
    let text = sample_prompt(3000);
    c.bench_function("analyse a 3,000-section prompt", |b| {
        b.iter(|| Analysis::new(std::hint::black_box(&text)))
    });
}

criterion_group!(benches, change);
criterion_main!(benches);
