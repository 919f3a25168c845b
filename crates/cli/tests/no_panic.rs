//! No input makes `promptforge run` panic or die on a signal.
//!
//! Property tests drive the real binary with (a) random argument strings against a prompt with
//! an explicit `args:` declaration and one without, (b) random Lua blocks built from a grammar of
//! fragments that poke at every corner of the section VM, and (c) random Host-state snapshots.
//! Every run must exit 0 or 1 (a usage error, 2, only where the flags themselves are bad) with
//! exactly one JSON outcome object on stdout: never 101 (a Rust panic), never a signal.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Number, Value, json};

/// How long one run may take before it counts as hung (every generated case runs in well under
/// a second; the margin is for a loaded machine).
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// A config for `cases` runs. Shrinking is capped: every step starts a process, and a hang
/// costs [`RUN_TIMEOUT`] per step, so a failure is reported within minutes, not hours.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        max_shrink_iters: 64,
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    }
}

/// Write `text` to a fresh file in `dir`.
fn write_file(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write a scratch file");
    path
}

/// A fresh scratch folder for one test case; removed when dropped.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("a scratch folder")
}

/// What one run of the binary gave back.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Run `promptforge run PROMPT --json` with fixed seed and instant plus `extra` flags. The
/// run's store is the folder `store` beside the prompt, inside the case's scratch folder.
fn run(prompt: &Path, extra: &[String]) -> Result<Ran, TestCaseError> {
    let store = prompt.with_file_name("store");
    let mut child = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .arg("run")
        .arg(prompt)
        .args([
            "--json",
            "--seed",
            "7",
            "--when",
            "2026-03-04T05:06:07.890Z",
        ])
        .arg("--store")
        .arg(&store)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| TestCaseError::fail(format!("cannot start promptforge: {e}")))?;
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf);
        buf
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for promptforge") {
            break status;
        }
        if started.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            let prompt_text = std::fs::read_to_string(prompt).unwrap_or_default();
            return Err(TestCaseError::fail(format!(
                "promptforge hung for {RUN_TIMEOUT:?} on:\n{prompt_text}"
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    Ok(Ran {
        code: status.code(),
        stdout: String::from_utf8_lossy(&out.join().expect("stdout reader")).into_owned(),
        stderr: String::from_utf8_lossy(&err.join().expect("stderr reader")).into_owned(),
    })
}

/// The run ended on its own (0 or 1, or 2 when `usage_ok`) and, unless it was a usage error,
/// printed exactly one JSON object on one line.
fn check(ran: &Ran, prompt: &Path, usage_ok: bool) -> Result<(), TestCaseError> {
    let context = || {
        format!(
            "prompt:\n{}\nstdout: {}\nstderr: {}",
            std::fs::read_to_string(prompt).unwrap_or_default(),
            ran.stdout,
            ran.stderr
        )
    };
    match ran.code {
        Some(0 | 1) => {}
        Some(2) if usage_ok => return Ok(()),
        code => {
            return Err(TestCaseError::fail(format!(
                "exit status {code:?} (expected 0 or 1)\n{}",
                context()
            )));
        }
    }
    let body = ran.stdout.strip_suffix('\n').unwrap_or(&ran.stdout);
    prop_assert!(
        !body.contains('\n'),
        "stdout is more than one line\n{}",
        context()
    );
    let value: Value = serde_json::from_str(body)
        .map_err(|e| TestCaseError::fail(format!("stdout is not JSON ({e})\n{}", context())))?;
    let outcome = value.get("outcome").and_then(Value::as_str);
    let want = match outcome {
        Some("completed") => 0,
        Some("failed") => 1,
        _ => {
            return Err(TestCaseError::fail(format!(
                "no completed/failed outcome\n{}",
                context()
            )));
        }
    };
    prop_assert_eq!(
        ran.code,
        Some(want),
        "exit status vs outcome\n{}",
        context()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Random JSON
// ---------------------------------------------------------------------------------------------

fn json_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter_map("finite", Number::from_f64)
            .prop_map(Value::Number),
        Just(Value::from(0.0)),
        Just(Value::from(u64::MAX)),
        Just(Value::from(i64::MIN)),
        Just(Value::from(1e308)),
        Just(Value::from(-5e-324)),
    ]
}

fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{0,8}",
        any::<String>(),
        "[\\x00-\\x1f\u{7f}\u{2028}\u{2029}\u{fffd}\u{1f600}]{0,8}",
        Just("{{ args }}".to_owned()),
        Just("prose".to_owned()),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        json_number(),
        json_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((json_string(), inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Nest `depth` arrays or objects around a scalar, as compact JSON text.
fn nested_text(depth: usize, objects: bool) -> String {
    let (open, close) = if objects {
        ("{\"a\":", "}")
    } else {
        ("[", "]")
    };
    format!("{}1{}", open.repeat(depth), close.repeat(depth))
}

// ---------------------------------------------------------------------------------------------
// (a) argument strings
// ---------------------------------------------------------------------------------------------

fn arg_string() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ -~]{0,40}",
        "[\\x01-\\x1f\u{7f}\u{85}\u{2028}\u{2029}]{0,24}",
        json_value().prop_map(|v| v.to_string()),
        (json_value(), any::<prop::sample::Index>()).prop_map(|(v, cut)| {
            // A JSON text cut off somewhere: almost never valid JSON any more.
            let text = v.to_string();
            let chars: Vec<char> = text.chars().collect();
            chars[..cut.index(chars.len() + 1)].iter().collect()
        }),
        prop_oneof![
            Just("1e400".to_owned()),
            Just("-1e400".to_owned()),
            Just("1e-400".to_owned()),
            Just("-0".to_owned()),
            Just("18446744073709551616".to_owned()),
            Just("-9223372036854775809".to_owned()),
            Just("{\"query\": 1e999, \"n\": 99999999999999999999999}".to_owned()),
            "[1-9][0-9]{18,300}",
            "-[1-9][0-9]{18,300}",
            "\\{\"n\": [1-9][0-9]{18,80}\\}",
        ],
        (1usize..3000, any::<bool>()).prop_map(|(d, objects)| nested_text(d, objects)),
        (1usize..400).prop_map(|d| "[".repeat(d)),
        prop_oneof![
            Just("\"\\ud800\"".to_owned()),
            Just("{\"query\": \"\\udfff tail\"}".to_owned()),
            Just("{\"query\": \"a\\u0000b\"}".to_owned()),
            Just("{\"query\": \"x\", \"query\": \"y\"}".to_owned()),
            Just("null".to_owned()),
            Just("  {\"query\":\"spaced\"}  ".to_owned()),
            Just("{\"query\":\"a\"} trailing".to_owned()),
        ],
        (1usize..60_000).prop_map(|n| "x".repeat(n)),
    ]
    // A process argument cannot hold NUL.
    .prop_map(|s| s.replace('\0', "\u{fffd}"))
}

const ARGS_BODY: &str = r#"
# Fuzz Args

```lua shared
seen_at_load = type(argv) .. ':' .. #args
```

```lua
if type(argv) == 'table' then argv.touched = true end
```

Raw {{ args }}

```lua
local ok, text = pcall(function() return prose end)
var.h1 = ok and #text or -1
```

## Read

Whole {{ argv }} and field {{ argv.query }}

```lua
local parts = { type(argv), tostring(argv), seen_at_load, tostring(var.h1) }
if type(argv) == 'table' then
  for _, v in ipairs(argv) do parts[#parts + 1] = tostring(v) end
  parts[#parts + 1] = tostring(argv.query)
  parts[#parts + 1] = tostring(pcall(function() argv.query = 1 end))
  local ok, copied = pcall(function() var.copy = argv.query end)
  parts[#parts + 1] = tostring(ok)
end
local ok, text = pcall(function() return prose end)
parts[#parts + 1] = ok and text or tostring(text)
return table.concat(parts, '|')
```

## Echo

{{ args }}

```lua
return prose
```
"#;

fn args_prompt(dir: &tempfile::TempDir, declared: bool) -> PathBuf {
    let declaration = if declared {
        "args:\n  query:\n    type: string\n  n:\n    type: integer\n    optional: true\n"
    } else {
        ""
    };
    let text = format!(
        "---\nname: fuzz-args\ndescription: Exercises argument handling\npromptforge: 0\n{declaration}---\n{ARGS_BODY}"
    );
    let name = if declared {
        "declared.md"
    } else {
        "default.md"
    };
    write_file(dir, name, &text)
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn argument_strings_never_panic(args in arg_string()) {
        let dir = scratch();
        for declared in [true, false] {
            let prompt = args_prompt(&dir, declared);
            let ran = run(&prompt, &[format!("--args={args}")])?;
            check(&ran, &prompt, false)?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// (b) Lua blocks from fragments
// ---------------------------------------------------------------------------------------------

/// Helpers every generated block can use.
const PRELUDE: &str = "local function deep(n) local t = {} for i = 1, n do t = { t } end return t end\n\
local function cyc() local t = {} t.self = t return t end\n";

/// Values a statement template can use in place of `@V@`.
const VALUES: &[&str] = &[
    "nil",
    "true",
    "false",
    "0",
    "-1",
    "42",
    "1.5",
    "-0.0",
    "1/0",
    "-1/0",
    "0/0",
    "2^63",
    "math.maxinteger",
    "math.mininteger",
    "''",
    "'text'",
    "'{{ args }}'",
    "string.char(255, 254)",
    "string.char(0)",
    "'\\u{2028}'",
    "string.rep('x', 300)",
    "string.rep('\\u{e9}', 257)",
    "string.rep('y', 100000)",
    "{}",
    "{ 1, 2, 3 }",
    "{ 1, nil, 3 }",
    "{ [1] = 1, [3] = 3 }",
    "{ 1, 2, x = 3 }",
    "{ a = 1, [2] = 'b', [true] = false }",
    "{ [1.5] = 1 }",
    "{ [''] = 1 }",
    "{ [string.char(255)] = 1 }",
    "{ [{}] = 1 }",
    "deep(50)",
    "deep(20000)",
    "cyc()",
    "{ f = type }",
    "type",
    "setmetatable({}, { __tostring = function() return 'T' end })",
    "setmetatable({}, { __tostring = function() error('tostring fails') end })",
    "setmetatable({}, { __tostring = function() return {} end })",
    "setmetatable({}, { __index = function(_, k) error('index ' .. tostring(k)) end })",
    "setmetatable({}, { __pairs = function() error('no pairs') end })",
    "setmetatable({}, { __pairs = 42 })",
    "setmetatable({}, { __metatable = 'locked' })",
    "setmetatable({}, { __len = function() return 'x' end })",
    "setmetatable({}, { __concat = function() error('no concat') end })",
    "setmetatable({}, { __len = function() return math.maxinteger end })",
    "setmetatable({}, { __len = function() return math.mininteger end })",
    "setmetatable({ 'a' }, { __len = function() return 2^40 end })",
    "setmetatable({}, { __len = function() error('no length') end })",
    "setmetatable({}, { __gc = function() while true do end end })",
    "models.get('w')",
    "messages.new()",
    "{ { role = 'user', content = 'hi' } }",
    "{ { role = 'user', content = { { type = 'text', text = 'x' } } } }",
    "_G",
    "var",
    "sys",
    "argv",
    "args",
    "prose",
    "log",
    "string",
    "getmetatable('')",
    "select(2, pcall(function() return sys.nope end))",
    "select(2, pcall(function() var.f = type end))",
];

/// Statement templates; `@V@` is replaced with a value.
const TEMPLATES: &[&str] = &[
    "var.k = @V@",
    "var.k = { inner = @V@ }",
    "var[@V@] = 1",
    "x = @V@",
    "error(@V@)",
    "error(@V@, 0)",
    "log(@V@)",
    "local _ = tostring(@V@)",
    "local _ = #(@V@)",
    "local _ = (@V@) .. 'x'",
    "local _ = 'x' .. (@V@)",
    "local _ = table.concat({ @V@, 'a' })",
    "setmetatable(_G, @V@)",
    "for _ in pairs(@V@) do end",
    "for _ in next, @V@ do end",
    "local _ = next(@V@)",
    "argv = @V@",
    "var = @V@",
    "sys.when = @V@",
    "local _ = list_from_section(@V@)",
    "local _ = sys[@V@]",
    "args = @V@",
    "_G[@V@] = 1",
    "prose = @V@",
    "local _ = select('#', pcall(error, @V@))",
    "local _ = string.format('%s', @V@)",
    "local _ = (@V@)[1]",
    "local _ = (@V@).field",
    "(@V@).field = 1",
    "local _ = xpcall(error, function(e) return e end, @V@)",
    "g_value = @V@",
    "local _ = fanout('### Worker', @V@)",
    "local _ = fanout(@V@, { 'a' })",
    "local _ = fanout('### Worker', { @V@, 'two' })",
    "local _ = call(@V@)",
    "local _ = call('## Items', @V@)",
    "jump(@V@)",
    "local _ = untrusted(@V@)",
    "local _ = store.read(@V@)",
    "store.write(@V@, 'x')",
    "store.write('f.txt', @V@)",
    "store.append('f.txt', @V@)",
    "local _ = store.str_replace('f.txt', @V@, 'y')",
    "local _ = store.glob(@V@)",
    "local _ = store.exists(@V@)",
    "store.delete(@V@)",
    "local _ = store.read_numbered('f.txt', @V@)",
    "local _ = models.use(@V@)",
    "local _ = models.use('w', @V@)",
    "models.default(@V@)",
    "local _ = models.get(@V@)",
    "local _ = models.infer(@V@)",
    "local _ = models.loop(@V@)",
    "local _ = models.loop(messages.new(), @V@)",
    "local m = messages.new() m:user(@V@) local _ = models.loop(m)",
    "local _ = tools.call(@V@, {})",
    "local _ = tools.call('fetch', @V@)",
    "tools.add(@V@)",
    "tools.always(@V@)",
    "tools.add_local(@V@)",
    "tools.add_local({ name = 'l', description = 'd', handler = @V@ })",
    "local _ = tasks.spawn(@V@)",
    "local _ = tasks.spawn('### Worker', @V@)",
    "local _ = tasks.join(@V@)",
    "local _ = tasks.join_any(@V@)",
    "local _ = tasks.status(@V@)",
    "tasks.cancel(@V@)",
    "tasks.concurrency(@V@)",
    "local _ = tasks.ready(@V@)",
    "local _ = table.concat(@V@)",
    "local _ = table.unpack(@V@)",
    "local _ = table.move(@V@, 1, 3, 2)",
    "table.sort(@V@)",
    "local _ = string.rep(@V@, 3)",
    "local _ = string.format('%s %d', @V@, 1)",
    "local _ = #@V@",
    "local _ = ui(@V@)",
];

/// Statements that need no value.
const STATEMENTS: &[&str] = &[
    "setmetatable(_G, { __index = function(_, k) error('strict ' .. tostring(k), 2) end })",
    "setmetatable(_G, { __newindex = function() end })",
    "setmetatable(_G, { __newindex = function(_, k) error('no new global ' .. tostring(k)) end })",
    "setmetatable(_G, { __index = _G })",
    "setmetatable(_G, { __metatable = false })",
    "setmetatable(_G, nil)",
    "getmetatable('').__index = nil",
    "getmetatable('').__index = function() error('no methods') end",
    "tostring = nil",
    "type = nil",
    "pcall = nil",
    "error = nil",
    "select = nil",
    "pairs = nil",
    "next = nil",
    "string = nil",
    "table = nil",
    "math = nil",
    "setmetatable = nil",
    "getmetatable = nil",
    "ipairs = nil",
    "_G = nil",
    "_G._G = nil",
    "var = nil",
    "sys = nil",
    "log = nil",
    "list_from_section = nil",
    "argv = nil",
    "local function r(n) return n == 0 and 0 or 1 + r(n - 1) end local _ = r(10000000)",
    "local function p(n) if n == 0 then error('deep') end return pcall(p, n - 1) end p(100000)",
    "local function t(v) return tostring(setmetatable({}, { __tostring = t })) end local _ = t()",
    "local _ = string.rep('ab', 2^20)",
    "local _ = string.rep('x', 2^40)",
    "local t = {} for i = 1, 1e6 do t[i] = i end",
    "local t = {} for i = 1, 200 do t[i] = string.rep('m', 1e6) .. i end",
    "for i = 1, 1100 do log('tick') end",
    "pcall(function() for i = 1, 1100 do log('tick') end end)",
    "log(string.rep('\\u{e9}', 256))",
    "local _ = prose",
    "local _ = prose .. prose",
    "local _ = ui and ui()",
    "local _ = ui()",
    "for k, v in pairs(_G) do end",
    "for k, v in pairs(var) do end",
    "for k in next, sys do end",
    "for k in pairs(type(argv) == 'table' and argv or {}) do end",
    "local _ = next({}, 'missing')",
    "local _ = next(_G, 'prose')",
    "local t = { a = 1, b = 2 } for k in pairs(t) do t[k] = nil t[k .. 'x'] = 1 end",
    "local t = { [false] = 1, [3] = 2, [7] = 3 } for k in next, t do t[k] = nil end",
    "local _ = table.concat({ 1, 2 }, ',', 1, 5)",
    "local _ = xpcall(error, error)",
    "local _ = xpcall(function() error('x') end, nil)",
    "local _ = string.format('%d', 1.5)",
    "local _ = ('x'):rep(-1)",
    "local _ = string.find('abc', '(')",
    "local _ = select(-1)",
    "local _ = string.gsub(string.rep('a', 1000), 'a', '%0%0')",
    "var.list = { 1, 2 } var.list[5] = 3",
    "var.t = {} var.t.self = var.t",
    "var.big = deep(20000)",
    "var.s = string.char(255)",
    "var[string.char(255)] = 1",
    "var[1] = 'one'",
    "var[true] = 1",
    "var.nan = 0/0",
    "var.inf = 1/0",
    "argv = deep(20000)",
    "argv = cyc()",
    "argv = { f = type }",
    "x = deep(20000)",
    "error(deep(20000))",
    "error(cyc())",
    "error(setmetatable({}, { __tostring = function() error('again') end }))",
    "error(setmetatable({}, { __tostring = function(t) return tostring(t) end }))",
    "error({ kind = 'store', message = 1 })",
    "error({ kind = 'lua', message = {} })",
    "local ok, e = pcall(function() return sys.nope end) e.message = nil error(e)",
    "local ok, e = pcall(function() return sys.nope end) e.message = {} error(e)",
    "local ok, e = pcall(function() return sys.nope end) pcall(setmetatable, e, nil) error(e)",
    "local ok, e = pcall(function() return sys.nope end) e.kind = 'store' error(e)",
    "local ok, e = pcall(function() return sys.nope end) e.kind = nil error(e)",
    "local ok, e = pcall(function() for i = 1, 1100 do log('q') end end) e.kind = 'tool' error(e)",
    "local ok, e = pcall(function() return sys.nope end) error(e, 2)",
    "do local c <close> = setmetatable({}, { __close = function() error('closing') end }) end",
    "local c <close> = 42",
    "local _ = list_from_section('## Items')[1]",
    "local _ = list_from_section('### Child')",
    "local _ = sys.id .. sys.when .. sys.section_name .. sys.taskid .. sys.section_count .. sys.execution",
    "local r = fanout('### Worker', { 1, 'x', { n = 3 } }) r[1].text = 'forged'",
    "local r = fanout('### Worker', { b = 1, a = 2 }) for i = 1, #r do local _ = tostring(r[i]) .. r[i].text end",
    "local r = fanout('### Worker', list_from_section('## Items')) setmetatable(r[1], nil)",
    "local _ = fanout('### Child', { 1 })",
    "local _ = fanout('### Worker', {})",
    "local _ = call('### Worker')",
    "local _ = tasks.spawn('### Worker')",
];

/// One generated statement, maybe wrapped in `pcall`.
fn statement() -> impl Strategy<Value = String> {
    let templated = (
        prop::sample::select(TEMPLATES),
        prop::sample::select(VALUES),
    )
        .prop_map(|(template, value)| template.replace("@V@", value));
    let plain = prop::sample::select(STATEMENTS).prop_map(str::to_owned);
    // Most statements are wrapped in `pcall`, so a block usually goes on past a failure and the
    // run reaches the later blocks and sections.
    (
        prop_oneof![3 => templated, 2 => plain],
        prop::bool::weighted(0.7),
    )
        .prop_map(|(stmt, wrap)| {
            if wrap {
                format!("pcall(function() {stmt} end)")
            } else {
                stmt
            }
        })
}

/// A block body: the prelude, some statements, and maybe a final `return`.
fn block() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(statement(), 0..5),
        prop::option::weighted(0.3, prop::sample::select(VALUES)),
    )
        .prop_map(|(statements, ret)| {
            let mut body = String::from(PRELUDE);
            for stmt in statements {
                // `;` keeps a statement that opens with `(` from reading as a call.
                body.push_str(&stmt);
                body.push_str(";\n");
            }
            if let Some(value) = ret {
                body.push_str("return ");
                body.push_str(value);
                body.push('\n');
            }
            body
        })
}

/// Prose that a block may read, placeholders good and bad included.
fn prose() -> impl Strategy<Value = String> {
    const PIECES: &[&str] = &[
        "Plain words.",
        "{{ args }}",
        "{{ argv }}",
        "{{ argv.query }}",
        "{{ var.k }}",
        "{{ var.k.inner }}",
        "{{ var }}",
        "{{ sys.id }}",
        "{{ sys.bogus }}",
        "{{ sys }}",
        "{{ item }}",
        "{{ item.x }}",
        "{{ args.x }}",
        "{{ x }}",
        "{{ g_value }}",
        "{{ _G }}",
        "{{ string }}",
        "{{ prose }}",
        "{{ }}",
        "{{ a..b }}",
        "{{ var. k }}",
        "{{",
        "}}",
        "\\{{ escaped }}",
        "\\\\",
        "\u{1b}{{ var.\u{1b} }}",
        "{{ kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk.x }}",
        "- a bullet",
        "`{{ args }}` <!-- {{ x }} -->",
    ];
    prop::collection::vec(prop::sample::select(PIECES), 0..4).prop_map(|pieces| pieces.join(" "))
}

/// A whole prompt: a shared library, H1 blocks with prose, and a few sections.
fn lua_prompt() -> impl Strategy<Value = String> {
    (
        prop::option::weighted(0.4, block()),
        prop::option::weighted(0.5, block()),
        prose(),
        block(),
        prose(),
        (block(), block(), block()),
        any::<bool>(),
    )
        .prop_map(
            |(
                shared,
                h1_first,
                h1_prose,
                h1_second,
                section_prose,
                (a_pro, a_epi, b),
                declared,
            )| {
                let mut text = String::from(
                    "---\nname: fuzz-lua\ndescription: Generated Lua blocks\npromptforge: 0\n",
                );
                if declared {
                    text.push_str("args:\n  query:\n    type: string\n");
                }
                text.push_str(
                    "models:\n  w: {}\nplugins: [promptforge/web]\ntools:\n  fetch: promptforge/web/fetch\n",
                );
                text.push_str("---\n\n# Fuzz Lua\n\n");
                if let Some(shared) = shared {
                    text.push_str(&format!("```lua shared\n{shared}```\n\n"));
                }
                if let Some(first) = h1_first {
                    text.push_str(&format!("```lua\n{first}```\n\n"));
                }
                text.push_str(&format!("{h1_prose}\n\n```lua\n{h1_second}```\n\n"));
                text.push_str(&format!(
                    "## A\n\n```lua\n{a_pro}```\n\n{section_prose}\n\n```lua\n{a_epi}```\n\n"
                ));
                text.push_str("### Child\n\n- c1\n- c2\n\n");
                text.push_str(&format!("## B\n\n```lua\n{b}```\n\n"));
                // A worker section that fails for one member, so fanouts see arm failures.
                text.push_str(
                    "### Worker\n\n```lua\nif item == 'two' then error('bad two') end\n\
                     return tostring(item) .. sys.index\n```\n\n",
                );
                text.push_str("## Items\n\n- one\n- two\n");
                text
            },
        )
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn lua_blocks_never_panic(text in lua_prompt(), with_snapshot in any::<bool>()) {
        let dir = scratch();
        let prompt = write_file(&dir, "prompt.md", &text);
        let mut extra = vec!["--args={\"query\":\"q\"}".to_owned()];
        let script = write_file(
            &dir,
            "script.json",
            r#"{"model": {"id": "fuzz"}, "replies": [{"echo": true}, "two", {"tool_calls": [{"id": "c1", "name": "fetch", "arguments": {"url": "https://e.com/"}}]}, {"echo": true}, {"fail": "overflow"}, {"fail": "status", "status": 503}]}"#,
        );
        let web = write_file(
            &dir,
            "web.json",
            r#"{"dns": {"e.com": ["93.184.215.14"]}, "pages": {"https://e.com/": {"status": 200, "headers": {"content-type": "text/html"}, "body": "<p>hi</p>"}}, "search": []}"#,
        );
        for (flag, file) in [("--script", &script), ("--web-script", &web)] {
            extra.push(flag.to_owned());
            extra.push(file.to_string_lossy().into_owned());
        }
        if with_snapshot {
            let snapshot = write_file(&dir, "snapshot.json", "{\"selected_model\":\"m\",\"n\":null}");
            extra.push("--snapshot".to_owned());
            extra.push(snapshot.to_string_lossy().into_owned());
        }
        let ran = run(&prompt, &extra)?;
        check(&ran, &prompt, false)?;
    }
}

// ---------------------------------------------------------------------------------------------
// (c) snapshots
// ---------------------------------------------------------------------------------------------

const SNAPSHOT_PROMPT: &str = r#"---
name: fuzz-snapshot
description: Reads the Host-state snapshot every way it can
promptforge: 0
---

# Fuzz Snapshot

```lua shared
at_load = type(ui) == 'function' and ui() or {}
```

```lua
local keys = 0
for k, v in pairs(ui()) do keys = keys + 1 end
var.keys = keys
local ok = pcall(function() var.copy = ui() end)
var.copied = ok
```

## Read

Snapshot {{ snap }} and {{ var.copy }}

```lua
snap = ui()
local parts = { tostring(var.keys), tostring(var.copied) }
for k, v in pairs(snap) do
  parts[#parts + 1] = tostring(k) .. '=' .. tostring(v)
  if type(v) == 'table' then
    for k2, v2 in pairs(v) do parts[#parts + 1] = tostring(k2) .. ':' .. tostring(v2) end
  end
end
local changed = ui()
for k in pairs(changed) do changed[k] = nil end
local ok, text = pcall(function() return prose end)
parts[#parts + 1] = ok and text or tostring(text)
parts[#parts + 1] = tostring(next(ui()) ~= nil or next(at_load) == nil)
return table.concat(parts, '|')
```
"#;

fn snapshot_object() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::collection::vec((json_string(), json_value()), 0..8)
            .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        (1usize..120).prop_map(|depth| {
            let mut v = Value::from("bottom");
            for _ in 0..depth {
                let mut m = Map::new();
                m.insert("deeper".to_owned(), v);
                v = Value::Object(m);
            }
            v
        }),
    ]
}

