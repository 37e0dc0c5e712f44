"""Rule ``train`` (rules/train.smk): a target's content-addressed training run (Levanter here, or a Ray job on a
cluster profile, which this job submits and follows) -> ``checkpoints/<target>/done``. Its rule log is a link to the
run's durable training log; on a Ray profile a vanished Snakemake leaves the job running (a rerun re-attaches)."""

from trajsft import rule_job, storage
from trajsft.plan import step_configs
from trajsft.train.target import detach_from_ray_job, link_rule_log, train  # never jax/levanter: a child trains


def on_ray(job) -> bool:
    return job.plan.cfg.get("executor") == "ray"


def run(job, snakemake) -> dict:
    cfg = step_configs.train(job.plan, job.name)
    submit = None
    if on_ray(job):
        from trajsft.cluster.submit import train_on_ray as submit
    return storage.train(job.plan, job.artifact, lambda: train(cfg, done_path=snakemake.output[0], on_ray=submit))


ENTRY = rule_job.Entry(
    run,
    rule_log=lambda job, path: link_rule_log(step_configs.train(job.plan, job.name), path),
    on_snakemake_gone=lambda job: detach_from_ray_job if on_ray(job) else None,
    manifest=False,  # the done marker is the training's own
)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
