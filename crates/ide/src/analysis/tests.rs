#![allow(clippy::unwrap_used, clippy::panic)] // test code

use super::*;

const PROMPT: &str = "---
name: demo
description: A demo
promptforge: 0
models:
  writer:
    description: Drafts
tools:
  search: promptforge/web/search
args:
  days:
    type: integer
---

# Demo

```lua shared
local function go() return call('## Sumarize') end
```

## Main

```lua
models.use('writer')
models.use('planer')
models.get('gpt-x')
tools.add('search')
tools.add('serch')
tools.add_local('lookup', 'L', {}, function() end)
tools.call('lookup')
local n = argv.days
call('## Summarize')
jump('## Sumarize')
```

## Summarize

Say it short.

```lua
return 1
```

### Inner

```lua
fanout('### Inner', {})
```
";

fn at(line: u32, col: u32) -> Pos {
    Pos { line, col }
}

fn warnings(a: &Analysis) -> Vec<(u32, String)> {
    a.diagnostics()
        .iter()
        .filter(|d| d.severity == Severity::Warning)
        .map(|d| (d.span.start.line, d.message.clone()))
        .collect()
}

#[test]
fn literal_references_that_name_nothing_are_warnings_with_a_suggestion() {
    let a = Analysis::new(PROMPT);
    assert!(
        a.diagnostics()
            .iter()
            .all(|d| d.severity == Severity::Warning),
        "{:?}",
        a.diagnostics()
    );
    assert_eq!(
        warnings(&a),
        [
            (
                18,
                "no section has the heading `## Sumarize`; did you mean `## Summarize`?".to_owned()
            ),
            (
                25,
                "model role `planer` is not declared under `models:`; declared roles: writer"
                    .to_owned()
            ),
            (
                28,
                "tool alias `serch` is not declared under `tools:`; did you mean `search`?".to_owned()
            ),
            (
                33,
                "section heading `## Sumarize` is not visible from section `Main`; did you mean `## Summarize`?"
                    .to_owned()
            ),
            (
                47,
                "section heading `### Inner` is not visible from section `Inner`".to_owned()
            ),
        ]
    );
    let w = &a.diagnostics()[1];
    assert_eq!((w.span.start, w.span.end), (at(25, 12), at(25, 20)));
}

#[test]
fn two_unrelated_problems_are_both_errors_at_their_lines() {
    let text = "---\nname: x\ndescription: d\npromptforge: 0\n---\n\n# T\n\n## A\n\n```lua\nlocal x = = 1\n```\n\n## A\n";
    let a = Analysis::new(text);
    let errors: Vec<(u32, &str)> = a
        .diagnostics()
        .iter()
        .map(|d| (d.span.start.line, d.kind.as_str()))
        .collect();
    assert_eq!(errors, [(12, "Lua"), (15, "Structure")]);
    // Navigation still works on a file with problems.
    assert_eq!(a.symbols().len(), 1);
}

#[test]
fn definition_and_references_follow_the_visible_set() {
    let a = Analysis::new(PROMPT);
    // `call('## Summarize')` on line 32 → the heading on line 36.
    assert_eq!(a.definition(at(32, 10)).map(|s| s.start.line), Some(36));
    assert_eq!(a.definition(at(33, 10)), None);
    let refs: Vec<u32> = a
        .references(at(36, 1))
        .iter()
        .map(|s| s.start.line)
        .collect();
    assert_eq!(refs, [36, 32]);
    let refs: Vec<u32> = a
        .references(at(32, 10))
        .iter()
        .map(|s| s.start.line)
        .collect();
    assert_eq!(refs, [36, 32]);
}

#[test]
fn completions_fit_where_the_cursor_is() {
    let a = Analysis::new(PROMPT);
    let labels = |c: Vec<Completion>| c.into_iter().map(|c| c.label).collect::<Vec<_>>();
    // In a section reference: the sections visible from Main.
    assert_eq!(labels(a.completion(at(32, 9))), ["## Summarize"]);
    // In a role label and a tool alias.
    assert_eq!(labels(a.completion(at(24, 13))), ["writer"]);
    assert_eq!(labels(a.completion(at(27, 12))), ["search"]);
    // After `argv.`: the declared args; after `models.`: its members.
    assert_eq!(labels(a.completion(at(31, 16))), ["days"]);
    let text = PROMPT.replace("local n = argv.days", "local n = models.");
    let b = Analysis::new(&text);
    let members = labels(b.completion(at(31, 18)));
    assert!(members.contains(&"loop".to_owned()) && members.contains(&"use".to_owned()));
    // Elsewhere in code: globals, roles and tool aliases.
    let globals = labels(a.completion(at(31, 1)));
    assert!(
        ["call", "store", "writer", "search"]
            .iter()
            .all(|g| globals.contains(&(*g).to_owned()))
    );
    // In the frontmatter: keys by level.
    assert!(labels(a.completion(at(2, 1))).contains(&"max_tool_iterations".to_owned()));
    assert!(labels(a.completion(at(7, 5))).contains(&"min_context".to_owned()));
    assert!(labels(a.completion(at(12, 5))).contains(&"optional".to_owned()));
}

#[test]
fn hovers_symbols_and_folds() {
    let a = Analysis::new(PROMPT);
    let hover = a.hover(at(32, 10)).unwrap();
    assert!(
        hover.contains("## Summarize") && hover.contains("Say it short."),
        "{hover}"
    );
    let hover = a.hover(at(24, 9)).unwrap();
    assert!(hover.contains("models.use(label, options?)"), "{hover}");
    let hover = a.hover(at(32, 2)).unwrap();
    assert!(hover.contains("call(target, input?)"), "{hover}");
    assert!(a.hover(at(2, 2)).unwrap().contains("name: text"));
    let symbols = a.symbols();
    assert_eq!(symbols.len(), 1);
    assert_eq!(symbols[0].name, "Demo");
    let names: Vec<&str> = symbols[0]
        .children
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["Main", "Summarize"]);
    assert_eq!(symbols[0].children[1].children[0].name, "Inner");
    let folds = a.folding();
    assert!(
        folds.contains(&(1, 13)) && folds.contains(&(21, 35)) && folds.contains(&(23, 34)),
        "{folds:?}"
    );
}

#[test]
fn an_unclosed_string_completes_only_on_its_own_line() {
    let text = PROMPT.replace("call('## Summarize')", "call('## Sum");
    let a = Analysis::new(&text);
    let labels: Vec<String> = a
        .completion(at(32, 12))
        .into_iter()
        .map(|c| c.label)
        .collect();
    assert_eq!(labels, ["## Summarize"]);
    // The next line is code again: `jump` is a global there, not a section name.
    let globals: Vec<String> = a
        .completion(at(33, 1))
        .into_iter()
        .map(|c| c.label)
        .collect();
    assert!(globals.contains(&"jump".to_owned()), "{globals:?}");
}
