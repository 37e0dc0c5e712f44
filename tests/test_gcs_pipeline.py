"""Integration: the demo pipeline with a gs:// storage root on fake-gcs-server (real Snakemake, Levanter,
gcsfs and tensorstore against the GCS JSON API), after its data was built under the local root."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline_utils import env, plan, run, train_and_watch
from trajsft import io
from trajsft.train import checkpoints

pytestmark = pytest.mark.integration
DATA = ("raw", "shards", "tokenized")
TWO_STEPS = {"teachers": {"demo": {"training": {"max_steps": 2}}}}  # the gs:// runs' training (cheap)


def files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    """The demo's data built under the local root: (workdir, {kind: plan row})."""
    wd = tmp_path_factory.mktemp("local")
    arts = {a["kind"]: a for a in plan(wd, "demo")["artifacts"]}
    run(wd, arts["tokenized"]["manifest"])
    return wd, arts


def payload_files(wd: Path, art: dict) -> dict[str, bytes]:
    return {p: b for p, b in files(wd / art["location"]).items() if p not in ("manifest.json", "payload.json")}


def test_demo_built_locally_trained_on_a_bucket_and_back(gcs, local_data):
    wd, arts = local_data
    root = f"{gcs.url}/trajsft"
    over = {"storage_root": root, **TWO_STEPS,
            "eval": {"targets": ["demo"]}}  # the matrix of the demo on its held-out split (no hash changes)
    manifest = lambda k: json.loads((wd / arts[k]["manifest"]).read_text())  # noqa: E731

    # 1. the data under the local root
    assert {manifest(k)["payload_from"] for k in DATA} == {"built"}

    # 2. the same config with a gs:// root: the manifests of the local root are not done for it; the
    # sealed local payloads are copied and verified (not recomputed), training reads and writes the bucket
    t = plan(wd, "demo", over)
    assert {a["kind"]: (a["exists"], a["present_at"]) for a in t["artifacts"]} == {
        "raw": (False, [str(wd / "results")]), "shards": (False, [str(wd / "results")]),
        "tokenized": (False, [str(wd / "results")]), "checkpoints": (False, []), "exports": (False, []),
        "evals": (False, []), "tasks": (False, []), "agent": (False, [])}
    # the training, with `trajsft eval demo --actions --watch` beside it scoring each HF export from the bucket into
    # the bucket; then `all`: the next-action scores, the report (cards, table, curves, next actions) and the eval
    # matrix; plus the export rule
    watched = train_and_watch(wd, over, wd / "train-gs.log")
    steps = [r["step"] for r in watched]  # two steps: one HF export (Levanter exports none at step 0)
    assert steps == [1] and all(r["splits"]["demo"]["turns"] == 7 for r in watched), watched
    run(wd, "all", "results/exports/demo/manifest.json", config=over)
    objs = gcs.objects()
    for k in DATA:
        m, name = manifest(k), arts[k]["name"]
        assert m["location"] == f"{root}/{k}/{name}" and m["payload_from"] == str(wd / arts[k]["location"])
        local = payload_files(wd, arts[k])
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
    # the report and the eval matrix read the run from the bucket
    card = json.loads((wd / "results/cards/demo/card.json").read_text())
    assert card["rows_in"] == 60 and card["kept_total"] > 0 and card["tokens"]["per_split"]["train"]["chats"] > 0
    assert (wd / "results/curves/demo.png").stat().st_size > 0 and (wd / "results/cards/teachers.html").exists()
    matrix = json.loads((wd / "results/eval/matrix.json").read_text())
    assert matrix["models"]["demo"]["path"].startswith(done["checkpoint_dir"] + "/"), matrix["models"]
    assert math.isfinite(matrix["cells"]["demo"]["demo"]["loss"]) and matrix["cells"]["demo"]["demo"]["tokens"] > 0
    # the student's next actions: the model and the held-out chats read from the bucket, the scores written there
    evals = json.loads((wd / "evals/demo/done").read_text())
    assert evals["location"].startswith(f"{root}/evals/demo-") and evals["model"] == Path(done["checkpoint_dir"]).name
    assert evals["source"]["path"].startswith(done["checkpoint_dir"] + "/")
    assert (evals["splits"]["demo"]["turns"], evals["splits"]["demo"]["skipped_no_room"]) == (7, 1)  # 1 fills seq_len
    assert io.read_json(f"{evals['location']}/actions.json")["splits"] == evals["splits"]
    from trajsft.report import actions

    assert list(actions.evaluated_steps(evals["location"])) == steps  # the watched steps, on the bucket
    assert steps[-1] == int(done["hf_export"].rsplit("step-", 1)[1])
    assert {r["model"] for r in watched} == {evals["model"]}
    t = plan(wd, "demo", over)
    built = [a for a in t["artifacts"] if a["kind"] not in ("tasks", "agent")]  # the agent evaluation: not asked for
    assert all(a["exists"] for a in built) and t["done_exists"]
    assert {a["kind"]: a["present_at"] for a in built} == (
        {k: [root, str(wd / "results")] for k in DATA} | {"checkpoints": [root], "exports": [root], "evals": [root]})
    assert "Nothing to be done" in run(wd, "-n", "checkpoints/demo/done", config=over).stdout

    # 3. back on the local root: the bucket's manifests are not done here either; the local payloads
    # verify and are reused, and the trained weights are copied from the bucket, not trained again
    local_over = {"teachers": over["teachers"]}
    dry = run(wd, "-n", "checkpoints/demo/done", config=local_over).stdout
    assert all(f"rule {r}:" in dry for r in ("download", "shard", "tokenize", "train")), dry
    run(wd, "checkpoints/demo/done", config=local_over)
    for k in DATA:
        assert manifest(k)["location"] == arts[k]["location"]
        assert manifest(k)["payload_from"] == str(wd / arts[k]["location"])
    t = plan(wd, "demo", local_over)
    local_done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert local_done["checkpoint_dir"] == t["checkpoint_dir"] and local_done["steps"] == done["steps"]
    assert (wd / done["log"]).read_text().count("[trajsft.levanter_run] launch train_lm") == 1  # the bucket's run only
    hf = wd / local_done["hf_export"]
    assert checkpoints.hf_export_complete(str(hf))
    prefix = done["hf_export"].split("/", 3)[3] + "/"
    assert files(hf) == {p[len(prefix):]: b for p, b in gcs.objects().items() if p.startswith(prefix)}


