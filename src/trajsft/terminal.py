"""What a long step says on the terminal while it works: one line at a bounded rate on stderr, never into a log file
(a rule job's stderr is Snakemake's terminal, its log file the rule's). A training's lines are
:mod:`trajsft.train.progress`'s (read from Levanter's log); a data step counts its rows with :class:`Counted`."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")


def every_s() -> float:
    """At most one line per this many seconds (``TRAJSFT_PROGRESS_SECONDS``, default 10)."""
    return float(os.environ.get("TRAJSFT_PROGRESS_SECONDS") or 10)


def duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Counted:
    """A data step's count of what it went through: ``add(n)`` as it goes; at most every :func:`every_s` seconds, the
    first only after that long (a step shorter than that says nothing), one line such as
    ``trajsft shard <name>: 2,400/5,251 rows · 850 rows/s · ETA 0:03``."""

    def __init__(self, label: str, total: Optional[int] = None, unit: str = "rows", *, every: Optional[float] = None,
                 out: Optional[Callable[[str], None]] = None, clock: Callable[[], float] = time.monotonic):
        self.label, self.total, self.unit, self.clock = label, total, unit, clock
        self.every_s = every_s() if every is None else every
        self.out = out or say
        self.n = 0
        self.started = self.said_at = clock()

    def add(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.said_at >= self.every_s:
            self.out(self.line(now))
            self.said_at = now

    def line(self, now: float) -> str:
        per_s = self.n / (now - self.started) if now > self.started else 0.0
        parts = [f"{self.n:,}/{self.total:,} {self.unit}" if self.total else f"{self.n:,} {self.unit}"]
        if per_s:
            parts.append(f"{rate(per_s)} {self.unit}/s")
            if self.total and self.n < self.total:
                parts.append(f"ETA {duration((self.total - self.n) / per_s)}")
        return f"{self.label}: " + " · ".join(parts)

    def counting(self, items: Iterable[T]) -> Iterator[T]:
        """``items``, each counted once the step took it."""
        for x in items:
            yield x
            self.add()
