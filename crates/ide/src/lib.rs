//! `promptforge-ide`: what an editor asks of a prompt file, answered from its text alone.
//!
//! Invariant: pure functions of the document text; nothing runs, nothing is read from disk,
//! nothing is serialised (the language server in the CLI turns these answers into LSP).
//! Positions are 1-based lines and 1-based byte columns, as the parser's errors are; the
//! server converts them to the client's encoding.
//!
//! An [`Analysis`] holds the file's [`Outline`] (which exists however broken the file is), the
//! prompt as far as it parses ([`Prompt::check_partial`]), every problem `check` reports, and
//! the literal arguments of the calls that name sections, model roles and tool aliases, found
//! by a small Lua lexer. From those it answers diagnostics (the parse problems, plus warnings
//! for references that name nothing), definitions, references, completions, hovers, symbols
//! and folding ranges.

mod analysis;
mod lua_lex;
pub mod reference;

pub use analysis::{Analysis, Completion, CompletionKind, Diagnostic, Pos, Severity, Span, Symbol};

#[doc(no_inline)]
pub use promptforge_syntax::{Outline, Prompt};

/// A generated prompt of `sections` sections, each with prose and a fence that reads a role
/// and names the next section: what the editor benchmarks (this crate's and the language
/// server's) analyse.
pub fn sample_prompt(sections: usize) -> String {
    let mut text = String::from(
        "---\nname: big\ndescription: Many sections\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Big\n\n",
    );
    for i in 0..sections {
        text.push_str(&format!(
            "## Part {i}\n\nSay something about part {i}.\n\n```lua\nmodels.use('w')\nlocal r = models.infer(prose)\nif r == '' then jump('## Part {}') end\nreturn r\n```\n\n",
            (i + 1) % sections.max(1)
        ));
    }
    text
}