def test_a_student_snapshotted_onto_the_bucket_tokenizes_and_trains_from_it(gcs, local_data, tmp_path):
    """The student's checkpoint and tokenizer snapshotted from the (fake) Hub onto the bucket (rule download_model):
    the tokenize rule reads the tokenizer from the gs:// snapshot, Levanter initialises from it and takes its
    tokenizer there, with the Hub still reachable and asked nothing more; the token counts are those of the same
    tokenizer files read locally."""
    import tiny_hf_model
    from fake_hub import FakeHub, Repo
    from test_model_snapshot import REPO_ID, SHA, student_config
    from trajsft.plan import config as C

    local_wd, local_arts = local_data
    wd = tmp_path / "wd"
    wd.mkdir()
    root = f"{gcs.url}/snapshot"
    cfg = student_config(root)
    cfg["students"]["tiny-hf"].update(tokenizer=REPO_ID, tokenizer_revision=SHA)  # the checkpoint's own
    cfg["teachers"]["demo"]["training"] = {"max_steps": 2}
    cfg["copy_from"] = [str(local_wd / "results")]  # the raw and shard payloads: copied, not rebuilt
    tok_files = {f.name: f.read_bytes() for f in (C.REPO_DIR / "demo/tokenizer").iterdir()}
    h = FakeHub({REPO_ID: Repo(SHA, {**tiny_hf_model.files(), **tok_files})}).start()
    try:
        arts = {a["kind"]: a for a in plan(wd, "demo", cfg)["artifacts"]}
        snap = arts["models"]["location"]
        assert snap.startswith(f"{root}/models/"), snap
        online = {**h.env(), "HF_HOME": str(tmp_path / "hf-home")}
        run(wd, arts["models"]["manifest"], config=cfg, extra_env=online)
        asked = len(h.requests)
        assert asked >= 4 and io.exists(f"{snap}/tokenizer.json") and io.exists(f"{snap}/model.safetensors")
        run(wd, "checkpoints/demo/done", config=cfg, extra_env=online)
        assert h.requests[asked:] == []  # everything after the snapshot read it from the bucket
    finally:
        h.stop()
    tok = json.loads((wd / arts["tokenized"]["manifest"]).read_text())
    assert tok["tokenizer"] == snap and tok["location"].startswith(f"{root}/tokenized/")
    local_tok = json.loads((local_wd / local_arts["tokenized"]["manifest"]).read_text())
    same = lambda m: {s: (m["stats"][s]["lengths"], m["stats"][s]["assistant_lengths"]) for s in ("train", "validation")}  # noqa: E731
    assert same(tok) == same(local_tok)  # the same tokenizer files: every chat the same length
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    lev = io.read_json(f"{done['checkpoint_dir']}/provenance/config.json")["levanter"]
    assert lev["initialize_from_hf"] == lev["model"]["reference_checkpoint"] == lev["data"]["tokenizer"] == snap
    assert done["steps"] == 2 and checkpoints.hf_export_complete(done["hf_export"])


