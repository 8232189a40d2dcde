import assert from "node:assert/strict";
import { test } from "node:test";
import { didChangeConfigurationParams, documentSelector, readSettings, serverOptions } from "../src/settings";

function getter(values: Record<string, unknown>) {
  return <T>(key: string, fallback: T): T => (key in values ? (values[key] as T) : fallback);
}

test("defaults leave the server's own defaults in force", () => {
  const opts = serverOptions(readSettings(getter({})));
  assert.deepEqual(opts, {
    model: null,
    device: "auto",
    precision: "auto",
    corpus: null,
    draftBudget: null,
    indexWorkspace: true,
    persistHistory: true,
    crossFile: "auto",
    languages: null,
  });
});

test("every server setting is sent under the server's camelCase key", () => {
  // Settings named like the server's keys, so the expected options are the same object.
  const all = {
    model: "/models/qwen",
    device: "cuda:1",
    precision: "int8",
    corpus: "/data/corpus.ds",
    draftBudget: 16,
    maxTokens: 96,
    maxLines: 4,
    timeBudgetMs: 800,
    languages: ["python", "rust"],
    exclude: ["**/gen/**"],
    indexWorkspace: false,
    persistHistory: false,
    crossFile: true,
    crossFileTokens: 256,
    requestLog: "/tmp/requests.jsonl",
  };
  const s = readSettings(getter({ ...all, model: " /models/qwen " }));
  assert.deepEqual(serverOptions(s), all);
  assert.deepEqual(didChangeConfigurationParams(s), { settings: { restLsp: all } });
});

test("crossFile is true, false or \"auto\"; anything else is the default \"auto\"", () => {
  assert.equal(serverOptions(readSettings(getter({ crossFile: false }))).crossFile, false);
  assert.equal(serverOptions(readSettings(getter({ crossFile: true }))).crossFile, true);
  assert.equal(serverOptions(readSettings(getter({ crossFile: "always" }))).crossFile, "auto");
});

test("a draft budget of 0 (plain decoding) is kept, invalid numbers are dropped", () => {
  assert.equal(serverOptions(readSettings(getter({ draftBudget: 0 }))).draftBudget, 0);
  const bad = readSettings(getter({ draftBudget: -3, maxTokens: "many", timeBudgetMs: Number.NaN }));
  assert.equal(bad.draftBudget, null);
  assert.equal(bad.maxTokens, null);
  assert.equal("maxTokens" in serverOptions(bad), false);
  assert.equal("timeBudgetMs" in serverOptions(bad), false);
});

test("server env keeps only string values; completions toggle defaults on", () => {
  const s = readSettings(getter({ "server.env": { OMP_NUM_THREADS: "2", BAD: 3 }, "server.args": ["-v", 7] }));
  assert.deepEqual(s.serverEnv, { OMP_NUM_THREADS: "2" });
  assert.deepEqual(s.serverArgs, ["-v"]);
  assert.equal(s.completionsEnabled, true);
  assert.equal(readSettings(getter({ "completions.enabled": false })).completionsEnabled, false);
});

test("document selector: all files, or the configured languages", () => {
  assert.deepEqual(documentSelector([]), [{ scheme: "file" }, { scheme: "untitled" }]);
  assert.deepEqual(documentSelector(["python"]), [
    { scheme: "file", language: "python" },
    { scheme: "untitled", language: "python" },
  ]);
});

test("serverSettings passes the server's other settings through; the named settings win", () => {
  const s = readSettings(getter({ serverSettings: { promptBudgetMs: 400, warmUp: false, maxTokens: 1 }, maxTokens: 32 }));
  const opts = serverOptions(s);
  assert.equal(opts.promptBudgetMs, 400);
  assert.equal(opts.warmUp, false);
  assert.equal(opts.maxTokens, 32);
  assert.deepEqual(readSettings(getter({ serverSettings: [1, 2] })).serverSettings, {});
  assert.deepEqual(readSettings(getter({ serverSettings: "x" })).serverSettings, {});
});
