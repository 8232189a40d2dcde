// The VS Code side: owns the LanguageClient, the status bar item and the commands. Everything that can be
// decided without the `vscode` API lives in settings.ts, launch.ts and status.ts (unit tested).
import * as os from "os";
import * as vscode from "vscode";
import {
  DidChangeConfigurationNotification,
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
} from "vscode-languageclient/node";
import { CURSOR_METHOD, CursorNotifier } from "./cursor";
import { isEmptyResult, Place, READY_CAPABILITY, READY_METHOD, ReadyTracker } from "./ready";
import { UnaskedTypingWatch } from "./unasked";
import { expandPath, isExecutableFile, resolveServerLaunch, ServerLaunch, ServerNotFoundError } from "./launch";
import { didChangeConfigurationParams, documentSelector, readSettings, RESTART_KEYS, RestLspSettings, serverOptions } from "./settings";
import { formatStatsReport, ServerState, stateDetail, stateFromStats, StatsSummary, statusView, summarizeStats } from "./status";

const SECTION = "restLsp";
const STATS_METHOD = "rest/stats";

let client: LanguageClient | undefined;
let launch: ServerLaunch | undefined;
let output: vscode.LogOutputChannel;
let statusItem: vscode.StatusBarItem;
let extensionUri: vscode.Uri;
let state: ServerState = "stopped";
let detail: string | undefined;
let summary: StatsSummary = {};
let statsTimer: NodeJS.Timeout | undefined;
let settings: RestLspSettings;
let cursor: CursorNotifier;
let ready = new ReadyTracker();
let unasked: UnaskedTypingWatch;

function currentSettings(): RestLspSettings {
  const cfg = vscode.workspace.getConfiguration(SECTION);
  return readSettings(<T>(key: string, fallback: T) => cfg.get<T>(key, fallback) as T);
}

function render(): void {
  const view = statusView(state, summary, settings.completionsEnabled, detail);
  statusItem.text = view.text;
  statusItem.tooltip = view.tooltip;
  statusItem.backgroundColor = state === "error" ? new vscode.ThemeColor("statusBarItem.errorBackground") : undefined;
  statusItem.show();
}

function setState(s: ServerState, why?: string): void {
  state = s;
  detail = why;
  render();
}

/** The interpreter selected in the Python extension, when that extension is installed. */
async function selectedPython(): Promise<string | undefined> {
  const ext = vscode.extensions.getExtension("ms-python.python");
  if (!ext) return undefined;
  try {
    const api = ext.isActive ? ext.exports : await ext.activate();
    const folder = vscode.workspace.workspaceFolders?.[0]?.uri;
    const env = api?.environments?.getActiveEnvironmentPath?.(folder);
    return typeof env?.path === "string" ? env.path : undefined;
  } catch (err) {
    output.appendLine(`could not ask the Python extension for its interpreter: ${err}`);
    return undefined;
  }
}

async function showMissingServer(err: ServerNotFoundError): Promise<void> {
  output.appendLine(err.message);
  if (err.searched.length > 0) output.appendLine(`searched:\n  ${err.searched.join("\n  ")}`);
  const choice = await vscode.window.showErrorMessage(err.message, "Open README", "Open Settings", "Show Log");
  if (choice === "Open README") {
    await vscode.commands.executeCommand("markdown.showPreview", vscode.Uri.joinPath(extensionUri, "README.md"));
  } else if (choice === "Open Settings") {
    await vscode.commands.executeCommand("workbench.action.openSettings", "restLsp.server.path");
  } else if (choice === "Show Log") {
    output.show();
  }
}

/** The document's URI as the server knows it, when the running server serves this document. */
function servedUri(document: vscode.TextDocument): string | undefined {
  if (!client || client.state !== State.Running) return undefined;
  if (vscode.languages.match(documentSelector(settings.languages), document) <= 0) return undefined;
  return client.code2ProtocolConverter.asUri(document.uri);
}

function cursorMoved(editor: vscode.TextEditor | undefined): void {
  const uri = editor && servedUri(editor.document);
  if (uri) cursor.moved(uri, editor.selection.active);
}

function sendCursor(params: unknown): void {
  const c = client;
  if (!c || c.state !== State.Running) return;
  // A server stopping meanwhile rejects the notification; the report is only a hint, so it is dropped.
  c.sendNotification(CURSOR_METHOD, params).catch(() => undefined);
}

function placeOf(uri: string, document: vscode.TextDocument, position: vscode.Position): Place {
  return { uri, version: document.version, line: position.line, character: position.character };
}

/** Trigger Inline Suggestion if the active editor is still at `place` (document version and cursor). */
function triggerAt(place: Place, why: string): boolean {
  const editor = vscode.window.activeTextEditor;
  if (!editor || servedUri(editor.document) !== place.uri || editor.document.version !== place.version) return false;
  const at = editor.selection.active;
  if (!editor.selection.isEmpty || at.line !== place.line || at.character !== place.character) return false;
  output.appendLine(`${why} at ${place.line + 1}:${place.character + 1}: asking`);
  void vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
  return true;
}

