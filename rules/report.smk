# Report rules: dataset cards, the teacher comparison table and training curves.
# Logic lives in trajsft.report (build: helpers and entry points; cards, plots, tables, curves),
# each rule's script is its module in src/trajsft/rules/ (trajsft.rule_job.run_report).
# `snakemake --report report.html` includes every output marked report(...) below.
#
# Needs from rules/common.smk: PLAN, STATE_DIR. For `rule all`: REPORT_OUTPUTS.

from trajsft.report import build as report_build
from trajsft.report.actions import evaluated_steps as eval_actions_steps


report: "../report/workflow.rst"


# targets compared in results/cards/teachers.html: config `report_targets`, else `default_targets`
REPORT_TARGETS = report_build.report_targets(PLAN, config)
# the targets whose next-action scores the report tabulates (those that hold out chats, trained here)
ACTIONS_TARGETS = [
    t
    for t in dict.fromkeys([*REPORT_TARGETS, *config["default_targets"]])
    if evals_of([t])
]
# table + cards of the report targets and default targets + curves of the default targets (+ next actions)
REPORT_OUTPUTS = report_build.report_outputs(
    PLAN, REPORT_TARGETS, config["default_targets"], STATE_DIR
) + ([f"{STATE_DIR}/evals/actions.html"] if ACTIONS_TARGETS else [])


rule report_card:
    input:
        unpack(lambda w: report_build.card_inputs(PLAN, w.target)),
    output:
        json=report(
            f"{STATE_DIR}/cards/{{target}}/card.json",
            caption="../report/card_json.rst",
            category="Dataset cards",
            subcategory="{target}",
            labels={"target": "{target}", "file": "card.json"},
        ),
        png=report(
            f"{STATE_DIR}/cards/{{target}}/card.png",
            caption="../report/card.rst",
            category="Dataset cards",
            subcategory="{target}",
            labels={"target": "{target}", "file": "card.png"},
        ),
    log:
        "logs/report/card/{target}.log",
    threads: 1
    resources:
        mem_mb=2000,
    params:
        seq_len=lambda w: report_build.card_params(PLAN, w.target)["seq_len"],
        weights=lambda w: report_build.card_params(PLAN, w.target)["weights"],
        mixture=lambda w: report_build.card_params(PLAN, w.target)["mixture"],
        native_seq_len=lambda w: report_build.card_params(PLAN, w.target)[
            "native_seq_len"
        ],
    script:
        "../src/trajsft/rules/report_card.py"


rule report_table:
    input:
        cards=[report_build.card_paths(t, STATE_DIR)["json"] for t in REPORT_TARGETS],
    output:
        html=report(
            f"{STATE_DIR}/cards/teachers.html",
            caption="../report/table.rst",
            category="Teacher comparison",
            labels={"target": "all report targets", "file": "teachers.html"},
        ),
        md=f"{STATE_DIR}/cards/teachers.md",
        tsv=f"{STATE_DIR}/cards/teachers.tsv",
    log:
        "logs/report/teachers.log",
    threads: 1
    resources:
        mem_mb=2000,
    script:
        "../src/trajsft/rules/report_table.py"


rule report_curves:
    input:
        done="checkpoints/{target}/done",
        log="logs/train/{target}.log",  # the train rule's log (a link to the durable run log)
    output:
        png=report(
            f"{STATE_DIR}/curves/{{target}}.png",
            caption="../report/curves.rst",
            category="Training curves",
            subcategory="{target}",
            labels={"target": "{target}", "file": "curves"},
        ),
        json=f"{STATE_DIR}/curves/{{target}}.json",
    log:
        "logs/report/curves/{target}.log",
    threads: 1
    resources:
        mem_mb=2000,
    script:
        "../src/trajsft/rules/report_curves.py"


rule report_actions:
    input:
        [PLAN.evals_done_path(t) for t in ACTIONS_TARGETS],
    output:
        html=report(
            f"{STATE_DIR}/evals/actions.html",
            caption="../report/actions_table.rst",
            category="Next actions",
            subcategory="all evaluated targets",
            labels={"target": "all evaluated targets", "file": "actions.html"},
        ),
        json=f"{STATE_DIR}/evals/actions.json",
    log:
        "logs/report/actions.log",
    threads: 1
    resources:
        mem_mb=2000,
    params:
        # the exports `trajsft eval --actions --watch` scored since: a new one reruns the table (a row per step)
        steps=lambda wildcards: {
            t: list(eval_actions_steps(PLAN.target(t)["evals"].location))
            for t in ACTIONS_TARGETS
        },
    script:
        "../src/trajsft/rules/report_actions.py"
