# The cross-teacher matrix (opt-in: config `eval:`): held-out loss of every trained target on every
# teacher's held-out split. Logic in trajsft.report.matrix (Levanter's own evaluator).
#
# Next-action scores (rule eval_actions, evals/<target>/done): the target's trained student generates
# each sampled held-out assistant turn greedily and is scored against the teacher's (trajsft.report.actions).
#
# Needs from rules/common.smk: W, STATE_DIR, job_resources, artifact_name, payload_location, job_step. For
# `rule all`: EVAL_OUTPUTS.

# the matrix outputs when the config has an `eval:` section, and the default targets' next-action scores
EVAL_OUTPUTS = W.eval_outputs()


# The payload (actions.json) is content-addressed (<storage_root>/evals/<target>-<hash>/: the run, the
# held-out shard sets, the actions: settings); `params.name` reruns the rule when that hash changes.
rule eval_actions:
    input:
        W.eval_actions_inputs,
    output:
        report(
            "evals/{target}/done",
            caption="../report/actions.rst",
            category="Next actions",
            subcategory="{target}",
            labels={"target": "{target}", "file": "done"},
        ),
    log:
        "logs/eval_actions/{target}.log",
    benchmark:
        "benchmarks/eval_actions/{target}.tsv"
    threads: job_resources("evals").threads
    resources:
        mem_mb=job_resources("evals").mem_mb,
    params:
        name=artifact_name("evals"),
        location=payload_location("evals"),
        step=job_step("eval_actions"),
    script:
        "../src/trajsft/rules/eval_actions.py"


# The agent evaluation (rule eval_agent, agent/<target>/done; on request, not in `rule all`: it needs bubblewrap
# and Debian's cargo): mini-swe-agent works each task of the target's task set (config agent.tasks) against the
# trained student, each episode in its sandbox, graded by the tests (trajsft.agent). Its payload
# (<storage_root>/agent/<target>-<hash>/) is content-addressed by the run, the task set, the harness and the
# agent: settings; a killed evaluation reruns only the tasks not yet graded there.
rule eval_agent:
    input:
        W.eval_agent_inputs,
    output:
        "agent/{target}/done",
    log:
        "logs/eval_agent/{target}.log",
    benchmark:
        "benchmarks/eval_agent/{target}.tsv"
    threads: job_resources("agent").threads
    resources:
        mem_mb=job_resources("agent").mem_mb,
    params:
        name=artifact_name("agent"),
        location=payload_location("agent"),
        step=job_step("eval_agent"),
    script:
        "../src/trajsft/rules/eval_agent.py"


rule eval_matrix:
    input:
        unpack(W.eval_matrix_inputs),
    output:
        json=report(
            f"{STATE_DIR}/eval/matrix.json",
            caption="../report/eval_json.rst",
            category="Cross-teacher matrix",
            labels={"file": "matrix.json"},
        ),
        png=report(
            f"{STATE_DIR}/eval/matrix.png",
            caption="../report/eval.rst",
            category="Cross-teacher matrix",
            labels={"file": "matrix.png"},
        ),
        html=report(
            f"{STATE_DIR}/eval/matrix.html",
            caption="../report/eval_table.rst",
            category="Cross-teacher matrix",
            labels={"file": "matrix.html"},
        ),
    log:
        "logs/eval/matrix.log",
    benchmark:
        "benchmarks/eval/matrix.tsv"
    threads: 2
    resources:
        mem_mb=16000,  # runs here (not on the cluster): a Qwen3-8B row needs ~40 GB
    params:
        # rows' runs, columns, the tokenized artifact of every cell, options: a change reruns it
        spec=W.eval_matrix_spec,
        step=job_step("eval_matrix"),
    script:
        "../src/trajsft/rules/eval_matrix.py"
