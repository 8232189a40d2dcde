// What the status bar shows: the server's state and live figures from `rest/stats`. Pure, so it is unit
// tested without VS Code. The stats reader is tolerant: it accepts the server's snake_case or camelCase
// keys and ignores what it does not know, so a newer server never breaks the status bar.

export type ServerState = "starting" | "indexing" | "ready" | "error" | "stopped";

export interface StatsSummary {
  requests?: number;
  acceptedPerStep?: number; // mean tokens emitted per model step (REST's M)
  tokensPerSecond?: number;
  cacheHits?: number;
  cancelled?: number;
  indexing?: boolean;
  indexProgress?: { done: number; total: number };
  datastoreTokens?: number;
  datastoreFiles?: number;
  datastoreState?: string;
  datastoreBytes?: number;
  model?: string;
  modelState?: string; // idle | loading | ready | failed
  modelError?: string;
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function snake(k: string): string {
  return k.replace(/([A-Z])/g, "_$1").toLowerCase();
}

/** The first key (snake_case or camelCase spelling) present in `o`. */
function pick(o: unknown, ...keys: string[]): unknown {
  if (!isObj(o)) return undefined;
  for (const k of keys) {
    if (k in o) return o[k];
    const s = snake(k);
    if (s in o) return o[s];
  }
  return undefined;
}

function num(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}

export function summarizeStats(stats: unknown): StatsSummary {
  const totals = pick(stats, "totals", "total") ?? stats;
  const ds = pick(stats, "datastore", "index");
  const out: StatsSummary = {};
  out.requests = num(pick(totals, "requests", "completions"));
  // from the counts where the server sends them: its own figure is rounded (to 3 places), and rounding that
  // again for the bar can show 1.09 for 46 tokens in 42 steps (1.0952)
  const tokens = num(pick(totals, "tokens", "generatedTokens"));
  const steps = num(pick(totals, "steps", "modelSteps"));
  out.acceptedPerStep = tokens !== undefined && steps
    ? tokens / steps
    : num(pick(totals, "acceptedPerStep", "meanAcceptedPerStep", "acceptedTokensPerStep"));
  out.tokensPerSecond = num(pick(totals, "tokensPerSecond", "tokensPerS"));
  if (out.tokensPerSecond === undefined) {
    // The server reports model time split into retrieval and forward passes.
    const ms = (num(pick(totals, "forwardMs")) ?? 0) + (num(pick(totals, "retrievalMs")) ?? 0);
    if (tokens !== undefined && ms > 0) out.tokensPerSecond = (tokens * 1000) / ms;
  }
  out.cacheHits = num(pick(totals, "cacheHits"));
  const cancelled = num(pick(totals, "cancelled", "cancellations"));
  const superseded = num(pick(totals, "superseded"));
  if (cancelled !== undefined || superseded !== undefined) out.cancelled = (cancelled ?? 0) + (superseded ?? 0);
  const model = pick(stats, "model");
  if (typeof model === "string") out.model = model;
  if (isObj(model)) {
    const name = pick(model, "name", "model");
    if (typeof name === "string") out.model = name;
    const state = pick(model, "state");
    if (typeof state === "string") out.modelState = state;
    const error = pick(model, "error");
    if (typeof error === "string" && error) out.modelError = error;
  }
  if (isObj(ds)) {
    // The server's shape: { folders: [{ state: pending|indexing|ready|failed|disabled, ... }],
    // stores: { key: { tokens, documents, bytes_on_disk } } }; a flat { state, tokens, ... } is read too.
    const folders = pick(ds, "folders");
    const states: string[] = [];
    const state = pick(ds, "state", "status");
    if (typeof state === "string") states.push(state);
    if (Array.isArray(folders)) for (const f of folders) {
      const st = pick(f, "state");
      if (typeof st === "string") states.push(st);
    }
    if (states.length > 0) out.datastoreState = states.join(", ");
    const indexing = pick(ds, "indexing");
    out.indexing = indexing === true || states.some((x) => /^(pending|indexing|building|scanning)$/i.test(x));
    const done = num(pick(ds, "indexedFiles", "filesDone", "done"));
    const total = num(pick(ds, "totalFiles", "filesTotal", "total"));
    if (done !== undefined && total !== undefined && total > 0) out.indexProgress = { done, total };
    else if (Array.isArray(folders) && folders.length > 1) {
      const ready = folders.filter((f) => /^(ready|failed|disabled)$/.test(String(pick(f, "state")))).length;
      out.indexProgress = { done: ready, total: folders.length };
    }
    const stores = pick(ds, "stores");
    const parts: unknown[] = isObj(stores) ? Object.values(stores) : [ds];
    const sum = (...keys: string[]) => {
      const vals = parts.map((p) => num(pick(p, ...keys))).filter((v): v is number => v !== undefined);
      return vals.length > 0 ? vals.reduce((a, b) => a + b, 0) : undefined;
    };
    out.datastoreTokens = sum("tokens", "totalTokens");
    out.datastoreFiles = sum("documents", "files");
    out.datastoreBytes = sum("bytesOnDisk");
  }
  return out;
}

/**
 * The state the status bar shows while the server runs and answers `rest/stats`: error while its model
 * failed to load (a new model setting can fix that without a restart), starting while it loads, indexing
 * while a workspace folder is being indexed, else ready.
 */
export function stateFromStats(current: ServerState, s: StatsSummary): ServerState {
  if (current === "stopped") return current;
  if (s.modelState === "failed") return "error";
  if (s.modelState === "loading") return "starting";
  return s.indexing ? "indexing" : "ready";
}

/** A line saying why the state is what it is (loading the model, the model's error). */
export function stateDetail(s: StatsSummary): string | undefined {
  if (s.modelState === "failed") return `the model failed to load: ${s.modelError ?? "see the log"}`;
  if (s.modelState === "loading") return "loading the model";
  return undefined;
}

export function formatCount(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)}G`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)}k`;
  return `${Math.round(n)}`;
}

