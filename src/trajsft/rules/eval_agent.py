"""Rule ``eval_agent`` (rules/eval.smk): a target's trained student works every task of its task set through
mini-swe-agent, each episode in its sandbox, graded by the tests -> ``agent`` (``agent/<target>/done``)."""

from trajsft import rule_job
from trajsft.agent.evaluate import eval_agent
from trajsft.plan import step_configs


def run(job, snakemake) -> dict:
    return rule_job.build(job, step_configs.eval_agent(job.plan, job.name), eval_agent)


ENTRY = rule_job.Entry(run)

if __name__ == "__main__":
    rule_job.run_rule(snakemake, ENTRY)  # noqa: F821 (injected by Snakemake)
