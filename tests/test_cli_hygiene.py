"""The daily tool's rough edges: output cut by a closed pipe, helps and module docstrings that name
today's code, no import cycles in src/, layers that import one way (import-linter's contract in
pyproject.toml), and no unused or undefined name in src/, tests/ and scripts/ (ruff's pyflakes checks)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from docs_utils import REPO

SRC = REPO / "src"
PKG = SRC / "trajsft"
# names module docstrings call that are not ours: Ray's driver API, transformers' tokenizer method
FOREIGN_CALLS = {"ray.init", "apply_chat_template"}


def _module_file(dotted: str) -> Path | None:
    base = SRC.joinpath(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            names |= {a.asname or a.name for a in n.names}
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _resolves(ref: str, here: Path) -> bool:
    """``name`` defined in the module ``here``, or ``trajsft.a.b[.name[.attr]]`` a module of ours
    (with that top-level name)."""
    ref = ref.lstrip("~")
    if not ref.startswith("trajsft."):
        return ref.split(".")[0] in _top_level_names(here)
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        mod = _module_file(".".join(parts[:i]))
        if mod:
            return i == len(parts) or parts[i] in _top_level_names(mod)
    return False


def docstring_refs(path: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    calls = [m for m in re.findall(r"``([A-Za-z_][\w.]*)\(", doc) if m not in FOREIGN_CALLS]
    roles = re.findall(r":(?:mod|func|class|meth):`([^`]+)`", doc)
    return calls + roles


def test_module_docstrings_name_todays_code():
    bad = [f"{p.relative_to(REPO)}: {ref}" for p in sorted(PKG.rglob("*.py"))
           for ref in docstring_refs(p) if not _resolves(ref, p)]
    assert not bad, "module docstrings name code that is not there:\n" + "\n".join(bad)


def test_docstring_check_sees_a_moved_function(tmp_path):
    stale = tmp_path / "mod.py"
    stale.write_text('"""Public API: ``follow(address)`` and :mod:`trajsft.cluster.gone`."""\n\ndef stop(): ...\n')
    assert [r for r in docstring_refs(stale) if not _resolves(r, stale)] == ["follow", "trajsft.cluster.gone"]


def _trajsft(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trajsft.cli", *args], cwd=REPO, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120)


def test_help_names_every_subcommand():
    from trajsft import cli

    parser = cli.build_parser()
    [sub] = [a for a in parser._actions if a.choices and "plan" in a.choices]
    top = _trajsft("--help").stdout
    for name, sp in sub.choices.items():
        assert f"``{name}``" in cli.__doc__, name  # the description lists it
        assert name in top
        h = _trajsft(name, "--help")
        assert h.returncode == 0 and h.stdout.startswith(f"usage: trajsft {name}"), name
    assert "as they land" not in top


CLOSED_PIPE_CASES = [
    ["status", "--offline"], ["status", "--offline", "--json"], ["plan"], ["plan", "--explain"],
    ["plan", "--json", "minimax-m2.5"], ["clusters"], ["--help"], ["plan", "--help"], ["status", "--help"],
]


@pytest.mark.parametrize("args", CLOSED_PIPE_CASES, ids=" ".join)
def test_output_into_a_closed_pipe_exits_quietly(args):
    """`trajsft status | head`: the reader is gone before the first write, so every write fails."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = _trajsft(*args, stdout=w)
    finally:
        os.close(w)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    assert p.returncode == 0


