"""Integration: the demo pipeline with a gs:// storage root on fake-gcs-server (real Snakemake, Levanter,
gcsfs and tensorstore against the GCS JSON API), after its data was built under the local root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_utils import env, plan, run
from trajsft import io
from trajsft.train import checkpoints

pytestmark = pytest.mark.integration
DATA = ("raw", "shards", "tokenized")


def files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_demo_built_locally_trained_on_a_bucket_and_back(gcs, tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    root = f"{gcs.url}/trajsft"
    over = {"storage_root": root, "teachers": {"demo": {"training": {"max_steps": 2}}}}  # cheap: 2 steps
    arts = {a["kind"]: a for a in plan(wd, "demo")["artifacts"]}
    manifest = lambda k: json.loads((wd / arts[k]["manifest"]).read_text())  # noqa: E731

    # 1. the data under the local root
    run(wd, arts["tokenized"]["manifest"])
    assert {manifest(k)["payload_from"] for k in DATA} == {"built"}

    # 2. the same config with a gs:// root: the manifests of the local root are not done for it; the
    # sealed local payloads are copied and verified (not recomputed), training reads and writes the bucket
    t = plan(wd, "demo", over)
    assert {a["kind"]: (a["exists"], a["present_at"]) for a in t["artifacts"]} == {
        "raw": (False, [str(wd / "results")]), "shards": (False, [str(wd / "results")]),
        "tokenized": (False, [str(wd / "results")]), "checkpoints": (False, [])}
    run(wd, "checkpoints/demo/done", "results/exports/demo/manifest.json", config=over)
    objs = gcs.objects()
    for k in DATA:
        m, name = manifest(k), arts[k]["name"]
        assert m["location"] == f"{root}/{k}/{name}" and m["payload_from"] == str(wd / arts[k]["location"])
        local = {p: b for p, b in files(wd / arts[k]["location"]).items() if p not in ("manifest.json", "payload.json")}
        assert local and {p: objs[f"trajsft/{k}/{name}/{p}"] for p in local} == local  # byte-identical
    assert manifest("tokenized")["cache_dir"] == f"{root}/tokenized/{arts['tokenized']['name']}/cache-packed"
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert done["checkpoint_dir"] == t["checkpoint_dir"] and done["checkpoint_dir"].startswith(f"{root}/checkpoints/")
    assert done["hf_export"].startswith(done["checkpoint_dir"] + "/hf/step-") and checkpoints.hf_export_complete(done["hf_export"])
    lev = io.read_json(f"{done['checkpoint_dir']}/provenance/config.json")["levanter"]
    assert lev["data"]["cache_dir"] == manifest("tokenized")["cache_dir"]
    assert json.loads((wd / "results/exports/demo/manifest.json").read_text())["location"].startswith(f"{root}/exports/")
    status = subprocess.run([sys.executable, "-m", "trajsft.cli", "status", "demo", "--json", "--configfile",
                             str(wd / "test-overrides.yaml")], capture_output=True, text=True, cwd=wd, env=env())
    [row] = json.loads(status.stdout)
    assert (row["state"], row["hf_export"], row["steps_total"]) == ("done", done["hf_export"], done["steps"])
    t = plan(wd, "demo", over)
    assert all(a["exists"] for a in t["artifacts"]) and t["done_exists"]
    assert {a["kind"]: a["present_at"] for a in t["artifacts"]} == {k: [root, str(wd / "results")] for k in DATA} | {"checkpoints": [root]}
    assert "Nothing to be done" in run(wd, "-n", "checkpoints/demo/done", config=over).stdout

    # 3. back on the local root: the bucket's manifests are not done here either; the local payloads
    # verify and are reused
    dry = run(wd, "-n", arts["tokenized"]["manifest"]).stdout
    assert all(f"rule {r}:" in dry for r in ("download", "shard", "tokenize")), dry
    run(wd, arts["tokenized"]["manifest"])
    for k in DATA:
        assert manifest(k)["location"] == arts[k]["location"]
        assert manifest(k)["payload_from"] == str(wd / arts[k]["location"])
