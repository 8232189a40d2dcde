"""Several people typing at once: one team server against a daemon per person (issue 33, item 4).

    flock /tmp/rest-cpu.lock .venv/bin/python benchmarks/bench_team_typing.py [--typists 1,4,8] [--bodies 2]
        [--arms team,daemons] [--project boltons==26.2.0] [--precision bf16] [--spec rest] [--no-repo]
        [--rhythm human|fast|old] [--json OUT] [--markdown OUT]

bench_typing.py's simulated person (its client, rhythm and accept rule, imported from it), N of them typing at
the same time in one event loop, each with their own `rest-lsp --stdio` daemon and their own copy of the open
document. The workspace is one held-out project prepared as bench_typing prepares it; the bodies are dealt
round-robin, so each typist types different ones (a typist's other removed bodies are in place in their copy:
each typed body sits where bench_typing's line numbers expect it). Typist j's rhythm is seeded with seed + j in
both arms, so the same person types the same bodies in each.

- `team`: every daemon has the `server` setting (docs/team.md) pointing at one `rest-lsp team-server` on
  loopback (the embedded model, `--spec rest`, the workspace as its `--repo` unless --no-repo), started once
  for all N and with its prefix cache emptied before each N;
- `daemons`: every daemon loads the model itself (REST, the daemon's defaults, `precision` set explicitly so
  that no daemon measures precisions in the background: rest_lsp/model/precision.py).

Reported per arm and N: pauses, pauses with a suggestion shown, the shown latency p50/p95 (pooled over the
typists), the p95 of every answered pause (shown or come after the next key), characters typed and accepted,
the CPU seconds of every process involved while the people type (the daemons, and the team server's process
tree) and the suggestions shown per CPU second, tokens generated per second (the team server's
`vllm:generation_tokens_total`; the daemons' own count otherwise), and the memory held (PSS, the peak of
samples every 5 s). The typists' client (this process) stands for the editors and is counted in neither arm.

Before each per-user daemon starts, the memory available must hold another one (what the largest started so
far holds alone, its USS, and at least --daemon-gib, for the load's peak) and a reserve: where it does not,
that N runs with the typists that fit, and says so.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not an editable install's
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "team"))

import bench_typing as T  # noqa: E402
from realcode import DEFAULT_PROJECT, fetch_project  # noqa: E402
from report import pct, write_json  # noqa: E402

GIB = 1 << 30
KEY = "bench-team-typing"
COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")


def deal(n_typists: int, per_typist: int, n_bodies: int) -> list[list[int]]:
    """Body indices per typist, dealt round-robin (typist j: j, j + n, ...), wrapping round when there are fewer
    bodies than typists times per_typist; sorted, since a typist types a file's bodies top-down (their line
    numbers assume the ones above are typed), and without repeats, since a body is typed once per document: a
    repeat the wrap makes is replaced by the next body after the typist's first."""
    if n_bodies <= 0:
        return [[] for _ in range(n_typists)]
    out = []
    for j in range(n_typists):
        order = [(j + k * n_typists) % n_bodies for k in range(per_typist)]
        order += [(j + i) % n_bodies for i in range(n_bodies)]
        out.append(sorted(list(dict.fromkeys(order))[:per_typist]))
    return out


def typist_document(opened: str, bodies: list, mine: set[int]) -> str:
    """The file as this typist opens it: the bodies they do not type already in place, theirs still removed.
    A Body's line is its line once every body above it is in place, so an own body above that is still to be
    typed moves the ones below up by its line count less one."""
    lines = opened.split("\n")
    missing = 0
    for k, b in enumerate(bodies):
        if k in mine:
            missing += b.text.count("\n")
            continue
        at = b.line - missing
        cur = lines[at]
        lines[at:at + 1] = (cur[:b.indent] + b.text + cur[b.indent:]).split("\n")
    return "\n".join(lines)


