# What the rules name: the plan and its input, params and resource functions, one object read from the config
# (trajsft.workflow.Rules: the checks made while the workflow is read and when a run starts live there).
from snakemake.utils import min_version

from trajsft.workflow import NAME_PATTERN, STATE_DIR, Rules

min_version("9.0")
# a target given as a --configfile, a config problem: one line, exit 1 (trajsft.logs.WorkflowStop)
W = Rules.read(config, workflow)
PLAN = W.plan


wildcard_constraints:
    name=NAME_PATTERN,
    target=W.target_pattern(),


# input, params and resource functions (trajsft.workflow.Rules)
done_targets = W.done_targets
job_resources = W.job_resources
artifact_inputs = W.artifact_inputs
artifact_name = W.artifact_name
payload_location = W.payload_location
checked_setting = W.checked_setting
job_step = W.job_step


# the run's id exported to its jobs, the Ray preflight, the storage root, signals forwarded to the jobs
onstart:
    W.start()
