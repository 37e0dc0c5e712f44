"""Real tasks (issue 71, parts 1 and 2): SWE-smith-rs instances read from their Hub dataset at its pinned revision (a
fake Hub on loopback), the held-out repositories a setting, each instance graded in the docker image it names (a
locally made image in SWE-smith's shape: the repository at /testbed; tests/docker_fixtures.py), with no network and
bubblewrap's limits; a failed pull is one line, counted per task."""

from __future__ import annotations

import io as _io
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import required
from fake_hub import FakeHub, Repo, point_this_process
from test_tasks import diff_of
from trajsft.errors import ConfigError, DataError
from trajsft.plan import config as C
from trajsft.plan import step_configs, toolchain
from trajsft.tasks import docker
from trajsft.tasks import grade as G
from trajsft.tasks import sandbox as S
from trajsft.tasks.record import RUST_TEST_CMD

CRATE = C.REPO_DIR / "tasks" / "demo" / "crates" / "mini_math"
DATASET, SHA = "SWE-bench/SWE-smith-rs", "5f3c0e8a" * 5
HELD, OTHER = "swesmith/rust-demo__mini_math.1f2e3d4c", "swesmith/rust-demo__other.0a0b0c0d"  # SWE-smith's mirrors
MISSING_IMAGE = "swesmith-missing/mini_math:0"  # no registry here: its pull fails
CLAMP = ["tests::clamp_below", "tests::clamp_above", "tests::clamp_inside"]


def bug_patch() -> str:
    """SWE-smith's kind of bug: an operator flipped in add (the add test fails, the clamp tests keep passing)."""
    return diff_of({"    a + b\n": "    a - b\n"}, CRATE)


def rows(image: str) -> list[dict]:
    """Instance rows as SWE-smith's HF dataset holds them (test lists as JSON text): one of the held-out repo in
    ``image``, one whose image cannot be pulled, one malformed, and one of a repo not held out."""
    base = {"repo": HELD, "patch": bug_patch(), "FAIL_TO_PASS": json.dumps(["tests::add_two"]),
            "PASS_TO_PASS": json.dumps(CLAMP), "problem_statement": "add subtracts\n\nadd(2, 3) is -1, not 5.",
            "image_name": image, "created_at": "2025-05-01T00:00:00"}
    return [{**base, "instance_id": "rust-demo__mini_math.1f2e3d4c.func_pm_op_flip__a1"},
            {**base, "instance_id": "rust-demo__mini_math.1f2e3d4c.func_pm_op_flip__b2", "image_name": MISSING_IMAGE},
            {**base, "instance_id": "rust-demo__mini_math.1f2e3d4c.func_pm_op_flip__c3", "FAIL_TO_PASS": "[oops"},
            {**base, "instance_id": "rust-demo__other.0a0b0c0d.func_pm_op_flip__d4", "repo": OTHER}]


