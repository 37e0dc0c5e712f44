"""One episode of mini-swe-agent (the harness that produced the teachers' trajectories), in tool-calling mode, against
a model behind trajsft's chat route, its commands run in the task's sandbox (:class:`trajsft.tasks.sandbox.Sandbox`,
wrapped as a mini-swe-agent environment: one sandbox implementation), then graded by the task's tests.

Nothing leaves the machine: litellm reads its model-cost map from its own package
(``LITELLM_LOCAL_MODEL_COST_MAP``), mini-swe-agent's global config lives in a directory of ours, a local model has
no price (``MSWEA_COST_TRACKING=ignore_errors``) and a failed request is not retried for minutes (one attempt)."""

from __future__ import annotations

import logging
import os
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import yaml

from ..errors import ConfigError, one_line
from ..tasks import grade as G
from ..tasks.record import Task
from ..tasks.sandbox import Limits, Sandbox, for_task

log = logging.getLogger("trajsft")

TEMPLATES = ("system_template", "instance_template", "observation_template", "format_error_template")
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's: a command whose output starts with it submits


@dataclass(frozen=True)
class Harness:
    """mini-swe-agent's templates (jinja2: ``{{task}}`` the problem statement, ``{{repo}}`` the repository) and the
    episode's limits."""

    system_template: str
    instance_template: str
    observation_template: str
    format_error_template: str
    step_limit: int = 4
    max_tokens: int = 64
    command_seconds: float = 30.0


def load(path: str | os.PathLike, **limits) -> Harness:
    """The templates of a harness file (YAML), with ``limits``; a missing or malformed file or key: one line."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"agent harness {path}: no such file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"agent harness {path}: not YAML ({one_line(e, 200)})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"agent harness {path}: expected a mapping of {', '.join(TEMPLATES)}")
    bad = [k for k in TEMPLATES if not isinstance(doc.get(k), str) or not doc[k].strip()]
    extra = sorted(set(doc) - set(TEMPLATES))
    if bad or extra:
        raise ConfigError(f"agent harness {path}: " + "; ".join(
            ([f"missing or empty: {', '.join(bad)}"] if bad else []) + ([f"unknown: {', '.join(extra)}"] if extra else [])))
    return Harness(**{k: doc[k] for k in TEMPLATES}, **limits)


def _quiet_imports() -> None:
    """What mini-swe-agent and litellm read when imported: nothing fetched, nothing written to ~/.config."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
    if "MSWEA_GLOBAL_CONFIG_DIR" not in os.environ:
        os.environ["MSWEA_GLOBAL_CONFIG_DIR"] = tempfile.mkdtemp(prefix="trajsft-mswea-")


def missing() -> Optional[str]:
    """None, or the one line that says the harness is not installed."""
    try:
        _quiet_imports()
        import minisweagent  # noqa: F401
        import litellm  # noqa: F401
    except ImportError as e:
        return (f"the agent harness is not installed ({e.name}): mini-swe-agent is in the lock's `agent` group "
                "(uv sync --group agent)")
    return None


def environment(box: Sandbox):
    """``box`` as a mini-swe-agent environment: each action's command runs in it (killed at its limit, said in the
    output), and an output that starts with the submit line ends the episode, as mini-swe-agent's own do."""
    from minisweagent.environments.local import LocalEnvironment

    class SandboxEnvironment(LocalEnvironment):
        def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
            ran = box.run(action.get("command", ""), timeout_s=timeout)
            output = {"output": ran.output, "returncode": -1 if ran.returncode is None else ran.returncode,
                      "exception_info": f"the command was killed at its time limit ({box.limits.command_s:g} s)"
                      if ran.timed_out else ""}
            self._check_finished(output)
            return output

        def get_template_vars(self, **kwargs) -> dict:
            return {"cwd": box.cwd, **kwargs}  # never this machine's environment variables

    return SandboxEnvironment(cwd=box.cwd, timeout=int(box.limits.command_s))


