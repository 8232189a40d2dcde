// A stand-in language server for the extension tests that need to see what the extension sends rather than
// what a model answers: it answers `initialize` and `rest/stats` and appends every notification it gets,
// with the time it arrived, as one JSON line to the file in $STUB_LOG.
import * as fs from "node:fs";
import { createMessageConnection, StreamMessageReader, StreamMessageWriter } from "vscode-jsonrpc/node";

const log = process.env.STUB_LOG!;
const connection = createMessageConnection(new StreamMessageReader(process.stdin), new StreamMessageWriter(process.stdout));

connection.onRequest("initialize", () => ({
  capabilities: { textDocumentSync: 2, inlineCompletionProvider: true },
  serverInfo: { name: "stub" },
}));
connection.onRequest("shutdown", () => null);
connection.onRequest("rest/stats", () => ({ totals: { requests: 0 }, recent: [], model: { state: "ready", name: "stub" } }));
connection.onRequest("textDocument/inlineCompletion", () => ({ items: [] }));
connection.onNotification((method: string, params: unknown) => {
  fs.appendFileSync(log, JSON.stringify({ at: Date.now(), method, params }) + "\n");
  if (method === "exit") process.exit(0);
});
connection.listen();
