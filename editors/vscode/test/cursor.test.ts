import assert from "node:assert/strict";
import { test } from "node:test";
import { CURSOR_REST_MS, CursorNotifier, CursorParams } from "../src/cursor";
import { FakeClock } from "./fake-clock";

function setup(enabled = { on: true }) {
  const clock = new FakeClock();
  const sent: Array<{ at: number; params: CursorParams }> = [];
  const n = new CursorNotifier((params) => sent.push({ at: clock.time, params }), () => enabled.on, clock);
  return { clock, sent, n, enabled };
}

test("the rest is 250 ms", () => {
  assert.equal(CURSOR_REST_MS, 250);
});

test("a cursor that rests is reported once, 250 ms after its last move, at its last position", () => {
  const { clock, sent, n } = setup();
  n.moved("file:///a.py", { line: 1, character: 2 });
  clock.advance(100);
  n.moved("file:///a.py", { line: 1, character: 3 });
  clock.advance(249);
  assert.deepEqual(sent, [], "still moving: nothing yet");
  clock.advance(1);
  assert.deepEqual(sent, [{ at: 350, params: { textDocument: { uri: "file:///a.py" }, position: { line: 1, character: 3 } } }]);
  clock.advance(5000);
  assert.equal(sent.length, 1, "no repeats while the cursor stays");
});

test("continuous moves (typing) are never reported more than once per 250 ms per document", () => {
  const { clock, sent, n } = setup();
  for (let i = 0; i < 100; i++) {
    n.moved("file:///a.py", { line: 0, character: i });
    n.moved("file:///b.py", { line: 0, character: i });   // another document keeps its own timer
    clock.advance(i % 10 === 9 ? 300 : 40);                // a pause every tenth key
  }
  clock.advance(1000);
  for (const uri of ["file:///a.py", "file:///b.py"]) {
    const times = sent.filter((s) => s.params.textDocument.uri === uri).map((s) => s.at);
    assert.equal(times.length, 10, `one report per pause for ${uri}`);
    for (let i = 1; i < times.length; i++) assert.ok(times[i] - times[i - 1] >= 250, `${times}`);
  }
});

test("nothing is sent while completions are off, and turning off drops a pending report", () => {
  const { clock, sent, n, enabled } = setup();
  n.moved("file:///a.py", { line: 0, character: 0 });
  enabled.on = false;
  clock.advance(300);
  n.moved("file:///a.py", { line: 0, character: 1 });
  clock.advance(300);
  assert.deepEqual(sent, []);
  assert.deepEqual(n.pending(), []);
  enabled.on = true;
  n.moved("file:///a.py", { line: 0, character: 2 });
  clock.advance(250);
  assert.equal(sent.length, 1);
});

test("cancel drops one document's pending report, cancelAll every one", () => {
  const { clock, sent, n } = setup();
  n.moved("file:///a.py", { line: 0, character: 0 });
  n.moved("file:///b.py", { line: 0, character: 0 });
  n.moved("file:///c.py", { line: 0, character: 0 });
  n.cancel("file:///a.py");
  assert.deepEqual(n.pending().sort(), ["file:///b.py", "file:///c.py"]);
  clock.advance(250);
  assert.deepEqual(sent.map((s) => s.params.textDocument.uri).sort(), ["file:///b.py", "file:///c.py"]);
  n.moved("file:///a.py", { line: 0, character: 0 });
  n.moved("file:///b.py", { line: 0, character: 0 });
  n.cancelAll();
  clock.advance(1000);
  assert.equal(sent.length, 2);
});
