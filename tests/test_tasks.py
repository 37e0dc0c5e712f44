"""Tasks that grade themselves (issue 68, first part): the task record, the sandbox (bubblewrap: no network, limits,
Debian's cargo) and the grader (SWE-smith's rule), on a small std-only crate of the demo set (tasks/demo/crates/mini_math)
with a bug made the way SWE-smith makes them (an operator flipped); the demo set and its controls."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import socket
import tempfile
import threading
from pathlib import Path

import pytest

import required
from trajsft.errors import ConfigError, DataError
from trajsft.tasks import grade as G
from trajsft.tasks.record import Task, from_row
from trajsft.tasks.sandbox import Limits, Sandbox, missing

REPOS = Path(__file__).resolve().parents[1] / "tasks" / "demo" / "crates"  # the demo set's crates
CLAMP = ["tests::clamp_below", "tests::clamp_above", "tests::clamp_inside"]


def needs_sandbox():
    lacking = missing("bubblewrap")
    if lacking:
        required.skip_or_fail("TRAJSFT_REQUIRE_SANDBOX", f"the sandbox needs {', '.join(lacking)}")


@pytest.fixture
def box_dir(tmp_path):
    """A directory the sandbox's user (nobody, when we are root) can reach: pytest's tmp_path is under a 0700 dir."""
    d = Path(tempfile.mkdtemp(prefix="trajsft-box-"))
    os.chmod(d, 0o711)
    yield d / "w"
    shutil.rmtree(d, ignore_errors=True)


def diff_of(edit: dict[str, str], base: Path = REPOS / "mini_math") -> str:
    """The git diff that replaces each ``old`` text of src/lib.rs by its ``new`` one in a copy of ``base``."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "r"
        G.checkout(base, repo)
        lib = repo / "src/lib.rs"
        text = lib.read_text()
        for old, new in edit.items():
            assert old in text, old
            text = text.replace(old, new, 1)
        lib.write_text(text)
        return G.git(repo, "diff").stdout


BUG = {"    if x < lo {": "    if x > lo {"}  # an operator flipped: every clamp test fails, add_two does not


def task(**over) -> Task:
    row = {"instance_id": "mini_math.flip_clamp", "repo": "mini_math", "patch": diff_of(BUG),
           "FAIL_TO_PASS": CLAMP, "PASS_TO_PASS": ["tests::add_two"],
           "problem_statement": "clamp returns the lower bound for values above it\n\nclamp(15, 0, 10) is 0.", **over}
    return from_row(row, "test row 0")


# ---- the record ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, line", [
    ({"patch": "--- a/x\n+++ b/x\n"}, "test row 0: field patch: not a git diff (it starts with '--- a/x\\n+++ b/x\\n')"),
    ({"FAIL_TO_PASS": []}, "test row 0: field FAIL_TO_PASS: empty (a bug that breaks no test cannot be graded)"),
    ({"PASS_TO_PASS": "not json"}, "test row 0: field PASS_TO_PASS: not a JSON list of test names"),
    ({"PASS_TO_PASS": [1]}, "test row 0: field PASS_TO_PASS: expected a list of test names, got list"),
    ({"instance_id": ""}, "test row 0: field instance_id: missing or empty"),
    ({"test_cmd": None}, "test row 0: field test_cmd: missing or empty"),
])
def test_a_malformed_instance_row_is_one_line_naming_the_row_and_field(change, line):
    with pytest.raises(DataError) as e:
        task(**change)
    assert str(e.value) == line


def test_swe_smith_rows_carry_their_test_lists_as_json_text():
    t = task(FAIL_TO_PASS=json.dumps(CLAMP), PASS_TO_PASS="[]")
    assert t.FAIL_TO_PASS == tuple(CLAMP) and t.PASS_TO_PASS == () and t.title.startswith("clamp returns")
    assert from_row(t.row(), "again") == t


def test_cargo_tests_verdict_lines_are_read():
    log = ("running 3 tests\ntest tests::a ... ok\ntest tests::b ... FAILED\ntest tests::c ... ignored\n"
           "test result: FAILED. 1 passed; 1 failed; 1 ignored\n   Doc-tests x\ntest src/lib.rs - f (line 3) ... ok\n")
    assert G.parse_test_log(log) == {"tests::a": "passed", "tests::b": "failed", "tests::c": "ignored",
                                     "src/lib.rs - f (line 3)": "passed"}  # a doctest, named as cargo names it


