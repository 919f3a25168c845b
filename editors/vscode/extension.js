// PromptForge for VS Code: starts `promptforge lsp` for prompt files, and adds Run / Check
// commands (and code lenses above the H1) that run the current file in a terminal.
'use strict';

const vscode = require('vscode');
const { LanguageClient, TransportKind } = require('vscode-languageclient/node');

let client;

function binary() {
  return vscode.workspace.getConfiguration('promptforge').get('path') || 'promptforge';
}

function inTerminal(subcommand) {
  const editor = vscode.window.activeTextEditor;
  if (!editor) {
    return;
  }
  const file = editor.document.fileName;
  editor.document.save().then(() => {
    const terminal =
      vscode.window.terminals.find((t) => t.name === 'PromptForge') ||
      vscode.window.createTerminal('PromptForge');
    terminal.show(true);
    const quoted = "'" + file.replace(/'/g, "'\\''") + "'";
    terminal.sendText(`${binary()} ${subcommand} ${quoted}`);
  });
}

class Lenses {
  provideCodeLenses(document) {
    for (let line = 0; line < document.lineCount; line++) {
      if (/^#\s/.test(document.lineAt(line).text)) {
        const range = new vscode.Range(line, 0, line, 0);
        return [
          new vscode.CodeLens(range, { title: '▶ Run', command: 'promptforge.run' }),
          new vscode.CodeLens(range, { title: '✓ Check', command: 'promptforge.check' }),
        ];
      }
    }
    return [];
  }
}

function activate(context) {
  context.subscriptions.push(
    vscode.commands.registerCommand('promptforge.run', () => inTerminal('run')),
    vscode.commands.registerCommand('promptforge.check', () => inTerminal('check')),
    vscode.languages.registerCodeLensProvider({ language: 'promptforge' }, new Lenses()),
  );
  const server = { command: binary(), args: ['lsp'], transport: TransportKind.stdio };
  client = new LanguageClient(
    'promptforge',
    'PromptForge',
    { run: server, debug: server },
    { documentSelector: [{ language: 'promptforge' }] },
  );
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