/** Ask again for the suggestion the server announced. */
function askAgain(place: Place): boolean {
  return triggerAt(place, "suggestion ready");
}

/** A typing change VS Code asked nothing for (its editor's inline controller not created yet: unasked.ts). */
function askUnasked(uri: string, version: number): boolean {
  const editor = vscode.window.activeTextEditor;
  if (!editor) return false;   // (turning completions off cancels the watch's timers)
  if (!vscode.workspace.getConfiguration("editor", editor.document).get<boolean>("inlineSuggest.enabled", true)) return false;
  const place = placeOf(uri, editor.document, editor.selection.active);
  if (place.version !== version) return false;
  ready.willAsk(place);
  return triggerAt(place, "VS Code asked nothing after typing");
}

/** Typing in the active editor's served document: the first keys of a new editor may go unasked. */
function documentChanged(e: vscode.TextDocumentChangeEvent): void {
  const editor = vscode.window.activeTextEditor;
  // undo and redo ask VS Code for nothing either
  if (!editor || editor.document !== e.document || e.contentChanges.length === 0 || e.reason !== undefined) return;
  const uri = settings.completionsEnabled ? servedUri(e.document) : undefined;
  if (uri) unasked.typed(uri, e.document.version);
}

async function provideInlineCompletionItems(
  document: vscode.TextDocument, position: vscode.Position, context: vscode.InlineCompletionContext,
  token: vscode.CancellationToken,
  next: (d: vscode.TextDocument, p: vscode.Position, c: vscode.InlineCompletionContext, t: vscode.CancellationToken) => unknown,
): Promise<unknown> {
  if (!settings.completionsEnabled) return undefined;
  const uri = servedUri(document);
  if (!uri) return next(document, position, context, token);
  unasked.editorAsked(uri);
  const place = placeOf(uri, document, position);
  const own = ready.asking(place);
  const ctx = own ? { ...context, triggerKind: vscode.InlineCompletionTriggerKind.Automatic } : context;
  const result = await next(document, position, ctx, token);
  const again = token.isCancellationRequested ? undefined : ready.answered(place, isEmptyResult(result));
  if (again) askAgain(again);
  return result;
}

async function pollStats(): Promise<void> {
  if (!client || client.state !== State.Running) return;
  try {
    const stats = await client.sendRequest(STATS_METHOD, {});
    summary = summarizeStats(stats);
    setState(stateFromStats(state, summary), stateDetail(summary));
  } catch {
    // A server busy loading its model answers later; the next poll tries again.
  }
}

async function startClient(): Promise<void> {
  settings = currentSettings();
  setState("starting");
  const folders = (vscode.workspace.workspaceFolders ?? []).map((f) => f.uri.fsPath);
  try {
    launch = resolveServerLaunch({
      serverPath: expandPath(settings.serverPath, os.homedir(), folders[0]),
      serverArgs: settings.serverArgs,
      serverEnv: settings.serverEnv,
      pythonPath: await selectedPython(),
      workspaceFolders: folders,
      env: process.env,
      platform: process.platform,
      isExecutable: isExecutableFile,
    });
  } catch (err) {
    if (err instanceof ServerNotFoundError) {
      setState("error", "server not found");
      void showMissingServer(err);
      return;
    }
    throw err;
  }
  output.appendLine(`starting ${launch.command} ${launch.args.join(" ")} (found via ${launch.source})`);

  const launched = serverOptions(settings);
  // No `transport`: the client then spawns exactly command + args (with `--stdio` already in args).
  const server: ServerOptions = { command: launch.command, args: launch.args, options: { env: launch.env } };
  const options: LanguageClientOptions = {
    documentSelector: documentSelector(settings.languages),
    initializationOptions: launched,
    outputChannel: output,
    middleware: {
      provideInlineCompletionItems: (document, position, context, token, next) =>
        provideInlineCompletionItems(document, position, context, token, next) as ReturnType<typeof next>,
    },
  };
  const c = new LanguageClient("restLsp", "rest-lsp", server, options);
  client = c;
  ready = new ReadyTracker();
  c.registerFeature({
    fillClientCapabilities: (caps) => {
      caps.experimental = { ...((caps.experimental as object | undefined) ?? {}), ...READY_CAPABILITY };
    },
    initialize: () => undefined,
    getState: () => ({ kind: "static" }),
    clear: () => undefined,
  });
  c.onNotification(READY_METHOD, (params: unknown) => {
    output.appendLine(`${READY_METHOD} ${JSON.stringify(params)}`);
    const again = ready.notice(params);
    if (again) askAgain(again);
  });
  c.onDidChangeState((e) => {
    if (client !== c) return;
    if (e.newState === State.Stopped && state !== "error") setState("stopped");
    if (e.newState === State.Starting) setState("starting");
  });
  try {
    await c.start();
  } catch (err) {
    if (client === c) setState("error", `${err}`);
    output.appendLine(`rest-lsp failed to start: ${err}`);
    void vscode.window.showErrorMessage(`rest-lsp failed to start: ${err}`, "Show Log").then((x) => x && output.show());
    return;
  }
  // Not "ready" yet: the server may still be loading its model. The first rest/stats below says which.
  // Settings changed while the server started were not sent (the client was not running): send them now.
  if (JSON.stringify(serverOptions(settings)) !== JSON.stringify(launched)) {
    output.appendLine("settings changed while the server started: sending them to the server");
    await c.sendNotification(DidChangeConfigurationNotification.type, didChangeConfigurationParams(settings));
  }
  // The editor already open when the server comes up counts as becoming active for this server.
  cursorMoved(vscode.window.activeTextEditor);
  await pollStats();
  if (statsTimer) clearInterval(statsTimer);
  statsTimer = setInterval(() => void pollStats(), settings.statsIntervalMs);
}

