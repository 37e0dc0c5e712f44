"""Sweeps (config ``sweeps:``): a grid of runs over a base target's training settings, each cell a target.

::

    sweeps:
      lr-demo:
        base: demo                       # a teacher or mixture; or `targets: [a, b]` as an axis
        grid:
          training.learning_rate: [1.0e-3, 3.0e-3]
        exclude: [{training.learning_rate: 3.0e-3}]   # optional: cells that match every key given
        include: [{training.learning_rate: 1.0e-4}]   # optional: cells beyond the product
        max_parallel: 2

The cells are the Cartesian product of the axes (``training.<field>``, and ``target`` when ``targets`` is given),
minus ``exclude``, plus ``include``. A cell whose settings are its target's own *is* that target (the 3.0e-3 cell
above is ``demo``: the same run, trained once); every other cell becomes a target of its own (a mixture entry
added to the config when it is validated) named by its sweep and its swept values, never truncated:
``lr-demo-learning_rate-0.001``; its run, as every run, is that name plus its hash. A cell reads its base's data
(the same tokenized artifacts: data is named by what it holds). ``sweeps/<name>/done`` trains every cell and
compares them (:mod:`trajsft.report.sweeps`).
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import ConfigError

AXIS_TARGET = "target"


@dataclass(frozen=True)
class Schema:
    """config/schema.yaml (``root``) and its number coercion (``coerce``: trajsft.plan.config.coerce_numbers), handed
    in by the config module that validates (this module never imports it)."""

    root: dict
    coerce: Any


@dataclass(frozen=True)
class Cell:
    sweep: str
    target: str  # the target that trains this cell (its base itself when the cell changes nothing)
    values: tuple[tuple[str, Any], ...]  # (axis, value), in the grid's axis order


def _merge(a: dict | None, b: dict | None) -> dict:
    """As trajsft.plan.specs.deep_merge (with None for an empty side). Not imported from there: that would put this
    module on the path between config and specs, which tests/test_cli_hygiene.py's cycle-check test expects to be
    direct."""
    out = copy.deepcopy(a or {})
    for k, v in (b or {}).items():
        out[k] = _merge(out.get(k), v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _fmt(v: Any) -> str:
    text = format(v, "g") if isinstance(v, float) else str(v)
    return re.sub(r"[^A-Za-z0-9._]", "_", text)


def _entry(cfg: dict, target: str) -> tuple[dict, dict]:
    """The base ``target``'s mixture-shaped entry (a teacher: a mixture of itself) and its effective training."""
    if target in cfg["teachers"]:
        t = cfg["teachers"][target]
        entry = {"teachers": {target: 1.0}, "student": t.get("student", cfg["student"])}
        if t.get("actions"):
            entry["actions"] = copy.deepcopy(t["actions"])
        return entry, _merge(cfg["training"], t.get("training"))
    m = cfg["mixtures"][target]
    entry = {k: copy.deepcopy(v) for k, v in m.items() if k != "training"}
    entry.setdefault("student", cfg["student"])
    return entry, _merge(cfg["training"], m.get("training"))


def _training_value(schema: "Schema", where: str, field: str, value: Any) -> Any:
    """``value`` of ``training.<field>`` as the schema reads it (YAML 1.1 strings such as ``3e-3`` are numbers);
    one line when the field does not exist or the value is not allowed."""
    from jsonschema import Draft202012Validator

    root, coerce_numbers = schema.root, schema.coerce
    props = root["definitions"]["training"]["properties"]
    if field not in props:
        raise ConfigError(f"config: {where}: training has no field '{field}' (fields: {', '.join(sorted(props))})")
    holder = coerce_numbers({field: value}, root["definitions"]["training"], root)
    errs = list(Draft202012Validator({**root["definitions"]["training"], "definitions": root["definitions"]})
                .iter_errors(holder))
    if errs:
        raise ConfigError(f"config: {where}: training.{field} {value!r} is not allowed ({errs[0].message})")
    return holder[field]


