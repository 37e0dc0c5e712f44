"""W&B online: bounded waits, a refusal told in one line, the run as the server names it.

Only JAX process 0 of a run talks to W&B (Levanter makes every other process write offline files). Its
``wandb.init`` raises when the server refuses the key, holds the run id for something else, or does not
answer: the ``train_lm`` child (:mod:`trajsft.train.train_lm_main`) then prints :data:`MARK` and the cause
in one line and exits :data:`EXIT_CODE`, which the local launch (:mod:`trajsft.train.run`) and a slice host
(:mod:`trajsft.cluster.host`) turn into a configuration error: the same key would be refused by every
retry and every slice. Once ``init`` has returned, W&B never stops training: ``log`` queues, and the
finish waits at most ``WANDB_FINISH_TIMEOUT``.

After ``init``, the child records the run as the server gave it (:data:`RECORD` in ``WANDB_DIR``: id,
URL, entity, project, whether it resumed and at which step) and adds this run's identity to the W&B config
(:data:`CONFIG_ENV`: target, run hash, content-addressed inputs); ``trajsft status`` shows that URL.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Mapping, Optional

EXIT_CODE = 78  # EX_CONFIG: the train_lm child could not start its W&B run
MARK = "trajsft: W&B:"  # the child's one line: MARK <cause>
RECORD = "wandb_run.json"  # in WANDB_DIR (the run's local dir): the run as the server gave it
CONFIG_ENV = "TRAJSFT_WANDB_CONFIG"  # JSON added to the W&B run's config under "trajsft"
RECORD_ENV = "TRAJSFT_WANDB_RECORD"  # where to write RECORD instead (a slice host: the run dir on the bucket)
DEFAULT_BASE_URL = "https://api.wandb.ai"

# Bounded waits (each only where the user has not set it). Measured against a stand-in server with wandb
# 0.31.0: a dead or 503 server holds init 100 s by default, 26 s with an init timeout of 15 s; a server gone
# after init holds finish() for minutes, exactly the finish timeout with one (the process then exits 0).
ENV_DEFAULTS = {"WANDB_INIT_TIMEOUT": "20", "WANDB_FINISH_TIMEOUT": "60"}


def env_defaults(env: Mapping[str, str]) -> dict:
    """The bounded-wait settings ``env`` leaves unset."""
    return {k: v for k, v in ENV_DEFAULTS.items() if not env.get(k)}


def base_url(env: Optional[Mapping[str, str]] = None) -> str:
    env = os.environ if env is None else env
    return (env.get("WANDB_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")


def cause(exc: BaseException, env: Optional[Mapping[str, str]] = None) -> str:
    """One line for an exception out of ``wandb.init`` (no response body beyond its first line)."""
    msg = " ".join(str(exc).split())
    where = base_url(env)
    code = re.search(r"\b(401|403)\b", msg)
    if code:
        return (f"{where} refused the API key (HTTP {code.group(1)}): check WANDB_API_KEY "
                f"(and WANDB_ENTITY / WANDB_PROJECT); {msg[:160]}")
    if type(exc).__name__ == "AuthenticationError":  # the SDK's own check, before asking the server
        return f"the W&B SDK refused WANDB_API_KEY before asking {where}: {msg[:200]}"
    if re.search(r"Timed out|timed out|giving up|Connection refused|ConnectionError|\b5\d\d\b", msg):
        limit = (env or os.environ).get("WANDB_INIT_TIMEOUT") or "?"
        return (f"{where} did not answer wandb.init within WANDB_INIT_TIMEOUT={limit}s (W&B down, or no route to "
                f"it?): {msg[:160]}; set wandb.mode: offline to train without it")
    return f"wandb.init failed at {where}: {type(exc).__name__}: {msg[:200]}"


def run_identity(levanter_cfg: Mapping[str, Any]) -> dict:
    """What names this run, from its train_lm config: the target (the first W&B tag), the run (its dir) and
    hash (the trainer and W&B id), and its content-addressed inputs (the other tags, ``kind:name``: each
    teacher's tokenized data, the student's snapshot)."""
    tr = levanter_cfg["trainer"]
    wb = next((t for t in tr.get("tracker") or [] if t.get("type") == "wandb"), {})
    tags = list(wb.get("tags") or [None])
    run_dir = os.path.dirname(str(tr["checkpointer"]["base_path"]).rstrip("/"))
    return {"target": tags[0], "run": os.path.basename(run_dir), "run_hash": tr["id"],
            "inputs": sorted(t for t in tags[1:] if ":" in str(t))}


def child_env(levanter_cfg: Mapping[str, Any]) -> dict:
    """Environment a train_lm child needs for W&B: :data:`CONFIG_ENV` (the run's identity)."""
    return {CONFIG_ENV: json.dumps(run_identity(levanter_cfg), sort_keys=True)}


def line_of(log_text: str) -> Optional[str]:
    """The child's cause (after :data:`MARK`) in a launch log, the last one; None if none."""
    hits = [ln.split(MARK, 1)[1].strip() for ln in log_text.splitlines() if MARK in ln]
    return hits[-1] if hits else None


def guard_init() -> None:
    """In the train_lm child: make Levanter's ``WandbConfig.init`` fail in one line (exit
    :data:`EXIT_CODE`) instead of a traceback, and record the run it started (:func:`record`)."""
    from levanter.tracker.wandb import WandbConfig

    if getattr(WandbConfig.init, "_trajsft_guarded", False):
        return
    original = WandbConfig.init

    def init(self, run_id):
        import wandb

        try:
            tracker = original(self, run_id)
        except wandb.errors.Error as e:
            print(f"{MARK} {cause(e)}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(EXIT_CODE)  # before JAX's and W&B's exit hooks, which wait for peers and the server
        record(tracker.run)
        return tracker

    init._trajsft_guarded = True
    WandbConfig.init = init


def record(run: Any) -> Optional[dict]:
    """Write :data:`RECORD` for an online run of this process and add :data:`CONFIG_ENV` to its config."""
    if run is None or getattr(run.settings, "mode", None) != "online":
        return None
    extra = os.environ.get(CONFIG_ENV)
    if extra:
        run.config.update({"trajsft": json.loads(extra)}, allow_val_change=True)
    rec = {"id": run.id, "url": run.url, "entity": run.entity, "project": run.project, "resumed": bool(run.resumed),
           "starting_step": int(run.starting_step or 0), "base_url": base_url()}
    from .. import io

    # the run dir, also on a bucket (a slice host's WANDB_DIR is its own local dir)
    io.write_json(os.environ.get(RECORD_ENV) or os.path.join(os.environ.get("WANDB_DIR") or ".", RECORD), rec)
    return rec


def read_record(run_dir: str) -> Optional[dict]:
    """:data:`RECORD` of a run dir (local or bucket), or None: the run as W&B named it, once it started."""
    from .. import io

    try:
        rec = io.read_json(io.join(run_dir, RECORD))
    except Exception:  # noqa: BLE001 - absent, unreadable or a bucket that refuses: the config's guess stands
        return None
    return rec if isinstance(rec, dict) and rec.get("url") else None


def offline_runs(run_dir: str) -> Optional[str]:
    """The offline W&B runs of a local run dir (``wandb.mode: offline``: the SDK writes ``offline-run-*`` under
    WANDB_DIR, the run dir) as the glob ``wandb sync`` uploads them with, or None (none, or a bucket: an offline run is
    written on the host that trained)."""
    import glob

    from .. import io

    if io.is_remote(run_dir):
        return None
    pattern = os.path.join(run_dir, "wandb", "offline-run-*")
    return pattern if glob.glob(pattern) else None


def key_shape_problem(key: str) -> Optional[str]:
    """What the W&B SDK itself says of ``key`` before sending it (e.g. fewer than 40 characters), or None."""
    try:
        from wandb.sdk.lib.wbauth.validation import check_api_key
    except ImportError:  # another SDK: the server's answer decides
        return None
    return check_api_key(key)


def check_key(key: str, url: Optional[str] = None, timeout_s: float = 5.0) -> tuple[Optional[str], Optional[str]]:
    """Ask W&B once who ``key`` is (GraphQL ``Viewer``): ``(problem, note)``, a refusal as the problem, no
    answer as a note (process 0 asks again, bounded by WANDB_INIT_TIMEOUT)."""
    import requests

    url = (url or base_url()).rstrip("/")
    shape = key_shape_problem(key)
    if shape:
        return f"WANDB_API_KEY: {shape} (the W&B SDK refuses it before asking {url})", None
    try:
        r = requests.post(f"{url}/graphql", auth=("api", key), timeout=timeout_s,
                          json={"query": "query Viewer { viewer { id entity username } }", "variables": {}})
    except requests.RequestException as e:
        return None, f"W&B at {url} did not answer ({type(e).__name__}): the key was not checked"
    if r.status_code in (401, 403):
        return (f"W&B at {url} refused WANDB_API_KEY (HTTP {r.status_code}): fix the key, or set "
                "wandb.mode: offline"), None
    if r.status_code >= 400:
        return None, f"W&B at {url} answered HTTP {r.status_code}: the key was not checked"
    try:
        viewer = (r.json().get("data") or {}).get("viewer")
    except ValueError:
        viewer = None
    if not viewer:
        return f"W&B at {url} does not know WANDB_API_KEY (no user for it): fix the key, or set wandb.mode: offline", None
    return None, None