const ICONS: Record<ServerState, string> = {
  starting: "$(loading~spin)",
  indexing: "$(sync~spin)",
  ready: "$(sparkle)",
  error: "$(error)",
  stopped: "$(circle-slash)",
};

export interface StatusView {
  text: string;
  tooltip: string;
}

export function statusView(state: ServerState, s: StatsSummary, enabled: boolean, detail?: string): StatusView {
  const parts = [`${ICONS[state]} REST`];
  if (!enabled) parts.push("off");
  else if (state === "starting" || state === "error" || state === "stopped") parts.push(state);
  else if (state === "indexing") {
    const p = s.indexProgress;
    parts.push(p ? `indexing ${Math.floor((100 * p.done) / p.total)}%` : "indexing");
  }
  if (enabled && (state === "ready" || state === "indexing")) {
    if (s.acceptedPerStep !== undefined) parts.push(`${s.acceptedPerStep.toFixed(2)} tok/step`);
    if (s.tokensPerSecond !== undefined) parts.push(`${s.tokensPerSecond.toFixed(1)} tok/s`);
  }
  const lines = [`rest-lsp: ${state}${enabled ? "" : " (completions off)"}`];
  if (detail) lines.push(detail);
  if (s.model) lines.push(`model: ${s.model}`);
  if (s.requests !== undefined) lines.push(`completions: ${s.requests}`);
  if (s.acceptedPerStep !== undefined) lines.push(`accepted tokens per model step: ${s.acceptedPerStep.toFixed(2)}`);
  if (s.tokensPerSecond !== undefined) lines.push(`tokens per second: ${s.tokensPerSecond.toFixed(1)}`);
  if (s.cacheHits !== undefined) lines.push(`cache hits: ${s.cacheHits}`);
  if (s.cancelled !== undefined) lines.push(`cancelled or superseded: ${s.cancelled}`);
  if (s.indexProgress) lines.push(`indexed files: ${s.indexProgress.done} / ${s.indexProgress.total}`);
  if (s.datastoreTokens !== undefined)
    lines.push(
      `datastore: ${formatCount(s.datastoreTokens)} tokens` +
        (s.datastoreFiles !== undefined ? ` in ${s.datastoreFiles} files` : "") +
        (s.datastoreBytes !== undefined ? `, ${formatCount(s.datastoreBytes)}B on disk` : ""),
    );
  if (s.datastoreState) lines.push(`index: ${s.datastoreState}`);
  lines.push("Click for statistics");
  return { text: parts.join(" "), tooltip: lines.join("\n") };
}

/** `rest/stats` as an indented, readable report for the output channel. */
export function formatStatsReport(stats: unknown): string {
  const lines: string[] = [];
  const walk = (v: unknown, indent: string, key: string) => {
    if (isObj(v)) {
      lines.push(`${indent}${key}:`);
      for (const [k, x] of Object.entries(v)) walk(x, indent + "  ", k);
    } else if (Array.isArray(v) && v.some((x) => isObj(x))) {
      lines.push(`${indent}${key}: (${v.length})`);
      v.forEach((x, i) => walk(x, indent + "  ", `[${i}]`));
    } else {
      const shown = typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : JSON.stringify(v);
      lines.push(`${indent}${key}: ${shown}`);
    }
  };
  if (isObj(stats)) for (const [k, v] of Object.entries(stats)) walk(v, "", k);
  else lines.push(JSON.stringify(stats));
  return lines.join("\n");
}
