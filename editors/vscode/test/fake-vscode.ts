// A stand-in for the `vscode` module, enough for the bundled extension (out/extension.js) and the
// vscode-languageclient inside it to activate, start the server and serve inline completions under plain
// node. What the tests look at is recorded in `FakeState`; every API member not modelled here is a
// harmless stub (a Proxy that accepts any call), so the client's many optional features register quietly.
import Module from "node:module";

type Listener = (e: unknown) => void;

export interface FakeState {
  settings: Record<string, unknown>;
  updates: Array<[string, unknown]>;
  commands: Map<string, (...args: unknown[]) => unknown>;
  executed: unknown[][];
  errors: Array<{ message: string; buttons: string[] }>;
  warnings: string[];
  output: string[];
  statusItem: { text: string; tooltip: string; shown: boolean };
  inlineProviders: Array<{ selector: unknown; provider: any }>;
  openDocument(doc: FakeDocument): void;
  /** Make an editor for `doc` the active one, its cursor at (line, character). */
  activateEditor(doc: FakeDocument, line: number, character: number): void;
  /** Move the cursor of the active editor, as a keystroke or click does. */
  moveCursor(line: number, character: number): void;
  /** Type one character at the active editor's cursor (a new document version); `reason` 1 is undo, 2 redo. */
  typeChar(reason?: number): void;
  fireConfigurationChange(keys: string[]): void;
  /** What showErrorMessage answers (a button label), e.g. "Open README". */
  errorChoice?: string;
}

export interface FakeDocument {
  uri: { toString(): string; fsPath: string; scheme: string };
  languageId: string;
  version: number;
  getText(): string;
  isClosed: boolean;
  lineCount: number;
}

function stub(name: string): any {
  return new Proxy(function () {}, {
    get(_t, p) {
      if (p === "then") return undefined;
      if (p === Symbol.toPrimitive) return () => name;
      if (p === Symbol.iterator) return function* () {};
      return stub(`${name}.${String(p)}`);
    },
    apply: () => stub(`${name}()`),
    construct: () => stub(`new ${name}`),
  });
}

function withFallback<T extends object>(obj: T, name: string): T {
  return new Proxy(obj, {
    get(t, p) {
      if (p in t) return (t as any)[p];
      if (p === "then") return undefined;
      return stub(`${name}.${String(p)}`);
    },
  });
}

function emitter() {
  const listeners: Listener[] = [];
  const event = (f: Listener, thisArg?: unknown) => {
    const g: Listener = thisArg === undefined ? f : (e) => f.call(thisArg, e);
    listeners.push(g);
    return { dispose: () => listeners.splice(listeners.indexOf(g), 1) };
  };
  return { event, fire: (e: unknown) => listeners.slice().forEach((f) => f(e)) };
}

export function fileUri(fsPath: string) {
  return { fsPath, scheme: "file", path: fsPath, toString: () => `file://${fsPath}` };
}

class Position {
  constructor(readonly line: number, readonly character: number) {}
}

class Range {
  readonly start: Position;
  readonly end: Position;
  constructor(a: any, b: any, c?: number, d?: number) {
    [this.start, this.end] = typeof a === "number" ? [new Position(a, b), new Position(c!, d!)] : [a, b];
  }
}

