#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point
//! A regression guard on cost that grows with the prompt: parsing (`check`) and walking
//! (`run`) N Lua-only sections through the binary must cost about the same per section at
//! N = 2,000 as at N = 200. Each test compares two measurements taken in the same run, so a
//! slow or loaded machine slows both alike: a ratio, never a timed threshold.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn prompt(sections: usize) -> String {
    let mut text =
        String::from("---\nname: flat\ndescription: d\npromptforge: 0\n---\n\n# Flat\n\n");
    // Eight lines of prose per section: anything that costs per file line above a section
    // (as padding each Lua region to its file line once did) shows at N = 2,000.
    let prose = "Some prose for this section, one of eight.\n".repeat(8);
    for i in 0..sections {
        text.push_str(&format!(
            "## S{i}\n\n{prose}\n```lua\nvar.n = (var.n or 0) + 1\n```\n\n"
        ));
    }
    text.push_str("## Last\n\n```lua\nreturn tostring(var.n or 0)\n```\n");
    text
}

/// The fastest of five `check` (parse only) or `run` (parse and walk) of a prompt with
/// `sections` sections.
fn wall(dir: &std::path::Path, sections: usize, walk: bool) -> Duration {
    let path = dir.join(format!("flat-{sections}.md"));
    std::fs::write(&path, prompt(sections)).unwrap();
    let mut best = Duration::MAX;
    for attempt in 0..5 {
        let mut command = Command::new(env!("CARGO_BIN_EXE_promptforge"));
        if walk {
            command
                .arg("run")
                .arg(&path)
                .args(["--json", "--seed", "1", "--store"])
                .arg(dir.join(format!("store-{sections}-{attempt}")));
        } else {
            command.arg("check").arg(&path);
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
        best = best.min(elapsed);
    }
    best
}

fn assert_flat(walk: bool) {
    let dir = tempfile::tempdir().unwrap();
    let base = wall(dir.path(), 0, walk);
    let per_section =
        |n: usize| (wall(dir.path(), n, walk).saturating_sub(base)).as_secs_f64() / n as f64;
    let small = per_section(200);
    let large = per_section(2000);
    assert!(
        large <= 2.0 * small,
        "{}: per-section cost {:.1} us at N=2000 is more than twice {:.1} us at N=200",
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
