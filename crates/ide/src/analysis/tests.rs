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

const TASKS: &str = "---
name: tasks
description: d
promptforge: 0
models:
  writer: {}
tools:
  search: promptforge/web/search
---

# Tasks

```lua shared
local ok = pcall(call, '## Research')
```

## Plan

The model may call `task` with {\"target\": \"## Research\"} or {\"target\": \"## Reserch\"}.

```lua
tools.allow_tasks({ '## Research' })
local ok, err = pcall(call, '## Resarch')
local ok2 = pcall(tasks.spawn, '## Research')
local double = { name = 'task', arguments = { target = '## Research' } }
local other = { target = 'the moon', colour = { target = '#fff' } }
tools.always('search')
tools.always('serch')
tools.add_local('lookup', 'L', {}, function() end)
tools.call('lookup')
tools.call('lokup')
models.default('writr')
models.get('gpt-x')
```

## Research

Dig in.

```lua
return 1
```
";

#[test]
fn pcall_forms_and_the_task_targets_are_references_too() {
    let a = Analysis::new(TASKS);
    // `pcall(call, '## Research')` in shared code: resolves (a heading anywhere), so no
    // warning, and it navigates.
    assert_eq!(a.definition(at(14, 26)).map(|s| s.start.line), Some(36));
    // In prose: `"target": "## Research"` resolves from the section it is in.
    assert_eq!(a.definition(at(19, 46)).map(|s| s.start.line), Some(36));
    // In Lua: a `target` field, and `pcall(tasks.spawn, ...)`.
    assert_eq!(a.definition(at(25, 58)).map(|s| s.start.line), Some(36));
    assert_eq!(a.definition(at(24, 34)).map(|s| s.start.line), Some(36));
    let refs: Vec<u32> = a
        .references(at(36, 1))
        .iter()
        .map(|s| s.start.line)
        .collect();
    assert_eq!(refs, [36, 14, 19, 22, 24, 25]);
    // Completion inside a `target` string offers the sections visible there.
    let labels: Vec<String> = a
        .completion(at(25, 58))
        .into_iter()
        .map(|c| c.label)
        .collect();
    assert_eq!(labels, ["## Research"]);
}

#[test]
fn every_kind_of_reference_check_and_what_it_leaves_alone() {
    let a = Analysis::new(TASKS);
    assert_eq!(
        warnings(&a),
        [
            (
                19,
                "section heading `## Reserch` is not visible from section `Plan`; did you mean `## Research`?"
                    .to_owned()
            ),
            (
                28,
                "tool alias `serch` is not declared under `tools:`; did you mean `search`?".to_owned()
            ),
            (
                31,
                "tool alias `lokup` is not declared under `tools:`; declared aliases: search".to_owned()
            ),
            (
                32,
                "model role `writr` is not declared under `models:`; did you mean `writer`?"
                    .to_owned()
            ),
        ]
    );
    // Not flagged: `pcall(call, '## Resarch')` (the author expects it may fail), a shared
    // reference that resolves somewhere, `tools.always` of a declared
    // alias, `tools.call` of a literal `add_local` alias, `models.get` (catalog ids too), a
    // `target` that is not written as a heading.
}

#[test]
fn a_broken_frontmatter_still_navigates_and_checks_sections_only() {
    let text = TASKS.replace(
        "promptforge: 0\n",
        "promptforge: 0\nmax_tool_iterations: 0\n",
    );
    let a = Analysis::new(&text);
    let errors: Vec<&str> = a
        .diagnostics()
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| d.kind.as_str())
        .collect();
    assert_eq!(errors, ["Frontmatter"]);
    // Sections still resolve, and section references are still checked...
    assert_eq!(a.definition(at(26, 58)).map(|s| s.start.line), Some(37));
    assert!(
        warnings(&a).iter().any(|(_, m)| m.contains("`## Reserch`")),
        "{:?}",
        warnings(&a)
    );
    // ...but what the frontmatter declares is unknown, so roles and tools are not.
    assert!(
        warnings(&a)
            .iter()
            .all(|(_, m)| !m.contains("tool alias") && !m.contains("model role")),
        "{:?}",
        warnings(&a)
    );
    assert_eq!(a.symbols()[0].children.len(), 2);
}

#[test]
fn the_first_steps_version_refusals_are_diagnostics_too() {
    let missing = Analysis::new("---\nname: x\ndescription: d\n---\n\n# T\n\n## A\n\nhi\n");
    let d = &missing.diagnostics()[0];
    assert_eq!(
        (d.span.start.line, d.kind.as_str(), d.message.as_str()),
        (
            1,
            "Structure",
            "not a promptforge prompt: no promptforge version"
        )
    );
    let newer =
        Analysis::new("---\nname: x\ndescription: d\npromptforge: 9\n---\n\n# T\n\n## A\n\nhi\n");
    let d = &newer.diagnostics()[0];
    assert_eq!(
        (d.span.start, d.kind.as_str(), d.message.as_str()),
        (
            at(4, 14),
            "Version",
            "unsupported promptforge version: 9 (this build supports major 0)"
        )
    );
}

#[test]
fn a_lua_error_spans_the_token_it_names() {
    let text = "---\nname: x\ndescription: d\npromptforge: 0\n---\n\n# T\n\n## A\n\n```lua\nlocal x = = 1\n```\n";
    let a = Analysis::new(text);
    let d = &a.diagnostics()[0];
    assert_eq!(d.kind, "Lua");
    // `near '='`: the second `=` is the one... but `=` occurs twice, so the whole line.
    assert_eq!((d.span.start, d.whole_line), (at(12, 1), true));
    let text = text.replace("local x = = 1", "local x = 1 end");
    let a = Analysis::new(&text);
    let d = &a.diagnostics()[0];
    assert_eq!(
        (d.span.start, d.span.end),
        (at(12, 13), at(12, 16)),
        "{d:?}"
    );
}

#[test]
fn a_long_list_of_names_is_cut_in_a_message() {
    let names: Vec<String> = (0..30).map(|i| format!("zz{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let text = suggestion("completely-different", &refs, "sections");
    assert!(text.ends_with(", and 18 more"), "{text}");
}

#[test]
fn a_role_label_line_gets_no_role_keys() {
    let a = Analysis::new(TASKS);
    // Line 6 is `  writer: {}`: a label of the author's, where no key fits.
    assert!(a.completion(at(6, 3)).is_empty());
}