def import_graph() -> dict[str, set[str]]:
    """Module -> the trajsft modules it imports, at module level or inside a function (a lazy import
    hides a cycle, it does not remove it). ``from . import x`` counts x when x is a module."""
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(SRC).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        mod = ".".join(parts)
        pkg = parts if rel.name == "__init__" else parts[:-1]
        deps = set()
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                deps |= {a.name for a in n.names if a.name.startswith("trajsft")}
            elif isinstance(n, ast.ImportFrom):
                base = pkg[: len(pkg) - n.level + 1] if n.level else []
                target = ".".join([*base, *(n.module.split(".") if n.module else [])])
                if not target.startswith("trajsft"):
                    continue
                for a in n.names:
                    sub = f"{target}.{a.name}"
                    deps.add(sub if _module_file(sub) else target)
        graph[mod] = {d for d in deps if d != mod and _module_file(d)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), sorted. A package's
    ``__init__`` importing its own modules is not a cycle by itself: edges into a package from its
    own modules are ignored (``from . import x`` inside the package)."""
    edges = {m: {d for d in ds if not (m.startswith(d + ".") and _module_file(d).name == "__init__.py")}
             for m, ds in graph.items()}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_cycles_in_src():
    graph = import_graph()
    assert "trajsft.plan.specs" in graph["trajsft.plan.config"]
    assert cycles(graph) == []


def test_cycle_check_sees_a_lazy_cycle():
    graph = import_graph()
    graph["trajsft.plan.specs"] = graph["trajsft.plan.specs"] | {"trajsft.plan.config"}
    assert ["trajsft.plan.config", "trajsft.plan.specs"] in cycles(graph)


def _lint_imports(cwd: Path, src: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache", "--no-logo"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _layers() -> list[str]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in cfg["contracts"] if c["type"] == "layers"]
    assert contract["containers"] == ["trajsft"]
    return contract["layers"]


def test_layers_cover_every_package_and_module():
    named = [n.strip() for layer in _layers() for n in re.split(r"[|:]", layer)]
    assert len(named) == len(set(named)), named
    ours = {p.stem if p.is_file() else p.name for p in PKG.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()}
    assert set(named) == ours


def test_layers_import_one_way():
    p = _lint_imports(REPO, SRC)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 kept, 0 broken" in p.stdout, p.stdout


def test_layers_contract_sees_an_upward_import(tmp_path):
    """The same contract on a copy of the package where io (a bottom layer) imports the CLI in a function."""
    import shutil

    shutil.copytree(PKG, tmp_path / "src" / "trajsft", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    io_py = tmp_path / "src" / "trajsft" / "io.py"
    io_py.write_text(io_py.read_text() + "\n\ndef _late():\n    from . import cli\n")
    p = _lint_imports(tmp_path, tmp_path / "src")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "trajsft.io is not allowed to import trajsft.cli" in p.stdout, p.stdout


def private_names_taken_across_modules() -> list[str]:
    """``from <our module> import _name`` and ``<our module>._name`` in src/trajsft (a module's private name is
    its own: a name another module needs is public)."""
    out = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        ours = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("trajsft")):
                for a in n.names:
                    ours.add(a.asname or a.name)
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        out.append(f"{path.relative_to(SRC)}:{n.lineno}: {a.name}")
            elif isinstance(n, ast.Import):
                ours |= {a.asname or a.name.split(".")[0] for a in n.names if a.name.startswith("trajsft")}
        for n in ast.walk(tree):
            if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ours
                    and n.attr.startswith("_") and not n.attr.startswith("__")):
                out.append(f"{path.relative_to(SRC)}:{n.lineno}: {n.value.id}.{n.attr}")
    return out


def test_no_module_takes_another_modules_private_names():
    assert private_names_taken_across_modules() == []


def _pyflakes(*paths: Path) -> subprocess.CompletedProcess:
    """ruff's pyflakes checks (F: unused or undefined names, f-strings without placeholders, ...) on ``paths``."""
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F", "--no-cache", "--quiet",
                           *map(str, paths)], capture_output=True, text=True, cwd=REPO)


def test_no_unused_or_undefined_names():
    p = _pyflakes(SRC, REPO / "tests", REPO / "scripts")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-1000:]


def test_the_name_check_sees_an_unused_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nprint(f'x')\n")
    p = _pyflakes(bad)
    assert p.returncode == 1 and "F401" in p.stdout and "F541" in p.stdout, p.stdout
