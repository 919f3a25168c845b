//! The language server in a real editor: Neovim (Debian's package), headless, with its
//! built-in LSP client attached to `promptforge lsp`: diagnostics on a broken file, a jump to
//! a definition, a completion list. Skipped when `nvim` is missing, unless
//! `PROMPTFORGE_REQUIRE_NVIM=1` (CI installs it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

const PROMPT: &str = "---\nname: p\ndescription: d\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# P\n\n## Main\n\n```lua\nmodels.use('writer')\nreturn call('## Sumarize')\n```\n\n## Summarize\n\nSay it short.\n\n```lua\nlocal x = = 1\n```\n";

/// The editor's side: attach the client, wait for diagnostics, ask for a definition and a
/// completion, write down what came back.
const SCRIPT: &str = r#"
local out = {}
local buf = vim.api.nvim_get_current_buf()
local id = vim.lsp.start_client({
  name = 'promptforge',
  cmd = { os.getenv('PF_BIN'), 'lsp' },
  root_dir = vim.fn.getcwd(),
})
vim.lsp.buf_attach_client(buf, id)
local want = tonumber(os.getenv('PF_DIAGS'))
vim.wait(10000, function() return #vim.diagnostic.get(buf) >= want end, 50)
local diags = vim.diagnostic.get(buf)
table.sort(diags, function(a, b) return a.lnum < b.lnum end)
for _, d in ipairs(diags) do
  table.insert(out, 'diag ' .. d.lnum .. ' ' .. d.severity .. ' ' .. d.message)
end
local params = {
  textDocument = { uri = vim.uri_from_bufnr(buf) },
  position = { line = 14, character = 16 },
}
local res = vim.lsp.buf_request_sync(buf, 'textDocument/definition', params, 5000) or {}
for _, r in pairs(res) do
  if r.result and r.result.range then
    table.insert(out, 'definition ' .. r.result.range.start.line)
  end
end
res = vim.lsp.buf_request_sync(buf, 'textDocument/completion', params, 5000) or {}
for _, r in pairs(res) do
  for _, item in ipairs(r.result or {}) do table.insert(out, 'completion ' .. item.label) end
end
vim.fn.writefile(out, os.getenv('PF_OUT'))
vim.cmd('qa!')
"#;

/// Open `p.md` in headless Neovim with the script above (waiting for `diagnostics` of them)
/// and give back what it wrote down.
fn edit_in_neovim(dir: &std::path::Path, diagnostics: u32) -> String {
    let out = dir.join("out.txt");
    let status = Command::new("nvim")
        .args([
            "--headless",
            "-u",
            "NONE",
            "-i",
            "NONE",
            "p.md",
            "-c",
            "luafile test.lua",
        ])
        .current_dir(dir)
        .env("PF_BIN", env!("CARGO_BIN_EXE_promptforge"))
        .env("PF_OUT", &out)
        .env("PF_DIAGS", diagnostics.to_string())
        .env("XDG_STATE_HOME", dir.join("state"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::read_to_string(&out).unwrap()
}

#[test]
fn neovim_shows_the_diagnostics_jumps_and_completes() {
    if Command::new("nvim").arg("--version").output().is_err() {
        assert!(
            std::env::var("PROMPTFORGE_REQUIRE_NVIM").as_deref() != Ok("1"),
            "nvim is required (apt install neovim)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.md"), PROMPT).unwrap();
    std::fs::write(dir.path().join("test.lua"), SCRIPT).unwrap();
    let seen = edit_in_neovim(dir.path(), 2);
    let lines: Vec<&str> = seen.lines().collect();
    // The typo'd reference is a warning (severity 2) with a suggestion; the Lua syntax error
    // an error (severity 1); each at its own line.
    assert!(
        lines[0].starts_with("diag 14 2 section heading `## Sumarize` is not visible")
            && lines[0].ends_with("did you mean `## Summarize`?"),
        "{seen}"
    );
    assert!(
        lines[1].starts_with("diag 22 1 lua compilation error"),
        "{seen}"
    );
    assert!(lines.contains(&"completion ## Summarize"), "{seen}");
    // The typo resolves nowhere: no definition; after fixing it the jump works (below).
    assert!(!seen.contains("definition"), "{seen}");

    std::fs::write(
        dir.path().join("p.md"),
        PROMPT.replace("Sumarize", "Summarize"),
    )
    .unwrap();
    let seen = edit_in_neovim(dir.path(), 1);
    assert!(seen.contains("definition 17"), "{seen}");
    assert!(seen.contains("diag 22 1 lua compilation error"), "{seen}");
}