def plans(files: list, n_typists: int, per_typist: int) -> list[list[tuple[Path, str, object]]]:
    """Per typist, what type_next takes for each of their bodies in order: (path, their document, body)."""
    flat = [(fi, k) for fi, (_, _, bodies) in enumerate(files) for k in range(len(bodies))]
    out = []
    for picks in deal(n_typists, per_typist, len(flat)):
        chosen = [flat[i] for i in picks]
        docs = {fi: typist_document(files[fi][1], files[fi][2], {k for f, k in chosen if f == fi})
                for fi in {f for f, _ in chosen}}
        out.append([(files[fi][0], docs[fi], files[fi][2][k]) for fi, k in chosen])
    return out


def tree_usage(pids: list[int], memory: str = "pss") -> tuple[float, int]:
    """User + system CPU seconds and memory of these processes and all their descendants (vLLM's engine core
    and worker are children of its API server). A process gone meanwhile counts nothing. `memory`: "pss",
    each page shared by k processes counted 1/k, so that N daemons mapping the same libraries sum to what they
    hold together (RSS would count the libraries N times); "uss", the pages only they hold: what one more
    costs."""
    import psutil   # installed with accelerate, a dependency of the project

    cpu, held = 0.0, 0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
                cpu += t.user + t.system
                held += getattr(p.memory_full_info(), memory)
            except psutil.NoSuchProcess:
                pass
    return cpu, held


def server_pid(port: int) -> int | None:
    """The team server's process (`rest-lsp team-server` replaces itself with vLLM's API server)."""
    import psutil

    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if "--port" in cmd and str(port) in cmd and any("api_server" in c or "team-server" in c for c in cmd):
            return p.info["pid"]
    return None


def counters(url: str) -> dict[str, float]:
    """vLLM's token counters from /metrics (summed over label sets), and its speculative-decoding ones."""
    from harness import get, spec_metrics

    body = get(url + "/metrics")[1]   # one read for both: the counters of one moment
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in body.decode().splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return {**out, **spec_metrics(url, body)}


