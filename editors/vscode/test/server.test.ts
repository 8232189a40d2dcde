// End to end: spawn the real server with exactly the command line and environment the extension builds
// (resolveServerLaunch + serverOptions), and speak LSP to it over vscode-jsonrpc as vscode-languageclient
// does: initialize, didOpen, textDocument/inlineCompletion, rest/stats, didChangeConfiguration, shutdown.
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";
import { createMessageConnection, StreamMessageReader, StreamMessageWriter } from "vscode-jsonrpc/node";
import { isExecutableFile as isExecutable, resolveServerLaunch } from "../src/launch";
import { didChangeConfigurationParams, readSettings, serverOptions } from "../src/settings";
import { summarizeStats } from "../src/status";
import { removeDir } from "./remove-dir";

// out-test/test/ -> editors/vscode -> repository root
const REPO = path.resolve(__dirname, "..", "..", "..", "..");
const PYTHON = process.env.REST_LSP_TEST_PYTHON ?? path.join(REPO, ".venv", "bin", "python");

const missing = !isExecutable(PYTHON)
  ? `no Python environment at ${PYTHON} (run scripts/install.sh)`
  : !isExecutable(path.join(path.dirname(PYTHON), "rest-lsp"))
    ? `rest-lsp is not installed in ${path.dirname(PYTHON)}`
    : undefined;

test("the extension's launch talks LSP inline completion with the real server", { skip: missing, timeout: 180_000 }, async () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "rest-lsp-vscode-"));
  const model = path.join(tmp, "model");
  // testmodels/ (test support) is not installed: python -m finds it from the repository root
  execFileSync(PYTHON, ["-m", "testmodels.tiny", model], { cwd: REPO, stdio: "inherit" });
  const ws = path.join(tmp, "workspace");
  fs.mkdirSync(ws);
  const text = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    \n";
  const file = path.join(ws, "calc.py");
  fs.writeFileSync(file, text);
  fs.writeFileSync(path.join(ws, "util.py"), "def sub(a, b):\n    return a - b\n");

  const values: Record<string, unknown> = { model, maxTokens: 12, timeBudgetMs: 20000 };
  const settings = readSettings(<T>(k: string, d: T) => (k in values ? (values[k] as T) : d));
  const launch = resolveServerLaunch({
    serverPath: "",
    serverArgs: [],
    serverEnv: {},
    pythonPath: PYTHON,
    workspaceFolders: [ws],
    // The extension passes its own process.env; the cache goes to the temporary directory here.
    env: { ...process.env, XDG_CACHE_HOME: path.join(tmp, "cache") },
    platform: process.platform,
    isExecutable,
  });
  assert.equal(launch.source, "python environment");
  assert.equal(launch.command, path.join(path.dirname(PYTHON), "rest-lsp"));
  assert.deepEqual(launch.args, ["--stdio"]);

  // What vscode-languageclient does for an Executable without transport: spawn(command, args, {env, cwd}).
  const proc = spawn(launch.command, launch.args, { env: launch.env, cwd: ws });
  let stderr = "";
  proc.stderr.on("data", (d) => (stderr += d.toString()));
  const exited = new Promise<number | null>((resolve) => proc.on("exit", (code) => resolve(code)));
  // Every exchange also ends when the server dies, so a crash fails the test with its stderr.
  const died = exited.then((code) => {
    throw new Error(`the server exited (code ${code}) before answering`);
  });
  died.catch(() => undefined);
  const ask = <T>(p: Promise<T>): Promise<T> => Promise.race([p, died]);
  const conn = createMessageConnection(new StreamMessageReader(proc.stdout), new StreamMessageWriter(proc.stdin));
  const messages: string[] = [];
  conn.onNotification("window/logMessage", (p: { message: string }) => void messages.push(p.message));
  conn.onNotification("window/showMessage", (p: { message: string }) => void messages.push(p.message));
  conn.onNotification("$/progress", () => undefined);
  conn.onRequest("window/workDoneProgress/create", () => null);
  conn.onRequest("client/registerCapability", () => null);
  conn.onRequest("workspace/configuration", (p: { items: unknown[] }) => p.items.map(() => null));
  conn.listen();

  try {
    const uri = pathToFileURL(file).toString();
    const init: any = await ask(conn.sendRequest("initialize", {
      processId: process.pid,
      rootUri: pathToFileURL(ws).toString(),
      workspaceFolders: [{ uri: pathToFileURL(ws).toString(), name: "workspace" }],
      capabilities: {
        textDocument: {
          synchronization: { dynamicRegistration: true, didSave: true },
          inlineCompletion: { dynamicRegistration: true },
        },
        window: { workDoneProgress: true },
        workspace: { configuration: true, workspaceFolders: true },
      },
      initializationOptions: serverOptions(settings),
    }));
    assert.ok(init.capabilities.inlineCompletionProvider, "the server advertises inlineCompletionProvider");
    await conn.sendNotification("initialized", {});
    await conn.sendNotification("textDocument/didOpen", { textDocument: { uri, languageId: "python", version: 1, text } });

    // Line 5 is "    " inside mul(): an empty block line, so a multi-line completion.
    const position = { line: 5, character: 4 };
    const result: any = await ask(conn.sendRequest("textDocument/inlineCompletion", {
      textDocument: { uri },
      position,
      context: { triggerKind: 1 },
    }));
    const items: any[] = Array.isArray(result) ? result : result.items;
    assert.ok(items.length >= 1, `expected at least one item, got ${JSON.stringify(result)}`);
    for (const item of items) {
      assert.equal(typeof item.insertText, "string");
      assert.ok(item.insertText.length > 0);
      assert.ok(item.range, "items carry a range");
      // The range ends at the cursor (or later, when it replaces text after it) and starts on its line.
      assert.equal(item.range.start.line, position.line);
      assert.ok(item.range.start.character <= position.character);
      assert.ok(item.range.end.line > position.line || item.range.end.character >= position.character);
    }

    const stats: any = await ask(conn.sendRequest("rest/stats", {}));
    assert.ok(stats.totals.requests >= 1, JSON.stringify(stats.totals));
    const summary = summarizeStats(stats);
    assert.equal(summary.requests, stats.totals.requests);

    // A change of settings as the extension sends it: every key must be one the server knows.
    values.maxTokens = 8;
    await conn.sendNotification("workspace/didChangeConfiguration", didChangeConfigurationParams(readSettings(
      <T>(k: string, d: T) => (k in values ? (values[k] as T) : d))));
    const after: any = await ask(conn.sendRequest("rest/stats", {}));
    assert.ok(after.totals);
    const unknown = messages.filter((m) => /unknown setting|expected/i.test(m));
    assert.deepEqual(unknown, [], "the server accepted every setting the extension sends");

    await ask(conn.sendRequest("shutdown"));
    await conn.sendNotification("exit");
    const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r("timeout"), 15000))]);
    assert.equal(code, 0, `server exit: ${code}\n${stderr.slice(-2000)}`);
  } catch (err) {
    proc.kill();
    throw new Error(`${err}\n--- server stderr ---\n${stderr.slice(-4000)}`);
  } finally {
    conn.dispose();
    await removeDir(tmp);
  }
});
