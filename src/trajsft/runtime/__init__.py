"""What every step's process shares at run time, below the steps themselves: tying a rule job to its Snakemake
run (:mod:`trajsft.runtime.signals`), recording a run's provenance and attempts (:mod:`trajsft.runtime.provenance`),
and reading the Hugging Face Hub at a pinned revision (:mod:`trajsft.runtime.hub`)."""
