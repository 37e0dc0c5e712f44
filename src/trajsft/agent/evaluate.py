"""Rule ``eval_agent`` (``agent/<target>/done``) and ``trajsft eval <target> --agent``: a target's trained student
works every task of a task set through mini-swe-agent, each episode in its sandbox, each submission graded by the
task's tests; the resolve rate with its count.

Per task, under the evaluation's location: ``episodes/<id>.traj.json`` (mini-swe-agent's own trajectory),
``episodes/<id>.diff`` (the submission) and ``episodes/<id>.json`` (the episode and the grader's row, written last:
a killed evaluation reruns only the tasks without one). ``results.json`` holds the rate and every row.

The model is the student (its run's newest model, loaded into the engine ``trajsft serve`` uses) or a built-in
scripted one (:mod:`trajsft.agent.replay`: ``replay`` resolves every task, ``submit`` none), served by trajsft's
chat route in this process on a loopback port."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from .. import io, terminal
from ..errors import ConfigError, DataError
from ..plan.step_configs import EvalAgentConfig
from ..report import actions
from ..report.trained import Trained, locate
from ..serve import server
from ..tasks import sandbox, taskset
from ..tasks.record import Task
from ..train.generate import END_OF_TURN
from . import harness as H
from . import replay

log = logging.getLogger("trajsft")

EPISODES, RESULTS = "episodes", "results.json"
STEPS = actions.STEPS  # <location>/steps/step-<N>/: the evaluation of the run's HF export at step N (--watch)


def graded_rows(location: str) -> dict[str, dict]:
    """The episodes already graded under ``location``, by task id (a row that does not read is left to rerun)."""
    out = {}
    for path in io.glob(io.join(location, EPISODES, "*.json")):
        if path.endswith(".traj.json"):
            continue
        try:
            row = io.read_json(path)
            out[row["instance_id"]] = row
        except (ValueError, KeyError, TypeError, OSError):
            continue
    return out


@contextlib.contextmanager
def _served(cfg: EvalAgentConfig, model: str, tasks: list[Task], at_once: int = 1,
            trained: Optional[Trained] = None) -> Iterator[tuple[str, str, Optional[dict]]]:
    """(the chat route's URL, the model name it answers to, the student's source or None) while the model is up,
    generating for ``at_once`` episodes at once; the student is ``trained`` (else located from ``cfg.train``)."""
    if model == "student":
        trained = trained or locate(cfg.train)
        with server.engine(trained, max_seqs=at_once) as eng:
            app = server.create_app(trained, eng.tokenizer, eng.submit, eng.max_seq_len, at_once,
                                    request_log=logging.DEBUG)
            with server.in_thread(app) as url:
                yield url, trained.name, trained.source
        return
    from transformers import AutoTokenizer

    tools = tuple(a.spec.get("tools") for a in cfg.train.tokenized.values())  # what each teacher's chats trained with
    tok_path = next(iter(cfg.train.tokenized.values())).spec["tokenizer"]  # what the student trained with
    tokenizer = AutoTokenizer.from_pretrained(tok_path)
    served = Trained(target=cfg.target, name=f"{cfg.train.run.name}-{model}", run_dir="", source={}, train_cfg={},
                     tools=tools)
    submit = replay.submitter(tokenizer, replay.script(model, tasks), END_OF_TURN)
    app = server.create_app(served, tokenizer, submit, int(cfg.train.spec.training.seq_len), at_once,
                            request_log=logging.DEBUG)
    with server.in_thread(app) as url:
        yield url, served.name, None


def eval_agent(cfg: EvalAgentConfig, model: str = "student", location: Optional[str] = None,
               say: Callable[[str], None] = log.info, only: Optional[Sequence[str]] = None) -> dict:
    """Every task of ``cfg``'s set (``only``: those ids) not yet graded under ``location`` (default: the evaluation's
    own), one episode each against ``model`` (``student``, or a built-in: ``replay``, ``submit``), on this machine;
    the result (rate, counts; its rows in ``results.json``, with the W&B run of a student's evaluation)."""
    location = location or cfg.location
    return finish(cfg, location, episodes(cfg, model, location, say, only))


def unmet(cfg: EvalAgentConfig, where: str = "") -> Optional[str]:
    """None, or one line naming what this machine lacks for the episodes (the harness, the sandbox's tools)."""
    why = H.missing()
    lacking = sandbox.missing(cfg.sandbox)
    if lacking:
        why = f"agent {cfg.target}: the sandbox ({cfg.sandbox}) needs {', '.join(lacking)}"
    return why and (f"{where}: {why}" if where else why)


def finish(cfg: EvalAgentConfig, location: str, result: dict, wandb: bool = True) -> dict:
    """``result`` (of :func:`episodes`) written to ``results.json`` under ``location`` (a student's evaluation also
    logged to W&B when online and ``wandb``, its URL kept); the figures without the rows."""
    if wandb and result["model"] not in replay.MODELS:
        result["wandb"] = to_wandb(cfg, result)
    io.write_json(io.join(location, RESULTS), result)
    return {k: v for k, v in result.items() if k != "rows"} | {"results": io.join(location, RESULTS)}


def episodes(cfg: EvalAgentConfig, model: str = "student", location: Optional[str] = None,
             say: Callable[[str], None] = log.info, only: Optional[Sequence[str]] = None,
             trained: Optional[Trained] = None) -> dict:
    """The episodes of :func:`eval_agent` (the student: ``trained``, else located from ``cfg.train``), each graded
    row under ``location`` as it ends; the result with every row. A task set in a bucket is read through a local
    copy."""
    location = location or cfg.location
    why = unmet(cfg)
    if why:
        raise ConfigError(why)
    with contextlib.ExitStack() as stack:
        tasks = taskset.load(_local(cfg.tasks, stack))
        return _episodes(cfg, model, location, say, only, trained, tasks)


def _local(tasks: str, stack: contextlib.ExitStack) -> str:
    """A local directory holding the task set at ``tasks`` (a bucket's: copied into a temporary one)."""
    if not io.is_remote(tasks):
        return tasks
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="trajsft-tasks-"))
    io.get_tree(tasks, tmp)
    return tmp


