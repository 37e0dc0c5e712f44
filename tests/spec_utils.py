"""Typed specs and run inputs for tests that build a Levanter config without a plan's data
(``trajsft.train.levanter_config.train_lm_config``)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Optional

from trajsft.plan import config as C
from trajsft.plan import specs as S
from trajsft.train.levanter_config import DataSource, RunInputs


@functools.lru_cache(maxsize=None)
def plan_specs() -> S.Specs:
    """The specs of the repo's config (config/config.yaml)."""
    return S.build(C.load(), C.REPO_DIR)


def target_spec(target: str = "demo", weights: Optional[Mapping[str, float]] = None,
                model: Optional[Mapping[str, int]] = None, **training) -> S.TargetSpec:
    """A target of the repo's config (``demo``: the tiny random-init student) with other teachers and
    weights, model dimensions or training fields."""
    spec = plan_specs().targets[target]
    student = spec.student
    if model is not None:
        student = dataclasses.replace(student, model=S.ModelSpec(**model))
    return dataclasses.replace(
        spec, student=student, training=dataclasses.replace(spec.training, **training),
        weights=spec.weights if weights is None else tuple((t, float(w)) for t, w in weights.items()))


def run_inputs(run_dir: str, sources: Mapping[str, tuple[str, int]], num_train_steps: int,
               run_id: str = "r1", tokenizer: str = "tok", chat_template: str = "{% generation %}x{% endgeneration %}",
               **kw) -> RunInputs:
    """``sources`` maps a teacher to ``(cache_dir, packed_sequences)``."""
    return RunInputs(run_id=run_id, run_dir=run_dir, tokenizer=tokenizer, chat_template=chat_template,
                     sources={t: DataSource(cache_dir=c, packed_sequences=p) for t, (c, p) in sources.items()},
                     num_train_steps=num_train_steps, **kw)
