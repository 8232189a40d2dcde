"""A stand-in for bench_typing's editor and server together: every request is answered with what the person is
about to type, up to the next space (or one character), after `delay` seconds; edits and answers are timed."""
import asyncio
import time
from types import SimpleNamespace


class ScriptedEditor:
    def __init__(self, text: str, delay: float = 0.0, one_char: bool = False):
        self.lines, self.version, self.text, self.delay, self.one_char = [""], 1, text, delay, one_char
        self.answers, self.edits = [], []

    def insert(self, line, col, text):
        self.version += 1
        self.edits.append((time.monotonic(), text))
        cur = self.lines[line]
        new = (cur[:col] + text + cur[col:]).split("\n")
        self.lines[line:line + 1] = new
        return line + len(new) - 1, len(new[-1]) - len(cur[col:])

    def cursor(self, line, col):
        pass

    def cancel(self, msg_id):
        pass

    def request(self, line, col, msg_id):
        coming = self.text[len("\n".join(self.lines)):]
        coming = coming[:1] if self.one_char else coming.split(" ")[0]

        async def reply():
            await asyncio.sleep(self.delay)
            self.answers.append(time.monotonic())
            return SimpleNamespace(items=[SimpleNamespace(insert_text=coming)])
        return asyncio.ensure_future(reply())