/// Any snapshot file text: a JSON object, another JSON value, or something broken.
fn snapshot_text() -> impl Strategy<Value = String> {
    prop_oneof![
        snapshot_object().prop_map(|v| v.to_string()),
        json_value().prop_map(|v| v.to_string()),
        any::<String>(),
        (1usize..400, any::<bool>()).prop_map(|(d, objects)| nested_text(d, objects)),
        Just(String::new()),
        Just("{\"a\": 1} {\"b\": 2}".to_owned()),
        Just("{\"dup\": 1, \"dup\": 2}".to_owned()),
        Just("{\"s\": \"\\ud800\"}".to_owned()),
    ]
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn snapshot_objects_never_panic(snapshot in snapshot_object()) {
        let dir = scratch();
        let file = write_file(&dir, "snapshot.json", &snapshot.to_string());
        let prompt = write_file(&dir, "prompt.md", SNAPSHOT_PROMPT);
        let ran = run(&prompt, &["--snapshot".to_owned(), file.to_string_lossy().into_owned()])?;
        check(&ran, &prompt, false)?;
    }

    #[test]
    fn snapshot_texts_never_panic(text in snapshot_text()) {
        // A snapshot that is not a JSON object is a usage error (exit 2), never a crash.
        let dir = scratch();
        let file = write_file(&dir, "snapshot.json", &text);
        let prompt = write_file(&dir, "prompt.md", SNAPSHOT_PROMPT);
        let ran = run(&prompt, &["--snapshot".to_owned(), file.to_string_lossy().into_owned()])?;
        check(&ran, &prompt, true)?;
    }
}

