"""The package's shape, checked from the source (ast, nothing imported): no import cycles among the modules
of restbase, indexer and rest_lsp, the ground floor (restbase, indexer) never importing rest_lsp, none of them
importing the test support (testmodels), and no module reaching into another module's underscore names."""
from __future__ import annotations

import ast
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("restbase", "indexer", "rest_lsp")
# code outside the packages that uses them (the tests may poke at internals; these may not)
USERS = ("benchmarks", "scripts", "testmodels")
# test support at the repository root: the tests' tiny models, never shipped, never used by the packages
TEST_SUPPORT = "testmodels"


# ---------------------------------------------------------------------------------------- the import graph
def package_modules(root: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every module of PACKAGES under `root`."""
    mods = {}
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = p
    return mods


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, anywhere in it (a function-level import counts: a lazy
    import hides a cycle from Python but not from the design). `from pkg import mod` is an edge to pkg.mod."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(m, path.name == "__init__.py", node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                k = _known(t, mods)
                if k is not None and k != m:
                    graph[m].add(k)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _describe(graph, comp) -> str:
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(comp)))}" for m in comp)


def test_no_import_cycles():
    graph = import_graph(package_modules())
    assert "indexer.store" in graph and "rest_lsp.service.core" in graph  # the walk found the packages
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(_describe(graph, c) for c in found)


# What each area may import of the project (docs/ARCHITECTURE.md, "Modules"). An area is a subpackage of
# rest_lsp, indexer, or a top-level module of rest_lsp or restbase.
_BASE = {"rest_lsp.filenames", "restbase.storage", "restbase.jit"}
ALLOWED = {
    "restbase": set(),
    "restbase.storage": set(),
    "restbase.jit": {"restbase.storage"},
    "restbase.assets": {"restbase.storage"},
    "rest_lsp": set(),
    "rest_lsp.filenames": set(),
    "rest_lsp.transport": set(),
    "rest_lsp.documents": set(),
    "indexer": {"restbase.storage", "restbase.jit", "restbase.assets"},  # torch-free: never the model or engine
    "rest_lsp.engine": _BASE,                                     # calls the model through its Verifier
    "rest_lsp.model": _BASE | {"restbase.assets", "rest_lsp.engine", "indexer"},
    "rest_lsp.service": _BASE | {"rest_lsp.engine", "rest_lsp.model", "indexer"},
    "rest_lsp.bench": _BASE | {"rest_lsp.engine", "rest_lsp.model", "indexer"},
    "rest_lsp.server": {"rest_lsp.documents", "rest_lsp.service"},
    "rest_lsp.cli": {"rest_lsp.bench", "rest_lsp.server", "rest_lsp.service", "rest_lsp.transport", "rest_lsp.team"},
    # the team server (vLLM's REST proposer and its launcher); its editor-side client is in rest_lsp.service
    "rest_lsp.team": _BASE | {"restbase.assets", "rest_lsp.engine", "rest_lsp.model", "rest_lsp.service", "rest_lsp.transport", "indexer"},
}


def area(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "indexer":
        return "indexer"
    return ".".join(parts[:2])


def test_areas_import_only_what_they_may():
    graph = import_graph(package_modules())
    assert set(map(area, graph)) == set(ALLOWED), "a new area: add it to ALLOWED and docs/ARCHITECTURE.md"
    bad = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                 if area(t) != area(m) and area(t) not in ALLOWED[area(m)])
    assert not bad, "imports across areas that docs/ARCHITECTURE.md does not allow:\n" + "\n".join(bad)


# The ground floor: restbase and indexer stand below rest_lsp and never import it, so that the indexer can be
# used, tested and reasoned about without the daemon (the embedded model's files, which the indexer's tokenizer
# reads, are restbase.assets).
GROUND = ("restbase", "indexer")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a ground-floor module into rest_lsp."""
    return sorted(f"{m} -> {t}" for m, ts in graph.items() if m.split(".")[0] in GROUND
                  for t in ts if t.split(".")[0] == "rest_lsp")


def test_the_ground_floor_never_imports_rest_lsp():
    graph = import_graph(package_modules())
    assert "restbase.jit" in graph and "indexer.shard" in graph  # the walk found the ground floor
    bad = upward_imports(graph)
    assert not bad, "restbase and indexer must not import rest_lsp:\n" + "\n".join(bad)


def test_upward_import_check_can_fail(tmp_path):
    """A function-level import of rest_lsp planted in a copy of the ground floor is found, as is a module-level
    one."""
    for pkg in ("restbase", "indexer", "rest_lsp"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "rest_lsp" / "assets.py").write_text("")
    (tmp_path / "rest_lsp" / "engine.py").write_text("")
    (tmp_path / "restbase" / "jit.py").write_text("def f():\n    from rest_lsp import engine\n")
    (tmp_path / "indexer" / "tokenizer.py").write_text("def g():\n    from rest_lsp import assets\n")
    (tmp_path / "indexer" / "store.py").write_text("import rest_lsp.engine\n")
    graph = import_graph(package_modules(tmp_path))
    assert upward_imports(graph) == ["indexer.store -> rest_lsp.engine", "indexer.tokenizer -> rest_lsp.assets",
                                     "restbase.jit -> rest_lsp.engine"]


# The production packages never use the test support: testmodels/ is not in the wheel, so an import of it (or
# `python -m testmodels...` spawned) would work in the repository and fail where the package is installed.
def uses_of_test_support(mods: dict[str, Path], root: Path = REPO) -> list[str]:
    """Imports of TEST_SUPPORT in the modules (function-level ones too), and string constants naming it (a
    `-m testmodels.tiny` command line, an importlib name)."""
    found = []
    for m, path in mods.items():
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [_absolute(m, path.name == "__init__.py", node)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value]
            else:
                continue
            found += [f"{rel}:{node.lineno}: {n}" for n in names
                      if n == TEST_SUPPORT or n.startswith(TEST_SUPPORT + ".")]
    return found


def test_the_packages_never_import_the_test_models():
    mods = package_modules()
    assert "rest_lsp.model.host" in mods and "indexer.store" in mods and "restbase.jit" in mods
    assert (REPO / TEST_SUPPORT / "tiny.py").is_file()   # what the rule keeps out, where the tests find it
    assert TEST_SUPPORT not in {m.split(".")[0] for m in mods}
    found = uses_of_test_support(mods)
    assert not found, f"restbase, indexer and rest_lsp must not use the test support {TEST_SUPPORT}/:\n" + \
        "\n".join(found)


def test_test_support_check_can_fail(tmp_path):
    """Module-level and function-level imports and a `-m` command line planted in a copy of the packages are
    found; names that only start with the same letters are not."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "rest_lsp" / "model").mkdir()
    (tmp_path / "rest_lsp" / "model" / "__init__.py").write_text("")
    (tmp_path / "rest_lsp" / "model" / "host.py").write_text("def f():\n    from testmodels.tiny import x\n")
    (tmp_path / "indexer" / "store.py").write_text("import testmodels\n")
    (tmp_path / "restbase" / "jit.py").write_text("CMD = ['python', '-m', 'testmodels.tiny']\n")
    (tmp_path / "rest_lsp" / "cli.py").write_text("import testmodelsx\nNAME = 'testmodels_like'\n")
    found = sorted(uses_of_test_support(package_modules(tmp_path), tmp_path))
    assert found == ["indexer/store.py:1: testmodels", "rest_lsp/model/host.py:2: testmodels.tiny",
                     "restbase/jit.py:1: testmodels.tiny"]


def test_cycle_finder_finds_a_cycle(tmp_path):
    """The check above can fail: a cycle planted in a copy of the package layout is found."""
    pkg = tmp_path / "indexer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from indexer import c\n")
    (pkg / "c.py").write_text("import indexer.a\n")
    (pkg / "d.py").write_text("from . import a\n")
    (tmp_path / "rest_lsp").mkdir()
    graph = import_graph(package_modules(tmp_path))
    assert cycles(graph) == [["indexer.a", "indexer.b", "indexer.c"]]


# ---------------------------------------------------------------------------------------- reach-ins
def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_privates(tree: ast.AST) -> set[str]:
    """Underscore names a module defines: functions, classes, variables, attributes it assigns on self/cls
    (not on another library's object: pygls' server._stop_event stays pygls')."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            names.add(node.args[1].value)
    return {n for n in names if _private(n)}


def reach_ins(files: list[Path], project_files: list[Path]) -> list[str]:
    """`x._name` (x not self/cls) where `_name` is not defined in the same module but is in another project
    module, and `from <project module> import _name`. Underscore names of other libraries (torch, pygls)
    are not the project's to police here."""
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in set(files) | set(project_files)}
    defined = {p: _defined_privates(trees[p]) for p in trees}
    project = set().union(*(defined[p] for p in project_files))
    found = []
    for p in files:
        rel = p.relative_to(REPO) if p.is_relative_to(REPO) else p
        for node in ast.walk(trees[p]):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) \
                        and node.value.func.id == "super":
                    continue
                if node.attr not in defined[p] and node.attr in project:
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level or mod.split(".")[0] in PACKAGES:
                    found += [f"{rel}:{node.lineno}: from {'.' * node.level}{mod} import {a.name}"
                              for a in node.names if _private(a.name)]
    return found