def test_a_missing_tool_or_an_unknown_sandbox_is_one_line(monkeypatch, tmp_path):
    from trajsft.tasks import sandbox as S

    with pytest.raises(ConfigError, match=r"^sandbox: 'docker' is not a sandbox \(one of: bubblewrap, none\)$"):
        Sandbox(tmp_path, "docker")
    monkeypatch.setattr(S.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(S.os.path, "exists", lambda p: False)
    with pytest.raises(ConfigError) as e:
        Sandbox(tmp_path)
    assert str(e.value).startswith("sandbox bubblewrap: missing bwrap (apt-get install bubblewrap)")
    assert "/usr/bin/cargo (apt-get install cargo-web rustc-web)" in str(e.value)


# ---- the sandbox --------------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_the_sandbox_has_no_network_and_debians_cargo_only(box_dir, monkeypatch):
    needs_sandbox()
    box_dir.mkdir()
    monkeypatch.setenv("PATH", f"{Path.home()}/.cargo/bin:{os.environ['PATH']}")  # a rustup cargo first: not inside
    with socket.socket() as s:  # a server on the host's loopback: the sandbox's own loopback is another one
        s.bind(("127.0.0.1", 0))
        s.listen()
        threading.Thread(target=lambda: s.accept(), daemon=True).start()
        port = s.getsockname()[1]
        ran = Sandbox(box_dir).run(f"getent hosts pypi.org; echo dns=$?; (echo > /dev/tcp/127.0.0.1/{port}) "
                                    "2>/dev/null; echo tcp=$?; command -v cargo; echo $CARGO_HOME; id -u; "
                                    "touch /usr/x 2>/dev/null; echo ro=$?; touch /work/y; echo rw=$?")
    assert ran.returncode == 0 and not ran.timed_out, ran
    out = ran.output.split()
    assert "dns=2" in out and "tcp=1" in out and "/usr/bin/cargo" in out and "/tmp/cargo-home" in out, out
    assert "ro=1" in out and "rw=0" in out and (box_dir / "y").exists()
    if os.geteuid() == 0:
        assert "65534" in out  # nobody, not root


@pytest.mark.integration
def test_a_hung_command_is_killed_at_its_limit_with_what_it_started(box_dir):
    import psutil

    needs_sandbox()
    box_dir.mkdir()
    box = Sandbox(box_dir, limits=Limits(command_s=2, total_s=3))
    # durations of this run's own (another test run on the machine may have a `sleep 300` of its own)
    mine = [f"{300 + n}.{os.getpid()}" for n in (0, 1)]
    ran = box.run(f"sleep {mine[0]} & sleep {mine[1]}")
    assert ran.timed_out and ran.returncode is None and 2 <= ran.seconds < 10, ran
    assert ran.output.endswith("[killed at its limit of 2 s]")
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] in [["sleep", t] for t in mine]]
    again = box.run("sleep 300")  # 1 s of the episode's 3 left
    assert again.timed_out and again.seconds < 3
    assert box.run("true").output == "the episode's 3 s are used up"


@pytest.mark.integration
def test_memory_and_processes_are_limited(box_dir, tmp_path):
    needs_sandbox()
    box_dir.mkdir()
    if os.geteuid() == 0:  # a directory nobody cannot reach: one line
        with pytest.raises(ConfigError, match=r"cannot be reached by the sandbox's user \(nobody\): .* is mode 700"):
            Sandbox(tmp_path, needs_cargo=False)
    box = Sandbox(box_dir, limits=Limits(memory_mb=256, processes=64), needs_cargo=False)
    big = box.run("/usr/bin/python3 -c 'b = bytearray(512 * 2**20)'")
    assert big.returncode != 0 and "MemoryError" in big.output, big
    if os.geteuid() == 0:  # as nobody: the process limit counts the sandbox user's processes
        many = box.run("for i in $(seq 100); do sleep 5 & done 2>&1 | head -1; wait")
        assert "Resource temporarily unavailable" in many.output, many


