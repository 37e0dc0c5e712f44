"""trajsft.io on gs:// paths against the real GCS JSON API (fake-gcs-server, tests/gcs_fixtures.py)."""

from __future__ import annotations

import json

import pytest

from trajsft import io


def test_write_read_json_bytes_and_exists(gcs):
    p = io.join(gcs.url, "trajsft", "raw", "demo-0123456789", "manifest.json")
    assert p == f"{gcs.url}/trajsft/raw/demo-0123456789/manifest.json"
    assert not io.exists(p)
    io.write_json(p, {"b": 1, "a": [1, 2]})
    assert io.exists(p)
    assert io.read_json(p) == {"a": [1, 2], "b": 1}
    # the manifests' own format (sorted keys, final newline), byte for byte in the bucket's backend
    assert gcs.objects()["trajsft/raw/demo-0123456789/manifest.json"] == b'{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    io.write_bytes(p, b"\x00\x01")  # overwrite: the object is replaced whole
    assert io.read_bytes(p) == b"\x00\x01"


def test_a_json_object_rewritten_longer_is_read_whole(gcs):
    """status reads attempts.json while the driver rewrites it: a read never mixes an old size with new bytes
    (gcsfs' open() takes the size it listed before, then reads that many bytes of whatever is there now)."""
    import gcsfs

    p = io.join(gcs.url, "run", "attempts.json")
    io.write_json(p, [{"attempt": 1}])
    io.filesystem(p).ls(f"{gcs.name}/run", detail=True)  # the listing (with the old size) is cached
    other = gcsfs.GCSFileSystem(skip_instance_cache=True)  # the driver, another process
    with other.open(f"{gcs.name}/run/attempts.json", "w") as f:
        f.write(json.dumps([{"attempt": 1, "slice_attempts": [{"slice_attempt": n} for n in range(5)]}]))
    assert len(io.read_json(p)[0]["slice_attempts"]) == 5


def test_failed_write_leaves_no_object(gcs):
    p = f"{gcs.url}/x/manifest.json"
    with pytest.raises(TypeError):
        io.write_json(p, {"not json": object()})
    assert not io.exists(p) and gcs.objects() == {}
    io.write_json(p, {"v": 1})
    with pytest.raises(TypeError):
        io.write_json(p, {"v": object()})
    assert io.read_json(p) == {"v": 1}  # the old object is untouched


def test_put_tree_and_glob(gcs, tmp_path):
    src = tmp_path / "tree"
    (src / "a" / "b").mkdir(parents=True)
    (src / "top.txt").write_text("top")
    (src / "a" / "b" / "deep.bin").write_bytes(bytes(range(256)) * 40)
    dest = f"{gcs.url}/run/hf/step-3"
    io.put_tree(src, dest)
    assert gcs.objects() == {"run/hf/step-3/top.txt": b"top", "run/hf/step-3/a/b/deep.bin": bytes(range(256)) * 40}
    assert io.glob(f"{gcs.url}/run/hf/*/top.txt") == [f"{dest}/top.txt"]
    assert io.glob(f"{gcs.url}/run/**/*.bin") == [f"{dest}/a/b/deep.bin"]
    assert io.glob(f"{gcs.url}/nothing/*") == []
    assert io.exists(dest)  # a "directory" is a prefix in a bucket
    assert json.loads(json.dumps(io.filesystem(dest).ls(f"{gcs.url}/run/hf"))) == [f"{gcs.name}/run/hf/step-3"]
    io.get_tree(dest + "/", tmp_path / "back")  # and back, as an agent evaluation's host reads its task set
    assert sorted(str(p.relative_to(tmp_path / "back")) for p in (tmp_path / "back").rglob("*") if p.is_file()) == \
        ["a/b/deep.bin", "top.txt"]
    assert (tmp_path / "back" / "a" / "b" / "deep.bin").read_bytes() == bytes(range(256)) * 40


def test_emulator_is_stopped_by_its_pid(tmp_path):
    import psutil
    from gcs_fixtures import start_gcs

    emu = start_gcs(tmp_path / "data")
    assert psutil.Process(emu.pid).cmdline()[:3] == [str(emu.proc.args[0]), "-scheme", "http"]
    emu.stop()
    assert emu.proc.poll() is not None and not psutil.pid_exists(emu.pid)
