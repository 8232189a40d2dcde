"""What the end-to-end tests over a real server share: a small Python file to complete in, and waiting for the
server's statistics to show something."""
from __future__ import annotations

import asyncio
import json

SOURCE = '''import os


def read_config(path):
    """Read a config file."""
    with open(path) as f:
        return f.read()


def main():
    
'''


async def wait_for(s, pred, what: str, timeout: float = 60):
    for _ in range(int(timeout * 10)):
        st = await s.stats()
        if pred(st):
            return st
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; stats: {json.dumps(st)[:2000]}\n{s.server_log()[-2000:]}")
