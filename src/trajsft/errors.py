"""The errors every layer shares: what the rule scripts and the CLI turn into one line.

Each carries one user-facing line (what is wrong, and where: file, row, field, host); the rule
scripts and the CLI print that line instead of a traceback. Modules import these from here, so no
module needs another one just for its errors. An error that only one module raises, for its own
callers, lives with that module: the Ray job client's ``RayJobsError`` family (a ``ClusterError``), the
fit check's ``LibtpuMissing`` (a ``DataError``), a transform's ``BadRow``, the export's
``Unrepresentable``, the tokenizer fetch's ``FetchError`` and storage's ``PayloadMismatch``.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem: a key, a value, a target or a profile."""


class PreflightError(ConfigError):
    """A cluster profile was refused before anything was submitted (address, token, bucket, env)."""


class JobEnvironmentError(ConfigError):
    """The training job's environment cannot start training: Ray could not set up the runtime env, a
    package does not import, an installed version is not the lock's. Never retried (another slice or
    Snakemake attempt meets the same environment); see :mod:`trajsft.cluster.setup_failure`."""


class DataError(RuntimeError):
    """A data problem: wrong row count, a missing column, an unreadable file or manifest."""


class TrainingFailed(RuntimeError):
    """Training failed: train_lm killed by a signal or exiting non-zero, a run already locked or still running, a
    Ray job that failed or ended without its result, an export that did not complete."""


class StorageFault(RuntimeError):
    """A step could not write where it writes (the storage root, mostly): a full device, a quota, a read-only file
    system, a refused permission. One line (trajsft.io.fault_line); what was built is kept, a rerun goes on."""


class SnakemakeStopping(RuntimeError):
    """Snakemake got SIGINT/SIGTERM and is shutting down: a retry it starts meanwhile starts no new training."""


class HostLost(RuntimeError):
    """A preemption, not a failure: this host's training process was killed, or a peer host of
    the slice went away. The slice loop starts a new slice attempt and does not count a failure."""


class SingleProcessOnPod(RuntimeError):
    """One training process was started on one host of a multi-host TPU slice (it would wait for
    its peers until JAX's deadline)."""


class ClusterError(RuntimeError):
    """The Ray cluster or a job on it: unreachable, unauthorized, a job failed or was stopped."""


# what a rule job reports in one line (and exit 1) beside the user errors of data and config
RULE_JOB_ERRORS = (TrainingFailed, SnakemakeStopping, ClusterError, StorageFault)


class SliceLimitExceeded(ClusterError):
    """More preemptions or failures than the profile's ``max_preemptions`` / ``max_failures``."""


def one_line(text: object, limit: int = 300) -> str:
    """``text`` (a message, an exception) on one line: whitespace runs become one space, and past ``limit``
    characters it is cut, ending in ``...``; an exception with no message is its class name."""
    line = " ".join(str(text).split()) or (type(text).__name__ if isinstance(text, BaseException) else "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def quiet_on_closed_pipe(main):
    """Wrap a command's ``main`` so that output cut by a closed pipe (``trajsft status | head``)
    ends the command quietly with exit 0 instead of a ``BrokenPipeError`` traceback. stdout is
    pointed at /dev/null first, so the interpreter's own final flush does not fail either (the
    recipe of Python's ``signal`` docs)."""
    import functools
    import os
    import sys

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0

    return wrapper