def parquet(table_rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = _io.BytesIO()
    pq.write_table(pa.Table.from_pylist(table_rows), buf)
    return buf.getvalue()


def hub(image: str) -> FakeHub:
    files = {"data/train-00000-of-00001.parquet": parquet(rows(image)), "README.md": b"# SWE-smith-rs\n"}
    return FakeHub({}, datasets={DATASET: Repo(SHA, files)}).start()


def entry(**over) -> dict:
    return {"dataset": DATASET, "revision": SHA, "held_out_repos": [HELD], **over}


def plan(tmp_path, **over) -> C.Plan:
    return C.Plan(C.load(None, {"storage_root": str(tmp_path / "store"), "tasks": {"rs": entry(**over)}}),
                  base_dir=C.REPO_DIR, state_dir=str(tmp_path / "results"))


# ---- the config: one line for what is missing ----------------------------------------------------------------------
@pytest.mark.parametrize("value, line", [
    ({"dataset": DATASET, "held_out_repos": [HELD]},
     f"config: tasks.rs: dataset {DATASET} needs revision: the commit sha its instances are read at (pinned: the "
     "tasks never change under a hash)"),
    ({"dataset": DATASET, "revision": SHA},
     f"config: tasks.rs: dataset {DATASET} needs held_out_repos: the repositories whose instances are graded (those "
     "held out of training)"),
    ({"dataset": DATASET, "revision": SHA, "held_out_repos": [HELD], "crates": "tasks/demo/crates"},
     "config: tasks.rs: give crates (a directory of crates: their bug mutations) or dataset (SWE-smith instances on "
     "the Hub), one of them"),
    ({"crates": "tasks/demo/crates", "max_tasks": 3}, "config: tasks.rs: max_tasks go with dataset, not crates"),
])
def test_a_dataset_task_set_needs_its_revision_and_held_out_repos(value, line):
    with pytest.raises(ConfigError) as e:
        C.load(None, {"tasks": {"rs": value}})
    assert str(e.value) == line


def test_a_dataset_sets_identity_is_the_dataset_revision_and_repos_not_this_hosts_cargo(tmp_path, monkeypatch):
    art = plan(tmp_path).task_set("rs")
    assert art.inputs["toolchain"] == toolchain.IMAGES and art.name.startswith("rs-")
    assert art.inputs["dataset"] == {"hub": DATASET, "revision": SHA} and art.inputs["held_out_repos"] == [HELD]
    monkeypatch.setattr(toolchain, "cargo_version", lambda: "cargo 0.1")  # the images' toolchain, not ours
    assert plan(tmp_path).task_set("rs").hash == art.hash
    hashes = {plan(tmp_path, **o).task_set("rs").hash for o in
              ({"revision": "0" * 40}, {"held_out_repos": [HELD, OTHER]}, {"max_tasks": 1})}
    assert art.hash not in hashes and len(hashes) == 3
    cfg = step_configs.make_tasks(plan(tmp_path, max_tasks=2), plan(tmp_path, max_tasks=2).task_set("rs").name)
    assert (cfg.crates, cfg.dataset, cfg.revision, cfg.held_out_repos, cfg.max_tasks) == (None, DATASET, SHA, (HELD,), 2)


# ---- the instances from the Hub ------------------------------------------------------------------------------------
def test_instances_of_the_held_out_repos_are_read_at_the_pinned_revision(tmp_path, monkeypatch, caplog):
    from trajsft.tasks import taskset

    from huggingface_hub.utils._http import reset_sessions

    h = hub("local/image:1")
    try:
        point_this_process(h, monkeypatch, str(tmp_path / "hf-cache"))
        p = plan(tmp_path)
        cfg = step_configs.make_tasks(p, p.task_set("rs").name)
        made, sha = taskset.instances(cfg, tmp_path / "dl")
        assert sha == SHA
        assert [t.instance_id for t in made.tasks] == [r["instance_id"] for r in rows("x")[:2]]  # by instance_id
        assert {t.image_name for t in made.tasks} == {"local/image:1", MISSING_IMAGE}
        assert made.tasks[0].FAIL_TO_PASS == ("tests::add_two",) and made.tasks[0].test_cmd == RUST_TEST_CMD
        assert dict(made.dropped) == {"malformed row": 1}  # counted, and said in one line naming file, row, field
        assert (f"{DATASET}@{SHA}:data/train-00000-of-00001.parquet row 3: field FAIL_TO_PASS: not a JSON list of "
                "test names") in caplog.text
        assert {p for _, p in h.requests} >= {f"/api/datasets/{DATASET}/revision/{SHA}",
                                              f"/datasets/{DATASET}/resolve/{SHA}/data/train-00000-of-00001.parquet"}
        # the repository a mirror stands for names the same instances
        upstream = step_configs.make_tasks(plan(tmp_path, held_out_repos=["rust-demo/mini_math"]),
                                           plan(tmp_path, held_out_repos=["rust-demo/mini_math"]).task_set("rs").name)
        assert [t.row() for t in taskset.instances(upstream, tmp_path / "dlu")[0].tasks] == [t.row() for t in made.tasks]
        first = step_configs.make_tasks(plan(tmp_path, max_tasks=1), plan(tmp_path, max_tasks=1).task_set("rs").name)
        made, _ = taskset.instances(first, tmp_path / "dl1")
        assert len(made.tasks) == 1 and dict(made.dropped) == {"malformed row": 1, "beyond max_tasks": 1}
        nobody = step_configs.make_tasks(plan(tmp_path, held_out_repos=["swesmith/nope.0"]),
                                         plan(tmp_path, held_out_repos=["swesmith/nope.0"]).task_set("rs").name)
        with pytest.raises(DataError) as e:
            taskset.instances(nobody, tmp_path / "dl2")
        assert str(e.value) == (f"{DATASET}@{SHA}: no instance of held-out repo swesmith/nope.0 in its 4 rows "
                                "(config tasks.rs.held_out_repos)")
        wrong = step_configs.make_tasks(plan(tmp_path, revision="0" * 40), plan(tmp_path, revision="0" * 40)
                                        .task_set("rs").name)
        with pytest.raises(DataError) as e:
            taskset.instances(wrong, tmp_path / "dl3")
        assert str(e.value) == f"{DATASET}@{'0' * 40}: Hugging Face Hub answered HTTP 404"
    finally:
        h.stop()
        reset_sessions()


def test_an_instance_runs_its_repositorys_swesmith_test_command(tmp_path, monkeypatch):
    """A row without test_cmd runs its repository's SWE-smith profile's command (a workspace: --all), else cargo test;
    a row's own test_cmd wins; the profiles' table is part of a dataset set's identity."""
    from huggingface_hub.utils._http import reset_sessions

    from trajsft.tasks import taskset

    ripgrep = "swesmith/BurntSushi__ripgrep.3b7fd442"
    base = {**rows("local/image:1")[0], "repo": ripgrep}
    # a parquet column: null in the rows that name no command
    table = [{**base, "instance_id": "BurntSushi__ripgrep.3b7fd442.b", "test_cmd": "cargo test -p grep-cli"},
             {**base, "instance_id": "BurntSushi__ripgrep.3b7fd442.a"},
             {**base, "instance_id": "rust-demo__mini_math.1f2e3d4c.c", "repo": HELD}]
    h = FakeHub({}, datasets={DATASET: Repo(SHA, {"data/train.parquet": parquet(table)})}).start()
    try:
        point_this_process(h, monkeypatch, str(tmp_path / "hf-cache"))
        p = plan(tmp_path, held_out_repos=["BurntSushi/ripgrep", HELD])
        made, _ = taskset.instances(step_configs.make_tasks(p, p.task_set("rs").name), tmp_path / "dl")
    finally:
        h.stop()
        reset_sessions()
    assert [t.test_cmd for t in made.tasks] == ["cargo test --all --verbose", "cargo test -p grep-cli", RUST_TEST_CMD]
    assert [t.instance_id[-1] for t in made.tasks] == ["a", "b", "c"]
    assert toolchain.test_command("swesmith/huggingface__tokenizers.ecad3f18") == \
        "cd /testbed/tokenizers && cargo test --verbose"  # SWE-smith's ~/testbed is the image's /testbed
    assert toolchain.test_command("swesmith/BurntSushi__ripgrep.0000000a") is None  # a profile is one commit's
    assert toolchain.test_command("BurntSushi__ripgrep.3b7fd442") is None
    before = plan(tmp_path).task_set("rs").hash
    monkeypatch.setitem(toolchain.SWESMITH_TEST_COMMANDS, "a__b.12345678", "cargo test")
    monkeypatch.setattr(toolchain, "IMAGES", toolchain.images())
    assert plan(tmp_path).task_set("rs").hash != before


def test_a_mirrors_repository_is_the_one_it_stands_for():
    from trajsft.tasks.taskset import upstream

    assert upstream("swesmith/BurntSushi__ripgrep.3b7fd442") == "BurntSushi/ripgrep"
    assert upstream("swesmith/tokio-rs__tokio") == "tokio-rs/tokio"  # no commit suffix
    assert upstream("swesmith/a__b.c.d1e2f3a4") == "a/b.c"  # dots in the name stay
    assert upstream("BurntSushi/ripgrep") == "BurntSushi/ripgrep" and upstream("swesmith/plain.1234567") == \
        "swesmith/plain.1234567"


def test_a_row_naming_an_image_reads_back_and_a_bad_image_name_is_one_line():
    from trajsft.tasks.record import from_row

    row = {**rows("local/image:1")[0]}
    t = from_row(row, "r 1")
    assert t.image_name == "local/image:1" and from_row(t.row(), "again") == t
    assert "image_name" not in from_row({**row, "image_name": None}, "r 2").row()  # a crate's task: unchanged rows
    with pytest.raises(DataError, match=r"^r 3: field image_name: not a docker image name \('a b'\)$"):
        from_row({**row, "image_name": "a b"}, "r 3")


# ---- docker: what a host lacks, and the container's limits ---------------------------------------------------------
def test_no_docker_is_one_line_naming_the_package(monkeypatch, tmp_path):
    monkeypatch.setattr(docker.shutil, "which", lambda *a, **k: None)
    assert docker.missing() == ["docker (apt-get install docker.io)"]
    assert S.missing(S.DOCKER) == ["docker (apt-get install docker.io)"]
    with pytest.raises(ConfigError, match=r"^sandbox docker: missing docker \(apt-get install docker.io\)$"):
        S.Sandbox(tmp_path, "bubblewrap", image="local/image:1")


def test_a_docker_sandbox_runs_each_command_in_a_fresh_container_with_bubblewraps_limits(monkeypatch, tmp_path):
    monkeypatch.setattr(docker, "missing", lambda: [])
    box = S.Sandbox(tmp_path, "none", S.Limits(memory_mb=1024, processes=64), image="local/image:1")
    assert box.kind == S.DOCKER and box.cwd == "/testbed"
    argv = box.argv("cargo test", "trajsft-x")
    assert argv[:4] == ["docker", "run", "--rm", "--name"] and argv[-6:] == [
        "local/image:1", "/bin/sh", "-c", 'exec /bin/bash -c "$1" 2>&1', "trajsft", "cargo test"]  # one output pipe
    for flag in (["--network", "none"], ["--cap-drop", "ALL"], ["--volume", f"{tmp_path}:/testbed"]):
        assert any(argv[i:i + 2] == flag for i in range(len(argv))), flag
    assert "--memory=1024m" in argv and "--memory-swap=1024m" in argv and "--pids-limit=64" in argv


# ---- end to end: the Hub's instances graded in their image ----------------------------------------------------------
@pytest.fixture(scope="module")
def image():
    """The instance image holding the demo's mini_math crate at /testbed (made once per machine)."""
    import docker_fixtures

    lacking = docker.missing() + ([] if shutil.which("debootstrap") else ["debootstrap (apt-get install debootstrap)"])
    if lacking:
        required.skip_or_fail("TRAJSFT_REQUIRE_DOCKER", f"the docker sandbox's test needs {', '.join(lacking)}")
    return docker_fixtures.instance_image(CRATE, "mini_math")


@pytest.mark.integration
def test_swesmith_instances_from_the_hub_are_graded_in_their_docker_image(image, tmp_path):
    """Done means of issue 71, parts 1 and 2: Snakemake's make_tasks reads the instances from the (fake) Hub, pulls
    their images (one fails: excluded, said), and keeps the instance whose gold fix resolves it in its image and whose
    empty patch does not; `trajsft tasks check` prints the same; graded from the set, a wrong fix does not resolve;
    inside, no network, and a hung command is killed with its container."""
    import pipeline_utils as PU
    from trajsft.tasks import taskset

    h = hub(image)
    try:
        over = {"tasks": {"rs": entry()}, "storage_root": str(tmp_path / "store")}
        art = C.Plan(C.load(None, over), base_dir=C.REPO_DIR, state_dir=str(tmp_path / "results")).task_set("rs")
        wd = tmp_path / "wd"
        wd.mkdir()
        target = f"results/tasks/{art.name}/manifest.json"
        PU.run(wd, target, config=over, timeout=900, extra_env=h.env())
        result = json.loads((wd / target).read_text())
        a1, b2 = (r["instance_id"] for r in rows(image)[:2])
        assert (result["tasks"], result["gold_resolved"], result["empty_resolved"]) == (1, 1, 0), result
        assert result["images"] == [image] and result["dropped_mutations"] == {"malformed row": 1}, result
        assert result["sandbox"] == "docker" and result["toolchain"] == toolchain.IMAGES, result
        assert list(result["excluded"]) == [b2], result  # no registry here: said in one line, the task excluded
        assert result["excluded"][b2].startswith(f"image {MISSING_IMAGE} could not be pulled: "), result
        assert "\n" not in result["excluded"][b2]
        log = (wd / f"logs/make_tasks/{art.name}.log").read_text()
        assert f"image {MISSING_IMAGE} could not be pulled" in log

        got = taskset.load(art.location)
        [t] = got.tasks
        assert (t.instance_id, t.image_name, t.repo) == (a1, image, HELD)
        controls = json.loads((Path(art.location) / "controls.json").read_text())
        [row] = controls["rows"]
        assert row["gold"]["fail_to_pass"] == {"tests::add_two": "passed"} and row["gold"]["resolved"]
        assert row["empty"]["fail_to_pass"] == {"tests::add_two": "failed"} and not row["empty"]["resolved"]
        assert row["empty"]["pass_to_pass"] == dict.fromkeys(CLAMP, "passed")
        assert not (Path(art.location) / "repos").exists()  # the image holds the repository

        wrong = G.grade(t, _edited(t, got.repos, {"    a - b\n": "    a * b\n"}), got.repos)  # 2 * 3 is not 5
        assert wrong.applied and not wrong.resolved and wrong.fail_to_pass == {"tests::add_two": "failed"}, wrong.row()
        breaks = G.grade(t, _edited(t, got.repos, {"    a - b\n": "    a + b\n", "        lo\n": "        hi\n"}),
                         got.repos)
        assert breaks.applied and not breaks.resolved and breaks.fail_to_pass == {"tests::add_two": "passed"}
        assert breaks.pass_to_pass["tests::clamp_below"] == "failed", breaks.row()

        # the same controls, as a user reads them
        p = subprocess.run([sys.executable, "-m", "trajsft.cli", "tasks", "check", "rs", "--configfile",
                            str(wd / "test-overrides.yaml")], capture_output=True, text=True, timeout=600, cwd=wd,
                           env=PU.env(**h.env()))
        assert p.returncode == 0, p.stderr[-2000:]
        assert f"1 tasks from {DATASET}@{SHA} ({HELD}) ({toolchain.IMAGES}; sandbox docker; rows dropped: " \
               "{'malformed row': 1})" in p.stdout, p.stdout
        assert "gold fix: resolved 1/1; empty patch: resolved 0/1; 1 tasks kept" in p.stdout, p.stdout
        assert f"excluded {b2}: image {MISSING_IMAGE} could not be pulled" in p.stdout, p.stdout
    finally:
        h.stop()

    # episodes in the image, through the real harness (mini-swe-agent) against the built-in models: the gold fix as
    # bash commands resolves the instance, submitting at once does not; an instance whose image cannot be pulled is
    # an unresolved row that says why, and runs no episode
    from trajsft.agent import evaluate

    p = C.Plan(C.load(None, {**over, "agent": {"tasks": "rs"}}), base_dir=C.REPO_DIR,
               state_dir=str(tmp_path / "results"))
    cfg = step_configs.eval_agent(p, "demo")
    assert cfg.tasks == art.location and evaluate.sandboxes(cfg) == ["docker"] and evaluate.unmet(cfg) is None
    replayed = evaluate.eval_agent(cfg, "replay", location=str(tmp_path / "replay"))
    assert (replayed["tasks"], replayed["resolved"], replayed["exit_statuses"]) == (1, 1, {"Submitted": 1}), replayed
    with_b2 = tmp_path / "with-b2"
    shutil.copytree(art.location, with_b2)
    from trajsft.tasks.record import from_row

    with open(with_b2 / "instances.jsonl", "a") as f:
        f.write(json.dumps(from_row(rows(image)[1], "b2").row()) + "\n")
    import dataclasses

    submitted = evaluate.episodes(dataclasses.replace(cfg, tasks=str(with_b2)), "submit",
                                  location=str(tmp_path / "submit"))
    by_id = {r["instance_id"]: r for r in submitted["rows"]}
    assert (by_id[a1]["resolved"], by_id[a1]["exit_status"]) == (False, "Submitted"), by_id[a1]
    assert (by_id[b2]["resolved"], by_id[b2]["exit_status"], by_id[b2]["steps"]) == (False, "image_unavailable", 0)
    assert by_id[b2]["error"].startswith(f"image {MISSING_IMAGE} could not be pulled: "), by_id[b2]
    assert submitted["exit_statuses"] == {"Submitted": 1, "image_unavailable": 1}
    kept = sorted(p.name for p in (tmp_path / "submit/episodes").iterdir())
    assert kept == [f"{a1}{ext}" for ext in (".diff", ".json", ".traj.json")], kept  # b2's not kept: a rerun pulls

    with tempfile.TemporaryDirectory() as tmp:
        repo = G.prepare(t, got.repos, Path(tmp) / "repo")
        box = S.for_task(t, repo, "bubblewrap", S.Limits(command_s=5))
        ran = box.run("cat /sys/class/net/*/operstate | wc -l; ls /sys/class/net; (echo > /dev/tcp/1.1.1.1/80) "
                      "2>/dev/null; echo tcp=$?; pwd; touch made-here; command -v cargo")
        out = ran.output.split()
        assert ran.returncode == 0 and out[:2] == ["1", "lo"] and "tcp=1" in out and "/testbed" in out, ran.output
        assert "/usr/bin/cargo" in out and (repo / "made-here").exists()
        # the image's build output comes with each copy (as SWE-smith's images, it ran the tests when made), never in
        # its history or diff: an unchanged copy's test run builds nothing; the bug's copy rebuilds its one crate
        assert (repo / "target/debug").is_dir() and "target" not in G.git(repo, "ls-files").stdout
        unchanged = Path(tmp) / "unchanged"
        assert G.checkout(G.source(t, got.repos), unchanged, "", build_output=True) is None
        built = S.for_task(t, unchanged, "bubblewrap", S.Limits(command_s=120)).run("cargo test --offline --verbose")
        assert built.returncode == 0 and "Fresh mini_math" in built.output, built.output[-2000:]
        assert "Compiling mini_math" not in built.output, built.output[-2000:]
        rebuilt = S.for_task(t, repo, "bubblewrap", S.Limits(command_s=120)).run("cargo test --offline --verbose")
        assert "Compiling mini_math" in rebuilt.output and "test tests::add_two ... FAILED" in rebuilt.output, \
            rebuilt.output[-2000:]
        # stdout and stderr in one pipe, in the order written (as cargo's verdict lines need)
        mixed = box.run("for i in 1 2 3; do printf 'out%s ... ' $i; echo err$i >&2; echo ok; done")
        assert mixed.output.splitlines() == ["out1 ... err1", "ok", "out2 ... err2", "ok", "out3 ... err3", "ok"], \
            mixed.output
        hung = box.run("sleep 60 & sleep 60")
        assert hung.timed_out and hung.returncode is None and 4 <= hung.seconds < 30, hung
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"name=^/{box.last_container}$"],
                              capture_output=True, text=True)
        assert box.last_container and left.returncode == 0 and left.stdout.strip() == "", left  # gone with its command


def _edited(t, repos: Path, edit: dict[str, str]) -> str:
    """The diff of ``edit`` (old -> new text of src/lib.rs) on the task's tree with its bug: a fix an agent might
    submit (the gold one: a - b back to a + b; one that also returns hi below the range breaks the clamp tests)."""
    with tempfile.TemporaryDirectory() as tmp:
        return diff_of(edit, G.prepare(t, repos, Path(tmp) / "repo"))