def clean_weights(ref: Path) -> dict[str, bytes]:
    """The HF export of the demo's 2-step training under the local root, without faults: the one the
    first test copied back from its bucket, else trained here."""
    t = plan(ref, "demo", TWO_STEPS)
    done = ref / "checkpoints/demo/done"
    if not (done.exists() and json.loads(done.read_text())["hash"] == t["checkpoint_dir"].rsplit("-", 1)[1]):
        run(ref, "checkpoints/demo/done", config=TWO_STEPS)
    return files(ref / json.loads(done.read_text())["hf_export"])


def test_demo_built_and_trained_through_storage_faults_is_byte_identical(gcs, local_data, tmp_path, monkeypatch):
    """The demo (download -> shards -> cache -> 2 training steps -> HF export) on a bucket behind the fault
    proxy (every 23rd request answered 503, every 37th dropped after the server acted, one 8 s stall), in a
    workdir that knows no other root: built, not copied, and every payload object is the local build's,
    byte for byte (our cache stats record: but for the locations it names), the HF weights too."""
    from fault_proxy import FaultProxy
    from gcs_fixtures import clear_fsspec_cache

    ref, arts = local_data
    weights = clean_weights(ref)
    proxy = FaultProxy(gcs.emulator.url, every={"503": 23, "drop": 37}, stall_at=40, stall_s=8.0).start()
    try:
        for k, v in gcs.emulator.env(proxy.url).items():
            monkeypatch.setenv(k, v)
        clear_fsspec_cache()
        wd = tmp_path / "faults"
        wd.mkdir()
        t0 = time.monotonic()
        over = {"storage_root": f"{gcs.url}/trajsft", **TWO_STEPS}
        run(wd, arts["tokenized"]["manifest"], config=over)
        data_seconds = time.monotonic() - t0
        data_counts, data_requests = dict(proxy.counts), proxy.requests
        run(wd, "checkpoints/demo/done", config=over)
        seconds = time.monotonic() - t0
    finally:
        proxy.stop()
    print(f"storage faults: data rules {data_counts} of {data_requests} requests in {data_seconds:.0f}s; with "
          f"training and HF export {dict(proxy.counts)} of {proxy.requests} requests in {seconds:.0f}s")
    assert data_counts["503"] >= 3 and data_counts["drop"] >= 2 and data_counts["stall"] == 1, data_counts
    assert proxy.counts["503"] > data_counts["503"] and proxy.counts["drop"] > data_counts["drop"], proxy.counts
    done = json.loads((wd / "checkpoints/demo/done").read_text())
    assert done["steps"] == 2 and done["hf_export"].startswith(f"{gcs.url}/trajsft/checkpoints/")
    prefix = done["hf_export"].split("/", 3)[3] + "/"
    assert {p[len(prefix):]: b for p, b in gcs.objects().items() if p.startswith(prefix)} == weights
    objs = gcs.objects()
    for k in DATA:
        m = json.loads((wd / arts[k]["manifest"]).read_text())
        assert m["payload_from"] == "built" and m["location"] == f"{gcs.url}/trajsft/{k}/{arts[k]['name']}"
        local = payload_files(ref, arts[k])
        prefix = f"trajsft/{k}/{arts[k]['name']}/"
        there = {p[len(prefix):]: b for p, b in objs.items() if p.startswith(prefix)}
        # byte-identical, but for our cache stats record, which names the cache's and shards' locations
        stats = {p for p in local if p.endswith("trajsft_cache_stats.json")}
        assert {p: there.get(p) for p in set(local) - stats} == {p: local[p] for p in set(local) - stats}, k
        for p in stats:
            b = there[p].replace(f"{gcs.url}/trajsft/".encode(), b"ROOT/")
            a = local[p].replace(f"{ref}/results/".encode(), b"ROOT/").replace(b'"results/', b'"ROOT/')
            assert a == b, p
        assert set(there) - set(local) <= {"manifest.json", "payload.json"}, k
