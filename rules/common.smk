import re
import sys
from functools import partial

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

from trajsft.logs import WorkflowStop, one_line_stops
from trajsft.plan.config import STATE_DIR, ConfigError, Plan, validate
from trajsft.plan import step_configs
from trajsft.plan.kinds import KINDS
from trajsft.plan.step import resolve as resolve_step

min_version("9.0")
one_line_stops()  # a WorkflowStop below is reported as its message alone, exit 1

# the train rule runs Levanter on this machine's CPUs, or, with a Ray profile, only a light submitter that
# follows the job (its resources: KINDS["checkpoints"].on_cluster)
TRAIN_LOCAL = config["executor"] != "ray"
# a Ray profile compiles the train step for its TPU slice before submitting (rule check_fit)
FIT_CHECK = not TRAIN_LOCAL and bool((config.get("ray") or {}).get("fit_check", True))


def validate_or_stop(cfg):
    """Schema + references; one line per problem (key and allowed values), no schema dump."""
    try:
        validate(cfg)
    except ConfigError as e:
        raise WorkflowStop(str(e)) from None


def targets_given_as_configfiles():
    """`snakemake --configfile mine.yaml checkpoints/x/done` reads the target as a config file
    (--configfile takes every following argument); an existing done marker would even load.
    """
    bad = [
        str(f)
        for f in workflow.configfiles
        if re.search(
            r"(^|/)checkpoints/[^/]+/done$|(^|/)results/.+/manifest\.json$", str(f)
        )
    ]
    if bad:
        raise WorkflowStop(
            f"trajsft: {', '.join(bad)} was read as a --configfile (it takes every following "
            "argument): put targets before --configfile, e.g. snakemake checkpoints/demo/done --configfile mine.yaml"
        )


targets_given_as_configfiles()
validate_or_stop(config)
PLAN = Plan(config, base_dir=workflow.basedir)


wildcard_constraints:
    name=r"[A-Za-z0-9][A-Za-z0-9._-]*-[0-9a-f]{10}",
    target="|".join(re.escape(t) for t in PLAN.targets),


def done_targets(targets):
    return [PLAN.done_path(PLAN.target(t)["name"]) for t in targets]


def planned(kind, wildcards):
    """The `kind` artifact that a job writes, named by the `name` wildcard, or its target's
    own (a per-target kind, trajsft.plan.kinds.Kind.of_target)."""
    of_target = KINDS[kind].of_target
    if of_target:
        return PLAN.target(wildcards.target)[of_target]
    return PLAN.get(kind, wildcards.name)


def job_resources(kind):
    """The rule's threads and memory, from the kind's record (its on_cluster share on a Ray profile)."""
    k = KINDS[kind]
    return k.on_cluster if k.on_cluster and not TRAIN_LOCAL else k.resources


def artifact_inputs(kind):
    """Input function: the manifests of every artifact this `kind` artifact is built from (its deps)."""

    def inner(wildcards):
        return [PLAN.get(*dep).manifest for dep in planned(kind, wildcards).deps]

    return inner


def artifact_name(kind):
    """Params function: the artifact's content-addressed name (a rerun trigger: a changed hashed
    setting names another artifact)."""

    def inner(wildcards):
        return planned(kind, wildcards).name

    return inner


def payload_location(kind):
    """Params function: the artifact's payload location under the current storage root (a rerun
    trigger: a manifest written for another root is not done for this one)."""

    def inner(wildcards):
        return planned(kind, wildcards).location

    return inner


def checked_setting(kind, key):
    """Params function: a setting of the kind's record (trajsft.plan.kinds) that is not hashed but must match for
    a built payload to be reused: a changed value reruns the rule (params rerun trigger).
    """

    def inner(wildcards):
        return KINDS[kind].checked[key](planned(kind, wildcards).spec)

    return inner


def job_step(step):
    """Params function: the job's typed step (trajsft.plan.step.Step), resolved once here, so
    that no job rebuilds the plan (never a rerun trigger: not a builtin value)."""

    def inner(wildcards):
        return resolve_step(
            PLAN, step, wildcards.get("name") or wildcards.get("target") or ""
        )

    return inner


def typo_target(wildcards):
    """Input function for a typo in checkpoints/<target>/done or evals/<target>/done (see unknown_target in
    train.smk)."""
    try:
        PLAN.target(wildcards.other)
    except ConfigError as e:  # unknown target 'x' (teachers and mixtures: ...)
        raise WorkflowStop(
            f"trajsft: {wildcards.marker}/{wildcards.other}/done: {e}"
        ) from None
    return []


def not_a_target():
    """Wildcard constraint: a checkpoints/<x>/done or evals/<x>/done name that is not a configured target (the
    name ends at the next / in the output's pattern, or at the end of a wildcard value checked alone).
    """
    names = "|".join(re.escape(t) for t in PLAN.targets)
    return f"(?!(?:{names})(?:/|$))[^/]+"