def test_no_module_reaches_into_another_modules_underscore_names():
    project = list(package_modules().values())
    users = [p for d in USERS if (REPO / d).is_dir() for p in sorted((REPO / d).rglob("*.py"))]
    found = reach_ins(project + users, project)
    assert not found, "give these a public name or method:\n" + "\n".join(found)


def test_reach_in_check_can_fail(tmp_path):
    owner = tmp_path / "owner.py"
    owner.write_text("class Engine:\n    def _forget_cache(self):\n        self._cost = 1\n"
                     "    def reset(self, other: 'Engine'):\n        other._forget_cache()\n")
    user = tmp_path / "user.py"
    user.write_text("from rest_lsp.owner import _helper\n\ndef f(engine):\n    engine._forget_cache()\n"
                    "    return engine._cost, engine.public, engine._not_ours\n")
    assert reach_ins([owner], [owner]) == []   # a class touching another instance of itself: its own module
    found = reach_ins([user], [owner])
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "engine._cost", "engine._forget_cache", "from rest_lsp.owner import _helper"]


# ---------------------------------------------------------------------------------------- choosing a verifier
# rest_lsp/model/verifiers.py is the one place that decides which verifier runs a model (device -> verifier ->
# whether its tree rows are exact -> the fallback): no other module of the packages builds the packed CPU
# verifier or the GPU one itself. (HFVerifier, the engine's default when it is given none, is not policed.)
CHOOSER = "rest_lsp.model.verifiers"
CHOSEN = ("FastVerifier", "StaticVerifier")
# Below the chooser, layer by layer: the two decoder forwards, then what they share. A module imports only
# from the layers below its own (the two forwards never import each other, nor the chooser).
VERIFIER_LAYERS = (
    (CHOOSER,),
    ("rest_lsp.model.fast", "rest_lsp.model.static"),
    ("rest_lsp.model.screened", "rest_lsp.model.support"),
    ("rest_lsp.model.probes", "rest_lsp.model.ops"),
)


