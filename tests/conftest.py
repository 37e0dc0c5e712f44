import os
import sys
import warnings
from pathlib import Path

import pytest

# tests run under `uv run pytest`: Ray must not re-launch its workers with `uv run`
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# No test reaches the real Hub, in this process or in the processes it starts (which inherit os.environ). Set
# here, before any test module imports huggingface_hub (which reads both at import), so every test sees the same
# environment whatever the order: the tests that talk to tests/fake_hub.py unset both for their own calls.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# JAX in this process (and its children) uses the CPU, as on the machine the suite runs on: libtpu (installed for
# `trajsft fit`) has no TPU to find here; where it is loaded in-process it writes TPU_* variables into os.environ,
# inherited by every training a later test starts (the guard below puts them back and names the test)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No test reaches the real W&B either: preflight asks W&B for the key of an online profile, here at a loopback port
# where nothing listens (refused at once); the W&B tests point WANDB_BASE_URL at tests/wandb_stub.py
os.environ["WANDB_BASE_URL"] = "http://127.0.0.1:9"
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

pytest_plugins = ["ray_fixtures", "gcs_fixtures", "fit_fixtures", "slice_fixtures", "checkout_guard"]

# what a TPU VM's variables say is decided by each test for its own children, never left behind: a test that leaves
# a TPU_* variable in os.environ (libtpu writes TPU_WORKER_ID where it finds no TPU) is named, and the variable goes.
# So does WANDB_SERVICE: the W&B SDK's token for its wandb-core service, which every child process inherits and joins
# (a trainer killed and relaunched under this worker's service then finds its run's id "in use")
_KEPT = ("TPU_", "WANDB_SERVICE")
_TPU_ENV = {k: v for k, v in os.environ.items() if k.startswith(_KEPT)}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        now = {k: v for k, v in os.environ.items() if k.startswith(_KEPT)}
        if now != _TPU_ENV:
            for k in now.keys() - _TPU_ENV.keys():
                del os.environ[k]
            os.environ.update(_TPU_ENV)
            changed = {k: now.get(k) for k in now.keys() | _TPU_ENV.keys() if now.get(k) != _TPU_ENV.get(k)}
            warnings.warn(f"{item.nodeid} left {changed} in os.environ (put back as the session began)")


# `pytest -n 2` (the README's command): the two emulated-slice modules share one Ray cluster
# (tests/slice_fixtures.py), so they run on one worker, sent first as they take the longest; every other
# module goes whole (its module fixtures built once) to whichever worker is free
SLICE_MODULES = ("tests/test_multihost.py", "tests/test_tpu_profile.py")


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SlicesFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "slices" if module in SLICE_MODULES else module

        def _assign_work_unit(self, node) -> None:
            if "slices" in self.workqueue:
                self.workqueue.move_to_end("slices", last=False)
            super()._assign_work_unit(node)

    return SlicesFirst(config, log)

