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


# ---- the root cause of a network failure ---------------------------------------------------------------------------

_HOST_PORT = r"host='([^']+)', port=(\d+)"
_NO_NAME = ("Name or service not known", "Temporary failure in name resolution", "nodename nor servname",
            "No address associated with hostname", "Failed to resolve")


def _chain(exc: BaseException):
    """``exc`` and what caused it, outermost first: ``__cause__``/``__context__``, and what libraries keep elsewhere
    (requests' ConnectionError holds urllib3's MaxRetryError in its args, which holds the socket error as ``reason``)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        nxt = e.__cause__ or e.__context__ or getattr(e, "reason", None)
        if not isinstance(nxt, BaseException):
            nxt = next((a for a in e.args if isinstance(a, BaseException)), None)
        e = nxt


def network_cause(exc: BaseException) -> str | None:
    """The root cause of a failed network request in a few words, naming the host, as ``trajsft plan`` names an
    unreachable bucket: the host name does not resolve (no network, DNS down), nothing listens, no answer in time,
    no route, a reset or a TLS failure. None when ``exc`` is not a network failure."""
    import errno
    import re
    import socket
    import ssl

    from urllib.parse import urlsplit

    chain = list(_chain(exc))
    found = next((m for e in chain if (m := re.search(_HOST_PORT, str(e)))), None)
    host, port = (found.group(1), found.group(2)) if found else (None, None)
    asked = next((u for e in chain if (u := getattr(getattr(e, "request", None), "url", None))), None)
    if host is None and asked:  # requests' error for a reply cut short names no host: the request does
        u = urlsplit(asked)
        host, port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
    where = f"{host}:{port}" if host else "the server"
    for e in reversed(chain):  # the deepest cause first
        text = str(e)
        if isinstance(e, socket.gaierror) or any(t in text for t in _NO_NAME):
            return f"{host or 'the host name'} does not resolve (no network, or DNS down)"
        if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
            return f"{where} refused the connection (nothing listens there)"
        if isinstance(e, ssl.SSLError):
            return f"the TLS handshake with {where} failed: {one_line(e, 200)}"
        if isinstance(e, (TimeoutError, socket.timeout)) or type(e).__name__ in ("ConnectTimeoutError", "ConnectTimeout",
                                                                                 "ReadTimeoutError", "ReadTimeout"):
            return f"{where} did not answer in time"
        if getattr(e, "errno", None) in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return f"no route to {where} (no network?)"
        if isinstance(e, ConnectionResetError):
            return f"{where} reset the connection"
    return None
