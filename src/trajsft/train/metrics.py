"""The one parser of a training log: Levanter's ``json_logger`` metrics, resume points and the
launch markers ``run_training`` writes. Used by the training result, ``status`` and the curves.
"""

from __future__ import annotations

import json
import os
import re
from typing import Optional


LAUNCH_MARK = "[trajsft.levanter_run] launch"


_JSON_LOGGER_RE = re.compile(r"levanter\.json_logger .*?:: (\{.*\})\s*$")
_RESUME_RE = re.compile(r"Resuming training from step (\d+)")


def json_logger_record(line: str) -> Optional[dict]:
    """The record of a ``json_logger`` line (``{"event": "log", "step": N, "metrics": {...}}``...), else None."""
    m = _JSON_LOGGER_RE.search(line)
    if not m:
        return None
    try:
        return json.loads(m.group(1))
    except ValueError:
        return None


def read_metrics(log_path: str) -> dict:
    """Parse the metrics Levanter's ``json_logger`` tracker wrote into a log.

    Returns ``{"steps": {step: {metric: value}}, "summary": {...}, "launches": [{"kind": "train_lm" |
    "export", "resumed_from_step": int|None, "first_step": int|None, "last_step": int|None}]}``. Step keys are Levanter's 0-based
    step indices. Later lines win, so steps replayed after a resume (and the duplicate line of the
    forced end-of-training hooks) are deduplicated. Launch boundaries are the marker lines
    ``run_training`` writes.
    """
    steps: dict[int, dict] = {}
    summary: dict = {}
    launches: list[dict] = []
    cur: Optional[dict] = None
    if not os.path.exists(log_path):
        return {"steps": steps, "summary": summary, "launches": launches}
    with open(log_path, errors="replace") as f:
        for line in f:
            if line.startswith(LAUNCH_MARK):
                kind = line[len(LAUNCH_MARK) :].split()[0] if line[len(LAUNCH_MARK) :].strip() else ""
                cur = {"kind": kind, "resumed_from_step": None, "first_step": None, "last_step": None}
                launches.append(cur)
                continue
            m = _RESUME_RE.search(line)
            if m and cur is not None:
                cur["resumed_from_step"] = int(m.group(1))
                continue
            rec = json_logger_record(line)
            if rec is None:
                continue
            ev = rec.get("event")
            if ev == "log" and rec.get("step") is not None:
                s = int(rec["step"])
                steps.setdefault(s, {}).update(rec.get("metrics") or {})
                if cur is not None and "train/loss" in (rec.get("metrics") or {}):
                    if cur["first_step"] is None:
                        cur["first_step"] = s
                    cur["last_step"] = s
            elif ev in ("summary", "finish"):
                summary.update(rec.get("metrics") or rec.get("summary") or {})
    return {"steps": steps, "summary": summary, "launches": launches}


def loss_history(metrics: dict) -> list:
    return [[s, float(m["train/loss"])] for s, m in sorted(metrics["steps"].items()) if "train/loss" in m]


def eval_losses(metrics: dict) -> dict:
    out = {}
    for s, m in sorted(metrics["steps"].items()):
        for k, v in m.items():
            if k.startswith("eval/") and k.endswith("/loss"):
                out[k] = [s, float(v)]
    return out
