"""``worker_process_setup_hook`` of the training job: runs in every Ray worker of the job.

Levanter's ``run_on_pod`` asks the GCE metadata server whether the TPU VM is being preempted
(``levanter.infra.tpus.get_current_tpu_is_preempted``: no timeout, and it *raises* when the
server cannot be reached, e.g. on GKE or any non-GCE Ray node). ``SliceActor.healthy`` and the
error handler of ``run_on_pod`` call it, so off GCE every health check "fails". We replace it
with the same query, bounded by a timeout, answering False where there is no metadata server.

The replacement is made when ``levanter.infra.tpus`` is imported, not by importing it: most of a
job's workers (the driver's channel, the host tasks, Ray's spare workers) never use Levanter, and
importing it (all of ``levanter``: JAX, datasets, equinox) costs each of them about 3 CPU-seconds
and a few hundred MB.

The workers that do use it mostly schedule: the driver calls ``run_on_pod``, and the workers of its task,
its slice actors and its host actors run code of ``levanter.infra.ray_tpu``. That module needs none of
the ML stack, but importing it runs ``levanter/__init__.py``, which imports all of it. ``setup`` makes the
``levanter`` package lazy: its ``__init__`` runs on the first import of a module outside
:data:`SCHEDULING_MODULES`, or the first attribute asked of the package that is not a submodule, so a
process that only schedules never runs it, and any other sees the package exactly as before. Measured
here: ``import levanter.infra.ray_tpu`` takes 0.5 CPU-s this way, 3.5 without.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
import types
from typing import Callable

log = logging.getLogger(__name__)

TARGET = "levanter.infra.tpus"
PACKAGE = "levanter"
# what run_on_pod's processes import of Levanter: imported without the package's __init__
SCHEDULING_MODULES = frozenset({"levanter.infra", "levanter.infra.ray_tpu", "levanter.infra.docker",
                                "levanter.infra.tpus", "levanter.utils", "levanter.utils.ray_utils"})


def gce_preempted(timeout_s: float = 2.0) -> bool:
    """True iff the GCE metadata server says this VM is being preempted (no server here: False, and the
    next calls do not ask again; :func:`trajsft.gce.metadata`)."""
    from .. import gce

    return gce.metadata("instance/preempted", timeout_s=timeout_s) == "TRUE"


def patch(tpus: types.ModuleType) -> None:
    tpus.get_current_tpu_is_preempted = gce_preempted


class _Loader(importlib.abc.Loader):
    """The module's own loader, then ``after(module)``."""

    def __init__(self, loader: importlib.abc.Loader, after: Callable[[types.ModuleType], None]):
        self.loader, self.after = loader, after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.after(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self.loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` with the other finders and has ``after(module)`` run once the module has executed."""

    def __init__(self, name: str, after: Callable[[types.ModuleType], None]):
        self.name, self.after = name, after

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:  # as the import system would without this finder (e.g. an editable install's)
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, self.after)
        return spec


def after_import(name: str, after: Callable[[types.ModuleType], None]) -> None:
    """Run ``after(module)`` on module ``name`` now if it is imported, else right after its import."""
    if name in sys.modules:
        after(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, after))


class _LazyPackage(importlib.abc.MetaPathFinder):
    """Runs the package's ``__init__`` before the first import of one of its modules not in ``light``."""

    def __init__(self, module: types.ModuleType, light: frozenset[str]):
        self.module, self.light, self.done = module, light, False

    def init(self) -> None:
        if self.done:
            return
        self.done = True
        self.module.__dict__.pop("__getattr__", None)
        try:
            self.module.__spec__.loader.exec_module(self.module)
        except BaseException:
            sys.modules.pop(self.module.__name__, None)  # as a failed import leaves it: the next import retries
            raise

    def find_spec(self, fullname, path, target=None):
        if not self.done and fullname.startswith(self.module.__name__ + ".") and fullname not in self.light:
            self.init()
        return None  # the other finders find it


def lazy_package(name: str, light: frozenset[str]) -> None:
    """Put package ``name`` in ``sys.modules`` without running its ``__init__``, which runs before the first
    import of one of its modules not in ``light``, or on the first attribute of the package that is not set."""
    if name in sys.modules or any(isinstance(f, _LazyPackage) and f.module.__name__ == name for f in sys.meta_path):
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # not installed (the hook must not fail a worker for it), or not a package
    module = importlib.util.module_from_spec(spec)
    finder = _LazyPackage(module, light)

    def __getattr__(attr: str):
        finder.init()
        return getattr(module, attr)

    module.__getattr__ = __getattr__
    sys.modules[name] = module
    sys.meta_path.insert(0, finder)


def ray_tpu() -> types.ModuleType:
    """``levanter.infra.ray_tpu`` (TPU types, ``run_on_pod``) for a process that schedules: imported with the
    ``levanter`` package lazy, as :func:`setup` makes it (Snakemake's preflight and a rule's launcher read a slice's
    hosts and chips from it: 0.5 CPU-s, not 2.5 with JAX)."""
    lazy_package(PACKAGE, SCHEDULING_MODULES)
    import levanter.infra.ray_tpu

    return levanter.infra.ray_tpu


def setup() -> None:
    lazy_package(PACKAGE, SCHEDULING_MODULES)
    after_import(TARGET, patch)
