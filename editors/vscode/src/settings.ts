// Settings of the extension and the server options derived from them. Pure: no `vscode` import, so the
// unit tests run under plain node.

/** The `restLsp.*` settings, typed. */
export interface RestLspSettings {
  serverPath: string; // "" = find `rest-lsp` in the selected Python environment or on PATH
  serverArgs: string[];
  serverEnv: Record<string, string>;
  completionsEnabled: boolean;
  statsIntervalMs: number;
  model: string;
  device: string;
  precision: string;
  corpus: string;
  draftBudget: number | null;
  maxTokens: number | null;
  maxLines: number | null;
  timeBudgetMs: number | null;
  languages: string[];
  exclude: string[];
  indexWorkspace: boolean;
  persistHistory: boolean;
  crossFile: boolean | "auto"; // other files of the repository before the current one in the prompt
  crossFileTokens: number | null; // their token budget; null: the server's per-device default
  requestLog: string;
  serverSettings: Record<string, unknown>; // more of the server's settings (camelCase), sent as they are
}

/** Reads one setting below `restLsp.` (a `WorkspaceConfiguration.get` in the extension, a map in tests). */
export type SettingGetter = <T>(key: string, fallback: T) => T;

export const DEFAULTS: RestLspSettings = {
  serverPath: "",
  serverArgs: [],
  serverEnv: {},
  completionsEnabled: true,
  statsIntervalMs: 2000,
  model: "",
  device: "auto",
  precision: "auto",
  corpus: "",
  draftBudget: null,
  maxTokens: null,
  maxLines: null,
  timeBudgetMs: null,
  languages: [],
  exclude: [],
  indexWorkspace: true,
  persistHistory: true,
  crossFile: "auto",
  crossFileTokens: null,
  requestLog: "",
  serverSettings: {},
};

/** true, false, or "auto" (the server's default); anything else is "auto". */
function crossFile(v: unknown): boolean | "auto" {
  return v === true || v === false ? v : "auto";
}

export function readSettings(get: SettingGetter): RestLspSettings {
  const str = (k: string, d: string) => {
    const v = get<unknown>(k, d);
    return typeof v === "string" ? v.trim() : d;
  };
  const num = (k: string) => {
    const v = get<unknown>(k, null);
    return typeof v === "number" && Number.isFinite(v) && v >= 0 ? Math.floor(v) : null;
  };
  const strs = (k: string) => {
    const v = get<unknown>(k, []);
    return Array.isArray(v) ? v.filter((x): x is string => typeof x === "string" && x.length > 0) : [];
  };
  const env = get<unknown>("server.env", {});
  const more = get<unknown>("serverSettings", {});
  return {
    serverPath: str("server.path", DEFAULTS.serverPath),
    serverArgs: strs("server.args"),
    serverEnv:
      env && typeof env === "object" && !Array.isArray(env)
        ? Object.fromEntries(Object.entries(env).filter(([, v]) => typeof v === "string")) as Record<string, string>
        : {},
    completionsEnabled: get<unknown>("completions.enabled", true) !== false,
    statsIntervalMs: Math.max(500, num("stats.intervalMs") ?? DEFAULTS.statsIntervalMs),
    model: str("model", DEFAULTS.model),
    device: str("device", DEFAULTS.device) || "auto",
    precision: str("precision", DEFAULTS.precision) || "auto",
    corpus: str("corpus", DEFAULTS.corpus),
    draftBudget: num("draftBudget"),
    maxTokens: num("maxTokens"),
    maxLines: num("maxLines"),
    timeBudgetMs: num("timeBudgetMs"),
    languages: strs("languages"),
    exclude: strs("exclude"),
    indexWorkspace: get<unknown>("indexWorkspace", true) !== false,
    persistHistory: get<unknown>("persistHistory", true) !== false,
    crossFile: crossFile(get<unknown>("crossFile", "auto")),
    crossFileTokens: num("crossFileTokens"),
    requestLog: str("requestLog", DEFAULTS.requestLog),
    serverSettings: more && typeof more === "object" && !Array.isArray(more) ? { ...(more as Record<string, unknown>) } : {},
  };
}

/**
 * The server's configuration as sent in `initializationOptions` and (under the `restLsp` section) in
 * `workspace/didChangeConfiguration`. Keys are the server's own (rest_lsp/service/config.py, camelCase).
 * Unset settings are left out so the server's defaults apply; `model: null` selects the embedded model.
 */
export function serverOptions(s: RestLspSettings): Record<string, unknown> {
  const out: Record<string, unknown> = {
    ...s.serverSettings, // the settings named below win over the same keys given here
    model: s.model === "" ? null : s.model,
    device: s.device,
    precision: s.precision,
    corpus: s.corpus === "" ? null : s.corpus,
    draftBudget: s.draftBudget,
    indexWorkspace: s.indexWorkspace,
    persistHistory: s.persistHistory,
    crossFile: s.crossFile,
  };
  if (s.crossFileTokens !== null) out.crossFileTokens = s.crossFileTokens;
  if (s.maxTokens !== null) out.maxTokens = s.maxTokens;
  if (s.maxLines !== null) out.maxLines = s.maxLines;
  if (s.timeBudgetMs !== null) out.timeBudgetMs = s.timeBudgetMs;
  out.languages = s.languages.length > 0 ? s.languages : null;
  if (s.exclude.length > 0) out.exclude = s.exclude;
  if (s.requestLog !== "") out.requestLog = s.requestLog;
  return out;
}

/** The `workspace/didChangeConfiguration` params for these settings. */
export function didChangeConfigurationParams(s: RestLspSettings): { settings: { restLsp: Record<string, unknown> } } {
  return { settings: { restLsp: serverOptions(s) } };
}

/** Which documents the client serves: the configured languages, or every file and untitled document. */
export function documentSelector(languages: string[]): Array<{ scheme: string; language?: string }> {
  const schemes = ["file", "untitled"];
  if (languages.length === 0) return schemes.map((scheme) => ({ scheme }));
  return languages.flatMap((language) => schemes.map((scheme) => ({ scheme, language })));
}

/** Keys below `restLsp.` whose change needs a new server process (command line, environment, served languages). */
export const RESTART_KEYS = ["server.path", "server.args", "server.env", "languages"];
