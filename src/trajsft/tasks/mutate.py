"""Task sets made offline the way SWE-smith makes them: procedural bug mutations of a crate's code (flip an
operator, negate a condition, swap a call's arguments, drop an off-by-one), each kept only where the unmodified
crate passes its tests and at least one test fails after it; FAIL_TO_PASS and PASS_TO_PASS come from the two runs,
the problem statement from the failing tests. Deterministic: the candidates are visited in file and line order."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import grade as G
from .record import RUST_TEST_CMD, Task
from .sandbox import Limits, Sandbox

# (kind, pattern, replacement) on one line of code outside the crate's #[cfg(test)] module
_FLIPS = {" < ": " > ", " > ": " < ", " <= ": " >= ", " >= ": " <= ", " == ": " != ", " != ": " == ",
          " + ": " - ", " - ": " + "}
_IF = re.compile(r"\bif (?!let )(.+?) \{")
_CALL = re.compile(r"(?<!fn )\b([a-z_]\w*)\(([a-z_][\w.]*), ([a-z_][\w.]*)\)")


@dataclass(frozen=True)
class Mutation:
    kind: str  # flip_operator | negate_condition | swap_arguments | drop_off_by_one
    file: str  # relative to the crate
    line: int  # 1-based
    before: str
    after: str

    nth: int = 1  # the how-manieth mutation of this kind on this line

    @property
    def name(self) -> str:
        return f"{self.kind}_{Path(self.file).stem}_{self.line}" + (f"_{self.nth}" if self.nth > 1 else "")


def candidates(crate: Path) -> list[Mutation]:
    """Every mutation of the crate's library code, in file and line order (one change per mutation)."""
    found = []
    for path in sorted((crate / "src").rglob("*.rs")):
        rel = str(path.relative_to(crate))
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip().startswith("#[cfg(test)]"):
                break  # the tests are not mutated
            code = line.split("//", 1)[0]
            if not code.strip():
                continue
            for old, new in _FLIPS.items():
                at = code.find(old)
                if at >= 0 and "->" not in code[max(0, at - 1):at + len(old) + 1]:
                    nth = 1 + sum(f.kind == "flip_operator" and f.line == i and f.file == rel for f in found)
                    found.append(Mutation("flip_operator", rel, i, line, line[:at] + new + line[at + len(old):], nth))
            m = _IF.search(code)
            if m and "=>" not in code:  # a match guard is no if statement
                found.append(Mutation("negate_condition", rel, i, line,
                                      line[:m.start(1)] + f"!({m.group(1)})" + line[m.end(1):]))
            m = _CALL.search(code)
            if m and m.group(2) != m.group(3):
                found.append(Mutation("swap_arguments", rel, i, line,
                                      line[:m.start(2)] + f"{m.group(3)}, {m.group(2)}" + line[m.end(3):]))
            if " + 1" in code or " - 1" in code:
                one = " + 1" if " + 1" in code else " - 1"
                found.append(Mutation("drop_off_by_one", rel, i, line, line.replace(one, "", 1)))
    return found


def _bug_patch(crate: Path, m: Mutation, work: Path) -> str:
    repo = work / "mutant"
    shutil.rmtree(repo, ignore_errors=True)
    G.checkout(crate, repo)
    f = repo / m.file
    lines = f.read_text().split("\n")
    assert lines[m.line - 1] == m.before
    lines[m.line - 1] = m.after
    f.write_text("\n".join(lines))
    return G.git(repo, "diff").stdout


def _failures(log: str, failing: list[str]) -> str:
    """The body of a problem statement: the first failing test's panic, as cargo printed it (the title names them
    all; one panic keeps an agent's first prompt short: a small student's context is its training seq_len)."""
    parts = []
    for t in failing[:1]:
        m = re.search(rf"---- {re.escape(t)} stdout ----\n(.*?)(?:\n\n|\Z)", log, re.S)
        said = "\n".join(x for x in (m.group(1) if m else "").splitlines() if not x.startswith("note: "))
        said = re.sub(r"^(thread '[^']*') \(\d+\) panicked", r"\1 panicked", said, flags=re.M)  # no thread id
        parts.append(f"`{t}` fails:\n{said.strip() or '(no message)'}")
    return "\n\n".join(parts)


@dataclass
class Made:
    tasks: list[Task] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)  # why a candidate was not kept -> how many


def from_crates(crates: Path, *, sandbox: str = "bubblewrap", limits: Limits = Limits(command_s=120)) -> Made:
    """The tasks of every crate under ``crates`` (a directory per crate), ``repo`` naming the crate's directory."""
    made = Made()
    with tempfile.TemporaryDirectory(prefix="trajsft-mutate-") as tmp:
        work = Path(tmp)
        work.chmod(0o711)  # the sandbox's user reaches the copies inside
        for crate in sorted(p for p in crates.iterdir() if (p / "Cargo.toml").is_file()):
            base, _ = _run(crate, "", work, sandbox, limits)
            if not base or "failed" in base.values():
                made.dropped["the crate's own tests do not all pass"] += 1
                continue
            for m in candidates(crate):
                patch = _bug_patch(crate, m, work)
                after, log = _run(crate, patch, work, sandbox, limits)
                if not after:
                    made.dropped["does not build, or runs no test"] += 1
                    continue
                fail = sorted(t for t, s in after.items() if s == "failed" and base.get(t) == "passed")
                if not fail:
                    made.dropped["no test fails"] += 1
                    continue
                keep = sorted(t for t, s in after.items() if s == "passed" and base.get(t) == "passed")
                short = ", ".join(t.rsplit("::", 1)[-1] for t in fail)
                made.tasks.append(Task(
                    instance_id=f"{crate.name}.{m.name}", repo=crate.name, patch=patch, FAIL_TO_PASS=tuple(fail),
                    PASS_TO_PASS=tuple(keep),
                    problem_statement=f"{crate.name}: {short} fail{'s' if len(fail) == 1 else ''}\n\n"
                                      + _failures(log, fail),
                    test_cmd=RUST_TEST_CMD))
    return made


def _run(crate: Path, patch: str, work: Path, sandbox: str, limits: Limits) -> tuple[dict[str, str], str]:
    """(each test's status, the log) of ``crate`` with ``patch``; no status when it does not apply or hangs."""
    repo = work / "run"
    shutil.rmtree(repo, ignore_errors=True)
    if G.checkout(crate, repo, patch) is not None:
        return {}, ""
    ran = Sandbox(repo, sandbox, limits).run(RUST_TEST_CMD)
    return ({} if ran.timed_out else G.parse_test_log(ran.output)), ran.output
