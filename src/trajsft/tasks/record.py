"""A task instance in SWE-smith's fields, so that real SWE-smith-rs instances read into the same record: the
repository, the bug as a git diff (``patch``), the tests it breaks (``FAIL_TO_PASS``) and those that must keep
passing (``PASS_TO_PASS``), the problem statement, the test command, and for SWE-smith's instances the docker image
holding the repository at /testbed (``image_name``). A malformed row is one line naming the row and the field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..errors import DataError

RUST_TEST_CMD = "cargo test --offline --verbose"  # SWE-smith's Rust profile runs `cargo test --verbose`; no network


@dataclass(frozen=True)
class Task:
    instance_id: str
    repo: str  # where the repository is: a directory of the task set (the demo's crates), or SWE-smith's owner/name
    patch: str  # the bug, a git diff against the repository
    FAIL_TO_PASS: tuple[str, ...]  # the tests the bug breaks: a fix makes them pass
    PASS_TO_PASS: tuple[str, ...]  # the tests that pass with and without the bug: a fix keeps them passing
    problem_statement: str  # a title line, then the body
    test_cmd: str = RUST_TEST_CMD
    image_name: Optional[str] = None  # a docker image holding the repository at /testbed: the task runs in it

    @property
    def title(self) -> str:
        return self.problem_statement.split("\n", 1)[0]

    def row(self) -> dict:
        return {"instance_id": self.instance_id, "repo": self.repo, "patch": self.patch,
                "FAIL_TO_PASS": list(self.FAIL_TO_PASS), "PASS_TO_PASS": list(self.PASS_TO_PASS),
                "problem_statement": self.problem_statement, "test_cmd": self.test_cmd,
                **({"image_name": self.image_name} if self.image_name else {})}


def _tests(row: Mapping[str, Any], field: str, where: str) -> tuple[str, ...]:
    value = row.get(field)
    if isinstance(value, str):  # SWE-smith's HF rows carry the lists as JSON text
        try:
            value = json.loads(value)
        except ValueError:
            raise DataError(f"{where}: field {field}: not a JSON list of test names") from None
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise DataError(f"{where}: field {field}: expected a list of test names, got {type(value).__name__}")
    return tuple(value)


def from_row(row: Any, where: str) -> Task:
    """The task of one instance row (``where`` names it: ``tasks.jsonl row 3``); one line for a malformed field."""
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    for field in ("instance_id", "repo", "patch", "problem_statement"):
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise DataError(f"{where}: field {field}: missing or empty")
    if not row["patch"].startswith("diff --git "):
        raise DataError(f"{where}: field patch: not a git diff (it starts with {row['patch'][:20]!r})")
    fail, keep = _tests(row, "FAIL_TO_PASS", where), _tests(row, "PASS_TO_PASS", where)
    if not fail:
        raise DataError(f"{where}: field FAIL_TO_PASS: empty (a bug that breaks no test cannot be graded)")
    test_cmd = row.get("test_cmd", RUST_TEST_CMD)
    if not isinstance(test_cmd, str) or not test_cmd.strip():
        raise DataError(f"{where}: field test_cmd: missing or empty")
    image = row.get("image_name")
    if image is not None and (not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image)):
        raise DataError(f"{where}: field image_name: not a docker image name ({str(image)[:60]!r})")
    return Task(instance_id=row["instance_id"], repo=row["repo"], patch=row["patch"], FAIL_TO_PASS=fail,
                PASS_TO_PASS=keep, problem_statement=row["problem_statement"], test_cmd=test_cmd, image_name=image)
