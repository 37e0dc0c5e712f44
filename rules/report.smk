# Report rules: dataset cards, the teacher comparison table and training curves.
# Logic lives in trajsft.report (build: helpers and entry points; cards, plots, tables, curves),
# each rule's script is its module in src/trajsft/rules/ (trajsft.rule_job.run_report).
# `snakemake --report report.html` includes every output marked report(...) below.
#
# Needs from rules/common.smk: W, PLAN, STATE_DIR. For `rule all`: REPORT_OUTPUTS.


report: "../report/workflow.rst"


# targets compared in results/cards/teachers.html: config `report_targets`, else `default_targets`
REPORT_TARGETS = W.report_targets()
# the targets whose next-action scores the report tabulates (those that hold out chats, trained here)
ACTIONS_TARGETS = W.actions_targets()
# the targets whose resolve rates results/agent/resolve_rate.html plots (rule report_agent, on request)
AGENT_TARGETS = W.agent_targets()
# table + cards of the report targets and default targets + curves of the default targets (+ next actions)
REPORT_OUTPUTS = W.report_outputs()


rule report_card:
    input:
        unpack(W.card_inputs),
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
        seq_len=W.card_param("seq_len"),
        weights=W.card_param("weights"),
        mixture=W.card_param("mixture"),
        native_seq_len=W.card_param("native_seq_len"),
    script:
        "../src/trajsft/rules/report_card.py"


rule report_table:
    input:
        cards=[W.card_paths(t)["json"] for t in REPORT_TARGETS],
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
        steps=W.actions_steps,
    script:
        "../src/trajsft/rules/report_actions.py"


# On request (not in `rule all`: each agent evaluation needs bubblewrap and cargo): the resolve rate of every
# agent-evaluated target over its run's training steps (the exports `trajsft eval --agent --watch` evaluated, then
# the final evaluation), as a plot and a table.
rule report_agent:
    input:
        [PLAN.agent_done_path(t) for t in AGENT_TARGETS],
    output:
        html=report(
            f"{STATE_DIR}/agent/resolve_rate.html",
            caption="../report/agent.rst",
            category="Agent evaluation",
            subcategory="all evaluated targets",
            labels={"target": "all evaluated targets", "file": "resolve_rate.html"},
        ),
        png=f"{STATE_DIR}/agent/resolve_rate.png",
        json=f"{STATE_DIR}/agent/resolve_rate.json",
    log:
        "logs/report/agent.log",
    threads: 1
    resources:
        mem_mb=2000,
    params:
        # the exports `trajsft eval --agent --watch` evaluated since: a new one reruns the plot (a point per step)
        steps=W.agent_steps,
    script:
        "../src/trajsft/rules/report_agent.py"