def _episodes(cfg: EvalAgentConfig, model: str, location: str, say: Callable[[str], None],
              only: Optional[Sequence[str]], trained: Optional[Trained], tasks: taskset.TaskSet) -> dict:
    if only is not None:
        unknown = sorted(set(only) - {t.instance_id for t in tasks.tasks})
        if unknown:
            raise ConfigError(f"agent {cfg.target}: no task {', '.join(unknown)} in {cfg.tasks}")
        tasks = taskset.TaskSet([t for t in tasks.tasks if t.instance_id in set(only)], tasks.repos)
    if not tasks.tasks:
        raise DataError(f"agent {cfg.target}: the task set {cfg.tasks} holds no task")
    harness = H.load(cfg.harness, step_limit=cfg.step_limit, max_tokens=cfg.max_tokens,
                     command_seconds=cfg.command_seconds)
    done = graded_rows(location)
    todo = [t for t in tasks.tasks if t.instance_id not in done]
    reused = len(tasks.tasks) - len(todo)
    if done:
        say(f"agent {cfg.target}: {len(done)} of {len(tasks.tasks)} tasks already graded under {location}; "
            f"running the other {len(todo)}")
    source = trained.source if trained else None  # (the served student's, when episodes run)
    at_once = max(1, min(cfg.episodes_at_once, len(todo)))
    if todo:
        with _served(cfg, model, tasks.tasks, at_once, trained) as (url, name, source), \
                tempfile.TemporaryDirectory(prefix="trajsft-agent-") as tmp, \
                concurrent.futures.ThreadPoolExecutor(at_once, thread_name_prefix="trajsft-episode") as pool:
            os.chmod(tmp, 0o711)  # the episodes' copies inside are reached by the sandbox's user (nobody)
            counted = terminal.Counted(f"trajsft eval_agent {cfg.target}", len(todo), "episodes")

            def episode(task: Task) -> tuple[H.Episode, str, Path]:
                traj = Path(tmp) / f"{task.instance_id}.traj.json"
                ran, diff = H.run(task, tasks.repos, url=url, model=name, harness=harness, sandbox=cfg.sandbox,
                                  workdir=Path(tmp), traj_path=traj)
                return ran, diff, traj

            # `at_once` episodes against the one engine, which batches their turns; each kept as it ends
            for fut in concurrent.futures.as_completed([pool.submit(episode, t) for t in todo]):
                ran, diff, traj = fut.result()
                base = io.join(location, EPISODES, ran.instance_id)
                if traj.exists():
                    io.write_text(base + ".traj.json", traj.read_text())
                io.write_text(base + ".diff", diff)
                io.write_json(base + ".json", {**ran.row(), "model": name})  # last: the task is graded
                done[ran.instance_id] = {**ran.row(), "model": name}
                log.info("agent %s: %s %s (%s, %d steps, %.1fs)", cfg.target, ran.instance_id,
                         "resolved" if ran.resolved else "unresolved", ran.exit_status, ran.steps, ran.seconds)
                counted.add(1)
    rows = [done[t.instance_id] for t in tasks.tasks]
    try:  # the tasks the set's controls excluded (never graded here), with why
        excluded = io.read_json(io.join(cfg.tasks, taskset.CONTROLS)).get("excluded") or {}
    except (OSError, ValueError):
        excluded = {}
    resolved = sum(bool(r["resolved"]) for r in rows)
    result = {"target": cfg.target, "model": model, "tasks": len(rows), "resolved": resolved,
              "resolve_rate": resolved / len(rows), "source": source, "task_set": cfg.tasks,
              "harness": {"step_limit": cfg.step_limit, "max_tokens": cfg.max_tokens,
                          "command_seconds": cfg.command_seconds, "episodes_at_once": cfg.episodes_at_once},
              "exit_statuses": _counts(r["exit_status"] for r in rows), "excluded": excluded,
              "episodes_run": len(todo), "episodes_reused": reused, "rows": rows}
    return result


