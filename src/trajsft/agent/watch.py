"""``trajsft eval <target> --agent --watch``: the agent evaluation of each HF export of a running training, under
the evaluation's ``steps/step-<N>/``, here or on a Ray profile as one Ray job per export (as the rule's)."""

from __future__ import annotations

from .. import io
from ..executor import executor_for
from ..plan.step_configs import EvalAgentConfig
from ..report.trained import locate
from . import job
from .evaluate import STEPS, episodes, finish


def step_location(cfg: EvalAgentConfig, step: int) -> str:
    """Where the evaluation of the run's export of ``step`` goes (``trajsft eval --agent --watch``)."""
    return io.join(cfg.location, STEPS, f"step-{step}")


def at_step(cfg: EvalAgentConfig, step: int, rule_log: str) -> dict:
    """The evaluation of the export of ``step`` of ``cfg``'s run, under :func:`step_location`: here, or on a Ray
    profile as one Ray job on a single-host slice (:mod:`trajsft.agent.job`, its log followed into ``rule_log``), as
    the rule's (the W&B run is the final evaluation's); its figures."""
    trained, location = locate(cfg.train, step), step_location(cfg, step)

    def here(c: EvalAgentConfig) -> dict:
        return finish(c, location, episodes(c, "student", location, trained=trained), wandb=False)

    def on_slice(c: EvalAgentConfig, log_path: str) -> dict:
        return job.submit(c, log_path, trained=trained, location=location, key=f"step{step}")

    return {**executor_for(cfg.train.workflow).on_eval_host(cfg, rule_log, here, on_slice)(), "step": step}