def verifier_constructions(mods: dict[str, Path], root: Path = REPO) -> list[str]:
    """Calls of CHOSEN outside CHOOSER: by name, as a module's attribute (`static.StaticVerifier(...)`), or
    under another name imported for it (`from .fast import FastVerifier as F`)."""
    found = []
    for m, path in mods.items():
        if m == CHOOSER:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = set(CHOSEN) | {a.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                               for a in node.names if a.name in CHOSEN and a.asname}
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name in names:
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(f)}(...)")
    return found


def layer_violations(graph: dict[str, set[str]], layers=VERIFIER_LAYERS) -> list[str]:
    """Imports from a module of `layers` into its own layer or one above it."""
    rank = {m: i for i, layer in enumerate(layers) for m in layer}
    return sorted(f"{m} -> {t}" for m, ts in graph.items() if m in rank
                  for t in ts if t in rank and rank[t] <= rank[m])


def test_only_the_chooser_builds_a_verifier():
    mods = package_modules()
    assert CHOOSER in mods and all(m in mods for layer in VERIFIER_LAYERS for m in layer)
    found = verifier_constructions(mods)
    assert not found, f"only {CHOOSER} chooses and builds a verifier (make_verifier, choose_verifier):\n" + \
        "\n".join(found)
    bad = layer_violations(import_graph(mods))
    assert not bad, "rest_lsp.model's verifier layers (chooser, the two forwards, what they share):\n" + \
        "\n".join(bad)


