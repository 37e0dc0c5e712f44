"""The code of each Snakemake rule, one module per rule (``rules/<file>.smk``'s ``script:`` names it): the rule's
typed config, its step and what its job does differently, handed to the harness (:mod:`trajsft.rule_job`). Run by
Snakemake as a script in the rule job's own process (``snakemake`` injected, ``__name__ == "__main__"``);
importable for tests. Each imports its own step only: a job pays no other step's imports."""
