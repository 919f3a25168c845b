//! Compiling Lua regions at parse time with Lua 5.5.
//!
//! Each region is compiled once, with debug information, under its location label as the chunk
//! name, and kept as bytecode that every section VM loads later. Every line number Lua reports
//! (compile diagnostics, runtime errors, tracebacks) is the absolute prompt-file line, so no
//! message ever needs rewriting: a region is compiled from its own source and its dump's line
//! information is then moved down to where the region starts (`relines`), which keeps the
//! cost of a region independent of how far down the file it sits. A region that does not
//! compile is compiled again from source padded with one newline per file line above it, so
//! the diagnostic names the file line; so is one whose dump the rewriter does not recognise.

use std::sync::Arc;

use mlua::{Lua, LuaOptions, StdLib, chunk::ChunkMode};

use crate::error::{ParseError, ParseErrorKind};

/// A compiled Lua region: the shared library, an H1 block, or a section block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuaRegion {
    /// The location label, e.g. ``section `Main` prologue`` (also the chunk name).
    pub label: String,
    /// The 1-based file line where the region's Lua starts (the line after the opening fence).
    pub first_line: u32,
    /// The Lua source as written (line endings normalised to `\n`).
    pub source: String,
    /// The file line a failure of the region is shown at when no frame of it is left on the
    /// stack to name one (a `return f(...)` tail call replaced it): its one `return f(...)`
    /// line when it has exactly one, else `first_line`.
    /// Worked out once here, not each time the region runs.
    pub fallback_line: u32,
    /// Lua 5.5 bytecode of the padded source, with debug information.
    pub bytecode: Arc<[u8]>,
}

/// Compiles regions; holds one bare Lua state (no libraries) used only as a compiler.
pub(crate) struct Compiler {
    lua: Lua,
}

/// Where a region's failure is shown when no frame of it is left on the stack: the line of
/// its one `return f(...)` tail call when it has exactly one (the frame that call replaced is
/// the one that failed), else the region's first line. Display only, never in a message.
pub(crate) fn fallback_line(first_line: u32, source: &str) -> u32 {
    let tail_calls: Vec<usize> = source
        .lines()
        .enumerate()
        .filter(|(_, line)| {
            let Some(rest) = line.trim_start().strip_prefix("return") else {
                return false;
            };
            if !rest.starts_with(char::is_whitespace) {
                return false;
            }
            let rest = rest.trim_start();
            let callee_end = rest
                .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | ':')))
                .unwrap_or(rest.len());
            callee_end > 0
                && rest[callee_end..]
                    .trim_start()
                    .starts_with(['(', '{', '\'', '"'])
        })
        .map(|(index, _)| index)
        .collect();
    let offset = match tail_calls.as_slice() {
        [only] => u32::try_from(*only).unwrap_or(0),
        _ => 0,
    };
    first_line.saturating_add(offset)
}

impl Compiler {
    pub(crate) fn new() -> Result<Self, ParseError> {
        let lua = Lua::new_with(StdLib::NONE, LuaOptions::default()).map_err(|e| {
            ParseError::new(
                ParseErrorKind::Lua,
                format!("lua compiler could not start: {e}"),
            )
        })?;
        Ok(Compiler { lua })
    }

    /// Compile `source`, whose first line is file line `first_line`, under `label`.
    pub(crate) fn compile(
        &self,
        label: String,
        first_line: u32,
        source: String,
    ) -> Result<LuaRegion, ParseError> {
        let offset = first_line.saturating_sub(1);
        let direct = self
            .lua
            .load(source.as_str())
            .set_name(label.clone())
            .set_mode(ChunkMode::Text)
            .into_function();
        if let Ok(function) = direct
            && let Some(bytecode) = crate::relines::shift_lines(&function.dump(false), offset)
        {
            return Ok(LuaRegion {
                label,
                first_line,
                fallback_line: fallback_line(first_line, &source),
                source,
                bytecode: bytecode.into(),
            });
        }
        self.compile_padded(label, first_line, source)
    }

