"""Rule ``eval_agent`` (rules/eval.smk): a target's trained student works every task of its task set through
mini-swe-agent, each episode in its sandbox, graded by the tests -> ``agent`` (``agent/<target>/done``): the
episodes here, or, on a Ray profile, one Ray job on a single-host slice that this job submits and follows (the
config's executor, trajsft.executor)."""

from trajsft import rule_job, storage
from trajsft.agent import job as agent_job
from trajsft.agent.evaluate import eval_agent
from trajsft.executor import executor_for
from trajsft.plan import step_configs


def run(job, snakemake) -> dict:
    cfg = step_configs.eval_agent(job.plan, job.name)
    work = executor_for(job.plan.cfg).on_eval_host(cfg, snakemake.log[0], eval_agent, agent_job.submit)
    return storage.build(job.plan, job.artifact, work)


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
