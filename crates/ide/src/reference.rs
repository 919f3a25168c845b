//! What an editor says about the language's own names: every Engine global and namespace
//! member with its call form and a line about it (the forms are the spec's quick reference,
//! chapter 17; the lines are ours), and the frontmatter keys at each level.

/// One documented name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The name as written after its namespace (`spawn`), or the global's own name.
    pub name: &'static str,
    /// How it is called or read.
    pub form: &'static str,
    /// What it does, in one line.
    pub doc: &'static str,
}

const fn e(name: &'static str, form: &'static str, doc: &'static str) -> Entry {
    Entry { name, form, doc }
}

/// The Engine's global names.
pub const GLOBALS: &[Entry] = &[
    e(
        "args",
        "args",
        "The raw argument string of the run (or of the task or arm).",
    ),
    e(
        "argv",
        "argv",
        "The argument string parsed: a table of the declared args, `{ prose = args }` for free text, nil when structured input is not JSON.",
    ),
    e(
        "call",
        "call(target, input?)",
        "Runs the section `target` (a heading reference such as `'## Review'`) as a chain and returns its result string.",
    ),
    e(
        "jump",
        "jump(target)",
        "Ends this block; the walk goes on at the section `target`.",
    ),
    e(
        "fanout",
        "fanout(worker, collection)",
        "Runs `worker` (a heading reference or a function) once per member, all at once; results come back in collection order.",
    ),
    e(
        "list_from_section",
        "list_from_section(heading)",
        "The items of a list section, as a 1-based array of strings.",
    ),
    e(
        "log",
        "log(message)",
        "Records a checkpoint event with `message`.",
    ),
    e(
        "prose",
        "prose",
        "The block's pending prose, with its placeholders rendered.",
    ),
    e(
        "var",
        "var.key = value",
        "Your own values, carried along the walk into the sections after.",
    ),
    e(
        "item",
        "item",
        "Inside a fanout arm: the member it processes (or a task's `item` option).",
    ),
    e(
        "untrusted",
        "untrusted(s)",
        "Wraps `s` in the run's untrusted envelope.",
    ),
    e(
        "ui",
        "ui()",
        "The Host-state snapshot, when the Host supplies one.",
    ),
    e(
        "models",
        "models.{name}(...)",
        "Model roles: choose a section's model and run rounds.",
    ),
    e(
        "messages",
        "messages.new()",
        "Builds message lists for `models.loop`.",
    ),
    e(
        "compactors",
        "compactors.fail",
        "What `models.loop` does when a round overflows the context.",
    ),
    e(
        "tools",
        "tools.{name}(...)",
        "Tool slots, local tools and the task built-ins.",
    ),
    e("store", "store.{name}(...)", "The run's file store."),
    e(
        "tasks",
        "tasks.{name}(...)",
        "Tasks: sections started to run beside this one.",
    ),
    e(
        "sys",
        "sys.{field}",
        "Run metadata: ids, the section, the start instant.",
    ),
    e(
        "input",
        "input.ask()",
        "The operator, through the `promptforge/user-input` Plugin.",
    ),
    e(
        "pairs",
        "pairs(t)",
        "Iterates a table in the same fixed key order on every run.",
    ),
    e(
        "next",
        "next(t, k?)",
        "The next key and value in `pairs` order.",
    ),
    e(
        "pcall",
        "pcall(f, ...)",
        "Calls `f`; `true` and its results, or `false` and the error value.",
    ),
    e(
        "xpcall",
        "xpcall(f, handler, ...)",
        "Like `pcall`; `handler` receives the error value.",
    ),
    e(
        "tostring",
        "tostring(v)",
        "A string for `v`; an error value gives its message.",
    ),
];

