"""Step ``fit`` (rule ``check_fit``, Ray profiles with ``ray.fit_check``): the target's train step compiled
for the profile's TPU slice on this machine (libtpu), as a job of its own that Snakemake runs while the data
rules run, so the compile is off the critical path and cached by the time the train rule submits.

The train_lm config is the train rule's own (:func:`trajsft.train.target.train_lm_config_for` for a TPU); a
teacher not tokenized yet gets a placeholder source, which decides no shape of the step. A step that does
not fit or does not compile fails the job in one line naming HBM and the knobs (the train rule is then
never run: nothing is submitted); without libtpu the job says so in one line and the run goes on.
"""

from __future__ import annotations

import logging

from ..fit import check
from ..plan.step_configs import TrainConfig
from ..train.target import explain, train_lm_config_for
from .submit import fit_check

log = logging.getLogger("trajsft")


def check_fit(cfg: TrainConfig) -> dict:
    """The fit summary of ``cfg.target`` on the profile's slice (``{"skipped": why}`` without libtpu)."""
    lev = train_lm_config_for(cfg, accelerator="tpu", untokenized_ok=True)
    summary = fit_check(cfg, lev, explain(cfg)["steps"])
    if "skipped" not in summary:
        for line in check.render(summary):
            log.info("%s", line)
    return summary