# ---- the grader ---------------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_the_gold_fix_resolves_and_the_empty_patch_does_not():
    needs_sandbox()
    t = task()
    gold = G.grade(t, G.gold_patch(t, REPOS), REPOS)
    assert gold.resolved and gold.applied and gold.reason is None, gold
    assert gold.fail_to_pass == dict.fromkeys(CLAMP, "passed") and gold.pass_to_pass == {"tests::add_two": "passed"}
    empty = G.grade(t, "", REPOS)
    assert not empty.resolved and empty.applied and empty.fail_to_pass == dict.fromkeys(CLAMP, "failed")
    assert (empty.passed, empty.failed) == (1, 3)
    assert G.resolve_rate([gold, empty]) == (0.5, 1, 2)


@pytest.mark.integration
def test_a_wrong_fix_and_a_fix_that_breaks_a_passing_test_are_unresolved(tmp_path):
    needs_sandbox()
    t = task()
    buggy_copy = G.prepare(t, REPOS, tmp_path / "buggy")  # the task's start, to write fixes against
    buggy = {"    if x > lo {": "    if x >= lo {"}  # touches the right line, still wrong
    wrong = G.grade(t, diff_of(buggy, base=buggy_copy), REPOS)
    assert wrong.applied and not wrong.resolved and "failed" in wrong.fail_to_pass.values(), wrong
    breaks = {"    if x > lo {": "    if x < lo {", "    a + b": "    a - b"}  # fixes clamp, breaks add
    broke = G.grade(t, diff_of(breaks, base=buggy_copy), REPOS)
    assert broke.applied and not broke.resolved, broke
    assert broke.fail_to_pass == dict.fromkeys(CLAMP, "passed") and broke.pass_to_pass == {"tests::add_two": "failed"}


@pytest.mark.integration
def test_a_patch_that_does_not_apply_and_tests_that_hang_are_unresolved_with_their_reason():
    needs_sandbox()
    t = task()
    stale = diff_of({"    a + b": "    b + a"}).replace("a + b", "a * b")  # its context is not in the file
    bad = G.grade(t, stale, REPOS)
    assert not bad.applied and not bad.resolved and bad.reason.startswith("the patch does not apply: "), bad
    hung = G.grade(task(test_cmd="sleep 300"), G.gold_patch(t, REPOS), REPOS, limits=Limits(command_s=2))
    assert not hung.resolved and hung.reason == "the tests were killed at their limit (2 s)", hung


# ---- task sets made by mutations, and their controls -----------------------------------------------------------------
def test_mutations_of_the_library_code_only_in_line_order(tmp_path):
    from trajsft.tasks.mutate import candidates

    crate = tmp_path / "c"
    (crate / "src").mkdir(parents=True)
    (crate / "src/lib.rs").write_text(
        "pub fn f(a: i32, b: i32) -> i32 {\n    if a < b { g(a, b) } else { a + 1 }  // keep < here\n}\n"
        "pub fn h(x: Option<i32>) -> i32 {\n    match x { Some(v) if v > 0 => v, _ => 0 }\n}\n"
        "#[cfg(test)]\nmod tests {\n    fn t() { assert!(1 < 2); }\n}\n")
    got = [(m.kind, m.line, m.after.strip(), m.nth) for m in candidates(crate)]
    assert got == [
        ("flip_operator", 2, "if a > b { g(a, b) } else { a + 1 }  // keep < here", 1),
        ("flip_operator", 2, "if a < b { g(a, b) } else { a - 1 }  // keep < here", 2),
        ("negate_condition", 2, "if !(a < b) { g(a, b) } else { a + 1 }  // keep < here", 1),
        ("swap_arguments", 2, "if a < b { g(b, a) } else { a + 1 }  // keep < here", 1),
        ("drop_off_by_one", 2, "if a < b { g(a, b) } else { a }  // keep < here", 1),
        ("flip_operator", 5, "match x { Some(v) if v < 0 => v, _ => 0 }", 1),  # a match guard: no negation
    ], got  # the -> of a signature and the tests module are not mutated; names differ: flip_operator_lib_2_2


