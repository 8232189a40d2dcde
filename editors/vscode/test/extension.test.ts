// The bundled extension (out/extension.js, as packaged) activated under node with a stand-in `vscode`
// module: the code that glues settings, the server launch, the language client, the status bar and the
// commands together, against the real server.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { createFakeVscode, FakeDocument, FakeState, fileUri, loadExtension } from "./fake-vscode";
import { removeDir } from "./remove-dir";

const ROOT = path.resolve(__dirname, "..", "..");          // editors/vscode
const BUNDLE = path.join(ROOT, "out", "extension.js");
const REPO = path.resolve(ROOT, "..", "..");
const PYTHON = process.env.REST_LSP_TEST_PYTHON ?? path.join(REPO, ".venv", "bin", "python");
const SERVER = path.join(path.dirname(PYTHON), "rest-lsp");

async function until<T>(what: string, f: () => T | undefined | false | Promise<T | undefined | false>,
                        timeoutMs = 120_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

test("a missing server: an error naming what was searched, with the README one click away", async () => {
  const { vscode, state } = createFakeVscode({ "server.path": "/nonexistent/bin/rest-lsp" }, []);
  state.errorChoice = "Open README";
  const ext = loadExtension(BUNDLE, vscode);
  await ext.activate({ subscriptions: [], extensionUri: fileUri(ROOT) });
  assert.deepEqual([...state.commands.keys()].sort(), [
    "restLsp.rebuildIndex", "restLsp.restart", "restLsp.showStats", "restLsp.toggleCompletions",
  ]);
  await until("the error message", () => state.errors.length > 0, 5000);
  assert.match(state.errors[0].message, /configured server "\/nonexistent\/bin\/rest-lsp" is not an executable/);
  assert.deepEqual(state.errors[0].buttons, ["Open README", "Open Settings", "Show Log"]);
  assert.equal(state.statusItem.text, "$(error) REST error");
  assert.match(state.statusItem.tooltip, /server not found/);
  await until("the README", () => state.executed.length > 0, 5000);
  const [command, uri] = state.executed[0] as [string, { fsPath: string }];
  assert.equal(command, "markdown.showPreview");
  assert.equal(uri.fsPath, path.join(ROOT, "README.md"));
  assert.ok(fs.existsSync(uri.fsPath), "the README ships with the extension");
  await ext.deactivate();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface StubSession {
  log: string; // what the stand-in server got: one JSON line per notification, with its arrival time
  settings: Record<string, unknown>;
  vscode: any;
  state: FakeState;
  doc(file: string, languageId?: string): FakeDocument;
}

/** The extension activated against test/stub-server.ts (restLsp.server.path, serving python) and ready; `body`
 * runs, then the extension is deactivated and its folder removed. */
async function withStubServer(prefix: string, body: (s: StubSession) => Promise<void>): Promise<void> {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  const log = path.join(tmp, "notifications.jsonl");
  const server = path.join(tmp, "stub-server");
  fs.writeFileSync(server, `#!/bin/sh\nexec "${process.execPath}" "${path.join(__dirname, "stub-server.js")}" "$@"\n`, { mode: 0o755 });
  const settings: Record<string, unknown> = { "server.path": server, "server.env": { STUB_LOG: log }, languages: ["python"] };
  const { vscode, state } = createFakeVscode(settings, [tmp]);
  const ext = loadExtension(BUNDLE, vscode);
  const doc = (file: string, languageId = "python") => ({
    uri: fileUri(path.join(tmp, file)), languageId, version: 1, getText: () => "x = 1\n", isClosed: false, lineCount: 2,
  });
  try {
    await ext.activate({ subscriptions: [], extensionUri: fileUri(ROOT) });
    await until("the ready state", () => state.statusItem.text.startsWith("$(sparkle) REST"), 20_000);
    await body({ log, settings, vscode, state, doc });
  } finally {
    await ext.deactivate();
    await removeDir(tmp);
  }
}

test("rest/cursor: sent once the cursor rests 250 ms, once when an editor becomes active, never while toggled off", { timeout: 60_000 }, async () => {
  await withStubServer("rest-lsp-cursor-", async ({ log, settings, state, doc }) => {
    const cursorReports = () => fs.existsSync(log)
      ? fs.readFileSync(log, "utf8").trim().split("\n").map((l) => JSON.parse(l)).filter((n) => n.method === "rest/cursor")
      : [];
    const py = doc("a.py", "python");
    state.openDocument(py);
    const activated = Date.now();
    state.activateEditor(py, 3, 7);
    await until("the activation report", () => cursorReports().length === 1, 5000);
    const [first] = cursorReports();
    assert.deepEqual(first.params, { textDocument: { uri: py.uri.toString() }, position: { line: 3, character: 7 } });
    assert.ok(first.at - activated >= 240, `reported ${first.at - activated} ms after activation`);

    // Typing: a move every 30 ms for 600 ms is one report, at the last position, after the cursor rested.
    let lastMove = 0;
    for (let i = 0; i < 20; i++) {
      state.moveCursor(4, i);
      lastMove = Date.now();
      await sleep(30);
    }
    await until("the report after typing", () => cursorReports().length === 2, 5000);
    await sleep(400);
    const reports = cursorReports();
    assert.equal(reports.length, 2, "one report for the whole burst");
    assert.deepEqual(reports[1].params.position, { line: 4, character: 19 });
    assert.ok(reports[1].at - lastMove >= 240, `reported ${reports[1].at - lastMove} ms after the last move`);

    // A document the server does not serve (restLsp.languages) is not reported.
    state.activateEditor(doc("notes.txt", "plaintext"), 0, 1);
    state.moveCursor(0, 2);
    // Completions toggled off: neither moves nor activations are reported.
    state.activateEditor(py, 1, 1);
    settings["completions.enabled"] = false;
    state.fireConfigurationChange(["restLsp", "restLsp.completions.enabled"]);
    state.moveCursor(1, 2);
    state.activateEditor(py, 1, 3);
    await sleep(600);
    assert.equal(cursorReports().length, 2, JSON.stringify(cursorReports().slice(2)));
    settings["completions.enabled"] = true;
    state.fireConfigurationChange(["restLsp", "restLsp.completions.enabled"]);
    state.moveCursor(2, 0);
    await until("a report once back on", () => cursorReports().length === 3, 5000);
    assert.deepEqual(cursorReports()[2].params.position, { line: 2, character: 0 });
  });
});

test("typing VS Code asks nothing for (a new editor's first keys) is asked for, until VS Code asks itself", { timeout: 60_000 }, async () => {
  await withStubServer("rest-lsp-unasked-", async ({ vscode, state, doc }) => {
    const triggers = () => state.executed.filter((x) => x[0] === "editor.action.inlineSuggest.trigger").length;
    const py = doc("a.py");
    state.openDocument(py);
    state.activateEditor(py, 0, 5);
    // An undo asks VS Code for nothing either; with inline suggestions off in the editor nothing is asked.
    state.typeChar(1);
    await sleep(800);
    state.settings["inlineSuggest.enabled"] = false;
    state.typeChar();
    await sleep(800);
    delete state.settings["inlineSuggest.enabled"];
    assert.equal(triggers(), 0);
    state.typeChar();
    state.typeChar();
    await until("the extension asking for the unasked typing", () => triggers() === 1, 5000);
    assert.ok(state.output.some((l) => l.startsWith("VS Code asked nothing after typing at 1:10")), state.output.join("\n"));
    state.typeChar();   // once per document: that command made VS Code's controller
    await sleep(800);
    assert.equal(triggers(), 1);
    // A document VS Code has asked about (its controller exists) is left to VS Code.
    const other = doc("b.py");
    state.openDocument(other);
    state.activateEditor(other, 0, 5);
    const provider = state.inlineProviders[0].provider;
    const token = { isCancellationRequested: false, onCancellationRequested: () => ({ dispose() {} }) };
    await provider.provideInlineCompletionItems(other, new vscode.Position(0, 5), { triggerKind: 1 }, token);
    state.typeChar();
    await sleep(800);
    assert.equal(triggers(), 1);
  });
});

const missing = fs.existsSync(SERVER) ? undefined : `rest-lsp is not installed at ${SERVER} (run scripts/install.sh)`;

test("activated against the real server: status, inline completions, toggle, settings, statistics", { skip: missing, timeout: 240_000 }, async () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "rest-lsp-ext-"));
  const model = path.join(tmp, "model");
  // testmodels/ (test support) is not installed: python -m finds it from the repository root
  execFileSync(PYTHON, ["-m", "testmodels.tiny", model], { cwd: REPO, stdio: "ignore" });
  const ws = path.join(tmp, "ws");
  fs.mkdirSync(ws);
  const text = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    \n";
  fs.writeFileSync(path.join(ws, "calc.py"), text);
  const settings: Record<string, unknown> = {
    "server.path": SERVER,
    "server.env": { XDG_CACHE_HOME: path.join(tmp, "cache") },
    model,
    maxTokens: 12,
    timeBudgetMs: 20000,
    // the plumbing under test, not the latency: an Automatic request waits for its prompt and its first line (on
    // a 2-core AVX2 EPYC a fresh cache's first drafting step compiles for 1.2 s, past the 20 ms predict budget)
    serverSettings: { promptBudgetMs: 0, predictBudgetMs: 0 },
    "stats.intervalMs": 500,
  };
  const { vscode, state } = createFakeVscode(settings, [ws]);
  const ext = loadExtension(BUNDLE, vscode);
  try {
    await ext.activate({ subscriptions: [], extensionUri: fileUri(ROOT) });
    assert.deepEqual(state.errors, []);
    // Ready once the model has loaded; the tooltip carries the figures from rest/stats.
    await until("the ready state", () => state.statusItem.text.startsWith("$(sparkle) REST"));
    assert.match(state.statusItem.tooltip, /rest-lsp: ready/);
    assert.match(state.statusItem.tooltip, /completions: 0/);
    assert.equal(state.inlineProviders.length, 1, "vscode-languageclient 10 registers inline completion");

    const uri = fileUri(path.join(ws, "calc.py"));
    state.openDocument({ uri, languageId: "python", version: 1, getText: () => text, isClosed: false, lineCount: 7 });
    const provider = state.inlineProviders[0].provider;
    const token = { isCancellationRequested: false, onCancellationRequested: () => ({ dispose() {} }) };
    const doc = { uri, languageId: "python", version: 1, getText: () => text };
    const ask = () => provider.provideInlineCompletionItems(doc, new vscode.Position(5, 4), { triggerKind: 1 }, token);
    const result = await ask();
    const items = Array.isArray(result) ? result : result.items;
    assert.ok(items.length >= 1, "the server's items reach VS Code");
    assert.equal(typeof items[0].insertText, "string");
    assert.equal(items[0].range.start.line, 5);
    await until("completion figures", () => /completions: [1-9]/.test(state.statusItem.tooltip), 10_000);

    // Toggle: the setting flips, and with it off the provider answers nothing (no server request).
    await state.commands.get("restLsp.toggleCompletions")!();
    assert.deepEqual(state.updates, [["completions.enabled", false]]);
    settings["completions.enabled"] = false;
    state.fireConfigurationChange(["restLsp", "restLsp.completions.enabled"]);
    await until("the off state", () => state.statusItem.text.includes(" off"), 5000);
    assert.equal(await ask(), undefined);
    settings["completions.enabled"] = true;
    state.fireConfigurationChange(["restLsp", "restLsp.completions.enabled"]);

    // A server setting goes to the running server (its log says what changed), without a restart.
    settings.maxTokens = 8;
    state.fireConfigurationChange(["restLsp", "restLsp.maxTokens"]);
    await until("the server to apply maxTokens", () => state.output.some((l) => /configuration changed: max_tokens/.test(l)), 20_000);
    assert.ok(!state.output.some((l) => /unknown setting/.test(l)));

    await state.commands.get("restLsp.showStats")!();
    assert.ok(state.output.some((l) => /^totals:$/m.test(l)), "the statistics report is in the output channel");
    // The server advertises rest-lsp.rebuildIndex (workspace/executeCommand): the index is rebuilt, then ready.
    await state.commands.get("restLsp.rebuildIndex")!();
    assert.ok(!state.warnings.some((w) => /no index rebuild command/.test(w)), state.warnings.join("; "));
    // The server counts the from-scratch build in rest/stats (datastore.folders[].rebuilds).
    await until("the rebuild in the statistics", async () => {
      await state.commands.get("restLsp.showStats")!();
      return state.output.some((l) => /^\s*rebuilds: 1$/m.test(l));
    }, 30_000);
  } finally {
    await ext.deactivate();
    await removeDir(tmp);
  }
});
