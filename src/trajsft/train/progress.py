"""A training's progress on the terminal: one line at a bounded rate while it runs (step/total, loss, tokens/s, ETA),
read from the new ``json_logger`` lines of its log; printed to stderr only, never into a log file (a rule job's
stderr is Snakemake's terminal, its log the training's)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable, Iterator, Optional

from ..terminal import duration as _duration, every_s, rate as _rate, say
from .metrics import json_logger_record


class Progress:
    """Call :meth:`look` as often as convenient: it reads what the log gained since the last look (nothing before
    the launch) and says a line when a new step finished and ``every`` seconds passed since the last line."""

    def __init__(self, label: str, log_path: str, total_steps: int, *, every: Optional[float] = None,
                 out: Optional[Callable[[str], None]] = None, clock: Callable[[], float] = time.monotonic):
        self.label, self.log_path, self.total, self.clock = label, log_path, int(total_steps), clock
        self.every_s = every_s() if every is None else every
        self.out = out or say
        self.offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        self.partial = ""
        self.step: Optional[int] = None
        self.loss: Optional[float] = None
        self.tokens_per_s: Optional[float] = None
        self.said_step: Optional[int] = None
        self.said_at = float("-inf")
        self.first: Optional[tuple[float, int]] = None  # (when, step) this launch's first step was seen

    def _read(self) -> None:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        self.offset += len(chunk)
        text = self.partial + chunk.decode(errors="replace")
        lines = text.split("\n")
        self.partial = lines.pop()
        for line in lines:
            rec = json_logger_record(line)
            if not rec or rec.get("event") != "log" or rec.get("step") is None:
                continue
            m = rec.get("metrics") or {}
            if "train/loss" in m:
                self.step, self.loss = int(rec["step"]), float(m["train/loss"])
                if self.first is None:
                    self.first = (self.clock(), self.step)
            if "throughput/tokens_per_second" in m:
                self.tokens_per_s = float(m["throughput/tokens_per_second"])

    def line(self) -> Optional[str]:
        """What the terminal is told now (None before the first step)."""
        if self.step is None:
            return None
        done = self.step + 1  # Levanter's steps are 0-based: step N is the (N+1)th update
        parts = [f"step {done}/{self.total}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.tokens_per_s:
            parts.append(f"{_rate(self.tokens_per_s)} tokens/s")
        if self.first and self.step > self.first[1]:
            per_step = (self.clock() - self.first[0]) / (self.step - self.first[1])
            parts.append(f"ETA {_duration(per_step * max(0, self.total - done))}")
        return f"{self.label}: " + " · ".join(parts)

    def look(self) -> None:
        self._read()
        now = self.clock()
        if self.step is None or self.step == self.said_step or now - self.said_at < self.every_s:
            return
        line = self.line()
        if line:
            self.out(line)
            self.said_step, self.said_at = self.step, now


@contextlib.contextmanager
def shown_while(progress: Progress, tick_s: float = 2.0) -> Iterator[Progress]:
    """Look at ``progress`` every ``tick_s`` seconds in a thread while the block runs (a local training's child, or
    a Ray job followed here: their log is written by the child, or by the follower)."""
    done = threading.Event()

    def loop():
        while not done.wait(tick_s):
            progress.look()

    t = threading.Thread(target=loop, name="trajsft-progress", daemon=True)
    t.start()
    try:
        yield progress
    finally:
        done.set()
        t.join(timeout=5)
