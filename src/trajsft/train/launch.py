"""Launching Levanter children: their environment, their prelude (:func:`child_prelude`) and a killable,
logged subprocess."""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import signal
import subprocess
import sys
import time
from typing import Mapping, Optional



def child_pythonpath(current: str, cwd: Optional[str] = None) -> str:
    """``PYTHONPATH`` for a child that runs in another directory and must import this very ``trajsft``: the
    directory this process imported the package from comes first (on a Ray host that is the job's
    unpacked working dir, whose ``src`` no venv holds), and relative entries (Ray's ``PYTHONPATH=src``)
    become absolute against this process's working directory."""
    import trajsft

    cwd = cwd or os.getcwd()
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(trajsft.__file__)))
    entries = [pkg_root] if os.path.basename(pkg_root) not in ("site-packages", "dist-packages") else []
    for e in current.split(os.pathsep):
        if e:
            e = e if os.path.isabs(e) else os.path.normpath(os.path.join(cwd, e))
            if e not in entries:
                entries.append(e)
    return os.pathsep.join(entries)


def levanter_env(run_dir: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> dict:
    """Environment for a Levanter subprocess: ``os.environ`` + safe defaults + ``env`` overrides.

    Defaults (only if not already set): ``RAY_AUTH_MODE=disabled`` (Ray 2.60 otherwise enables token
    auth for a fresh local cluster and writes ``~/.ray/auth_token``), ``RAY_TMPDIR`` (short path),
    ``TOKENIZERS_PARALLELISM=false``, ``WANDB_SILENT=true`` and W&B's bounded waits
    (:data:`trajsft.train.tracking.ENV_DEFAULTS`); ``PYTHONPATH`` imports this process's
    ``trajsft`` (:func:`child_pythonpath`). ``WANDB_DIR`` is forced to ``run_dir``
    (Levanter's WandbConfig has no ``dir`` field; W&B reads this env var) unless ``env`` sets it. An inherited
    ``WANDB_SERVICE`` is dropped.
    """
    out = dict(os.environ)
    # a training owns its W&B service: an inherited token (WANDB_SERVICE, set by the SDK in whichever process used it
    # first: a test worker, a notebook) makes a slice's hosts, or a killed trainer and its relaunch, share one
    # wandb-core, where the run's id is "in use"
    out.pop("WANDB_SERVICE", None)
    out["PYTHONPATH"] = child_pythonpath(out.get("PYTHONPATH", ""))
    out.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray puts unix sockets under its temp dir; paths must stay < ~107 chars
    out["RAY_TMPDIR"] = out.get("RAY_TMPDIR") or f"/tmp/ray-{os.getuid()}"
    out.setdefault("TOKENIZERS_PARALLELISM", "false")
    out.setdefault("WANDB_SILENT", "true")
    if run_dir is not None:
        out["WANDB_DIR"] = os.path.abspath(run_dir)
    if env:
        out.update({k: str(v) for k, v in env.items()})
    from .tracking import env_defaults

    out.update(env_defaults(out))
    return out


def child_prelude() -> None:
    """First thing every child does: ask the kernel to SIGKILL it when the launching thread dies
    (PR_SET_PDEATHSIG), so a SIGKILLed Snakemake / driver never leaves an orphan trainer writing
    checkpoints next to its own relaunch; exit if the parent is already gone. Done in the child
    itself (not via preexec_fn, which is unsafe in multi-threaded parents such as Snakemake), at
    the top of the launched module (:mod:`trajsft.train.train_lm_main`, :mod:`trajsft.train.hf_export`).
    Then every thread's Python stack is written to stderr (the child's log) on :data:`STACKS_SIGNAL` (the stall
    watchdog sends it before its kill: the log says where a hung trainer waited), :func:`quiet_none_leaves`, and
    handlers that cannot write drop their records quietly."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)
        except Exception:
            pass
        pp = int(os.environ.get("TRAJSFT_PARENT_PID", "0") or 0)
        if pp and os.getppid() != pp:
            sys.exit(99)
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    quiet_none_leaves()
    logging.raiseExceptions = False  # a full or read-only disk: no "--- Logging error ---" block per record


NONE_LEAF_WARNING = "Unknown leaf type <class 'NoneType'>"


class _NoneLeafFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != NONE_LEAF_WARNING


def quiet_none_leaves() -> None:
    """Drop Levanter's ``Unknown leaf type <class 'NoneType'>`` warning (one per ``None`` leaf of the
    trainer state, ~50 on every resume). Levanter 1.2.dev1644's ``_sharding_from_leaf`` warns for
    every leaf that is not an array while it restores a checkpoint, and the state has ``None`` leaves
    by design (absent optimizer or model parts); their sharding is ``None`` and nothing is loaded for
    them, which is right. Any other unknown leaf type still warns."""
    log = logging.getLogger("levanter.tensorstore_serialization")
    if not any(isinstance(f, _NoneLeafFilter) for f in log.filters):
        log.addFilter(_NoneLeafFilter())


# The children, launched as real modules. train_lm: the same entry point as ``python -m
# levanter.main.train_lm`` (its ``__main__`` block is exactly ``levanter.config.main(main)()``), but
# imported as a module so train_lm's logger is "levanter.main.train_lm" (INFO, e.g. "Resuming
# training from step N") instead of "__main__", whose INFO lines Levanter's logging setup drops;
# and with the end-of-training hooks run once (see trajsft.train.train_lm_main).
TRAIN_CHILD = [sys.executable, "-m", "trajsft.train.train_lm_main"]
EXPORT_CHILD = [sys.executable, "-m", "trajsft.train.hf_export"]


STOP_SAVE_GRACE_S = 120.0  # how long a stopped local training may take to finish its step and save it
STACKS_SIGNAL = signal.SIGUSR1  # a child (child_prelude) writes every thread's Python stack to its log on it
STACKS_GRACE_S = 3.0  # how long a hung child is given to write them before its kill


class Stalled(Exception):
    """The child wrote nothing to its log for ``seconds``: killed as hung. ``waiting_in``: the innermost frame of
    the stack it wrote when asked (:data:`STACKS_SIGNAL`), ``file:line in function``, or None."""

    def __init__(self, seconds: float, waiting_in: Optional[str] = None):
        where = f", waiting in {waiting_in} (every thread's stack is in its log)" if waiting_in else ""
        super().__init__(f"wrote nothing to its log for {seconds:g} s{where}")
        self.seconds = seconds
        self.waiting_in = waiting_in


_FRAME_RE = re.compile(r'^\s+File "(.+)", line (\d+) in (\S+)')


def innermost_frame(dump: str) -> Optional[str]:
    """The innermost frame of the main thread in a faulthandler dump (it lists threads newest first: the main thread
    last), as ``file:line in function``, the file shortened to its last two parts; None without a dump."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", "\n" + dump)
    blocks = [b for b in blocks if re.match(r"(?:Current thread|Thread) 0x", b)]
    for ln in (blocks[-1].splitlines()[1:] if blocks else []):
        if m := _FRAME_RE.match(ln):
            path = "/".join(m.group(1).split("/")[-2:])
            return f"{path}:{m.group(2)} in {m.group(3)}"
    return None


