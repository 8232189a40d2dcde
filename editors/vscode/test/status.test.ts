import assert from "node:assert/strict";
import { test } from "node:test";
import { formatStatsReport, stateFromStats, statusView, summarizeStats } from "../src/status";

// The shape rest_lsp/service/stats.py returns (snake_case), plus the datastore part.
const STATS = {
  totals: {
    requests: 12, model_calls: 9, cache_hits: 3, cancelled: 2, superseded: 1,
    tokens: 300, steps: 120, retrieval_ms: 100.0, forward_ms: 5900.0, accepted_per_step: 2.5,
  },
  recent: [{ outcome: "completed", tokens: 20 }],
  datastore: { state: "indexing", indexed_files: 30, total_files: 120, tokens: 1_500_000, files: 30 },
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

test("accepted per step falls back to tokens / steps; unknown shapes give an empty summary", () => {
  assert.equal(summarizeStats({ totals: { tokens: 30, steps: 20 } }).acceptedPerStep, 1.5);
  assert.deepEqual(summarizeStats(null), { requests: undefined, acceptedPerStep: undefined, tokensPerSecond: undefined, cacheHits: undefined, model: undefined });
  assert.equal(summarizeStats({ totals: { tokens: 5, steps: 0 } }).acceptedPerStep, undefined);
});

test("state follows the datastore; errors stick", () => {
  const indexing = summarizeStats(STATS);
  const ready = summarizeStats({ ...STATS, datastore: { state: "ready", tokens: 10 } });
  assert.equal(stateFromStats("starting", indexing), "indexing");
  assert.equal(stateFromStats("indexing", ready), "ready");
  assert.equal(stateFromStats("error", ready), "error");
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