@pytest.mark.integration
def test_a_task_that_fails_its_control_is_excluded_with_its_reason():
    from trajsft.tasks import controls

    needs_sandbox()
    good = task()
    unknown = task(instance_id="mini_math.unknown_test", FAIL_TO_PASS=["tests::no_such_test"])
    harmless = task(instance_id="mini_math.comment", patch=diff_of({"/// The sum": "/// The total"}),
                    FAIL_TO_PASS=["tests::add_two"])
    checked = controls.check([good, unknown, harmless], REPOS)
    assert checked.kept == [good.instance_id] and checked.counts() == (2, 1, 3)
    assert checked.excluded == {"mini_math.unknown_test": "the gold fix does not resolve it",
                                "mini_math.comment": "the empty patch resolves it"}
    assert checked.rows[1]["gold"]["fail_to_pass"] == {"tests::no_such_test": "missing"}


@pytest.mark.integration
def test_tasks_check_demo_gold_resolves_all_and_empty_none_and_the_set_is_deterministic():
    """Done means of issue 68: `trajsft tasks check demo` (the set made from tasks/demo/crates: >= 8 tasks)."""
    import sys

    from trajsft.plan import config as C
    from trajsft.tasks.mutate import from_crates

    needs_sandbox()
    p = subprocess.run([sys.executable, "-m", "trajsft.cli", "tasks", "check", "demo", "--json"], capture_output=True,
                       text=True, timeout=600, cwd=C.REPO_DIR)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    n = out["tasks"]
    assert n >= 8 and (out["gold_resolved"], out["empty_resolved"], out["excluded"]) == (n, 0, {}), out["excluded"]
    assert out["toolchain"].startswith("cargo 1.") and out["sandbox"] == "bubblewrap"
    assert out["manifest"].startswith("results/tasks/demo-") and out["manifest"].endswith("/manifest.json")
    kinds = {r["instance_id"].split(".")[1].rsplit("_lib_", 1)[0] for r in out["rows"]}
    assert {"flip_operator", "negate_condition"} <= kinds, kinds
    again = from_crates(C.REPO_DIR / "tasks/demo/crates")  # the same tasks, byte for byte
    assert [t.row() for t in again.tasks] == out["instances"]
    assert [t.instance_id for t in again.tasks] == [r["instance_id"] for r in out["rows"]]
    t = again.tasks[0]  # its statement: a title, then each failing test's panic (no thread id)
    assert t.title == "mini_math: clamp_above, clamp_below, clamp_inside fail", t.title
    assert "`tests::clamp_above` fails:\nthread 'tests::clamp_above' panicked at src/lib.rs:" in t.problem_statement
    assert "clamp_below' panicked" not in t.problem_statement  # the first failing test's panic only


def test_an_unknown_set_or_a_missing_tool_is_one_line(monkeypatch, capsys):
    import trajsft.cli as cli
    from trajsft.tasks import sandbox as S

    assert cli.main(["tasks", "check", "nope"]) == 2
    assert capsys.readouterr().err == "trajsft: unknown task set 'nope' (config tasks: demo)\n"
    monkeypatch.setattr(S, "missing", lambda kind, needs_cargo=True: ["bwrap (apt-get install bubblewrap)"])
    assert cli.main(["tasks", "check", "demo"]) == 2
    assert capsys.readouterr().err == ("trajsft: tasks demo: the sandbox (bubblewrap) needs bwrap "
                                      "(apt-get install bubblewrap)\n")


# ---- the task set as an artifact (config tasks:, rule make_tasks) -------------------------------------------------
def _plan(tmp_path, **over):
    from trajsft.plan import config as C

    return C.Plan(C.load(None, {"storage_root": str(tmp_path / "store"), **over}), base_dir=C.REPO_DIR,
                  state_dir=str(tmp_path / "results"))