async function stopClient(): Promise<void> {
  cursor.cancelAll();
  unasked.cancelAll();
  if (statsTimer) clearInterval(statsTimer);
  statsTimer = undefined;
  const c = client;
  client = undefined;
  if (c) {
    try {
      await c.stop(5000);
    } catch (err) {
      output.appendLine(`stopping rest-lsp: ${err}`);
    }
  }
  setState("stopped");
}

async function restart(): Promise<void> {
  await stopClient();
  summary = {};
  await startClient();
}

async function rebuildIndex(): Promise<void> {
  if (!client || client.state !== State.Running) {
    void vscode.window.showWarningMessage("rest-lsp is not running.");
    return;
  }
  // The server advertises its commands; the index command is found by name so both stay in step.
  const commands = client.initializeResult?.capabilities.executeCommandProvider?.commands ?? [];
  const command = commands.find((c) => /rebuild|reindex/i.test(c));
  if (!command) {
    void vscode.window.showWarningMessage("This rest-lsp server offers no index rebuild command.");
    return;
  }
  await client.sendRequest(ExecuteCommandRequest.type, { command, arguments: [] });
  setState("indexing");
  void vscode.window.setStatusBarMessage("rest-lsp: rebuilding the workspace index", 3000);
}

async function showStats(): Promise<void> {
  if (!client || client.state !== State.Running) {
    void vscode.window.showWarningMessage("rest-lsp is not running.");
    return;
  }
  const stats = await client.sendRequest(STATS_METHOD, {});
  summary = summarizeStats(stats);
  render();
  output.appendLine(`--- rest/stats ${new Date().toISOString()}`);
  output.appendLine(formatStatsReport(stats));
  output.show(true);
}

async function toggleCompletions(): Promise<void> {
  const cfg = vscode.workspace.getConfiguration(SECTION);
  await cfg.update("completions.enabled", !settings.completionsEnabled, vscode.ConfigurationTarget.Global);
}

async function onConfigurationChanged(e: vscode.ConfigurationChangeEvent): Promise<void> {
  if (!e.affectsConfiguration(SECTION)) return;
  const previous = settings;
  settings = currentSettings();
  render();
  if (!settings.completionsEnabled) {
    cursor.cancelAll();
    unasked.cancelAll();
  }
  if (RESTART_KEYS.some((k) => e.affectsConfiguration(`${SECTION}.${k}`)) || !client) {
    await restart();
    return;
  }
  if (JSON.stringify(serverOptions(previous)) !== JSON.stringify(serverOptions(settings)) && client.state === State.Running) {
    output.appendLine("settings changed: sending them to the server");
    await client.sendNotification(DidChangeConfigurationNotification.type, didChangeConfigurationParams(settings));
  }
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  extensionUri = context.extensionUri;
  output = vscode.window.createOutputChannel("rest-lsp", { log: true });
  statusItem = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  statusItem.command = "restLsp.showStats";
  settings = currentSettings();
  cursor = new CursorNotifier(sendCursor, () => settings.completionsEnabled);
  unasked = new UnaskedTypingWatch(askUnasked);
  context.subscriptions.push(
    output,
    statusItem,
    vscode.commands.registerCommand("restLsp.restart", restart),
    vscode.commands.registerCommand("restLsp.rebuildIndex", rebuildIndex),
    vscode.commands.registerCommand("restLsp.showStats", showStats),
    vscode.commands.registerCommand("restLsp.toggleCompletions", toggleCompletions),
    vscode.workspace.onDidChangeConfiguration((e) => void onConfigurationChanged(e)),
    vscode.window.onDidChangeTextEditorSelection((e) => cursorMoved(e.textEditor)),
    vscode.window.onDidChangeActiveTextEditor(cursorMoved),
    vscode.workspace.onDidChangeTextDocument(documentChanged),
    vscode.workspace.onDidCloseTextDocument((d) => {
      const uri = client?.code2ProtocolConverter.asUri(d.uri) ?? d.uri.toString();
      cursor.cancel(uri);
      unasked.closed(uri);
    }),
    { dispose: () => void stopClient() },
  );
  await startClient();
}

export async function deactivate(): Promise<void> {
  await stopClient();
}
