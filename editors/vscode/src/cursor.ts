// `rest/cursor`: tells the server where the cursor rests, so it can warm its KV cache there before the next
// keystroke asks for a completion. Pure: no `vscode` import, so the unit tests run under plain node with a
// fake clock.

export const CURSOR_METHOD = "rest/cursor";
/** How long the cursor must rest before it is reported; also the least time between two reports of a document. */
export const CURSOR_REST_MS = 250;

export interface CursorPosition {
  line: number;
  character: number; // UTF-16 code units, as VS Code and the LSP count them
}

export interface CursorParams {
  textDocument: { uri: string };
  position: CursorPosition;
}

export interface Clock {
  setTimeout(f: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const realClock: Clock = {
  setTimeout: (f, ms) => setTimeout(f, ms),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};

/**
 * Reports a document's cursor once it has rested `restMs` after the last move (or after its editor became
 * active). Each report waits for a rest of `restMs`, so a document is never reported twice within `restMs`.
 * Nothing is sent while `enabled()` is false.
 */
export class CursorNotifier {
  private readonly timers = new Map<string, unknown>();

  constructor(
    private readonly send: (params: CursorParams) => void,
    private readonly enabled: () => boolean,
    private readonly clock: Clock = realClock,
    private readonly restMs: number = CURSOR_REST_MS,
  ) {}

  /**
   * The cursor moved, or an editor for the document became active. Both wait for the rest: an activation
   * reported at once could reach the server before the client's `didOpen` of a document opened with it.
   */
  moved(uri: string, position: CursorPosition): void {
    this.cancel(uri);
    if (!this.enabled()) return;
    const at = { line: position.line, character: position.character };
    this.timers.set(uri, this.clock.setTimeout(() => {
      this.timers.delete(uri);
      if (this.enabled()) this.send({ textDocument: { uri }, position: at });
    }, this.restMs));
  }

  /** Drop a pending report (document closed, or no longer served). */
  cancel(uri: string): void {
    const timer = this.timers.get(uri);
    if (timer !== undefined) this.clock.clearTimeout(timer);
    this.timers.delete(uri);
  }

  /** Drop every pending report (completions turned off, server stopped). */
  cancelAll(): void {
    for (const uri of [...this.timers.keys()]) this.cancel(uri);
  }

  /** Documents with a report waiting for the cursor to rest (for tests). */
  pending(): string[] {
    return [...this.timers.keys()];
  }
}