def evaluated_steps(location: str) -> dict[int, dict]:
    """The per-export evaluations under an evaluation's ``location`` (``steps/step-<N>/results.json``), by step."""
    return actions.evaluated_steps(location, RESULTS)


def to_wandb(cfg: EvalAgentConfig, result: dict) -> Optional[str]:
    """With ``wandb.mode: online``: the evaluation as a W&B run of the training's project, in the group named by the
    training run (``agent_eval`` job), its id the evaluation's hash (a rerun updates it): the rate, the counts and a
    row per episode's figures in its summary; its URL. Offline or disabled (also by ``WANDB_MODE`` here, as a host
    without internet access forces its training's): None. A refusal is one line."""
    w = cfg.train.workflow["wandb"]
    if w.get("mode") != "online" or os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return None
    import wandb

    from ..train.tracking import cause, env_defaults

    bounded = env_defaults(os.environ)  # bounded waits, as the training's, while this run lives
    os.environ.update(bounded)
    try:
        with tempfile.TemporaryDirectory(prefix="trajsft-wandb-") as tmp:  # the SDK's files, until its finish
            return _log_run(cfg, result, wandb, cause, tmp)
    finally:
        for k in bounded:
            os.environ.pop(k, None)
        # the SDK's service goes with the run: its token (WANDB_SERVICE) left in os.environ would make every process
        # started after it (sandboxed commands, a training) join this process's wandb-core
        wandb.teardown()


def _log_run(cfg: EvalAgentConfig, result: dict, wandb, cause, tmp: str) -> str:
    from ..train.target import wandb_names

    project, entity = wandb_names(cfg.train.workflow)
    run_name = cfg.train.run.name
    try:
        run = wandb.init(project=project, entity=entity, id=f"agent-{cfg.name}", name=f"{cfg.target} agent",
                         group=run_name, job_type="agent_eval", resume="allow", reinit="create_new",
                         tags=[cfg.target, f"checkpoints:{run_name}", f"tasks:{os.path.basename(cfg.tasks)}"],
                         config={"trajsft": {"target": cfg.target, "run": run_name, "evaluation": cfg.name,
                                             **result["harness"]}},
                         dir=tmp, settings=wandb.Settings(silent=True))  # its URL is ours to say
    except wandb.errors.Error as e:
        raise ConfigError(f"agent {cfg.target}: W&B: {cause(e)}") from None
    try:
        run.log({"agent/resolve_rate": result["resolve_rate"], "agent/resolved": result["resolved"],
                 "agent/tasks": result["tasks"]})
        run.summary.update({"agent/exit_statuses": result["exit_statuses"],
                            "agent/episodes": {r["instance_id"]: {k: r[k] for k in (
                                "resolved", "exit_status", "steps", "prompt_tokens", "completion_tokens", "seconds")}
                                for r in result["rows"]}})
        return run.url
    finally:
        run.finish()


def _counts(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))
