"""Storage faults between the pipeline and its bucket: a fault-injecting proxy (tests/fault_proxy.py) in
front of fake-gcs-server. gcsfs' retries carry 503s, dropped connections and cut-off uploads; a write
cut off mid-object never leaves an object (GCS uploads are all-or-nothing), so no seal and no manifest."""

from __future__ import annotations

import os
import time

import pytest

from fault_proxy import FaultProxy
from gcs_fixtures import clear_fsspec_cache
from trajsft import io


@pytest.fixture
def proxied(gcs, monkeypatch):
    """(bucket, start(**faults)): the test's bucket reached through a fault proxy."""
    proxies = []

    def start(**faults) -> FaultProxy:
        p = FaultProxy(gcs.emulator.url, **faults).start()
        proxies.append(p)
        for k, v in gcs.emulator.env(p.url).items():
            monkeypatch.setenv(k, v)
        clear_fsspec_cache()
        return p

    yield gcs, start
    for p in proxies:
        p.stop()


def test_writes_and_reads_survive_503s_drops_and_cut_uploads(proxied):
    gcs, start = proxied
    proxy = start(schedule={2: "503", 5: "drop", 8: "cut", 9: "503"})
    blobs = {f"x/{i}.bin": os.urandom(1000 + 997 * i) for i in range(6)}
    for rel, data in blobs.items():
        io.write_bytes(f"{gcs.url}/{rel}", data)
    assert gcs.objects() == blobs  # every object whole: none partial, none missing
    assert {rel: io.read_bytes(f"{gcs.url}/{rel}") for rel in blobs} == blobs
    assert proxy.counts["503"] and proxy.counts["drop"] and proxy.counts["cut"], proxy.counts


def test_an_upload_cut_off_mid_object_leaves_no_object(proxied):
    gcs, start = proxied
    seen: list[dict] = []

    def after_cut(path):
        time.sleep(0.3)  # the server has read the half body and the closed connection
        seen.append(gcs.objects())

    data = b"{" + b" " * 50_000 + b"}"
    proxy = start(pcut=1.0, max_cuts=1, on_cut=after_cut)  # the first upload is cut, gcsfs retries it
    io.write_bytes(f"{gcs.url}/cut/manifest.json", data)
    assert proxy.counts["cut"] == 1 and seen == [{}]  # nothing while cut off
    assert gcs.objects() == {"cut/manifest.json": data}  # then the whole object