    /// The padded compile: the source behind `first_line - 1` newlines.
    fn compile_padded(
        &self,
        label: String,
        first_line: u32,
        source: String,
    ) -> Result<LuaRegion, ParseError> {
        let padding = first_line.saturating_sub(1) as usize;
        let mut padded = String::with_capacity(padding + source.len());
        padded.extend(std::iter::repeat_n('\n', padding));
        padded.push_str(&source);
        let function = self
            .lua
            .load(padded)
            .set_name(label.clone())
            .set_mode(ChunkMode::Text)
            .into_function()
            .map_err(|e| {
                let diagnostic = match e {
                    mlua::Error::SyntaxError { message, .. } => message,
                    other => other.to_string(),
                };
                ParseError::new(
                    ParseErrorKind::Lua,
                    format!("lua compilation error at {label} (line {first_line}): {diagnostic}"),
                )
            })?;
        let bytecode = function.dump(false);
        Ok(LuaRegion {
            label,
            first_line,
            fallback_line: fallback_line(first_line, &source),
            source,
            bytecode: bytecode.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_with_no_frame_left_is_shown_at_the_one_tail_call_or_the_first_line() {
        let region = |source: &str| source.to_owned();
        let one = region("local x = 1\nmodels.default('w')\nreturn models.infer('hi ' .. x)\n");
        assert_eq!(fallback_line(20, &one), 22);
        let table_call = region("return store.read { path = 'a' }\n");
        assert_eq!(fallback_line(20, &table_call), 20);
        let two = region("if a then\n  return f(1)\nend\nreturn g(2)\n");
        assert_eq!(fallback_line(20, &two), 20);
        let not_a_call = region("local y = 2\nreturn y\nreturned(1)\n");
        assert_eq!(fallback_line(20, &not_a_call), 20);
    }

    /// Run a region and return the error text and the traceback Lua gives.
    fn run(region: &LuaRegion) -> String {
        let lua = Lua::new();
        let f = lua
            .load(&region.bytecode[..])
            .set_name(region.label.clone())
            .set_mode(mlua::chunk::ChunkMode::Binary)
            .into_function()
            .unwrap();
        let traceback: mlua::Function = lua
            .load("return function(e) return tostring(e) .. '\\n' .. debug.traceback('', 2) end")
            .eval()
            .unwrap();
        let xpcall: mlua::Function = lua.globals().get("xpcall").unwrap();
        let (_, text): (bool, String) = xpcall.call((f, traceback)).unwrap();
        text
    }

    #[test]
    fn shifted_line_information_matches_the_padded_compile() {
        let compiler = Compiler::new().unwrap();
        let sources = [
            "error('boom')",
            "\n\nlocal x = 1\nlocal function f()\n  error('inner')\nend\nf()",
            "local t = {}\nfor i = 1, 3 do t[i] = i end\nlocal g = function(a)\n  return a.b.c\nend\nreturn g({})",
            "local function outer()\n  local function inner()\n    error({})\n  end\n  inner()\nend\nouter()",
        ];
        for first_line in [1, 2, 130, 5000, 70000] {
            for source in sources {
                // A long body, so line info holds absolute entries of its own too.
                let long = format!("{}{source}", "x = 1\n".repeat(300));
                for source in [source.to_owned(), long] {
                    let label = "section `Main` prologue".to_owned();
                    let fast = compiler
                        .compile(label.clone(), first_line, source.clone())
                        .unwrap();
                    let padded = compiler
                        .compile_padded(label, first_line, source.clone())
                        .unwrap();
                    assert_eq!(run(&fast), run(&padded), "line {first_line}: {source}");
                    // The fast path was taken: the rewriter knows the dump.
                    let direct = compiler
                        .lua
                        .load(source.as_str())
                        .set_name("section `Main` prologue")
                        .into_function()
                        .unwrap();
                    assert!(
                        crate::relines::shift_lines(&direct.dump(false), first_line - 1).is_some()
                    );
                }
            }
        }
    }

    #[test]
    fn compile_error_names_label_and_absolute_line() {
        let compiler = Compiler::new().unwrap();
        let err = compiler
            .compile(
                "section `Check` epilog".into(),
                13,
                "local a = 1\nassert(false".into(),
            )
            .unwrap_err();
        assert_eq!(err.kind, ParseErrorKind::Lua);
        assert!(
            err.message.starts_with(
                "lua compilation error at section `Check` epilog (line 13): [string \"section `Check` epilog\"]:14:"
            ),
            "{}",
            err.message
        );
    }

    #[test]
    fn runtime_lines_are_absolute() {
        let compiler = Compiler::new().unwrap();
        let region = compiler
            .compile("section `Main` prologue".into(), 12, "error('boom')".into())
            .unwrap();
        let lua = Lua::new();
        let f = lua
            .load(&region.bytecode[..])
            .set_mode(mlua::chunk::ChunkMode::Binary)
            .into_function()
            .unwrap();
        let err = f.call::<()>(()).unwrap_err().to_string();
        assert!(
            err.contains("[string \"section `Main` prologue\"]:12: boom"),
            "{err}"
        );
    }

    #[test]
    fn lua55_syntax_is_accepted() {
        let compiler = Compiler::new().unwrap();
        compiler
            .compile("H1 `T` lua".into(), 1, "global x\nx = 1".into())
            .unwrap();
    }
}
