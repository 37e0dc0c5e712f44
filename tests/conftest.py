import os
import sys
from pathlib import Path

# tests run under `uv run pytest`: Ray must not re-launch its workers with `uv run`
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

sys.path.insert(0, str(Path(__file__).resolve().parent))

# `trajsft fit` results are shared by every test of one session (and by the processes they start), never with
# the user's ~/.cache/trajsft/fit: the first compile of a setting in a session is a real compile
if "TRAJSFT_FIT_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["TRAJSFT_FIT_CACHE"] = tempfile.mkdtemp(prefix="trajsft-fit-cache-")
    atexit.register(shutil.rmtree, os.environ["TRAJSFT_FIT_CACHE"], True)

pytest_plugins = ["ray_fixtures", "gcs_fixtures"]
