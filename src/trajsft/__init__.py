"""trajsft: SFT a student on teacher agent trajectories."""

import os

# Ray >= 2.43 notices a driver started under `uv run` and starts its workers with `uv run`
# too, which fails for Levanter's cache-building workers (they start outside the project
# dir). Our environment is already complete: let Ray start plain workers.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
