"""Logging for rule jobs: to the rule's log file and stderr, with secrets redacted."""

from __future__ import annotations

import logging
import os
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


def setup(log_path: str | None = None, level: str = "INFO") -> logging.Logger:
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