// ---------------------------------------------------------------------------------------------
// (d) scripted model and scripted web files
// ---------------------------------------------------------------------------------------------

/// Random script and web-script files: JSON values of every shape, near-misses of the real
/// formats included. A file the Host cannot use is a usage error (exit 2); any other run ends
/// with one outcome.
fn script_text() -> impl Strategy<Value = String> {
    let reply = prop_oneof![
        json_value(),
        Just(json!({"echo": true})),
        Just(json!({"fail": "status", "status": 503})),
        Just(json!({"fail": "overflow"})),
        Just(json!({"text": "", "finish_reason": "length"})),
        json_value().prop_map(
            |v| json!({"text": "t", "tool_calls": [{"id": "c", "name": "fetch", "arguments": v}]})
        ),
        json_value().prop_map(|v| json!({"when": v, "text": "w"})),
        json_value().prop_map(|v| json!({"when_tool": v, "text": "w"})),
        json_value().prop_map(|v| json!({"text": "u", "usage": v})),
    ];
    let model = prop_oneof![
        Just(json!({"id": "fuzz"})),
        json_value().prop_map(|v| json!({"id": "fuzz", "context": v})),
        json_value().prop_map(|v| json!({"id": "fuzz", "thinking": v})),
        json_value(),
    ];
    (
        prop::option::of(model),
        prop::collection::vec(reply, 0..5),
        any::<bool>(),
    )
        .prop_map(|(model, replies, raw)| {
            if raw {
                return json!(replies).to_string();
            }
            let mut script = json!({"replies": replies});
            if let Some(model) = model {
                script["model"] = model;
            }
            script.to_string()
        })
}

