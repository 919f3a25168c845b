#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point
//! A regression guard on cost that grows with the prompt: parsing (`check`) and walking
//! (`run`) N Lua-only sections through the binary must cost about the same per section at
//! N = 4,000 as at N = 400. Each test compares measurements taken in the same run, so a
//! slow or loaded machine slows both alike: a ratio, never a timed threshold. The three sizes
//! are measured in turn, round after round, and each keeps its fastest round, so a burst of
//! load on the machine (other tests run beside this one) cannot land on one size only.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn prompt(sections: usize) -> String {
    let mut text =
        String::from("---\nname: flat\ndescription: d\npromptforge: 0\n---\n\n# Flat\n\n");
    // Three lines of prose per section: anything that costs per file line above a section
    // (as padding each Lua region to its file line once did) shows at N = 4,000.
    let prose = "Some prose for this section, one of three.\n".repeat(3);
    for i in 0..sections {
        text.push_str(&format!(
            "## S{i}\n\n{prose}\n```lua\nvar.n = (var.n or 0) + 1\n```\n\n"
        ));
    }
    text.push_str("## Last\n\n```lua\nreturn tostring(var.n or 0)\n```\n");
    text
}

/// How long one `check` (parse only) or `run` (parse and walk) of the prompt at `path`, with
/// `sections` sections, takes.
fn once(dir: &std::path::Path, path: &std::path::Path, sections: usize, walk: bool) -> Duration {
    let mut command = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    if walk {
        command
            .arg("run")
            .arg(path)
            .args(["--json", "--seed", "1", "--no-history", "--store"])
            .arg(dir.join("store"));
    } else {
        command.arg("check").arg(path);
    }
    let started = Instant::now();
    let output = command.stdin(Stdio::null()).output().unwrap();
    let elapsed = started.elapsed();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    if walk {
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            format!(r#"{{"outcome":"completed","result":"{sections}"}}"#)
        );
    }
    elapsed
}

const ROUNDS: usize = 7;
const SMALL: usize = 400;
const LARGE: usize = 4000;

fn assert_flat(walk: bool) {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [0, SMALL, LARGE];
    let paths: Vec<_> = sizes
        .iter()
        .map(|&n| {
            let path = dir.path().join(format!("flat-{n}.md"));
            std::fs::write(&path, prompt(n)).unwrap();
            path
        })
        .collect();
    let mut best = [Duration::MAX; 3];
    for _ in 0..ROUNDS {
        for (i, &n) in sizes.iter().enumerate() {
            best[i] = best[i].min(once(dir.path(), &paths[i], n, walk));
        }
    }
    let per_section = |i: usize| best[i].saturating_sub(best[0]).as_secs_f64() / sizes[i] as f64;
    let (small, large) = (per_section(1), per_section(2));
    assert!(
        large <= 2.0 * small,
        "{}: per-section cost {:.1} us at N={LARGE} is more than twice {:.1} us at N={SMALL}",
        if walk { "run" } else { "check" },
        large * 1e6,
        small * 1e6
    );
}

#[test]
fn parsing_costs_the_same_per_section_at_any_size() {
    assert_flat(false);
}

#[test]
fn walking_costs_the_same_per_section_at_any_size() {
    assert_flat(true);
}