def cells(cfg: dict, schema: Optional[Schema] = None) -> dict[str, list[Cell]]:
    """Every sweep's cells, in grid order (``schema``: values checked and coerced, as :func:`expand` does; without
    it the values are read as the validated config holds them); ConfigError (one line) for a sweep that cannot be
    expanded."""
    teachers, mixtures = cfg["teachers"], cfg.get("mixtures") or {}
    out: dict[str, list[Cell]] = {}
    for name, sw in (cfg.get("sweeps") or {}).items():
        where = f"sweeps.{name}"
        if ("base" in sw) == ("targets" in sw):
            raise ConfigError(f"config: {where}: give either base (a teacher or mixture) or targets (a list: an axis)")
        bases = [sw["base"]] if "base" in sw else list(sw["targets"])
        for b in bases:
            if b not in teachers and b not in mixtures:
                raise ConfigError(f"config: {where}: unknown target '{b}' (teachers and mixtures: "
                                  f"{', '.join([*teachers, *mixtures])})")
        axes: list[tuple[str, list]] = []
        if "targets" in sw:
            axes.append((AXIS_TARGET, bases))
        for axis, values in (sw.get("grid") or {}).items():
            if not axis.startswith("training."):
                raise ConfigError(f"config: {where}.grid: axis '{axis}' is not training.<field> (the targets axis is "
                                  f"{where}.targets)")
            field = axis.removeprefix("training.")
            axes.append((axis, [_value(schema, f"{where}.grid.{axis}", field, v) for v in values]))
            if schema is not None:  # the config holds the values as read (3e-3: a number), for cells(cfg) to name
                sw["grid"][axis] = list(axes[-1][1])
        if not axes:
            raise ConfigError(f"config: {where}: an empty grid (give grid: {{training.<field>: [values]}} or targets)")

        def point(d: dict, label: str) -> tuple[tuple[str, Any], ...]:
            unknown = sorted(set(d) - {a for a, _ in axes})
            if unknown:
                raise ConfigError(f"config: {where}.{label}: {', '.join(unknown)} is not an axis of the sweep "
                                  f"({', '.join(a for a, _ in axes)})")
            got = tuple((a, d[a] if a == AXIS_TARGET else _value(schema, f"{where}.{label}", a[9:], d[a]))
                        for a, _ in axes if a in d)
            if schema is not None:
                d.update(got)
            return got

        excluded = [point(e, "exclude") for e in sw.get("exclude") or []]
        grid = [tuple(zip([a for a, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]
        grid = [g for g in grid if not any(set(e) <= set(g) for e in excluded)]
        for inc in sw.get("include") or []:
            p = point(inc, "include")
            if len(p) != len(axes):
                raise ConfigError(f"config: {where}.include: a cell names every axis ({', '.join(a for a, _ in axes)})")
            if p not in grid:
                grid.append(p)
        # the name says the values that vary across the cells (an axis of one value: in every cell, said once)
        named = [a for a, _ in axes if len({repr(dict(g)[a]) for g in grid}) > 1] or [a for a, _ in axes]
        out[name] = [_cell(cfg, name, sw, g, named) for g in grid]
    return out


def _value(schema: Optional[Schema], where: str, field: str, value: Any) -> Any:
    return _training_value(schema, where, field, value) if schema is not None else value


def _cell(cfg: dict, sweep: str, sw: dict, values: tuple[tuple[str, Any], ...], named: list[str]) -> Cell:
    base = dict(values).get(AXIS_TARGET, sw.get("base"))
    _, training = _entry(cfg, base)
    changed = [(a, v) for a, v in values if a != AXIS_TARGET and training.get(a[9:]) != v]
    if not changed:
        return Cell(sweep, base, values)
    parts = [base] if AXIS_TARGET in dict(values) else []
    parts += [f"{a[9:]}-{_fmt(v)}" for a, v in values if a != AXIS_TARGET and a in named]
    return Cell(sweep, "-".join([sweep, *parts]), values)


def expand(cfg: dict, schema: Schema) -> dict[str, list[Cell]]:
    """Add every cell that is not its base as a mixture entry of ``cfg`` (its base's teachers, student and actions,
    its base's training with the cell's values); the cells. Idempotent; a cell name taken by another target is one
    line."""
    found = cells(cfg, schema)
    mixtures = cfg.setdefault("mixtures", {})
    for name, cs in found.items():
        for c in cs:
            base = dict(c.values).get(AXIS_TARGET, cfg["sweeps"][name].get("base"))
            if c.target == base:
                continue
            entry, training = _entry(cfg, base)
            for a, v in c.values:
                if a != AXIS_TARGET:
                    training[a[9:]] = v
            entry["training"] = training
            if c.target in cfg["teachers"] or (c.target in mixtures and mixtures[c.target] != entry):
                raise ConfigError(f"config: sweeps.{name}: cell {c.target} has the name of another target: rename "
                                  "the sweep")
            mixtures[c.target] = entry
    return found


@dataclass(frozen=True)
class Slots:
    """A sweep's cap on trainings at once (``max_parallel``), as a Snakemake global resource: ``resource`` (a
    Python identifier), ``cap`` slots, one taken by the training of each target in ``targets``."""

    sweep: str
    resource: str
    cap: int
    targets: frozenset[str]


def slots(cfg: dict) -> list[Slots]:
    """Every sweep that sets ``max_parallel``: its Snakemake resource (``sweep_<name>``, characters other than
    letters, digits and ``_`` as ``_``; a name two sweeps would share numbered), its cap and its cells' targets. A
    target in several sweeps takes a slot of each."""
    found = cells(cfg)
    out: list[Slots] = []
    taken: set[str] = set()
    for name, sw in (cfg.get("sweeps") or {}).items():
        if not sw.get("max_parallel"):
            continue
        resource = "sweep_" + re.sub(r"\W", "_", name, flags=re.ASCII)
        if resource in taken:
            resource = next(f"{resource}_{i}" for i in itertools.count(2) if f"{resource}_{i}" not in taken)
        taken.add(resource)
        out.append(Slots(name, resource, int(sw["max_parallel"]), frozenset(c.target for c in found[name])))
    return out
