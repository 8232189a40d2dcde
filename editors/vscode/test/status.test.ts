import assert from "node:assert/strict";
import { test } from "node:test";
import { formatStatsReport, stateDetail, stateFromStats, statusView, summarizeStats } from "../src/status";

// The shape rest_lsp/service/stats.py returns (snake_case), plus the datastore part.
const STATS = {
  totals: {
    requests: 12, model_calls: 9, cache_hits: 3, cancelled: 2, superseded: 1,
    tokens: 300, steps: 120, retrieval_ms: 100.0, forward_ms: 5900.0, accepted_per_step: 2.5,
  },
  recent: [{ outcome: "completed", tokens: 20 }],
  datastore: { state: "indexing", indexed_files: 30, total_files: 120, tokens: 1_500_000, files: 30 },
};

// What rest_lsp/server.py answers: model and datastore parts as the service and workspace index report them.
const SERVER_STATS = {
  totals: { requests: 4, tokens: 40, steps: 16, forward_ms: 1900, retrieval_ms: 100, cancelled: 0, superseded: 1 },
  recent: [],
  model: { state: "ready", error: null, name: "Qwen2.5-Coder-0.5B" },
  datastore: {
    folders: [
      { folder: "/ws/a", state: "ready" },
      { folder: "/ws/b", state: "indexing" },
    ],
    stores: {
      a: { tokens: 120_000, documents: 40, bytes_on_disk: 800_000 },
      b: { tokens: 30_000, documents: 10, bytes_on_disk: 200_000 },
    },
    open_buffers: 1,
  },
};

test("summary reads the server's figures", () => {
  const s = summarizeStats(STATS);
  assert.equal(s.requests, 12);
  assert.equal(s.acceptedPerStep, 2.5);
  assert.equal(s.tokensPerSecond, 50); // 300 tokens in 6 s of retrieval + forward
  assert.equal(s.cacheHits, 3);
  assert.equal(s.cancelled, 3);
  assert.equal(s.indexing, true);
  assert.deepEqual(s.indexProgress, { done: 30, total: 120 });
  assert.equal(s.datastoreTokens, 1_500_000);
});

test("accepted per step is tokens / steps where both are sent, else the server's figure; unknown shapes give an empty summary", () => {
  assert.equal(summarizeStats({ totals: { tokens: 30, steps: 20 } }).acceptedPerStep, 1.5);
  // the counts, not the server's rounded figure: 46 / 42 = 1.0952 shows as 1.10, not 1.095 -> 1.09
  const m = summarizeStats({ totals: { tokens: 46, steps: 42, accepted_per_step: 1.095 } }).acceptedPerStep;
  assert.equal(m, 46 / 42);
  assert.equal(m!.toFixed(2), "1.10");
  assert.deepEqual(JSON.parse(JSON.stringify(summarizeStats(null))), {});
  assert.equal(summarizeStats({ totals: { tokens: 5, steps: 0 } }).acceptedPerStep, undefined);
});

test("the server's own shape: model state, folders, summed stores", () => {
  const s = summarizeStats(SERVER_STATS);
  assert.equal(s.model, "Qwen2.5-Coder-0.5B");
  assert.equal(s.modelState, "ready");
  assert.equal(s.indexing, true);
  assert.deepEqual(s.indexProgress, { done: 1, total: 2 });
  assert.equal(s.datastoreTokens, 150_000);
  assert.equal(s.datastoreFiles, 50);
  assert.equal(s.datastoreBytes, 1_000_000);
  assert.equal(s.acceptedPerStep, 2.5);
  assert.equal(s.tokensPerSecond, 20);
  assert.equal(s.cancelled, 1);
  assert.match(statusView("indexing", s, true).tooltip, /datastore: 150\.0k tokens in 50 files, 1\.0MB on disk/);
});

test("state follows the model and the datastore", () => {
  const indexing = summarizeStats(STATS);
  const ready = summarizeStats({ ...STATS, datastore: { state: "ready", tokens: 10 } });
  assert.equal(stateFromStats("starting", indexing), "indexing");
  assert.equal(stateFromStats("indexing", ready), "ready");
  const loading = summarizeStats({ model: { state: "loading" }, datastore: { folders: [] } });
  assert.equal(stateFromStats("ready", loading), "starting");
  assert.equal(stateDetail(loading), "loading the model");
  const failed = summarizeStats({ model: { state: "failed", error: "OSError: no such model" } });
  assert.equal(stateFromStats("ready", failed), "error");
  assert.equal(stateDetail(failed), "the model failed to load: OSError: no such model");
  // A new model setting that loads clears the error without a restart; a stopped client stays stopped.
  assert.equal(stateFromStats("error", ready), "ready");
  assert.equal(stateFromStats("stopped", ready), "stopped");
});

test("status bar text shows progress and live figures", () => {
  const v = statusView("indexing", summarizeStats(STATS), true);
  assert.equal(v.text, "$(sync~spin) REST indexing 25% 2.50 tok/step 50.0 tok/s");
  assert.match(v.tooltip, /datastore: 1\.5M tokens in 30 files/);
  assert.match(v.tooltip, /indexed files: 30 \/ 120/);
  assert.equal(statusView("starting", {}, true).text, "$(loading~spin) REST starting");
  assert.equal(statusView("error", {}, true, "server not found").text, "$(error) REST error");
  assert.match(statusView("error", {}, true, "server not found").tooltip, /server not found/);
  assert.equal(statusView("ready", summarizeStats(STATS), false).text, "$(sparkle) REST off");
});

test("statistics report lists nested figures", () => {
  const r = formatStatsReport(STATS);
  assert.match(r, /^totals:$/m);
  assert.match(r, /^ {2}accepted_per_step: 2\.500$/m);
  assert.match(r, /^datastore:$/m);
  assert.match(r, /^recent: \(1\)$/m);
});
