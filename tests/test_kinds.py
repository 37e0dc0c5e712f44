"""The artifact kinds come from one registry (trajsft.plan.kinds): every kind has a rule that runs its step
through the one rule script, a step function, a format version hashed into its artifacts and a plan path."""

from __future__ import annotations

import re
import subprocess

import pytest

from docs_utils import REPO
from trajsft.io import join
from trajsft.plan import config as C
from trajsft.plan import specs as S
from trajsft.plan import step as ST
from trajsft.plan.kinds import BY_RULE, KINDS, REGISTRY


def rule_blocks() -> dict[str, str]:
    """Rule name -> its text, from rules/*.smk."""
    out = {}
    for f in sorted((REPO / "rules").glob("*.smk")):
        for m in re.finditer(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", f.read_text(), re.M | re.S):
            out[m.group(1)] = m.group(2)
    return out


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    cfg = C.load()
    return C.Plan(cfg, state_dir=str(tmp_path_factory.mktemp("state") / "results"))


@pytest.mark.parametrize("kind", REGISTRY, ids=lambda k: k.name)
def test_every_kind_has_a_rule_a_step_function_a_format_and_a_plan_path(kind, plan):
    rules = rule_blocks()
    assert kind.rule in rules, f"no rule {kind.rule} in rules/*.smk"
    body = rules[kind.rule]
    assert f'job_step("{kind.rule}")' in body and f'"../src/trajsft/rules/{kind.rule}.py"' in body, body
    assert body.count(f'job_resources("{kind.name}")') == 2, body  # threads and mem_mb from the record
    assert callable(rule_module(kind.rule).ENTRY.run)
    # a rule spells its output (readable in the rule, as snakemake-workflows do): it is where the plan says
    # (a training run and its next-action scores: a done marker per target, beside each other)
    markers = {"train": "checkpoints/{target}/done", "eval_actions": "evals/{target}/done",
               "eval_agent": "agent/{target}/done"}
    out = markers.get(kind.rule, f'f"{{STATE_DIR}}/{kind.name}/{{{{')
    assert out in body.split("log:")[0], (kind.rule, body)
    assert BY_RULE[kind.rule] is kind and kind.rule in ST.STEPS
    assert isinstance(kind.format, int) and kind.format >= 1
    arts = [a for (k, _), a in plan.artifacts.items() if k == kind.name]
    assert arts, f"the default config plans no {kind.name} artifact"
    for a in arts:
        assert a.inputs["format"] == kind.format
        assert a.location == join(plan.root, kind.name, a.name)
        if kind.rule == "eval_actions":
            assert a.manifest == C.Plan.evals_done_path(a.spec["target"]) and a.name.startswith(a.spec["target"] + "-")
        elif kind.rule == "eval_agent":
            assert a.manifest == C.Plan.agent_done_path(a.spec["target"]) and a.name.startswith(a.spec["target"] + "-")
        else:
            assert a.manifest.startswith(f"{plan.state_dir}/{kind.name}/")
        assert set(kind.checked_settings(a.spec)) == set(kind.checked)
    assert set(kind.downstream) <= set(KINDS)
    if kind.of_target:  # a per-target kind: each target's record holds its one artifact of the kind
        held = {(plan.target(t)[kind.of_target].kind, plan.target(t)[kind.of_target].name) for t in plan.targets}
        assert held == {(k, n) for (k, n) in plan.artifacts if k == kind.name}
        t = next(iter(plan.targets))
        assert ST.resolve(plan, kind.rule, t).artifact is plan.target(t)[kind.of_target]


def test_kinds_are_what_specs_hash_into_and_listed_once_in_src():
    assert tuple(S.KINDS) == tuple(k.name for k in REGISTRY)
    lines = subprocess.run(["grep", "-rnE", '"raw".*"shards".*"tokenized"', str(REPO / "src"), "--include=*.py"],
                           capture_output=True, text=True).stdout.splitlines()
    assert len(lines) <= 1, lines


def test_every_rule_job_names_its_step_by_its_rule():
    rules = rule_blocks()
    steps = {r: m.group(1) for r, body in rules.items() if (m := re.search(r'job_step\("(\w+)"\)', body))}
    assert steps and all(rule == step for rule, step in steps.items()), steps
    assert set(steps) == set(ST.STEPS)


def rule_module(rule: str):
    import importlib

    return importlib.import_module(f"trajsft.rules.{rule}")


def test_each_rule_names_its_own_module_as_its_script():
    """One hop from a rule to its code: every rule with a script names trajsft/rules/<rule>.py, and every module
    there is a rule's script."""
    rules = rule_blocks()
    scripts = {r: m.group(1) for r, body in rules.items() if (m := re.search(r'script:\s*"([^"]+)"', body))}
    assert scripts and all(path == f"../src/trajsft/rules/{r}.py" for r, path in scripts.items()), scripts
    modules = {p.stem for p in (REPO / "src/trajsft/rules").glob("*.py")} - {"__init__"}
    assert modules == set(scripts), modules ^ set(scripts)
    assert not list((REPO / "scripts").glob("*rule*.py"))


def test_the_layout_page_names_each_kinds_rule_and_directory():
    page = (REPO / "docs/development-and-layout.md").read_text()
    for kind in REGISTRY:
        assert re.search(rf"^\| `{kind.rule}` \| `{kind.name}/`", page, re.M), kind


def test_a_step_function_is_named_as_its_rule_and_step_means_one_thing():
    """A step's code is the function its rule is named for; no module of ours is named "step" but the record's
    and its configs'."""
    for rule in ST.STEPS:
        fn = getattr(rule_module(rule), rule)
        assert callable(fn) and fn.__name__ == rule, rule
    modules = [p.relative_to(REPO / "src").as_posix() for p in (REPO / "src/trajsft").rglob("*.py")]
    named = sorted(m for m in modules if re.search(r"(^|/|_)steps?(_|\.py$)", m))
    assert named == ["trajsft/plan/step.py", "trajsft/plan/step_configs.py"], named  # the record, the configs


def test_every_step_takes_its_typed_config_not_the_plan(plan):
    """Every step function takes its typed config (trajsft.plan.step_configs), not the plan: its first parameter is
    the config class its kind's resolver returns, any other has a default (train's done marker and Ray submitter);
    rule check_fit's step takes its target's training config, rule eval_matrix's the matrix's."""
    import inspect

    from trajsft.plan import step_configs

    # each rule's step and the resolver of its typed config, as its module (trajsft/rules/<rule>.py) pairs them
    steps = [(getattr(rule_module(r), r), getattr(step_configs, "train" if r == "check_fit" else r)) for r in ST.STEPS]
    for fn, resolver in steps:
        returns = inspect.signature(resolver).return_annotation
        first, *rest = inspect.signature(fn).parameters.values()
        assert first.annotation == returns and hasattr(step_configs, returns), (fn.__name__, first, returns)
        # an artifact's step may take more only with a default (train's done marker and Ray submitter); the
        # matrix also takes the files it writes (the rule's outputs)
        assert [p.name for p in rest if p.default is inspect.Parameter.empty] == (["out"] if fn.__name__ == "eval_matrix"
                                                                                  else []), (fn.__name__, rest)
    art = next(a for (k, _), a in plan.artifacts.items() if k == "raw")
    cfg = step_configs.download(plan, art.name)
    assert (cfg.name, cfg.location, cfg.rows) == (art.name, art.location, int(art.spec["rows"]))
