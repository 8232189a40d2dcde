// Removing a test folder that a language server still exiting may write into (its last log line, a cache file).
// fs.rmSync's own maxRetries retries only the final rmdir, not the children: a file written after they were
// removed fails it with ENOTEMPTY however long it waits (seen in CI). So the whole removal is retried.
import * as fs from "node:fs";

export async function removeDir(dir: string, tries = 25, delayMs = 200): Promise<void> {
  for (let i = 1; ; i++) {
    try {
      fs.rmSync(dir, { recursive: true, force: true });
      return;
    } catch (err) {
      if (i >= tries) throw err;
      await new Promise((r) => setTimeout(r, delayMs));
    }
  }
}