export function createFakeVscode(settings: Record<string, unknown>, workspaceFolders: string[]): { vscode: any; state: FakeState } {
  const opened = emitter();
  const configChanged = emitter();
  const activeEditorChanged = emitter();
  const selectionChanged = emitter();
  const documentChanged = emitter();
  let activeEditor: { document: FakeDocument; selection: { active: Position; anchor: Position; isEmpty: boolean } } | undefined;
  const documents: FakeDocument[] = [];
  const state: FakeState = {
    settings,
    updates: [],
    commands: new Map(),
    executed: [],
    errors: [],
    warnings: [],
    output: [],
    statusItem: { text: "", tooltip: "", shown: false },
    inlineProviders: [],
    openDocument(doc) {
      documents.push(doc);
      opened.fire(doc);
    },
    activateEditor(doc, line, character) {
      const at = new Position(line, character);
      activeEditor = { document: doc, selection: { active: at, anchor: at, isEmpty: true } };
      activeEditorChanged.fire(activeEditor);
    },
    moveCursor(line, character) {
      if (!activeEditor) throw new Error("no active editor");
      const at = new Position(line, character);
      activeEditor.selection = { active: at, anchor: at, isEmpty: true };
      selectionChanged.fire({ textEditor: activeEditor, selections: [activeEditor.selection], kind: 1 });
    },
    typeChar(reason) {
      if (!activeEditor) throw new Error("no active editor");
      const at = activeEditor.selection.active;
      activeEditor.document.version += 1;
      documentChanged.fire({
        document: activeEditor.document,
        contentChanges: [{ range: new Range(at, at), rangeOffset: 0, rangeLength: 0, text: "x" }],
        reason,
      });
      state.moveCursor(at.line, at.character + 1);
    },
    fireConfigurationChange(keys) {
      configChanged.fire({ affectsConfiguration: (s: string) => keys.some((k) => k === s || k.startsWith(`${s}.`)) });
    },
  };
  const disposable = { dispose() {} };
  const none = () => disposable;
  const channel = withFallback(
    {
      appendLine: (l: string) => void state.output.push(l),
      append: (l: string) => void state.output.push(l),
      info: (l: string) => void state.output.push(l),
      warn: (l: string) => void state.output.push(l),
      error: (l: string) => void state.output.push(String(l)),
      trace() {},
      debug() {},
      show() {},
      hide() {},
      clear() {},
      dispose() {},
      onDidChangeLogLevel: none,
      logLevel: 2,
      name: "rest-lsp",
    },
    "channel",
  );
  const item = state.statusItem as any;
  item.show = () => void (state.statusItem.shown = true);
  item.hide = () => void (state.statusItem.shown = false);
  item.dispose = () => undefined;
  const vscode = withFallback(
    {
      version: "1.95.0",
      Position,
      Range,
      Selection: Range,
      InlineCompletionItem: class {
        constructor(readonly insertText: unknown, readonly range?: Range, readonly command?: unknown) {}
      },
      InlineCompletionList: class {
        constructor(readonly items: unknown[]) {}
      },
      InlineCompletionTriggerKind: { Invoke: 0, Automatic: 1 },
      SnippetString: class {
        constructor(readonly value: string) {}
      },
      StatusBarAlignment: { Left: 1, Right: 2 },
      ThemeColor: class {
        constructor(readonly id: string) {}
      },
      ConfigurationTarget: { Global: 1, Workspace: 2, WorkspaceFolder: 3 },
      Disposable: class {
        constructor(private readonly f?: () => void) {}
        dispose() {
          this.f?.();
        }
        static from() {
          return disposable;
        }
      },
      EventEmitter: class {
        private readonly e = emitter();
        event = this.e.event;
        fire(x: unknown) {
          this.e.fire(x);
        }
        dispose() {}
      },
      CancellationTokenSource: class {
        token = { isCancellationRequested: false, onCancellationRequested: none };
        cancel() {
          this.token.isCancellationRequested = true;
        }
        dispose() {}
      },
      Uri: withFallback(
        {
          file: fileUri,
          parse: (s: string) => fileUri(s.replace(/^file:\/\//, "")),
          joinPath: (base: any, ...parts: string[]) => fileUri([base.fsPath ?? String(base), ...parts].join("/")),
        },
        "Uri",
      ),
      env: withFallback({ machineId: "test", sessionId: "test", language: "en", appName: "fake", uiKind: 1 }, "env"),
      window: withFallback(
        {
          createOutputChannel: () => channel,
          createStatusBarItem: () => item,
          showErrorMessage: async (message: string, ...buttons: string[]) => {
            state.errors.push({ message, buttons });
            return state.errorChoice;
          },
          showWarningMessage: async (message: string) => {
            state.warnings.push(message);
            return undefined;
          },
          showInformationMessage: async () => undefined,
          setStatusBarMessage: none,
          onDidChangeActiveTextEditor: activeEditorChanged.event,
          onDidChangeTextEditorSelection: selectionChanged.event,
          onDidChangeVisibleTextEditors: none,
          visibleTextEditors: [],
          get activeTextEditor() {
            return activeEditor;
          },
        },
        "window",
      ),
      workspace: withFallback(
        {
          getConfiguration: () => ({
            get: (k: string, d: unknown) => (k in state.settings ? state.settings[k] : d),
            update: async (k: string, v: unknown) => void state.updates.push([k, v]),
          }),
          get workspaceFolders() {
            return workspaceFolders.map((f, index) => ({ uri: fileUri(f), name: f, index }));
          },
          get textDocuments() {
            return documents;
          },
          onDidOpenTextDocument: opened.event,
          onDidChangeConfiguration: configChanged.event,
          onDidChangeTextDocument: documentChanged.event,
          onDidCloseTextDocument: none,
          onDidSaveTextDocument: none,
          onWillSaveTextDocument: none,
          onDidChangeWorkspaceFolders: none,
        },
        "workspace",
      ),
      languages: withFallback(
        {
          match: (selector: Array<{ scheme?: string; language?: string }>, doc: FakeDocument) =>
            selector.some((s) => (!s.scheme || s.scheme === doc.uri.scheme) && (!s.language || s.language === doc.languageId)) ? 10 : 0,
          registerInlineCompletionItemProvider: (selector: unknown, provider: unknown) => {
            state.inlineProviders.push({ selector, provider });
            return disposable;
          },
        },
        "languages",
      ),
      commands: withFallback(
        {
          registerCommand: (id: string, f: (...a: unknown[]) => unknown) => {
            state.commands.set(id, f);
            return { dispose: () => state.commands.delete(id) };
          },
          executeCommand: async (...args: unknown[]) => void state.executed.push(args),
        },
        "commands",
      ),
      extensions: { getExtension: () => undefined },
    },
    "vscode",
  );
  return { vscode, state };
}

let current: unknown;
let hooked = false;

/**
 * Load a fresh copy of the bundled extension with `vscode` resolved to this fake. The hook stays for the
 * process (node's test runner gives each test file its own), since bundled modules may resolve `vscode`
 * lazily.
 */
export function loadExtension(bundle: string, vscode: unknown): { activate(ctx: unknown): Promise<void>; deactivate(): Promise<void> } {
  current = vscode;
  if (!hooked) {
    hooked = true;
    const anyModule = Module as any;
    const original = anyModule._load;
    anyModule._load = function (request: string, ...rest: unknown[]) {
      return request === "vscode" ? current : original.call(this, request, ...rest);
    };
  }
  delete require.cache[require.resolve(bundle)];
  return require(bundle);
}