/// The members of each Engine namespace.
pub const MEMBERS: &[(&str, &[Entry])] = &[
    (
        "models",
        &[
            e(
                "use",
                "models.use(label, options?)",
                "Selects the role `label` for this section and returns its handle; options: `temperature`, `max_tokens`.",
            ),
            e(
                "default",
                "models.default(label)",
                "Sets the prompt-wide default role (once) and returns its handle.",
            ),
            e(
                "get",
                "models.get(label)",
                "A role's handle, or a handle for a catalog model id; the section's selection is unchanged.",
            ),
            e(
                "infer",
                "models.infer(handle?, prompt)",
                "One round on the section's (or the handle's) model; the reply text.",
            ),
            e(
                "loop",
                "models.loop(handle?, messages, compactor?)",
                "Runs rounds and the tool calls they ask for until a text reply; appends every record to `messages`.",
            ),
        ],
    ),
    (
        "messages",
        &[e(
            "new",
            "messages.new()",
            "An empty message list with the `system`, `user`, `assistant`, `tool` and `append` builders.",
        )],
    ),
    (
        "compactors",
        &[e(
            "fail",
            "compactors.fail",
            "The default overflow policy: raises `context_exhausted`.",
        )],
    ),
    (
        "tools",
        &[
            e(
                "add",
                "tools.add(alias_or_tool, description?)",
                "Offers a bound tool to this section's rounds (a list form takes several).",
            ),
            e(
                "add_local",
                "tools.add_local(alias, description, params, handler)",
                "Registers a tool written in Lua for this section.",
            ),
            e(
                "always",
                "tools.always(alias, description?)",
                "Offers a bound tool in every section from now on.",
            ),
            e(
                "call",
                "tools.call(alias_or_tool, args?)",
                "Calls a tool from Lua and returns its output.",
            ),
            e(
                "allow_tasks",
                "tools.allow_tasks(targets?)",
                "Lets the model start, check, cancel and wait for tasks (limited to the listed headings when given).",
            ),
            e(
                "calls",
                "tools.calls[alias]",
                "How many times the section called that alias.",
            ),
        ],
    ),
    (
        "store",
        &[
            e(
                "read",
                "store.read(path, start?, end?)",
                "The file's text (or lines `start` to `end`).",
            ),
            e(
                "read_numbered",
                "store.read_numbered(path, start?, end?)",
                "The file's lines numbered `N| text`.",
            ),
            e(
                "write",
                "store.write(path, contents)",
                "Creates or replaces the file.",
            ),
            e(
                "append",
                "store.append(path, contents)",
                "Adds to the end of the file, creating it when absent.",
            ),
            e(
                "str_replace",
                "store.str_replace(path, old, new)",
                "Replaces the one occurrence of `old`.",
            ),
            e(
                "delete",
                "store.delete(path)",
                "Removes the file or an empty directory.",
            ),
            e(
                "exists",
                "store.exists(path)",
                "Whether a file or directory is there.",
            ),
            e("glob", "store.glob(pattern)", "The matching paths, sorted."),
        ],
    ),
    (
        "tasks",
        &[
            e(
                "spawn",
                "tasks.spawn(target, opts?)",
                "Starts the section `target` as a task and returns its handle at once; opts: `input`, `item`, `index`.",
            ),
            e(
                "join",
                "tasks.join(set, opts?)",
                "Waits for every task of `set`; their results in set order, then whether the wait timed out.",
            ),
            e(
                "join_any",
                "tasks.join_any(set, opts?)",
                "Waits for the first task of `set` to end: its handle, `ok` and result.",
            ),
            e("ready", "tasks.ready(task)", "Whether the task has ended."),
            e(
                "status",
                "tasks.status(task)",
                "The task's status table (state, section, turns, ...).",
            ),
            e(
                "pending",
                "tasks.pending(filter?)",
                "The chain's live tasks in spawn order.",
            ),
            e("cancel", "tasks.cancel(task)", "Cancels the task."),
            e(
                "note",
                "tasks.note(text)",
                "Sets the `note` its owner reads in `tasks.status`.",
            ),
            e(
                "concurrency",
                "tasks.concurrency(n?)",
                "The chain's admission limit, lowered to `n`.",
            ),
        ],
    ),
    (
        "sys",
        &[
            e("execution", "sys.execution", "The run's name."),
            e("id", "sys.id", "This section entry's id, such as `0.3.0`."),
            e(
                "index",
                "sys.index",
                "An arm's 1-based position, or a task's `index`.",
            ),
            e(
                "model",
                "sys.model",
                "The section's catalog model id, after its first tool call.",
            ),
            e(
                "section_count",
                "sys.section_count",
                "How many top-level sections the prompt has.",
            ),
            e(
                "section_name",
                "sys.section_name",
                "The running section's name (the title in the H1 pass).",
            ),
            e(
                "taskid",
                "sys.taskid",
                "The nearest enclosing task's id, `0` on the main walk.",
            ),
            e("when", "sys.when", "The run's start instant, RFC 3339."),
        ],
    ),
    (
        "input",
        &[
            e(
                "ask",
                "input.ask()",
                "The operator's next message and `true`, or the fixed fallback and `false`.",
            ),
            e(
                "connected",
                "input.connected()",
                "Whether the Host has someone to ask, fixed for the run.",
            ),
        ],
    ),
];

