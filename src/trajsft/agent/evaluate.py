"""Rule ``eval_agent`` (``agent/<target>/done``) and ``trajsft eval <target> --agent``: a target's trained student
works every task of a task set through mini-swe-agent, each episode in its sandbox, each submission graded by the
task's tests; the resolve rate with its count.

Per episode, under the evaluation's location: ``episodes/<id>.traj.json`` (mini-swe-agent's own trajectory),
``episodes/<id>.diff`` (the submission) and ``episodes/<id>.json`` (the episode and the grader's row, written last:
a killed evaluation reruns only the episodes without one); with ``agent.repeats`` N > 1 each task has N episodes,
sampled at ``agent.temperature``, the k-th (k >= 1) named ``<id>.r<k>``. ``results.json`` holds the rate (the mean
over the episodes, with the std of the repeats' rates) and every row.

The model is the student (its run's newest model, loaded into the engine ``trajsft serve`` uses) or a built-in
scripted one (:mod:`trajsft.agent.replay`: ``replay`` resolves every task, ``submit`` none), served by trajsft's
chat route in this process on a loopback port."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

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


def episode_name(instance_id: str, repeat: int) -> str:
    """The name of an episode's files under ``episodes/``: the task's id (its first episode), ``<id>.r<k>`` for its
    repeat k."""
    return instance_id if repeat == 0 else f"{instance_id}.r{repeat}"


def graded_rows(location: str) -> dict[tuple[str, int], dict]:
    """The episodes already graded under ``location``, by (task id, repeat) (a row that does not read is left to
    rerun)."""
    out = {}
    for path in io.glob(io.join(location, EPISODES, "*.json")):
        if path.endswith(".traj.json"):
            continue
        try:
            row = io.read_json(path)
            out[(row["instance_id"], int(row.get("repeat", 0)))] = row
        except (ValueError, KeyError, TypeError, OSError):
            continue
    return out


def rate_shown(doc: Mapping) -> str:
    """An evaluation's rate as people read it: ``31.1%``, with repeats ``31.1% ± 3.8%`` (the repeats' std)."""
    std = doc.get("resolve_rate_std")
    return f"{doc['resolve_rate']:.1%}" + ("" if std is None else f" ± {std:.1%}")


def spread(rows: Sequence[dict], repeats: int) -> dict:
    """Each repeat's resolve rate (over the same tasks) and their std (the sample's, n - 1; None for one repeat):
    how much the rate moves between runs of the same student."""
    rates = []
    for k in range(repeats):
        mine = [r for r in rows if int(r.get("repeat", 0)) == k]
        rates.append(sum(bool(r["resolved"]) for r in mine) / len(mine) if mine else 0.0)
    return {"repeat_rates": rates, "resolve_rate_std": statistics.stdev(rates) if repeats > 1 else None}


@contextlib.contextmanager
def _served(cfg: EvalAgentConfig, model: str, tasks: list[Task], at_once: int = 1,
            trained: Optional[Trained] = None) -> Iterator[tuple[str, str, Optional[dict], Optional[dict]]]:
    """(the chat route's URL, the model name it answers to, the student's source or None, the engine's live
    figures or None) while the model is up, generating for ``at_once`` episodes at once; the student is ``trained``
    (else located from ``cfg.train``)."""
    if model == "student":
        trained = trained or locate(cfg.train)
        with server.engine(trained, max_seqs=at_once) as eng:
            app = server.create_app(trained, eng.tokenizer, eng.submit, eng.max_seq_len, at_once,
                                    request_log=logging.DEBUG)
            with server.in_thread(app) as url:
                yield url, trained.name, trained.source, eng.stats
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
        yield url, served.name, None, None


def eval_agent(cfg: EvalAgentConfig, model: str = "student", location: Optional[str] = None,
               say: Callable[[str], None] = log.info, only: Optional[Sequence[str]] = None) -> dict:
    """Every task of ``cfg``'s set (``only``: those ids) not yet graded under ``location`` (default: the evaluation's
    own), one episode each against ``model`` (``student``, or a built-in: ``replay``, ``submit``), on this machine;
    the result (rate, counts; its rows in ``results.json``, with the W&B run of a student's evaluation)."""
    location = location or cfg.location
    return finish(cfg, location, episodes(cfg, model, location, say, only))


def sandboxes(cfg: EvalAgentConfig) -> list[str]:
    """The sandboxes the set's episodes run in: docker for its tasks that name an image, the agent's ``sandbox`` for
    the others (a set not readable yet: the agent's; its load says why later)."""
    try:
        lines = io.read_bytes(io.join(cfg.tasks, taskset.INSTANCES)).decode().splitlines()
    except (OSError, UnicodeDecodeError):
        return [cfg.sandbox]
    kinds = set()
    for line in lines:
        with contextlib.suppress(ValueError, AttributeError):
            kinds.add(sandbox.DOCKER if json.loads(line).get("image_name") else cfg.sandbox)
    return sorted(kinds) or [cfg.sandbox]


def unmet(cfg: EvalAgentConfig, where: str = "") -> Optional[str]:
    """None, or one line naming what this machine lacks for the episodes (the harness, the sandboxes' tools)."""
    why = H.missing()
    for kind in sandboxes(cfg):
        lacking = sandbox.missing(kind)
        if lacking:
            why = f"agent {cfg.target}: the sandbox ({kind}) needs {', '.join(lacking)}"
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
    repeats = max(1, cfg.repeats)
    wanted = [(t, k) for k in range(repeats) for t in tasks.tasks]  # every task once, then again per repeat
    done = graded_rows(location)
    todo = [(t, k) for t, k in wanted if (t.instance_id, k) not in done]
    reused = len(wanted) - len(todo)
    # the images of the tasks left, pulled by this host first: a task whose image it cannot get is an unresolved row
    # that says why, counted, and not kept under episodes/ (a rerun pulls again)
    unavailable = taskset.pull([t for t, _ in todo])
    for t, k in [(t, k) for t, k in todo if t.instance_id in unavailable]:
        done[(t.instance_id, k)] = {**H.Episode(
            instance_id=t.instance_id, resolved=False, exit_status="image_unavailable", steps=0, prompt_tokens=0,
            completion_tokens=0, seconds=0.0, graded={}, error=unavailable[t.instance_id], repeat=k).row(),
            "model": model}
    todo = [(t, k) for t, k in todo if t.instance_id not in unavailable]
    if reused:
        say(f"agent {cfg.target}: {reused} of {len(wanted)} {'tasks' if repeats == 1 else 'episodes'} already graded "
            f"under {location}; running the other {len(todo)}")
    source = trained.source if trained else None  # (the served student's, when episodes run)
    at_once = max(1, min(cfg.episodes_at_once, len(todo)))
    engine = None
    if todo:
        with _served(cfg, model, tasks.tasks, at_once, trained) as (url, name, source, stats), \
                tempfile.TemporaryDirectory(prefix="trajsft-agent-") as tmp, \
                concurrent.futures.ThreadPoolExecutor(at_once, thread_name_prefix="trajsft-episode") as pool:
            os.chmod(tmp, 0o711)  # the episodes' copies inside are reached by the sandbox's user (nobody)
            counted = terminal.Counted(f"trajsft eval_agent {cfg.target}", len(todo), "episodes")

            def episode(task: Task, k: int) -> tuple[H.Episode, str, Path]:
                traj = Path(tmp) / f"{episode_name(task.instance_id, k)}.traj.json"
                ran, diff = H.run(task, tasks.repos, url=url, model=name, harness=harness, sandbox=cfg.sandbox,
                                  workdir=Path(tmp), traj_path=traj, repeat=k, temperature=cfg.temperature)
                return ran, diff, traj

            clock = _Clock()
            # `at_once` episodes against the one engine, which batches their turns; each kept as it ends
            for fut in concurrent.futures.as_completed([pool.submit(episode, t, k) for t, k in todo]):
                ran, diff, traj = fut.result()
                base = io.join(location, EPISODES, episode_name(ran.instance_id, ran.repeat))
                if traj.exists():
                    io.write_text(base + ".traj.json", traj.read_text())
                io.write_text(base + ".diff", diff)
                io.write_json(base + ".json", {**ran.row(), "model": name})  # last: the episode is graded
                done[(ran.instance_id, ran.repeat)] = {**ran.row(), "model": name}
                log.info("agent %s: %s%s %s (%s, %d steps, %.1fs)", cfg.target, ran.instance_id,
                         f" (repeat {ran.repeat})" if repeats > 1 else "",
                         "resolved" if ran.resolved else "unresolved", ran.exit_status, ran.steps, ran.seconds)
                counted.add(1)
            engine = clock.figures(stats, [done[(t.instance_id, k)] for t, k in todo])
    rows = [done[(t.instance_id, k)] for t, k in wanted]
    try:  # the tasks the set's controls excluded (never graded here), with why
        excluded = io.read_json(io.join(cfg.tasks, taskset.CONTROLS)).get("excluded") or {}
    except (OSError, ValueError):
        excluded = {}
    resolved = sum(bool(r["resolved"]) for r in rows)
    # resolved counts episodes: with repeats, the rate is their mean (each repeat works the same tasks)
    result = {"target": cfg.target, "model": model, "tasks": len(tasks.tasks), "episodes": len(rows),
              "repeats": repeats, "resolved": resolved, "resolve_rate": resolved / len(rows),
              **spread(rows, repeats), "source": source, "task_set": cfg.tasks,
              "harness": {"step_limit": cfg.step_limit, "max_tokens": cfg.max_tokens,
                          "command_seconds": cfg.command_seconds, "episodes_at_once": cfg.episodes_at_once,
                          "repeats": repeats, "temperature": cfg.temperature},
              "exit_statuses": _counts(r["exit_status"] for r in rows), "excluded": excluded,
              "episodes_run": len(todo), "episodes_reused": reused, "engine": engine, "rows": rows}
    return result


class _Clock:
    """The wall and CPU time of the episodes run here, from its start: this process's (the engine, the harness) and
    its children's (the sandboxed commands and the grader's tests)."""

    def __init__(self):
        self.wall, self.own, self.children = time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)

    def figures(self, stats: Optional[dict], rows: Sequence[dict]) -> dict:
        """The episodes' throughput: tokens the model generated per second of their wall time, and, for the
        student, how full the engine's batches were (sequences per batch over its max_seqs)."""
        wall = time.monotonic() - self.wall
        tokens = sum(int(r.get("completion_tokens") or 0) for r in rows)
        out = {"episodes": len(rows), "wall_s": round(wall, 2), "generated_tokens": tokens,
               "tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
               "cpu_s": round(_cpu(resource.RUSAGE_SELF) - self.own, 2),
               "sandbox_cpu_s": round(_cpu(resource.RUSAGE_CHILDREN) - self.children, 2)}
        if stats:
            seqs, batches = stats["sequences"], stats["batches"]
            out.update(max_seqs=stats["max_seqs"], batches=batches, mean_batch_seqs=round(seqs / batches, 2)
                       if batches else None, occupancy=round(seqs / batches / stats["max_seqs"], 3) if batches
                       else None, engine_busy_s=round(stats["busy_s"], 2))
        return out


def _cpu(who: int) -> float:
    u = resource.getrusage(who)
    return u.ru_utime + u.ru_stime


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
                 "agent/tasks": result["tasks"], "agent/n_episodes": result["episodes"],
                 **({"agent/resolve_rate_std": result["resolve_rate_std"]}
                    if result.get("resolve_rate_std") is not None else {})})
        run.summary.update({"agent/exit_statuses": result["exit_statuses"],
                            "agent/episodes": {episode_name(r["instance_id"], r.get("repeat", 0)): {k: r[k] for k in (
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