@dataclass
class Episode:
    """One task's episode and its grade: the row the evaluation keeps per task."""

    instance_id: str
    resolved: bool
    exit_status: str  # Submitted, LimitsExceeded, RepeatedFormatError, context_exceeded, could_not_start, ...
    steps: int  # model calls
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    graded: dict  # the grader's row (trajsft.tasks.grade.Graded)
    error: Optional[str] = None  # what ended the episode, when it was not the agent's own exit
    repeat: int = 0  # which of the task's episodes (agent.repeats)

    def row(self) -> dict:
        return asdict(self)


def seed(task: Task, repeat: int) -> int:
    """The sampling seed of ``task``'s episode ``repeat``: its own, the same on every rerun."""
    return zlib.crc32(f"{task.instance_id}#{repeat}".encode())


def run(task: Task, repos: Path, *, url: str, model: str, harness: Harness, sandbox: str, workdir: Path,
        traj_path: Path, repeat: int = 0, temperature: float = 0.0) -> tuple[Episode, str]:
    """One episode of ``task`` (its repository under ``repos``) against ``model`` at ``url``, in a fresh copy under
    ``workdir``; mini-swe-agent's trajectory saved at ``traj_path``. Greedy, or sampled at ``temperature`` with the
    seed of the task's episode ``repeat``. The episode and the submission (the diff of the copy, however the episode
    ended)."""
    _quiet_imports()
    import litellm
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_model import LitellmModel

    litellm.suppress_debug_info = True  # no "Provider List" banner per request
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm_model", "agent"):
        logging.getLogger(name).setLevel(logging.WARNING)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trajsft-episode-", dir=workdir) as tmp:
        os.chmod(tmp, 0o711)  # the sandbox's user (nobody) reaches the copy inside
        repo = G.prepare(task, repos, Path(tmp) / "repo")
        box = for_task(task, repo, sandbox, Limits(command_s=harness.command_seconds,
                                                   total_s=harness.command_seconds * (harness.step_limit + 1)))
        lm = LitellmModel(
            model_name=f"openai/{model}", cost_tracking="ignore_errors",
            observation_template=harness.observation_template, format_error_template=harness.format_error_template,
            # `user` (OpenAI's end-user id; litellm drops it unless sent in the body) names the episode's task: the
            # replay model answers by it
            model_kwargs={"api_base": url, "api_key": "trajsft", "max_tokens": harness.max_tokens,
                          "temperature": temperature, "extra_body": {"user": task.instance_id},
                          **({"seed": seed(task, repeat)} if temperature > 0 else {})})
        agent = DefaultAgent(lm, environment(box), system_template=harness.system_template,
                             instance_template=harness.instance_template, step_limit=harness.step_limit,
                             cost_limit=0, output_path=traj_path)
        error = None
        try:
            info = agent.run(task=task.problem_statement, repo=task.repo)
            status = info.get("exit_status") or "unknown"
        except litellm.exceptions.ContextWindowExceededError as e:
            status = "could_not_start" if agent.n_calls <= 1 else "context_exceeded"
            error = one_line(getattr(e, "message", e), 300)
        except Exception as e:  # noqa: BLE001 - a request or harness failure ends this episode, said, and graded
            status, error = f"error: {type(e).__name__}", one_line(e, 300)
        diff = G.submission(repo)
    # every model call's usage: an assistant turn's, and a reply mini-swe-agent refused (a format error: its response
    # rides on the user message that says so)
    usage = [(m.get("extra") or {}).get("response", {}).get("usage") or {} for m in agent.messages]
    graded = G.grade(task, diff, repos, sandbox=sandbox, workdir=workdir)
    return Episode(instance_id=task.instance_id, resolved=graded.resolved, exit_status=status, steps=agent.n_calls,
                   prompt_tokens=sum(u.get("prompt_tokens") or 0 for u in usage),
                   completion_tokens=sum(u.get("completion_tokens") or 0 for u in usage),
                   seconds=round(time.monotonic() - started, 2), graded=graded.row(), error=error, repeat=repeat), diff
