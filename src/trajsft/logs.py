"""Logging for rule jobs: to the rule's log file and stderr, with secrets redacted."""

from __future__ import annotations

import logging
import os
import re
import sys

SECRET_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN", "RAY_TOKEN")


def secret_values() -> list[str]:
    return [v for k in SECRET_VARS if (v := os.environ.get(k)) and len(v) >= 4]


def redact(text: str) -> str:
    for v in secret_values():
        text = text.replace(v, "***")
    return text


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


_TRACEBACK = "Traceback (most recent call last):"
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?::\s.*)?$")  # ``ValueError: ...``, ``jax.errors.JaxRuntimeError: ...``


def last_exception(text: str) -> str | None:
    """The exception a log's last Python traceback ended with (``ValueError: ...``: its class and message line),
    else None: the cause of a child process that died of it."""
    at = text.rfind(_TRACEBACK)
    if at < 0:
        return None
    found = None
    for line in text[at:].splitlines()[1:]:
        if line and not line[0].isspace():  # the frames are indented; the raise is not
            if _RAISED.match(line.rstrip()):
                found = line.rstrip()
            break
    return found


def setup(log_path: str | None = None, level: str = "INFO") -> logging.Logger:
    # a handler that cannot write (a full or read-only disk) drops the record instead of printing a
    # "--- Logging error ---" block with a trace for each one
    logging.raiseExceptions = False
    root = logging.getLogger()
    root.setLevel(level)
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="a"))
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    return logging.getLogger("trajsft")


# ---- user errors met while Snakemake reads the workflow ----------------------------------------------------------

_STOPS: list[str] = []  # the message of every WorkflowStop raised in this process


class WorkflowStop(Exception):
    """A user error met while Snakemake reads the workflow or builds its DAG: a config problem, a target given as a
    ``--configfile``, a target that names no target, an opt-in section missing. Raised (never ``sys.exit``), so
    Snakemake reports it and exits 1 as for any workflow error; with :func:`one_line_stops` installed the report is
    the message alone on stderr, with no Snakefile line or trace: the user fixes a config or a command, not our code."""

    def __init__(self, message: str):
        super().__init__(message)
        _STOPS.append(message)


class _OneLineStops(logging.Filter):
    """Snakemake logs an error as ``<Class> in file F, line N:`` + the message + a trace (an input function's is
    wrapped in an InputFunctionException that adds its wildcards), on stdout: when the record reports a
    WorkflowStop, the stop's message alone goes to stderr instead, where every one-line error of ours goes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and _STOPS:
            text = str(record.msg)
            for message in reversed(_STOPS):
                if message in text:
                    print(message, file=sys.stderr, flush=True)
                    return False
        return True


# Snakemake's report of a script rule that exited non-zero: the temporary script's command line, which says nothing
# the rule has not said. 1: a one-line error or a traceback; 130/143: stopped by SIGINT/SIGTERM (said in one line)
_SAID_BY_THE_RULE = re.compile(r"CalledProcessError in file .*\.smk\", line \d+:\s*Command '[^']*\.snakemake/scripts/"
                               r"[^']*\.py' returned non-zero exit status (1|130|143)\.", re.S)


class _SaidByTheRule(logging.Filter):
    """Drops Snakemake's ``RuleException: CalledProcessError ... returned non-zero exit status 1`` for a rule script
    (every trajsft rule is one) that ended on its own cause: the rule job said it on stderr (trajsft.rule_job), so the
    terminal has the cause once and Snakemake's ``Error in rule`` block below says where the log is. An exit by a
    signal (``-9``: out of memory?) is kept: no rule code said anything."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and _SAID_BY_THE_RULE.search(str(record.msg)))


def one_line_stops(logger: str = "snakemake.logging") -> None:
    """Report every :class:`WorkflowStop` as its message alone on Snakemake's logger, and leave out Snakemake's
    restatement of a rule script's own failure (:class:`_SaidByTheRule`). Idempotent: the workflow is read more than
    once in one process."""
    target = logging.getLogger(logger)
    for kind in (_OneLineStops, _SaidByTheRule):
        if not any(isinstance(f, kind) for f in target.filters):
            target.addFilter(kind())