fn web_text() -> impl Strategy<Value = String> {
    let page = prop_oneof![
        json_value(),
        Just(json!({"status": 200, "headers": {"content-type": "text/plain"}, "body": "ok"})),
        json_value().prop_map(|v| json!({"status": v, "headers": {"content-type": "text/html"}})),
        json_value().prop_map(|v| json!({"status": 301, "headers": {"location": v}})),
        json_value().prop_map(|v| json!({"status": 200, "headers": v, "body": "b"})),
        json_value().prop_map(|v| json!({"status": 200, "body_base64": v})),
        json_value().prop_map(|v| json!({"timeout": v})),
        json_value().prop_map(|v| json!({"status": 200, "body": "abc", "break_after": v})),
    ];
    let dns = prop_oneof![
        Just(json!(["93.184.215.14"])),
        Just(json!("fail")),
        json_value(),
    ];
    (dns, page, prop::option::of(json_value())).prop_map(|(dns, page, search)| {
        let mut web = json!({"dns": {"e.com": dns}, "pages": {"https://e.com/": page}});
        if let Some(search) = search {
            web["search"] = search;
        }
        web.to_string()
    })
}

const SCRIPTED_PROMPT: &str = "---\nname: fuzz-files\ndescription: d\npromptforge: 0\nmodels:\n  w: {}\n\
plugins: [promptforge/web]\ntools:\n  fetch: promptforge/web/fetch\n  search: promptforge/web/search\n---\n\n\
# Fuzz files\n\n## Main\n\n```lua\nmodels.default('w')\ntools.add({'fetch', 'search'})\n\
local a = pcall(models.infer, 'hello')\nlocal m = messages.new()\nm:user('go')\n\
local b = pcall(models.loop, m)\nlocal c = pcall(tools.call, 'fetch', { url = 'https://e.com/' })\n\
local d = pcall(tools.call, 'search', { query = 'q' })\n\
return tostring(a) .. tostring(b) .. tostring(c) .. tostring(d)\n```\n";

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn script_and_web_files_never_panic(script in script_text(), web in web_text()) {
        let dir = scratch();
        let prompt = write_file(&dir, "prompt.md", SCRIPTED_PROMPT);
        let script = write_file(&dir, "script.json", &script);
        let web = write_file(&dir, "web.json", &web);
        let extra = vec![
            "--script".to_owned(),
            script.to_string_lossy().into_owned(),
            "--web-script".to_owned(),
            web.to_string_lossy().into_owned(),
        ];
        let ran = run(&prompt, &extra)?;
        check(&ran, &prompt, true)?;
    }
}