def _wait_writing(proc: subprocess.Popen, log_path: str, stall_s: float, poll_s: float) -> int:
    """``proc``'s exit code; SIGKILLed, :class:`Stalled` raised, once its log has not grown for ``stall_s``."""
    size, since = -1, time.monotonic()
    while True:
        try:
            return proc.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            pass
        now = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        if now != size:
            size, since = now, time.monotonic()
        elif time.monotonic() - since >= stall_s:
            # its stacks first (a child that set up child_prelude writes them to the log), then the kill
            try:
                proc.send_signal(STACKS_SIGNAL)
                proc.wait(timeout=STACKS_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            proc.kill()
            proc.wait()
            with open(log_path, "rb") as f:
                f.seek(size)
                raise Stalled(stall_s, innermost_frame(f.read().decode(errors="replace")))


def run_subprocess(cmd: list[str], log_path: str, env: dict, cwd: str, header: str, timeout=None,
                   stall_s: Optional[float] = None, poll_s: float = 5.0) -> int:
    """Run ``cmd`` with its output appended to ``log_path`` (after ``header``) until it exits; the child is stopped
    if this process is. With ``stall_s``: a child whose log does not grow for that long is SIGKILLed as hung
    (:class:`Stalled`)."""
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "a", buffering=1) as log:
        log.write(f"{header}\n")
        log.flush()
        env = dict(env, TRAJSFT_PARENT_PID=str(os.getpid()))
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
        )
        try:
            if stall_s:
                return _wait_writing(proc, log_path, stall_s, poll_s)
            return proc.wait(timeout=timeout)
        except BaseException:
            # our caller is going away (KeyboardInterrupt / SIGTERM->exception / timeout): don't leave a trainer
            # writing checkpoints behind. A local training saves its step first (trajsft.train.train_lm_main): it
            # gets longer, and the same stop relayed again (Ctrl-C reaches us from the terminal and from Snakemake)
            # does not cut that wait short
            proc.terminate()
            deadline = time.monotonic() + (STOP_SAVE_GRACE_S if env.get("TRAJSFT_SAVE_ON_STOP") == "1" else 30)
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    break
                except KeyboardInterrupt:
                    continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise



def exit_reason(rc: Optional[int]) -> str:
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name if -rc in {int(x) for x in signal.Signals} else "?"
        hint = "; out of memory?" if -rc == signal.SIGKILL else ""
        return f"train_lm was killed by signal {-rc} ({name}{hint})"
    return f"train_lm exited with code {rc}"