def train_inputs(wildcards):
    """Input function (train): the tokenized manifests of the target's teachers, the manifest of the
    student's initial weights (init: hf) and, on a Ray profile, the fit check of its slice.
    """
    train = step_configs.train(PLAN, wildcards.target)
    return (
        [a.manifest for a in train.tokenized.values()]
        + ([train.model.manifest] if train.model else [])
        + ([f"{STATE_DIR}/fit/{wildcards.target}/preflight.json"] if FIT_CHECK else [])
    )


def fit_versions():
    """Params of check_fit: the compiler's versions (jax, jaxlib, libtpu, levanter)."""
    from trajsft.fit.check import versions

    return versions()


def eval_matrix_inputs(wildcards):
    """Input function of the eval_matrix rule: each row's done marker, each cell's tokenized manifest."""
    from trajsft.report.matrix import eval_inputs

    if config.get("eval") is None:
        raise WorkflowStop(
            "trajsft: results/eval/matrix.* needs an eval: section in the config (the cross-teacher "
            "matrix is opt-in): e.g. --configfile config/eval.yaml"
        )
    return eval_inputs(PLAN)


def eval_actions_inputs(wildcards):
    """Input function of eval_actions: the target's done marker and the shard sets whose held-out chats are
    scored; a teacher that holds out nothing stops the workflow in one line (which setting to change).
    """
    problem = step_configs.held_out_problem(PLAN, wildcards.target)
    if problem:
        raise WorkflowStop(
            f"trajsft: {PLAN.evals_done_path(wildcards.target)}: {problem}"
        )
    ev = PLAN.target(wildcards.target)["evals"]
    return [PLAN.done_path(wildcards.target)] + [
        PLAN.get(*dep).manifest for dep in ev.deps if dep[0] == "shards"
    ]


def evals_of(targets):
    """The evals/<target>/done markers built by default: those of ``targets`` that hold out chats to score, when
    training runs here. On a Ray profile each is a Ray job on a TPU host: built when named (snakemake evals/<t>/done).
    """
    if not TRAIN_LOCAL:
        return []
    return [
        PLAN.evals_done_path(t)
        for t in targets
        if step_configs.held_out_problem(PLAN, t) is None
    ]


def sweep_inputs(wildcards):
    """Input function of the sweep rule: the done marker of every cell (a cell that is its base: the base's)."""
    from trajsft.plan.sweeps import cells

    found = cells(config)
    if wildcards.sweep not in found:
        raise WorkflowStop(
            f"trajsft: sweeps/{wildcards.sweep}/done: unknown sweep '{wildcards.sweep}' "
            f"(sweeps: {', '.join(found) or 'none in the config'})"
        )
    return [PLAN.done_path(c.target) for c in found[wildcards.sweep]]


def sweep_slots():
    """The train rule's sweep resources: on a Ray profile, each sweep with max_parallel is a Snakemake global
    resource of that many slots and each of its cells' trainings takes one, so at most max_parallel trainings of
    a sweep are submitted at once; the rest wait here, not in the Ray queue. Locally, cores schedule them.
    """
    from trajsft.plan.sweeps import slots

    if TRAIN_LOCAL:
        return {}
    out = {}
    for s in slots(config):
        # --resources sweep_<name>=N on the command line wins
        if s.resource not in workflow.global_resources:
            workflow.register_resource(s.resource, s.cap)
        out[s.resource] = partial(slot_taken, members=s.targets)
    return out


def slot_taken(wildcards, members):
    return int(wildcards.target in members)


def forward_signals_to_jobs():
    from trajsft.runtime.signals import forward_to_rule_jobs

    forward_to_rule_jobs()


def preflight_or_exit():
    """On a Ray cluster profile: refuse to start (in seconds) if training could not run."""
    if config["executor"] != "ray":
        return
    from trajsft.cluster.submit import preflight

    notes = []
    problems = preflight(config, notes)
    for n in notes:
        print(f"trajsft preflight: note: {n}", file=sys.stderr)
    for p in problems:
        print(f"trajsft preflight: {p}", file=sys.stderr)
    if problems:
        raise WorkflowError(
            f"preflight failed ({len(problems)} problem(s) above); nothing was submitted"
        )


def storage_or_exit():
    """Every executor: the storage root takes a write (a Ray profile's preflight asked already), and a note when
    what this run's trainings write there is more than it has free (trajsft.fit.disk).
    """
    from trajsft.fit import disk

    jobs = workflow.dag.needrun_jobs()
    targets = sorted({str(j.wildcards.target) for j in jobs if j.rule.name == "train"})
    trainings = [step_configs.train(PLAN, t) for t in targets]
    space = disk.check(PLAN.root, trainings, probe=config["executor"] != "ray")
    if space["problem"]:
        print(f"trajsft: {space['problem']}", file=sys.stderr)
        sys.exit(1)
    if space["short"]:
        print(f"trajsft: note: {space['lines'][-1]}", file=sys.stderr)


def register_run():
    """Export this run id (pid + start time) to the jobs: they die with this Snakemake."""
    from trajsft.runtime.signals import register_run

    register_run()


onstart:
    register_run()
    preflight_or_exit()
    storage_or_exit()
    forward_signals_to_jobs()
