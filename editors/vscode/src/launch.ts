// Finding the `rest-lsp` executable and building the exact command line and environment the extension
// spawns. Pure apart from the injected file check, so tests run it (and spawn its result) without VS Code.
import * as fs from "fs";
import * as path from "path";

/** Whether `file` is an executable regular file (the default check; tests inject their own). */
export function isExecutableFile(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}


export interface LaunchInputs {
  serverPath: string; // the `restLsp.server.path` setting; "" = search
  serverArgs: string[];
  serverEnv: Record<string, string>;
  pythonPath?: string; // the interpreter selected in the Python extension, if any
  workspaceFolders: string[];
  env: Record<string, string | undefined>; // the extension host's environment
  platform: string; // process.platform
  isExecutable: (file: string) => boolean;
}

export interface ServerLaunch {
  command: string;
  args: string[];
  env: Record<string, string>;
  /** Where the command was found, for the log and the status tooltip. */
  source: "setting" | "python environment" | "VIRTUAL_ENV" | "PATH" | "workspace .venv";
}

export class ServerNotFoundError extends Error {
  constructor(readonly searched: string[], readonly configured?: string) {
    super(
      configured
        ? `rest-lsp: the configured server "${configured}" is not an executable file.`
        : "rest-lsp: the `rest-lsp` server was not found in the selected Python environment or on PATH. " +
            "Install it (`pip install rest-lsp`) or set `restLsp.server.path`.",
    );
  }
}

/** Path functions of the target platform (so the Windows rules are testable on Linux too). */
function pathFor(platform: string): typeof path.posix {
  return platform === "win32" ? path.win32 : path.posix;
}

function executableNames(platform: string): string[] {
  return platform === "win32" ? ["rest-lsp.exe", "rest-lsp.cmd", "rest-lsp"] : ["rest-lsp"];
}

function pathKey(env: Record<string, string | undefined>, platform: string): string {
  if (platform !== "win32") return "PATH";
  return Object.keys(env).find((k) => k.toUpperCase() === "PATH") ?? "Path";
}

function venvBin(venv: string, platform: string): string {
  return pathFor(platform).join(venv, platform === "win32" ? "Scripts" : "bin");
}

/**
 * Candidate (directory, source) pairs, most specific first: the selected interpreter's environment, an
 * activated virtualenv, PATH, then a `.venv` in a workspace folder.
 */
function searchDirs(inp: LaunchInputs): Array<[string, ServerLaunch["source"]]> {
  const p = pathFor(inp.platform);
  const dirs: Array<[string, ServerLaunch["source"]]> = [];
  if (inp.pythonPath) dirs.push([p.dirname(inp.pythonPath), "python environment"]);
  const venv = inp.env.VIRTUAL_ENV;
  if (venv) dirs.push([venvBin(venv, inp.platform), "VIRTUAL_ENV"]);
  const sep = inp.platform === "win32" ? ";" : ":";
  for (const d of (inp.env[pathKey(inp.env, inp.platform)] ?? "").split(sep)) if (d) dirs.push([d, "PATH"]);
  for (const w of inp.workspaceFolders) dirs.push([venvBin(p.join(w, ".venv"), inp.platform), "workspace .venv"]);
  return dirs;
}

export function resolveServerLaunch(inp: LaunchInputs): ServerLaunch {
  const p = pathFor(inp.platform);
  let command: string | undefined;
  let source: ServerLaunch["source"] = "setting";
  const searched: string[] = [];
  const configured = inp.serverPath;
  if (configured && (configured.includes("/") || configured.includes("\\"))) {
    // An explicit path; `~` and `${workspaceFolder}` are expanded by the extension before this.
    if (!inp.isExecutable(configured)) throw new ServerNotFoundError([configured], configured);
    command = configured;
  } else {
    const names = configured ? [configured] : executableNames(inp.platform);
    for (const [dir, src] of searchDirs(inp)) {
      for (const name of names) {
        const file = p.join(dir, name);
        searched.push(file);
        if (inp.isExecutable(file)) {
          command = file;
          source = configured ? "setting" : src;
          break;
        }
      }
      if (command) break;
    }
    if (!command) throw new ServerNotFoundError(searched, configured || undefined);
  }

  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(inp.env)) if (v !== undefined) env[k] = v;
  Object.assign(env, inp.serverEnv);
  // Logs must reach the output channel as they happen, not when a buffer fills.
  env.PYTHONUNBUFFERED = "1";
  if (source === "python environment" || source === "VIRTUAL_ENV" || source === "workspace .venv") {
    // Behave as if the environment were activated: tools the server starts resolve from it first.
    const key = pathKey(env, inp.platform);
    const sep = inp.platform === "win32" ? ";" : ":";
    const bin = p.dirname(command);
    const rest = env[key] ?? "";
    if (!rest.split(sep).includes(bin)) env[key] = rest ? `${bin}${sep}${rest}` : bin;
  }

  const args = [...inp.serverArgs];
  // vscode-languageclient appends `--stdio` only when a transport is given; the extension gives none and
  // passes the flag itself, so this is the whole command line.
  if (!args.includes("--stdio") && !args.includes("--tcp")) args.push("--stdio");
  return { command, args, env, source };
}

/** `~/x` and `${workspaceFolder}/x` in the server path setting. */
export function expandPath(p: string, home: string, workspaceFolder?: string): string {
  let out = p;
  if (out === "~" || out.startsWith("~/")) out = path.join(home, out.slice(1));
  if (workspaceFolder) out = out.split("${workspaceFolder}").join(workspaceFolder);
  return out;
}
