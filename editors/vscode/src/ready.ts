// `rest/suggestionReady`: an Automatic request the server could not answer in time (its prompt still computing
// on a busy CPU) gets an empty reply, and VS Code asks again only at the next key. The server announces when
// that suggestion is decided; the extension then asks again (Trigger Inline Suggestion) if the document and the
// cursor are still where the request was made, and sends that request as Automatic (no sampled alternatives).
// The notice can overtake its own empty reply, so either order asks again. Pure: no `vscode` import.

export const READY_METHOD = "rest/suggestionReady";
/** Announced in ClientCapabilities.experimental: the server sends the notice only to clients that ask again. */
export const READY_CAPABILITY = { restLsp: { suggestionReady: true } };

export interface Place {
  uri: string;
  version: number;
  line: number;
  character: number; // UTF-16 code units, as VS Code and the LSP count them
}

export function samePlace(a: Place, b: Place): boolean {
  return a.uri === b.uri && a.version === b.version && a.line === b.line && a.character === b.character;
}

/** The place a rest/suggestionReady notification names, or undefined for anything malformed. */
export function parseNotice(params: unknown): Place | undefined {
  const p = params as { textDocument?: { uri?: unknown; version?: unknown }; position?: { line?: unknown; character?: unknown } };
  const uri = p?.textDocument?.uri;
  const version = p?.textDocument?.version;
  const line = p?.position?.line;
  const character = p?.position?.character;
  if (typeof uri !== "string" || typeof version !== "number" || typeof line !== "number" || typeof character !== "number") {
    return undefined;
  }
  return { uri, version, line, character };
}

/** Whether an inline completion result shows nothing. */
export function isEmptyResult(result: unknown): boolean {
  if (!result) return true;
  const items = Array.isArray(result) ? result : (result as { items?: unknown[] }).items;
  return !Array.isArray(items) || items.length === 0;
}

/**
 * Follows the newest inline completion request: `asking` before it is sent, `answered` with its reply,
 * `notice` for each rest/suggestionReady. `answered` and `notice` return the place to ask again at once the
 * request was answered empty and its notice came (in either order); the next `asking` at that place is the
 * extension's own request.
 */
export class ReadyTracker {
  private last?: { place: Place; answered: boolean; empty: boolean; noticed: boolean };
  private reasking?: Place;

  /** A request is about to be sent; true when it is the extension's own request after a notice. */
  asking(place: Place): boolean {
    const own = this.reasking !== undefined && samePlace(this.reasking, place);
    this.reasking = undefined;
    this.last = { place, answered: false, empty: false, noticed: false };
    return own;
  }

  /** The extension is about to ask at `place` for a reason of its own: that request is its own too. */
  willAsk(place: Place): void {
    this.reasking = place;
  }

  /** The reply to the request for `place` (not for a cancelled one). */
  answered(place: Place, empty: boolean): Place | undefined {
    const last = this.last;
    if (!last || !samePlace(last.place, place)) return undefined;
    last.answered = true;
    last.empty = empty;
    return empty && last.noticed ? this.claim() : undefined;
  }

  notice(params: unknown): Place | undefined {
    const place = parseNotice(params);
    const last = this.last;
    if (!place || !last || !samePlace(last.place, place)) return undefined;
    last.noticed = true;
    return last.answered && last.empty ? this.claim() : undefined;
  }

  private claim(): Place {
    const place = this.last!.place;
    this.last = undefined;
    this.reasking = place;
    return place;
  }
}
