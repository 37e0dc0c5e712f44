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
    assert f'job_step("{kind.rule}")' in body and '"../scripts/rule.py"' in body, body
    assert callable(kind.step_function())
    assert BY_RULE[kind.rule] is kind and kind.rule in ST.STEPS
    assert isinstance(kind.format, int) and kind.format >= 1
    arts = [a for (k, _), a in plan.artifacts.items() if k == kind.name]
    assert arts, f"the default config plans no {kind.name} artifact"
    for a in arts:
        assert a.inputs["format"] == kind.format
        assert a.location == join(plan.root, kind.name, a.name)
        assert a.manifest.startswith(f"{plan.state_dir}/{kind.name}/")
        assert set(kind.checked_settings(a.spec)) == set(kind.checked)
    assert set(kind.downstream) <= set(KINDS)


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


def test_scripts_hold_one_rule_script():
    rules = rule_blocks()
    scripts = {m for body in rules.values() for m in re.findall(r'"\.\./scripts/([^"]+)"', body)}
    assert scripts == {"rule.py"}
    assert sorted(p.name for p in (REPO / "scripts").glob("*rule*.py")) == ["rule.py"]


def test_the_layout_page_names_each_kinds_rule_and_directory():
    page = (REPO / "docs/development-and-layout.md").read_text()
    for kind in REGISTRY:
        assert re.search(rf"^\| `{kind.rule}` \| `{kind.name}/`", page, re.M), kind
