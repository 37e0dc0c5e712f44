"""Reading the README and docs/*.md as a user would: their links and the commands of their code blocks."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = ("uv", "python3", "python", "snakemake", "trajsft", "bash", "pipx", "apt-get")


def doc_files() -> list[Path]:
    """README.md and every page under docs/ (pages added later are picked up by the glob)."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]


def code_lines(text: str) -> list[str]:
    """Lines of code blocks: fenced (```) blocks, and indented blocks (4 spaces more than the text
    around them, after a blank line, as in a list item's continuation)."""
    out, fenced, indent_block = [], False, None
    prev_blank = True
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            out.append(line.strip())
            continue
        if not line.strip():
            prev_blank = True
            continue
        ind = len(line) - len(line.lstrip(" "))
        if indent_block is not None and ind >= indent_block:
            out.append(line.strip())
        elif prev_blank and ind >= 4 and not line.lstrip().startswith(("- ", "* ", "|")):
            indent_block = ind
            out.append(line.strip())
        else:
            indent_block = None if ind < 4 or not prev_blank else indent_block
            if ind < (indent_block or 10**9):
                indent_block = None
        prev_blank = False
    return out


def commands(text: str) -> list[str]:
    """The shell commands in a document's code blocks, comments after `  # ` removed."""
    cmds = []
    for line in code_lines(text):
        if line.split(" ", 1)[0] not in PROGRAMS:
            continue
        # a program's message ("trajsft fit: ... does not fit", a rule job's "trajsft train demo: ..."), not a command
        if re.match(r"^\S+ [\w-]+(?: [\w.+-]+)?: ", line):
            continue
        cmds.append(re.sub(r"\s+#\s.*$", "", line).strip())
    return cmds


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """Every markdown link or image target outside code blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return LINK.findall(text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(m) for m in re.findall(r"^#+\s+(.*)$", text, flags=re.M)}