/// The members of namespace `ns`, if it is one.
pub fn members(ns: &str) -> Option<&'static [Entry]> {
    MEMBERS
        .iter()
        .find(|(name, _)| *name == ns)
        .map(|(_, m)| *m)
}

/// Frontmatter keys by where they sit: the top level, or under the parent (`models.*` is a
/// role's keys, `args.*` an arg's, `input`/`output` a file's, `plugins` an entry's).
pub const FRONTMATTER: &[(&str, &[Entry])] = &[
    (
        "",
        &[
            e("name", "name: text", "The prompt's name (required)."),
            e(
                "description",
                "description: text",
                "One line saying what the prompt does (required).",
            ),
            e(
                "promptforge",
                "promptforge: 0",
                "The language version the prompt is written for (needed to run).",
            ),
            e(
                "max_tool_iterations",
                "max_tool_iterations: 1..1000",
                "The round cap of each `models.loop` call.",
            ),
            e(
                "input",
                "input: { path, description }",
                "A file the caller places in the store before the run.",
            ),
            e(
                "output",
                "output: { path, description }",
                "A file the run leaves in the store for the caller.",
            ),
            e(
                "plugins",
                "plugins: [id, ...]",
                "The Plugins the prompt needs, such as `promptforge/web`.",
            ),
            e(
                "tools",
                "tools: { alias: namespace/plugin/tool }",
                "Tool slots, each bound to a tool path.",
            ),
            e(
                "args",
                "args: { name: { type, ... } }",
                "The declared arguments (their presence makes input structured JSON).",
            ),
            e(
                "models",
                "models: { label: { ... } }",
                "Model roles the prompt uses.",
            ),
        ],
    ),
    (
        "models",
        &[
            e("description", "description: text", "What the role is for."),
            e(
                "keywords",
                "keywords: [frontier, fast, ...]",
                "What the role needs: chat, creative, fast, frontier, small, thinking, no-thinking.",
            ),
            e(
                "min_context",
                "min_context: tokens",
                "The smallest context window the role accepts.",
            ),
        ],
    ),
    (
        "args",
        &[
            e(
                "type",
                "type: string | boolean | integer | number",
                "The JSON type the caller supplies (required).",
            ),
            e(
                "optional",
                "optional: true",
                "The caller may leave the arg out.",
            ),
            e(
                "default",
                "default: value",
                "Advertised to callers; a Host that builds the arguments fills it in.",
            ),
            e("description", "description: text", "What the arg is for."),
        ],
    ),
    (
        "input",
        &[
            e("path", "path: file.md", "The store path of the file."),
            e("description", "description: text", "What the file holds."),
        ],
    ),
    (
        "output",
        &[
            e("path", "path: file.md", "The store path of the file."),
            e("description", "description: text", "What the file holds."),
        ],
    ),
    (
        "plugins",
        &[
            e(
                "ref",
                "ref: namespace/plugin",
                "The Plugin id (in the map form).",
            ),
            e(
                "optional",
                "optional: true",
                "The prompt runs without the Plugin.",
            ),
            e("config", "config: value", "The Plugin's configuration."),
        ],
    ),
];

/// The frontmatter keys under `parent` (`""` for the top level).
pub fn frontmatter_keys(parent: &str) -> &'static [Entry] {
    FRONTMATTER
        .iter()
        .find(|(p, _)| *p == parent)
        .map_or(&[][..], |(_, keys)| *keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_namespace_is_a_global_and_names_are_unique() {
        for (ns, members) in MEMBERS {
            assert!(GLOBALS.iter().any(|g| g.name == *ns), "{ns}");
            let mut names: Vec<&str> = members.iter().map(|m| m.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), members.len(), "{ns}");
        }
        assert!(members("tasks").is_some_and(|m| m.iter().any(|e| e.name == "spawn")));
        assert!(frontmatter_keys("args").iter().any(|k| k.name == "type"));
    }
}
