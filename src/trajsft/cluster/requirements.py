"""The TPU hosts' Python packages: the ``hosts`` dependency group's closure in ``uv.lock``, Ray aside.

A real cluster image holds Ray and little else; the training job's runtime env installs
``envs/tpu-requirements.txt`` on top of it on every node the job uses. That file is written by one
command from the lock, so the hosts run exactly the program the lock (and ``trajsft fit``) describes::

    uv run python -m trajsft.cluster.requirements           # rewrite envs/tpu-requirements.txt
    uv run python -m trajsft.cluster.requirements --check   # exit 1 when the file is stale

It runs ``uv export --frozen --no-hashes --only-group hosts`` with one ``--no-emit-package`` for Ray
and for every package that only Ray pulls in (computed here from the lock's graph: Levanter depends on
``ray[default]``, so ``--no-emit-package ray`` alone would still pin aiohttp, grpcio, opencensus and the
rest of Ray's dependencies). Ray and what only Ray needs stay the cluster's own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tomllib
from collections import deque
from pathlib import Path
from typing import Iterable

from ..plan.config import REPO_DIR

GROUP = "hosts"
CLUSTER_OWN = ("ray",)  # what the cluster image provides; with every package only it pulls in
OUT = "envs/tpu-requirements.txt"
HEADER = f"""\
# The TPU hosts' Python packages: the `{GROUP}` dependency group of pyproject.toml, closed under uv.lock
# (every package it reaches, extras included, at the lock's version, with markers for the hosts'
# platform), without Ray and what only Ray pulls in: those are the cluster image's own.
# Generated from the lock; do not edit. After changing pyproject.toml or uv.lock:
#   uv run python -m trajsft.cluster.requirements
"""


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def load_lock(repo: Path = REPO_DIR) -> dict:
    return tomllib.loads((repo / "uv.lock").read_text())


def _packages(lock: dict) -> dict[str, dict]:
    return {norm(p["name"]): p for p in lock["package"]}


def _edges(dep: dict) -> Iterable[tuple[str, str | None]]:
    name = norm(dep["name"])
    yield name, None
    for extra in dep.get("extra") or []:
        yield name, extra


def group_roots(lock: dict, group: str = GROUP, project: str = "trajsft") -> list[tuple[str, str | None]]:
    pkg = _packages(lock)[norm(project)]
    deps = (pkg.get("dev-dependencies") or {}).get(group)
    if deps is None:
        raise KeyError(f"uv.lock has no dependency group {group!r} for {project}")
    return [e for d in deps for e in _edges(d)]


def closure(lock: dict, roots: Iterable[tuple[str, str | None]], skip: Iterable[str] = ()) -> set[str]:
    """Every package reachable in the lock's graph from ``roots`` (``(name, extra)`` pairs: an extra
    brings that package's optional dependencies), never going through a package in ``skip``. Markers
    are ignored: a universal closure, as ``uv export`` writes it."""
    pkgs = _packages(lock)
    skip = {norm(s) for s in skip}
    seen: set[tuple[str, str | None]] = set()
    todo = deque(r for r in roots if r[0] not in skip)
    while todo:
        name, extra = todo.popleft()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        p = pkgs[name]
        deps = p.get("dependencies") or [] if extra is None else (p.get("optional-dependencies") or {}).get(extra, [])
        for d in deps:
            for e in _edges(d):
                if e[0] not in skip and e not in seen:
                    todo.append(e)
    return {name for name, _ in seen}


def cluster_only(lock: dict, group: str = GROUP) -> list[str]:
    """Ray and every package of the group's closure that only Ray pulls in."""
    roots = group_roots(lock, group)
    return sorted(closure(lock, roots) - closure(lock, roots, skip=CLUSTER_OWN))


def uv_command() -> list[str]:
    """uv itself: ``$UV`` (set by ``uv run``), else ``uv`` on the PATH, else ``python -m uv``."""
    if os.environ.get("UV"):
        return [os.environ["UV"]]
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def export_args(lock: dict, group: str = GROUP) -> list[str]:
    args = ["export", "--frozen", "--no-hashes", "--no-header", "--no-annotate", "--only-group", group]
    for name in cluster_only(lock, group):
        args += ["--no-emit-package", name]
    return args


def render(repo: Path = REPO_DIR, group: str = GROUP) -> str:
    """The requirements file's text, as ``uv export`` writes it from the lock (with our header)."""
    cmd = [*uv_command(), *export_args(load_lock(repo), group)]
    p = subprocess.run(cmd, cwd=repo, capture_output=True, text=True,
                       env={**os.environ, "UV_NO_PROGRESS": "1"})
    if p.returncode != 0:
        err = " ".join((p.stderr or p.stdout).split())[:400]
        raise SystemExit(f"trajsft.cluster.requirements: `uv {' '.join(cmd[1:4])} ...` failed: {err}")
    return HEADER + p.stdout


def pins(text: str) -> dict[str, str]:
    """``{package: version}`` of a requirements file (comments, extras and markers aside)."""
    out = {}
    for ln in text.splitlines():
        ln = ln.split("#", 1)[0].split(";", 1)[0].strip()
        if ln and "==" in ln:
            name, version = ln.split("==", 1)
            out[norm(name.split("[", 1)[0].strip())] = version.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trajsft.cluster.requirements", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help=f"exit 1 when {OUT} is not what the lock gives")
    ap.add_argument("--output", default=str(REPO_DIR / OUT))
    args = ap.parse_args(argv)
    text = render()
    out = Path(args.output)
    if args.check:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: it is not the `{GROUP}` group's closure in uv.lock; "
                  f"regenerate it with `uv run python -m trajsft.cluster.requirements`", file=sys.stderr)
            return 1
        print(f"{out}: {len(pins(text))} packages, as uv.lock gives them")
        return 0
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, out)
    print(f"wrote {out}: {len(pins(text))} packages from uv.lock (group {GROUP!r}, without "
          f"{len(cluster_only(load_lock()))} packages that are Ray's own)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
