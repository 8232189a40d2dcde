import assert from "node:assert/strict";
import { test } from "node:test";
import { UNASKED_WAIT_MS, UnaskedTypingWatch } from "../src/unasked";
import { FakeClock } from "./fake-clock";

const A = "file:///w/a.py";
const B = "file:///w/b.py";

function setup() {
  const clock = new FakeClock();
  const asked: Array<[string, number]> = [];
  const declined = new Set<number>();   // versions the extension does not ask for (editor moved, setting off)
  const watch = new UnaskedTypingWatch((uri, version) => !declined.has(version) && asked.push([uri, version]) > 0, clock);
  return { clock, asked, watch, declined };
}

test("a typing change VS Code leaves unasked is asked for once the wait is over, at the last version typed", () => {
  const { clock, asked, watch } = setup();
  watch.typed(A, 2);
  clock.advance(UNASKED_WAIT_MS - 1);
  assert.deepEqual(asked, []);
  watch.typed(A, 3);   // the next key restarts the wait
  clock.advance(UNASKED_WAIT_MS - 1);
  assert.deepEqual(asked, []);
  clock.advance(1);
  assert.deepEqual(asked, [[A, 3]]);
  assert.deepEqual(watch.pending(), []);
  watch.typed(A, 4);   // asked once: the command created VS Code's controller, which asks from now on
  clock.advance(2 * UNASKED_WAIT_MS);
  assert.deepEqual(asked, [[A, 3]]);
});

test("once VS Code asks about a document, its typing is never asked for again (until it is closed)", () => {
  const { clock, asked, watch } = setup();
  watch.typed(A, 2);
  watch.editorAsked(A);   // VS Code asked within the wait: the pending ask is dropped
  clock.advance(2 * UNASKED_WAIT_MS);
  watch.typed(A, 3);
  clock.advance(2 * UNASKED_WAIT_MS);
  assert.deepEqual(asked, []);
  watch.typed(B, 1);      // another document is watched on its own
  clock.advance(UNASKED_WAIT_MS);
  assert.deepEqual(asked, [[B, 1]]);
  watch.closed(A);        // reopened later: perhaps in an editor whose controller is not there yet
  watch.typed(A, 1);
  clock.advance(UNASKED_WAIT_MS);
  assert.deepEqual(asked, [[B, 1], [A, 1]]);
});

test("cancelAll and closed drop what is waiting", () => {
  const { clock, asked, watch } = setup();
  watch.typed(A, 2);
  watch.typed(B, 2);
  assert.deepEqual(watch.pending().sort(), [A, B]);
  watch.closed(B);
  watch.cancelAll();
  clock.advance(2 * UNASKED_WAIT_MS);
  assert.deepEqual(asked, []);
});

test("a change the extension declined to ask for (the editor moved on, inline suggestions off) keeps the watch on", () => {
  const { clock, asked, watch, declined } = setup();
  declined.add(2);
  watch.typed(A, 2);
  clock.advance(UNASKED_WAIT_MS);
  assert.deepEqual(asked, []);
  watch.typed(A, 3);
  clock.advance(UNASKED_WAIT_MS);
  assert.deepEqual(asked, [[A, 3]]);
});
