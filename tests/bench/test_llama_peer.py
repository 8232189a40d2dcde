"""benchmarks/llama_peer.py without llama-server: its llama.vim-style client against a fake /infill that
answers after a delay with what follows in a known text, and records what it was asked."""
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import llama_peer as P  # noqa: E402

CODE = "def f(a, b):\n    total = a + b\n    return total * 2\n"


class FakeServer:
    """Completes from CODE: the text after the longest end of prefix + prompt found in CODE."""

    def __init__(self, delay: float = 0.15):
        self.delay, self.bodies, self.in_flight, self.max_in_flight = delay, [], 0, 0
        self.totals = {"requests": 0, "speculative": 0, "hints_from_cache": 0, "hints_typed_through": 0,
                       "prompt_n": 0, "prompt_ms": 0.0, "predicted_n": 0, "predicted_ms": 0.0}

    def post(self, path, body):
        assert path == "/infill"
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.bodies.append(body)
        time.sleep(self.delay)
        self.in_flight -= 1
        typed = body["input_prefix"] + body["prompt"]
        for n in range(len(typed), 0, -1):
            at = CODE.find(typed[-n:])
            if at >= 0:
                return {"content": CODE[at + n:].split("\n")[0] + "\n", "timings/predicted_n": 3}
        return {"content": ""}


def test_one_request_at_a_time_hints_typed_through_and_speculative_requests():
    async def run():
        server = FakeServer()
        ed = P.InfillEditor(server, Path("/w/x.py"), "def f(a, b):\n    ")
        line, col = 1, 4
        first = ed.request(line, col, "r0")  # nothing cached yet: answered when the response comes
        ed.cursor(line, col)
        hint = (await asyncio.wait_for(first, 2)).items[0].insert_text
        assert hint == "total = a + b", hint
        assert server.bodies[0]["prompt"] == "" and server.bodies[0]["n_indent"] == 0  # a blank line: from col 0
        assert server.bodies[0]["t_max_predict_ms"] == P.T_FIRST_PREDICT_MS
        for ch in "tot":  # keys faster than the server: requests wait, never overlap, never cancelled
            line, col = ed.insert(line, col, ch)
            await asyncio.sleep(0.03)
        typed_through = await asyncio.wait_for(ed.request(line, col, "r1"), 0.05)  # shown at once: from the cache
        assert typed_through.items[0].insert_text == "al = a + b"
        assert server.totals["hints_typed_through"] >= 1
        await asyncio.sleep(1.0)
        assert server.max_in_flight == 1
        spec = [b for b in server.bodies if b["t_max_predict_ms"] == P.T_MAX_PREDICT_MS]
        assert spec and spec[0]["prompt"] == "    total = a + b"  # as if the hint were accepted
        assert server.totals["speculative"] == len(spec)
    asyncio.run(run())


def test_the_context_is_llama_vims():
    ed = P.InfillEditor(FakeServer(), Path("/w/x.py"), "a\nb\n    c = 1\nd\n")
    ctx = ed._context((2, 6), [])
    assert ctx["prefix"] == "a\nb\n" and ctx["middle"] == "    c " and ctx["suffix"] == "= 1\nd\n\n"
    assert ctx["indent"] == 4
    ahead = ed._context((2, 9), ["2", "e = 3"])  # after accepting "2\ne = 3" at the end of line 2
    assert ahead["prefix"] == "a\nb\n    c = 12\n" and ahead["middle"] == "e = 3" and ahead["suffix"].startswith("\n")
