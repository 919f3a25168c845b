//! What the language server does on every change: analyse the whole document again. The
//! target (issue 26) is a 3,000-section prompt answered within 50 ms.

use criterion::{Criterion, criterion_group, criterion_main};
use promptforge_ide::Analysis;

/// A prompt with `n` sections, each with prose and a fence that calls the next one.
fn prompt(n: usize) -> String {
    let mut text = String::from(
        "---\nname: big\ndescription: Many sections\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Big\n\n",
    );
    for i in 0..n {
        text.push_str(&format!(
            "## Part {i}\n\nSay something about part {i}.\n\n```lua\nmodels.use('w')\nlocal r = models.infer(prose)\nif r == '' then jump('## Part {}') end\nreturn r\n```\n\n",
            (i + 1) % n
        ));
    }
    text
}

fn change(c: &mut Criterion) {
    let text = prompt(3000);
    c.bench_function("analyse a 3,000-section prompt", |b| {
        b.iter(|| Analysis::new(std::hint::black_box(&text)))
    });
}

criterion_group!(benches, change);
criterion_main!(benches);
