"""Preflight's storage probe against a GCS-compatible endpoint (fake-gcs-server): no DNS lookup of
storage.googleapis.com when the client is pointed elsewhere, one line in seconds when it cannot write."""

from __future__ import annotations

import time

import fsspec.config
import pytest

from gcs_fixtures import clear_fsspec_cache, free_port
from trajsft import storage
from trajsft.cluster import preflight as P


@pytest.fixture
def no_dns(monkeypatch):
    def resolves(host, timeout_s):
        raise AssertionError(f"preflight looked up {host} although a custom endpoint is set")

    monkeypatch.setattr(storage, "resolves", resolves)


def test_emulator_bucket_passes_without_dns_and_leaves_nothing(gcs, no_dns):
    assert storage.custom_endpoint(f"{gcs.url}/trajsft") == (gcs.emulator.url, "STORAGE_EMULATOR_HOST")
    assert storage.probe_write(f"{gcs.url}/trajsft", 20) is None
    assert gcs.objects() == {}  # the probe object was removed


def test_fsspec_endpoint_url_is_honoured(gcs, no_dns, monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    monkeypatch.setitem(fsspec.config.conf, "gcs", {"endpoint_url": gcs.emulator.url, "token": "anon"})
    clear_fsspec_cache()
    assert storage.custom_endpoint(gcs.url) == (gcs.emulator.url, "fsspec gcs.endpoint_url")
    assert storage.probe_write(gcs.url, 20) is None


def test_missing_bucket_is_one_line_in_seconds(gcs, no_dns):
    t0 = time.monotonic()
    [line] = P.preflight(f"http://127.0.0.1:{free_port()}", [], {}, "gs://no-such-bucket-here/trajsft", timeout_s=3)[1:]
    assert time.monotonic() - t0 < 10
    assert line == f"storage root gs://no-such-bucket-here/trajsft is not writable: no bucket no-such-bucket-here at {gcs.emulator.url}"


def test_unreachable_endpoint_is_one_line_in_seconds(monkeypatch, no_dns):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    clear_fsspec_cache()
    t0 = time.monotonic()
    err = storage.probe_write("gs://b/trajsft", 20)
    assert time.monotonic() - t0 < 5
    assert err.startswith(f"storage root gs://b/trajsft unreachable: cannot connect to {url} (set by "
                          "STORAGE_EMULATOR_HOST): ") and "\n" not in err, err


def test_a_bucket_in_another_region_than_the_profiles_zone_is_one_line(gcs, no_dns):
    """The emulator's buckets are in US-CENTRAL1 (as the GCS JSON API says of a one-region bucket)."""
    root = f"{gcs.url}/trajsft"
    assert storage.probe_write(root, 20, zone="us-central1-a") is None
    assert storage.probe_write(root, 20, zone="us-central1") is None  # a region names every zone of it
    assert storage.probe_write(root, 20, zone="us-east5-a") == (
        f"storage root {root} is in US-CENTRAL1 (its bucket's location), but this profile's cluster is in us-east5-a "
        "(ray.zone): every read and checkpoint would cross regions; use a bucket in us-east5, nothing was submitted")
    assert storage.bucket_problem(root, "us-east5-a", "US", "multi-region") is None  # no one region's
    assert gcs.objects() == {}


def test_a_probe_whose_delete_answer_is_lost_passes(gcs, no_dns, monkeypatch):
    """Every second request is done by the server but its answer dropped: the upload's retry, or the delete's retry
    finding the object gone (404), is no "no bucket" (a Snakemake run's start refused a bucket behind faults)."""
    from fault_proxy import FaultProxy
    from gcs_fixtures import clear_fsspec_cache

    proxy = FaultProxy(gcs.emulator.url, every={"drop": 2}).start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        clear_fsspec_cache()
        assert storage.probe_write(f"{gcs.url}/trajsft", 20) is None
        assert proxy.counts["drop"] >= 1, proxy.counts
    finally:
        proxy.stop()
    assert gcs.objects() == {}