def test_verifier_checks_can_fail(tmp_path):
    """A verifier built outside the chooser (by name, as an attribute, under an alias, in a function) is found,
    the chooser's own construction and a mere mention are not; one forward importing the other is found."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    model, service = tmp_path / "rest_lsp" / "model", tmp_path / "rest_lsp" / "service"
    for d in (model, service):
        d.mkdir()
        (d / "__init__.py").write_text("")
    (model / "verifiers.py").write_text("from .fast import FastVerifier\n\ndef make(m):\n    return FastVerifier(m)\n")
    (model / "fast.py").write_text("class FastVerifier:\n    pass\n\ndef g():\n    from . import static\n")
    (model / "static.py").write_text("class StaticVerifier:\n    pass\n")
    (model / "ops.py").write_text("")
    (service / "backend.py").write_text(
        "from rest_lsp.model import static\nfrom rest_lsp.model.fast import FastVerifier as Fv\n\n"
        "def load(m):\n    kinds = (Fv, 'StaticVerifier')\n    return static.StaticVerifier(m), Fv(m), kinds\n")
    (service / "bench.py").write_text("def run(m):\n    from rest_lsp.model.fast import FastVerifier\n"
                                      "    return FastVerifier(m)\n")
    mods = package_modules(tmp_path)
    assert sorted(verifier_constructions(mods, tmp_path)) == [
        "rest_lsp/service/backend.py:6: Fv(...)", "rest_lsp/service/backend.py:6: static.StaticVerifier(...)",
        "rest_lsp/service/bench.py:3: FastVerifier(...)"]
    assert layer_violations(import_graph(mods)) == ["rest_lsp.model.fast -> rest_lsp.model.static"]


# A benchmark measures the checkout it lives in. Run from a git worktree whose environment is another checkout's
# (an editable install), `import rest_lsp` would find that other checkout unless the script puts its own root on
# sys.path first: a quality run of a worktree's change measured main's code that way (docs/bench.md).
ROOT_ON_PATH = {"str(Path(__file__).resolve().parents[1])", "str(ROOT)"}


def benchmarks_importing_another_checkout(root: Path = REPO) -> list[str]:
    """Benchmark scripts (those with a __main__ block) that import a package of this repository, or a
    neighbour in benchmarks/ (which may import one), before a module-level sys.path.insert(0, <the root>)."""
    bench = root / "benchmarks"
    local = {*PACKAGES, TEST_SUPPORT, *(p.stem for p in bench.glob("*.py"))}

    def ours(node) -> bool:
        if isinstance(node, ast.Import):
            return any(a.name.split(".")[0] in local for a in node.names)
        return isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in local

    bad = []
    for path in sorted(bench.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if "__main__" not in ast.unparse(tree) or not any(ours(n) for n in ast.walk(tree)):
            continue
        for node in tree.body:
            if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                    and ast.unparse(node.value.func) == "sys.path.insert"
                    and ast.unparse(node.value.args[1]) in ROOT_ON_PATH):
                break
            if ours(node) or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bad.append(f"{path.name}:{node.lineno}")
                break
        else:
            bad.append(f"{path.name}: never")
    return bad


def test_benchmarks_import_their_own_checkout():
    assert (REPO / "benchmarks" / "bench_layout.py").is_file()
    bad = benchmarks_importing_another_checkout()
    assert not bad, "put the repository root first on sys.path before these imports:\n" + "\n".join(bad)


def test_checkout_check_can_fail(tmp_path):
    """A script importing rest_lsp, or a neighbour, before the root is on sys.path is found, as is one whose
    only project import sits in a function with no insert at all; a module without a __main__ block, and a
    script that inserts the root first, are not."""
    b = tmp_path / "benchmarks"
    b.mkdir()
    main = '\nif __name__ == "__main__":\n    pass\n'
    ok = "import sys\nfrom pathlib import Path\n\nsys.path.insert(0, str(Path(__file__).resolve().parents[1]))\n"
    (b / "helper.py").write_text("from rest_lsp import x\n")
    (b / "early.py").write_text("import sys\nfrom rest_lsp.service import core\n" + ok + main)
    (b / "neighbour.py").write_text("import sys\nimport helper\n" + ok + main)
    (b / "inside.py").write_text("def f():\n    from indexer import store\n" + main)
    (b / "good.py").write_text(ok + "import helper\nfrom rest_lsp import y\n\ndef f():\n    import indexer\n" + main)
    assert benchmarks_importing_another_checkout(tmp_path) == ["early.py:2", "inside.py:1", "neighbour.py:2"]
