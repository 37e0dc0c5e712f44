"""The parts of ``scripts/make_demo_assets.py``, one file per concern (see that script's docstring)."""

import sys
from pathlib import Path

# the parts import trajsft (the chat template): src/ of this checkout
_SRC = str(Path(__file__).resolve().parents[2] / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