def test_a_task_sets_identity_is_its_crates_settings_and_toolchain(tmp_path, monkeypatch):
    """The toolchain is hashed in (the tests' outcome depends on it); the sandbox is not (the controls check that it
    changes no outcome); a missing cargo is an identity of its own, never a failure of the plan."""
    from trajsft.plan import toolchain

    demo = _plan(tmp_path).task_set("demo")
    assert demo.name.startswith("demo-") and demo.inputs["toolchain"] == toolchain.cargo_version()
    assert demo.location == str(tmp_path / "store" / "tasks" / demo.name)
    assert _plan(tmp_path, tasks={"demo": {"crates": "tasks/demo/crates", "sandbox": "none"}}).task_set("demo").hash \
        == demo.hash
    monkeypatch.setattr(toolchain, "cargo_version", lambda: "cargo 1.85.0 (d73d2caf9 2024-12-31)")
    other = _plan(tmp_path).task_set("demo")
    assert other.hash != demo.hash and other.inputs["toolchain"] == "cargo 1.85.0 (d73d2caf9 2024-12-31)"
    monkeypatch.undo()
    monkeypatch.setattr(toolchain, "CARGO", str(tmp_path / "no-cargo"))
    toolchain.cargo_version.cache_clear()
    try:
        assert _plan(tmp_path).task_set("demo").inputs["toolchain"] == f"cargo missing: {tmp_path / 'no-cargo'}"
    finally:
        monkeypatch.undo()
        toolchain.cargo_version.cache_clear()
    with pytest.raises(ConfigError, match=r"^unknown task set 'nope' \(config tasks: demo\)$"):
        _plan(tmp_path).task_set("nope")


def test_a_task_set_read_back_says_a_bad_row_in_one_line(tmp_path):
    from trajsft.tasks import taskset

    with pytest.raises(DataError, match=r"instances.jsonl is missing: build the task set first \(rule make_tasks\)$"):
        taskset.load(str(tmp_path))
    row = {"instance_id": "a.b", "repo": "a", "patch": "diff --git a/x b/x\n", "FAIL_TO_PASS": ["t"],
           "PASS_TO_PASS": [], "problem_statement": "a: t fails\n\nbody"}
    (tmp_path / "instances.jsonl").write_text(json.dumps(row) + "\n" + "{oops\n")
    with pytest.raises(DataError, match=r"instances.jsonl row 2: not JSON \("):
        taskset.load(str(tmp_path))
    (tmp_path / "instances.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "FAIL_TO_PASS": []}) + "\n")
    with pytest.raises(DataError, match=r"instances.jsonl row 2: field FAIL_TO_PASS: empty"):
        taskset.load(str(tmp_path))
    (tmp_path / "instances.jsonl").write_text(json.dumps(row) + "\n")
    got = taskset.load(str(tmp_path))
    assert [t.instance_id for t in got.tasks] == ["a.b"] and got.repos == tmp_path / "repos"


@pytest.mark.integration
def test_rule_make_tasks_writes_a_set_that_grades_itself(tmp_path):
    """Snakemake's rule writes the set (its kept tasks, controls, and the crates they check out of); graded from the
    payload alone, a task's gold fix resolves it and the empty patch does not; a second run has nothing to do."""
    import pipeline_utils as PU
    from trajsft.tasks import taskset

    needs_sandbox()
    crates = tmp_path / "crates"
    shutil.copytree(REPOS / "mini_math", crates / "mini_math")
    over = {"tasks": {"mini": {"crates": str(crates)}}, "storage_root": str(tmp_path / "store")}
    art = _plan(tmp_path, **over).task_set("mini")
    wd = tmp_path / "wd"
    wd.mkdir()
    target = f"results/tasks/{art.name}/manifest.json"
    PU.run(wd, target, config=over, timeout=600)
    manifest = json.loads((wd / target).read_text())
    result = manifest
    n = result["tasks"]
    assert n >= 3 and (result["made"], result["gold_resolved"], result["empty_resolved"]) == (n, n, 0), result
    assert result["toolchain"] == art.inputs["toolchain"] and result["repos"] == ["mini_math"]
    got = taskset.load(art.location)
    assert len(got.tasks) == n and all(t.repo == "mini_math" for t in got.tasks)
    assert sorted(p.name for p in (got.repos / "mini_math").iterdir()) == ["Cargo.toml", "src"]
    controls = json.loads((Path(art.location) / "controls.json").read_text())
    assert controls["excluded"] == {} and [r["instance_id"] for r in controls["rows"]] == [t.instance_id for t in got.tasks]
    t = got.tasks[0]
    gold = G.grade(t, G.gold_patch(t, got.repos), got.repos)
    empty = G.grade(t, "", got.repos)
    assert gold.resolved and not empty.resolved, (gold.row(), empty.row())
    again = PU.run(wd, target, config=over, timeout=300)
    assert "Nothing to be done" in again.stdout + again.stderr
