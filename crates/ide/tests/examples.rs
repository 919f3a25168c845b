//! Every example prompt, as an editor sees it: no problem reported, the H1 and its sections
//! as symbols, every literal section reference resolving to its heading, and completions and
//! hovers inside its code.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::Path;

use promptforge_ide::{Analysis, Pos};

fn examples() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(!out.is_empty());
    out
}

#[test]
fn every_example_reads_cleanly_in_an_editor() {
    for (path, text) in examples() {
        let a = Analysis::new(&text);
        assert!(a.diagnostics().is_empty(), "{path}: {:?}", a.diagnostics());
        let symbols = a.symbols();
        assert_eq!(symbols.len(), 1, "{path}: one H1");
        let prompt = a.prompt().unwrap();
        assert_eq!(symbols[0].name, prompt.title, "{path}");
        for (n, line) in text.lines().enumerate() {
            let line_no = u32::try_from(n + 1).unwrap();
            // Every literal heading reference passed to a call goes to a heading.
            for (col, _) in line.match_indices("('#") {
                let pos = Pos {
                    line: line_no,
                    col: u32::try_from(col + 4).unwrap(),
                };
                let target = a
                    .definition(pos)
                    .unwrap_or_else(|| panic!("{path}:{line_no}: no definition"));
                assert!(
                    prompt.sections.iter().any(|s| s.line == target.start.line),
                    "{path}:{line_no}"
                );
                assert!(a.hover(pos).is_some(), "{path}:{line_no}: no hover");
            }
            // Engine calls have hovers, and code after `models.` completes its members.
            if let Some(col) = line.find("models.") {
                let on = Pos {
                    line: line_no,
                    col: u32::try_from(col + 2).unwrap(),
                };
                assert!(
                    a.hover(on).is_some(),
                    "{path}:{line_no}: no hover on models"
                );
                let after_dot = Pos {
                    line: line_no,
                    col: u32::try_from(col + 8).unwrap(),
                };
                let members: Vec<String> = a
                    .completion(after_dot)
                    .into_iter()
                    .map(|c| c.label)
                    .collect();
                assert!(
                    members.contains(&"infer".to_owned()),
                    "{path}:{line_no}: {members:?}"
                );
            }
        }
    }
}
