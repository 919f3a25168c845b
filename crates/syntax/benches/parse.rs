//! Parsing a large prompt: hundreds of sections, thousands of lines, a Lua block in each.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::fmt::Write as _;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use promptforge_syntax::Prompt;

/// A prompt with `sections` H2 sections, each with an H3 child, prose, a list section every
/// tenth section, and a prologue and epilog Lua block.
fn large_prompt(sections: usize) -> String {
    let mut s = String::from(
        "---\nname: big\ndescription: a large prompt\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# Big\n\n```lua shared\nfunction helper(x) return x .. '!' end\n```\n\n```lua\nmodels.default('writer')\n```\n\n",
    );
    for i in 0..sections {
        let _ = write!(
            s,
            "## Section {i}\n\n```lua\nvar.n{i} = {i}\nlocal t = {{}}\nfor k = 1, 10 do t[k] = k * {i} end\n```\n\nExplain item {{{{ var.n{i} }}}} in detail.\nA second line of prose with `code` and *emphasis*.\n\n```python\n# not a heading\nprint({i})\n```\n\n```lua\nreturn helper(prose)\n```\n\n### Child {i}\n\nChild prose.\n\n"
        );
        if i % 10 == 0 {
            let _ = write!(s, "### List {i}\n\n- alpha\n- beta\n- gamma\n\n");
        }
    }
    s
}

fn bench_parse(c: &mut Criterion) {
    let source = large_prompt(500);
    let mut group = c.benchmark_group("parse");
    group.throughput(Throughput::Bytes(source.len() as u64));
    group.bench_function("500 sections", |b| {
        b.iter(|| Prompt::parse(std::hint::black_box(&source)))
    });
    group.finish();
}

criterion_group!(benches, bench_parse);
criterion_main!(benches);
