import os
import sys
from pathlib import Path

# tests run under `uv run pytest`: Ray must not re-launch its workers with `uv run`
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# No test reaches the real Hub, in this process or in the processes it starts (which inherit os.environ). Set
# here, before any test module imports huggingface_hub (which reads both at import), so every test sees the same
# environment whatever the order: the tests that talk to tests/fake_hub.py unset both for their own calls.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# in-process Ray (Levanter's cache builder) starts without token auth unless a test points it at a test head
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

sys.path.insert(0, str(Path(__file__).resolve().parent))

# `trajsft fit` results are shared by every test of one session (and by the processes they start), never with
# the user's ~/.cache/trajsft/fit: the first compile of a setting in a session is a real compile
if "TRAJSFT_FIT_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["TRAJSFT_FIT_CACHE"] = tempfile.mkdtemp(prefix="trajsft-fit-cache-")
    atexit.register(shutil.rmtree, os.environ["TRAJSFT_FIT_CACHE"], True)

pytest_plugins = ["ray_fixtures", "gcs_fixtures", "fit_fixtures", "slice_fixtures"]
