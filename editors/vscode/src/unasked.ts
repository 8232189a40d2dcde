// The first keys typed in a freshly opened editor: VS Code creates an editor's inline-suggestion controller
// "eventually" (when the window is idle, at most 5 s after the editor appears; code-server 4.139 / VS Code
// 1.139 registers it with EditorContributionInstantiation.Eventually). Keys typed before that ask for no
// inline completion, and VS Code asks only at the next key: someone who opens a file and types at once on a
// busy machine (the server loading its model) sees nothing. So, until VS Code has asked about a document,
// a typing change it leaves unasked for `waitMs` is asked for by the extension (Trigger Inline Suggestion,
// sent as Automatic), once: that command creates the controller, and so does VS Code's own asking, so after
// either the watch is off for the document until it is closed (at most one suggestion VS Code did not ask for,
// e.g. while the user snoozed inline suggestions).
// Pure: no `vscode` import, so the unit tests run under plain node with a fake clock.
import { Clock, realClock } from "./cursor";

/** Far above VS Code's own debounce (50 ms) plus a busy window's delay, so a working editor always asks first. */
export const UNASKED_WAIT_MS = 500;

export class UnaskedTypingWatch {
  private readonly asked = new Set<string>();
  private readonly timers = new Map<string, unknown>();

  constructor(
    /** Ask for the document's version if the editor is still there (the caller checks cursor, version and
     * settings); true when it asked, which turns the watch off for the document. */
    private readonly ask: (uri: string, version: number) => boolean,
    private readonly clock: Clock = realClock,
    private readonly waitMs: number = UNASKED_WAIT_MS,
  ) {}

  /** A served document, in the active editor, changed by typing to `version`. */
  typed(uri: string, version: number): void {
    if (this.asked.has(uri)) return;
    this.cancel(uri);
    this.timers.set(uri, this.clock.setTimeout(() => {
      this.timers.delete(uri);
      if (this.ask(uri, version)) this.asked.add(uri);
    }, this.waitMs));
  }

  /** VS Code asked for an inline completion in this document: its controller exists, the watch is off. */
  editorAsked(uri: string): void {
    this.cancel(uri);
    this.asked.add(uri);
  }

  /** The document was closed: a new editor for it may be a new controller. */
  closed(uri: string): void {
    this.cancel(uri);
    this.asked.delete(uri);
  }

  cancelAll(): void {
    for (const uri of [...this.timers.keys()]) this.cancel(uri);
  }

  /** Documents with a change waiting to be asked for (for tests). */
  pending(): string[] {
    return [...this.timers.keys()];
  }

  private cancel(uri: string): void {
    const timer = this.timers.get(uri);
    if (timer !== undefined) this.clock.clearTimeout(timer);
    this.timers.delete(uri);
  }
}
