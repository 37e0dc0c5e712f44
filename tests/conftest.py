import os
import sys
from pathlib import Path

# tests run under `uv run pytest`: Ray must not re-launch its workers with `uv run`
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest_plugins = ["ray_fixtures", "gcs_fixtures"]
