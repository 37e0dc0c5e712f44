#!/usr/bin/env python
"""Generate the committed demo assets: a tiny teacher-trajectory dataset and a tokenizer.

Writes (relative to the repository root unless ``--out`` is given):

* ``demo/dataset/`` -- a Hugging Face dataset repo layout::

      README.md                          dataset card (YAML front matter: default config)
      data/train-00000-of-00002.parquet
      data/train-00001-of-00002.parquet
      EXPECTED.json                      ground truth about the deliberately bad rows

  with the columns of the real ``AlienKevin/SWE-smith-rs-*-trajectories`` datasets:
  ``messages`` (JSON string of an OpenAI chat list), ``instance_id``, ``resolved``,
  ``model``, ``traj_id``, ``patch``.  Rows are synthetic agentic bug-fixing trajectories on
  Rust repositories (a bash tool, SWE-smith style instance ids), plus a handful of
  malformed rows described in ``EXPECTED.json``.

* ``demo/tokenizer/`` -- a small byte-level BPE tokenizer trained on the demo text, saved as
  a transformers ``PreTrainedTokenizerFast`` with Qwen3's special/added tokens and the
  project's chat template (``src/trajsft/data/templates/qwen3_chat_template.jinja``).

Everything is derived from a fixed seed: running the script twice gives byte-identical
files.
"""

from __future__ import annotations

import os
import sys

# Running ``python scripts/make_demo_assets.py`` puts scripts/ first on sys.path, where a
# sibling ``tokenize.py`` would shadow the stdlib module (imported by inspect/dataclasses).
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse  # noqa: E402
import hashlib  # noqa: E402
import random  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# the parts live in scripts/demo_assets/ (one file per concern); scripts/ goes last on sys.path
sys.path.append(os.path.dirname(os.path.abspath(__file__)))

from demo_assets.settings import REPO_ROOT, SEED  # noqa: E402
from demo_assets.rows import build_rows  # noqa: E402
from demo_assets.dataset import write_dataset  # noqa: E402
from demo_assets.tokenizer import build_tokenizer, training_corpus  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "demo", help="output directory (default: <repo>/demo)")
    args = ap.parse_args(argv)
    rng = random.Random(SEED)
    rows, expected = build_rows(rng)
    write_dataset(rows, expected, args.out / "dataset")
    vocab = build_tokenizer(training_corpus(rows), args.out / "tokenizer")
    digest = hashlib.sha256()
    for p in sorted(args.out.rglob("*")):
        if p.is_file():
            digest.update(p.relative_to(args.out).as_posix().encode() + b"\0" + p.read_bytes())
    print(f"wrote {args.out}: {len(rows)} rows, {expected['expected_skipped']} malformed, vocab {vocab}, sha256 {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
