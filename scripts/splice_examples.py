"""Copy docs/plan-example.txt and docs/status-example.txt into the README's indented blocks that show
them (the block after the paragraph linking each file), so the README never drifts from the files
scripts/render_docs.sh generates. `python scripts/splice_examples.py` rewrites README.md in place."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def indented(text: str) -> str:
    return "\n".join(("    " + line).rstrip() for line in text.rstrip("\n").splitlines())


def splice(readme: str, name: str, example: str) -> str:
    """Replace the first indented block after the line linking docs/<name> (a placeholder line
    STATUS_EXAMPLE/PLAN_EXAMPLE counts as a block)."""
    m = re.search(rf"\(docs/{re.escape(name)}\)[^\n]*\n(?:[^\n]+\n)*?\n((?:    [^\n]*\n|[A-Z_]+\n)+)", readme)
    if not m:
        raise SystemExit(f"splice_examples: no block after a link to docs/{name} in README.md")
    return readme[:m.start(1)] + indented(example) + "\n" + readme[m.end(1):]


def main() -> int:
    readme = (REPO / "README.md").read_text()
    for name in ("plan-example.txt", "status-example.txt"):
        readme = splice(readme, name, (REPO / "docs" / name).read_text())
    (REPO / "README.md").write_text(readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
