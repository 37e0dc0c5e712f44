# Task sets (config `tasks:`): what a trained student's agent is graded on. Rule make_tasks writes a set's tasks
# (<storage_root>/tasks/<name>-<hash>/: the bug mutations of its crates that pass their controls, and copies of
# the crates), content-addressed by the crates' content, its settings and `cargo --version`. Logic in
# trajsft.tasks.taskset; `trajsft tasks check <name>` prints the same controls.
#
# Needs from rules/common.smk: STATE_DIR, job_resources, payload_location, job_step.


rule make_tasks:
    output:
        f"{STATE_DIR}/tasks/{{name}}/manifest.json",
    log:
        "logs/make_tasks/{name}.log",
    benchmark:
        "benchmarks/make_tasks/{name}.tsv"
    threads: job_resources("tasks").threads
    resources:
        mem_mb=job_resources("tasks").mem_mb,
    params:
        location=payload_location("tasks"),
        step=job_step("make_tasks"),
    script:
        "../src/trajsft/rules/make_tasks.py"
