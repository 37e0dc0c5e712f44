"""Rule ``train`` (rules/train.smk): a target's content-addressed training run (Levanter here, or a Ray job on a
cluster profile, which this job submits and follows: the config's executor, trajsft.executor) ->
``checkpoints/<target>/done``. Its rule log is a link to the run's durable training log; on a Ray profile a vanished
Snakemake leaves the job running (a rerun re-attaches)."""

from trajsft import rule_job, storage
from trajsft.executor import executor_for
from trajsft.plan import step_configs
from trajsft.train.target import resume_note, train  # never jax/levanter: a child trains


def run(job, snakemake) -> dict:
    cfg = step_configs.train(job.plan, job.name)
    executor = executor_for(job.plan.cfg)
    return storage.train(job.plan, job.artifact, lambda: train(cfg, done_path=snakemake.output[0], executor=executor))


ENTRY = rule_job.Entry(
    run,
    rule_log=lambda job, path: executor_for(job.plan.cfg).process_log(step_configs.train(job.plan, job.name), path),
    on_snakemake_gone=lambda job: executor_for(job.plan.cfg).on_snakemake_gone(),
    manifest=False,  # the done marker is the training's own
    stop_note=lambda job: resume_note(step_configs.train(job.plan, job.name)),
)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
