"""The typed step each rule job gets through params (trajsft.plan.step): resolved once by the
Snakemake process, picklable, restricted to what the step reads, and never a rerun trigger."""

import pickle

import pytest

from trajsft.plan import config as C
from trajsft.plan import step as ST


@pytest.fixture(scope="module")
def plan():
    return C.Plan(C.load([C.DEFAULT_CONFIG, C.REPO_DIR / "config" / "eval.yaml"]), base_dir=C.REPO_DIR)


def kinds(step):
    return sorted(k for k, _ in step.plan.artifacts)


def test_each_step_holds_its_artifact_and_what_it_is_built_from(plan):
    chain = {a.kind: a for a in plan.chain("demo")}
    assert kinds(ST.resolve(plan, "download", chain["raw"].name)) == ["raw"]
    assert kinds(ST.resolve(plan, "shard", chain["shards"].name)) == ["raw", "shards"]
    tok = ST.resolve(plan, "tokenize", chain["tokenized"].name)
    assert kinds(tok) == ["raw", "shards", "tokenized"] and tok.artifact is chain["tokenized"]
    train = ST.resolve(plan, "train", "mix-all")
    assert list(train.plan.targets) == ["mix-all"] and train.artifact is plan.target("mix-all")["run"]
    assert kinds(train).count("tokenized") == 3 and "exports" not in kinds(train)
    export = ST.resolve(plan, "export", "demo")
    assert kinds(export) == ["exports", "raw", "shards"] and export.artifact.kind == "exports"
    ev = ST.resolve(plan, "eval_matrix")
    assert ev.artifact is None and set(ev.plan.targets) == set(plan.eval_rows())
    assert set(ev.plan.eval_cells) == set(plan.eval_cells)
    assert plan.get("raw", chain["raw"].name) and len(plan.artifacts) > len(train.plan.artifacts)  # untouched
    with pytest.raises(ValueError, match="unknown step"):
        ST.resolve(plan, "shards", chain["shards"].name)  # a kind's name: its rule is shard


def test_a_step_pickles_and_its_plan_answers_like_the_whole_plan(plan):
    """Snakemake pickles a script job's params; the job reads the step's plan as it read the whole one."""
    step = pickle.loads(pickle.dumps(ST.resolve(plan, "train", "gpt-5-mini")))
    run = plan.target("gpt-5-mini")["run"]
    assert step.artifact.name == run.name and step.artifact.inputs == run.inputs
    assert step.plan.specs.targets["gpt-5-mini"] == plan.specs.targets["gpt-5-mini"]
    assert step.plan.cfg == plan.cfg and step.plan.base_dir == plan.base_dir
    for a in plan.chain("gpt-5-mini"):
        assert step.plan.get(a.kind, a.name).location == a.location


def test_a_step_is_never_a_params_rerun_trigger(plan):
    """Snakemake's params trigger compares repr()s of builtin values only; a Step is none (the rules
    keep their explicit triggers: rows, strict, run, name)."""
    from snakemake.persistence import UNREPRESENTABLE, PersistenceBase

    step = ST.resolve(plan, "download", plan.chain("demo")[0].name)
    assert PersistenceBase._serialize_param_builtin(None, step) is UNREPRESENTABLE
