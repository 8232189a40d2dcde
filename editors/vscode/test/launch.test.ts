import assert from "node:assert/strict";
import * as path from "node:path";
import { test } from "node:test";
import { expandPath, LaunchInputs, resolveServerLaunch, ServerNotFoundError } from "../src/launch";

function inputs(executables: string[], over: Partial<LaunchInputs> = {}): LaunchInputs {
  const set = new Set(executables);
  return {
    serverPath: "",
    serverArgs: [],
    serverEnv: {},
    workspaceFolders: [],
    env: { PATH: "/usr/local/bin:/usr/bin", HOME: "/home/u" },
    platform: "linux",
    isExecutable: (f) => set.has(f),
    ...over,
  };
}

test("found on PATH: the command line is rest-lsp --stdio and PATH is untouched", () => {
  const l = resolveServerLaunch(inputs(["/usr/bin/rest-lsp"]));
  assert.equal(l.command, "/usr/bin/rest-lsp");
  assert.deepEqual(l.args, ["--stdio"]);
  assert.equal(l.source, "PATH");
  assert.equal(l.env.PATH, "/usr/local/bin:/usr/bin");
  assert.equal(l.env.PYTHONUNBUFFERED, "1");
});

test("the selected Python environment wins over PATH and is put first on PATH", () => {
  const l = resolveServerLaunch(
    inputs(["/usr/bin/rest-lsp", "/proj/.venv/bin/rest-lsp"], { pythonPath: "/proj/.venv/bin/python" }),
  );
  assert.equal(l.command, "/proj/.venv/bin/rest-lsp");
  assert.equal(l.source, "python environment");
  assert.equal(l.env.PATH, "/proj/.venv/bin:/usr/local/bin:/usr/bin");
});

test("VIRTUAL_ENV and a workspace .venv are searched", () => {
  const venv = resolveServerLaunch(inputs(["/v/bin/rest-lsp"], { env: { PATH: "/usr/bin", VIRTUAL_ENV: "/v" } }));
  assert.equal(venv.source, "VIRTUAL_ENV");
  const ws = resolveServerLaunch(inputs(["/ws/.venv/bin/rest-lsp"], { workspaceFolders: ["/ws"] }));
  assert.equal(ws.command, "/ws/.venv/bin/rest-lsp");
  assert.equal(ws.source, "workspace .venv");
});

test("a configured path is used as given, with extra args and env", () => {
  const l = resolveServerLaunch(
    inputs(["/opt/rest/bin/rest-lsp"], {
      serverPath: "/opt/rest/bin/rest-lsp",
      serverArgs: ["--log-level", "debug"],
      serverEnv: { OMP_NUM_THREADS: "2" },
    }),
  );
  assert.equal(l.command, "/opt/rest/bin/rest-lsp");
  assert.deepEqual(l.args, ["--log-level", "debug", "--stdio"]);
  assert.equal(l.env.OMP_NUM_THREADS, "2");
  assert.equal(l.source, "setting");
});

test("--stdio is not doubled", () => {
  const l = resolveServerLaunch(inputs(["/usr/bin/rest-lsp"], { serverArgs: ["--stdio"] }));
  assert.deepEqual(l.args, ["--stdio"]);
});

test("missing server: a clear error listing where it looked", () => {
  assert.throws(
    () => resolveServerLaunch(inputs([], { pythonPath: "/p/bin/python" })),
    (err: unknown) => {
      assert.ok(err instanceof ServerNotFoundError);
      assert.match(err.message, /not found in the selected Python environment or on PATH/);
      assert.match(err.message, /restLsp\.server\.path/);
      assert.deepEqual(err.searched, ["/p/bin/rest-lsp", "/usr/local/bin/rest-lsp", "/usr/bin/rest-lsp"]);
      return true;
    },
  );
  assert.throws(() => resolveServerLaunch(inputs([], { serverPath: "/nope/rest-lsp" })), /configured server "\/nope\/rest-lsp"/);
});

test("a bare configured name is searched like the default", () => {
  const l = resolveServerLaunch(inputs(["/usr/bin/my-rest"], { serverPath: "my-rest" }));
  assert.equal(l.command, "/usr/bin/my-rest");
});

test("Windows: Scripts directory and .exe", () => {
  const exe = path.win32.join("C:\\env\\Scripts", "rest-lsp.exe");
  const l = resolveServerLaunch(
    inputs([exe], { platform: "win32", env: { Path: "C:\\Windows" }, pythonPath: "C:\\env\\Scripts\\python.exe" }),
  );
  assert.equal(l.command, exe);
});

test("~ and ${workspaceFolder} expand in the server path", () => {
  assert.equal(expandPath("~/bin/rest-lsp", "/home/u"), "/home/u/bin/rest-lsp");
  assert.equal(expandPath("${workspaceFolder}/.venv/bin/rest-lsp", "/h", "/ws"), "/ws/.venv/bin/rest-lsp");
});