def reset_prefix_cache(url: str) -> bool:
    """Empty vLLM's prefix cache (its dev-mode endpoint), so that one N does not reuse another N's prompts."""
    req = urllib.request.Request(url + "/reset_prefix_cache", method="POST", data=b"",
                                 headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status == 200
    except OSError:
        return False


def summarize(typists: list[dict], cpu_s: float, wall_s: float, tokens: float | None) -> dict:
    """One arm at one N from its typists' results (bench_typing's finish_method, plus `answered_ms`: the latency
    of every pause whose answer came back). Latencies are pooled over the typists: a pause is a pause,
    whoever typed it."""
    shown_ms = [ms for t in typists for ms in t["shown_ms"]]
    answered_ms = [ms for t in typists for ms in t["answered_ms"]]
    pauses = sum(t["pauses"] for t in typists)
    shown = sum(t["shown"] for t in typists)
    return {
        "typists": len(typists), "pauses": pauses, "shown": shown,
        "shown_rate": round(shown / pauses, 3) if pauses else None,
        "shown_ms_p50": pct(shown_ms, 50), "shown_ms_p95": pct(shown_ms, 95),
        "answered_ms_p95": pct(answered_ms, 95),
        "worst_typist_shown_ms_p95": max((pct(t["shown_ms"], 95) or 0 for t in typists), default=None),
        "typed": sum(t["keys_typed"] for t in typists), "accepted": sum(t["chars_accepted"] for t in typists),
        "typeable": sum(t["chars_total"] for t in typists),
        "cpu_s": round(cpu_s, 1), "wall_s": round(wall_s, 1),
        "shown_per_cpu_s": round(shown / cpu_s, 3) if cpu_s > 0 else None,
        "tokens": tokens, "tokens_per_s": round(tokens / wall_s, 2) if tokens is not None and wall_s > 0 else None,
    }


def targets(runs: dict) -> list[str]:
    """Issue 33's two targets at the largest N both arms reached (8 by default): the team server's shown p95 at
    most twice one typist's on it, and more suggestions shown per CPU second than the per-user daemons."""
    team, own = runs.get("team", {}), runs.get("daemons", {})
    out = []
    if team:
        n = max(team, key=int)
        one = team.get("1")
        if one and str(n) != "1" and one["shown_ms_p95"] and team[n]["shown_ms_p95"] is not None:
            ratio = team[n]["shown_ms_p95"] / one["shown_ms_p95"]
            out.append(f"latency: team server, {n} typists' shown p95 {team[n]['shown_ms_p95']:.0f} ms = {ratio:.2f}x "
                       f"one typist's ({one['shown_ms_p95']:.0f} ms): {'met' if ratio <= 2 else 'NOT met'} (<= 2x)")
            low = [f"{k} typist{'s' * (k != '1')} {100 * (r['shown_rate'] or 0):.1f}%" for k, r in
                   (("1", one), (str(n), team[n])) if (r["shown_rate"] or 0) < 0.95]
            if low:
                # a pause whose answer comes after the next key has no latency in the figures: the shown p95
                # is then the p95 of the quicker answers only, and says nothing of the rest
                out.append(f"latency: only shown pauses are timed ({', '.join(low)} of pauses shown): the verdict "
                           "covers those, not every pause")
        elif one and str(n) != "1" and team[n].get("pauses") and not team[n]["shown"]:
            # no answer came before the next key at any pause: the latency is past every typist's patience
            out.append(f"latency: team server, {n} typists: no suggestion shown at any of {team[n]['pauses']} pauses "
                       f"(one typist's shown p95 {ms(one['shown_ms_p95'])} ms): NOT met (<= 2x)")
        else:
            out.append("latency: not measured (needs the team arm at 1 typist and at more)")
    both = [n for n in team if n in own]
    if both:
        n = max(both, key=int)
        a, b = team[n]["shown_per_cpu_s"], own[n]["shown_per_cpu_s"]
        if a is not None and b:
            note = "" if own[n]["typists"] == int(n) else f" (only {own[n]['typists']} daemons fitted)"
            out.append(f"efficiency: {n} typists, shown per CPU second team {a:.3f} vs per-user daemons {b:.3f}"
                       f"{note} = {a / b:.2f}x: {'met' if a > b else 'NOT met'} (> 1x)")
    else:
        out.append("efficiency: not measured (needs both arms at the same N)")
    return out


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def markdown(report: dict) -> str:
    head = ("| arm | typists | pauses | shown | shown p50 / p95 ms | answered p95 ms | typed | accepted | CPU s "
            "| shown per CPU s | tokens/s | memory GiB (PSS) |")
    out = [f"CPU: {report.get('cpu')}, {report.get('cores')} cores", "", head, "|" + "---|" * 12]
    for arm, per_n in report["runs"].items():
        for n, r in sorted(per_n.items(), key=lambda kv: int(kv[0])):
            ran = f"{r['typists']}" + ("" if r["typists"] == int(n) else f" of {n}")
            out.append(
                f"| {arm} | {ran} | {r['pauses']} | {100 * (r['shown_rate'] or 0):.1f}% | "
                f"{ms(r['shown_ms_p50'])} / {ms(r['shown_ms_p95'])} | {ms(r['answered_ms_p95'])} | "
                f"{r['typed']} | {r['accepted']} | {r['cpu_s']} | {r['shown_per_cpu_s']} | {r['tokens_per_s']} | "
                f"{r.get('pss_gib')} |")
    out += ["", *targets(report["runs"])]
    for arm, per_n in report["runs"].items():
        for n, r in per_n.items():
            if r.get("note"):
                out.append(f"{arm}, {n} typists: {r['note']}")
    return "\n".join(out)


async def type_plan(run: T.MethodRun, plan: list, args) -> None:
    for path, doc, body in plan:
        await T.type_next(run, path, doc, body, args)


async def run_n(arm: str, n: int, ws: Path, files: list, args, logs: Path, url: str | None) -> dict:
    """N typists on this arm: start their daemons, let them type, and measure."""
    import psutil

    options = T.method_options("rest", {"server": {"url": url, "key": KEY}} if arm == "team"
                               else {"precision": args.precision})[1]
    team_pids = [server_pid(int(url.rsplit(":", 1)[1]))] if url else []
    runs, note, per_daemon = [], None, int(args.daemon_gib * GIB)
    for j in range(n):  # one after another: loading N models at once would hold N loads' peaks
        if arm == "daemons":
            avail = psutil.virtual_memory().available
            if avail < per_daemon + int(args.reserve_gib * GIB):
                note = (f"memory: {avail / GIB:.1f} GiB available before daemon {j + 1}, a daemon holds up to "
                        f"{per_daemon / GIB:.1f} GiB (+{args.reserve_gib} GiB reserve): {j} of {n} daemons fitted")
                print(note, file=sys.stderr)
                break
        run = await T.start_method(f"{arm}{n}-t{j}", options, ws, args, logs / f"{arm}{n}")
        run.rng, run.trace = random.Random(args.seed + j), []   # typist j's rhythm, the same in both arms
        runs.append(run)
        if arm == "daemons":
            per_daemon = max(per_daemon, tree_usage([run.server.proc.pid], "uss")[1])
    if not runs:
        return {"typists": 0, "note": note}
    await asyncio.gather(*(T.wait_quiet(r.server) for r in runs))
    reset = reset_prefix_cache(url) if url else None
    idle = None
    if team_pids and team_pids[0]:   # a server that burns CPU with nobody typing would charge it to the typists
        c0 = tree_usage(team_pids)[0]
        await asyncio.sleep(5.0)
        idle = round((tree_usage(team_pids)[0] - c0) / 5.0, 2)
    daemon_pids, server_pids = [r.server.proc.pid for r in runs], [p for p in team_pids if p]
    pids = daemon_pids + server_pids
    m0 = counters(url) if url else None
    daemons_cpu0, server_cpu0 = tree_usage(daemon_pids)[0], tree_usage(server_pids)[0]
    t0 = time.perf_counter()
    held_peak = 0

    async def sample_memory():
        nonlocal held_peak
        while True:
            held_peak = max(held_peak, tree_usage(pids)[1])
            await asyncio.sleep(5.0)

    sampler = asyncio.ensure_future(sample_memory())
    await asyncio.gather(*(type_plan(r, plan, args) for r, plan in zip(runs, plans(files, len(runs), args.bodies))))
    wall = time.perf_counter() - t0
    await asyncio.sleep(1.0)   # what the daemons still decode for the last keys belongs to this run
    sampler.cancel()
    daemons_cpu = tree_usage(daemon_pids)[0] - daemons_cpu0
    server_cpu = tree_usage(server_pids)[0] - server_cpu0
    m1 = counters(url) if url else None
    typists = []
    for r in runs:
        res = await T.finish_method(r)
        res["shown_ms"] = list(r.tally["shown_latency"])
        res["answered_ms"] = [t["ms"] for t in res.pop("trace") or []]
        typists.append(res)
    if url:
        tokens = m1["vllm:generation_tokens_total"] - m0["vllm:generation_tokens_total"]
    else:
        tokens = sum(t["server"].get("tokens") or 0 for t in typists)
    out = summarize(typists, daemons_cpu + server_cpu, wall, tokens)
    out.update(daemons_cpu_s=round(daemons_cpu, 1), server_cpu_s=round(server_cpu, 1),
               pss_gib=round(held_peak / GIB, 1), note=note, prefix_cache_reset=reset, server_idle_cpu_per_s=idle,
               per_typist=[{k: v for k, v in t.items() if k not in ("shown_ms", "answered_ms")} for t in typists])
    if url:
        out["server_counters"] = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
        out["daemon_tokens"] = sum(t["server"].get("tokens") or 0 for t in typists)
    print(f"[{arm} x{n}] " + json.dumps({k: v for k, v in out.items() if k != "per_typist"}), file=sys.stderr)
    return out


async def main_async(args) -> dict:
    from harness import team_server, team_venv_ready
    from rest_lsp.model.precision import cpu_name
    from rest_lsp.team.server import resolve_model

    ns = [int(x) for x in args.typists.split(",")]
    arms = args.arms.split(",")
    if "team" in arms and (why := team_venv_ready()):
        raise SystemExit(why)
    root = fetch_project(args.project)
    work = Path(tempfile.mkdtemp(prefix="rest-lsp-team-typing."))
    report = {"project": args.project, "command": " ".join(sys.argv), "cpu": cpu_name(), "cores": os.cpu_count(),
              "memory_gib": None, "bodies_per_typist": args.bodies, "precision_daemons": args.precision,
              "spec": args.spec, "repo": not args.no_repo, "rhythm": args.rhythm, "runs": {}}
    try:
        import psutil

        report["memory_gib"] = round(psutil.virtual_memory().total / GIB, 1)
        ws, files = T.prepare(root, args.files, max(ns) * args.bodies, args.seed, work)
        report["files"] = [str(p.relative_to(ws)) for p, _, _ in files]
        report["bodies"] = sum(len(b) for _, _, b in files)
        for arm in arms:
            report["runs"][arm] = {}
            if arm == "team":
                model_dir, _ = resolve_model(None)
                os.environ["VLLM_SERVER_DEV_MODE"] = "1"   # for /reset_prefix_cache between the N
                t0 = time.monotonic()
                team_args = ("--max-model-len", str(args.max_model_len), "--dtype", args.team_dtype,
                             *(() if args.no_repo else ("--repo", str(ws))))
                with team_server(model_dir, key=KEY, spec=args.spec, team_args=team_args,
                                 log_path=work / "team-server.log") as (url, _, _):
                    report["team_server_start_s"] = round(time.monotonic() - t0, 1)
                    for n in ns:
                        report["runs"][arm][str(n)] = await run_n(arm, n, ws, files, args, work / "logs", url)
            elif arm == "daemons":
                for n in ns:
                    report["runs"][arm][str(n)] = await run_n(arm, n, ws, files, args, work / "logs", None)
            else:
                raise SystemExit(f"unknown arm {arm!r}: team, daemons")
        return report
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--project", default=DEFAULT_PROJECT)
    p.add_argument("--files", type=int, default=4, help="files whose bodies are dealt")
    p.add_argument("--typists", default="1,4,8")
    p.add_argument("--bodies", type=int, default=2, help="bodies each typist types")
    p.add_argument("--arms", default="team,daemons")
    p.add_argument("--precision", default="bf16", help="the per-user daemons' precision (never `auto`: each "
                   "daemon would measure precisions in the background, several times the model's memory)")
    p.add_argument("--spec", default="rest", help="the team server's proposer (team-server --spec)")
    p.add_argument("--team-dtype", default="auto", help="the team server's --dtype (rest-lsp team-server --dtype)")
    p.add_argument("--max-model-len", type=int, default=4096, help="the team server's context (its default)")
    p.add_argument("--no-repo", action="store_true", help="the team server drafts from the requests alone")
    p.add_argument("--daemon-gib", type=float, default=2.0, help="the least memory a daemon is assumed to need")
    p.add_argument("--reserve-gib", type=float, default=1.5, help="memory left free when starting daemons")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rhythm", choices=sorted(T.RHYTHMS), default=T.DEFAULT)
    p.add_argument("--no-cancel", action="store_true")
    p.add_argument("--no-cursor", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the workspace and the logs")
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None)
    args = p.parse_args(argv)
    args.trace = True   # start_method's trace: every answered pause's latency, late ones included
    report = asyncio.run(main_async(args))
    text = markdown(report)
    print(text)
    if args.json:
        write_json(args.json, report)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
