import assert from "node:assert/strict";
import { test } from "node:test";
import { isEmptyResult, parseNotice, Place, ReadyTracker } from "../src/ready";

const AT: Place = { uri: "file:///w/a.py", version: 3, line: 5, character: 4 };
const notice = (p: Place) => ({ textDocument: { uri: p.uri, version: p.version }, position: { line: p.line, character: p.character } });

test("an empty reply and then its notice: ask again, once, and that request is the extension's own", () => {
  const r = new ReadyTracker();
  assert.equal(r.asking(AT), false);
  assert.equal(r.answered(AT, true), undefined);
  assert.deepEqual(r.notice(notice(AT)), AT);
  assert.equal(r.notice(notice(AT)), undefined, "one request per notice");
  assert.equal(r.asking({ ...AT }), true);
  assert.equal(r.asking({ ...AT }), false, "only the next request is ours");
});

test("the notice overtakes its empty reply: ask again when the reply comes", () => {
  const r = new ReadyTracker();
  r.asking(AT);
  assert.equal(r.notice(notice(AT)), undefined);
  assert.deepEqual(r.answered(AT, true), AT);
});

test("no request again for a shown reply, another place, another version, a newer request, or a malformed notice", () => {
  const r = new ReadyTracker();
  r.asking(AT);
  r.answered(AT, false);
  assert.equal(r.notice(notice(AT)), undefined, "the reply showed something");
  r.asking(AT);
  r.answered(AT, true);
  assert.equal(r.notice(notice({ ...AT, version: 4 })), undefined);
  assert.equal(r.notice(notice({ ...AT, character: 5 })), undefined);
  assert.equal(r.notice({ textDocument: { uri: AT.uri }, position: { line: 5, character: 4 } }), undefined);
  assert.equal(r.notice(null), undefined);
  r.asking({ ...AT, version: 4, character: 5 });   // the person typed on
  assert.equal(r.notice(notice(AT)), undefined);
  assert.equal(r.asking(AT), false, "a later request at the old place is the editor's, not ours");
});

test("parseNotice and isEmptyResult", () => {
  assert.deepEqual(parseNotice(notice(AT)), AT);
  assert.equal(parseNotice({ textDocument: { uri: 1, version: 1 }, position: { line: 0, character: 0 } }), undefined);
  assert.equal(isEmptyResult(undefined), true);
  assert.equal(isEmptyResult(null), true);
  assert.equal(isEmptyResult([]), true);
  assert.equal(isEmptyResult({ items: [] }), true);
  assert.equal(isEmptyResult({ items: [{ insertText: "x" }] }), false);
  assert.equal(isEmptyResult([{ insertText: "x" }]), false);
});

test("willAsk: the extension's next request at that place is its own, whatever came before", () => {
  const r = new ReadyTracker();
  r.asking(AT);
  r.answered(AT, false);
  r.willAsk({ ...AT, version: 4 });
  assert.equal(r.asking(AT), false, "another version is not the place it meant to ask at");
  r.willAsk(AT);
  assert.equal(r.asking({ ...AT }), true);
  assert.equal(r.asking({ ...AT }), false, "only the next request");
});
