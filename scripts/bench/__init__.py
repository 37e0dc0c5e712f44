"""The parts of ``scripts/benchmark.py``, one file per measured concern (see that script's docstring)."""
